"""The engine's layout before the engine-neutral names (issue 24; main at commit 7c5257e), which
the next deploy migrates away from: one health-gated restart, nothing left behind.

Then: the unit `sglang.service` (/etc/systemd/system/sglang.service, a link to
<root>/current/serving/sglang.service, enabled by a multi-user.target.wants link), the stable
secret-args name under /etc/sglang, the scripts /usr/local/libexec/inference-host/sglang-*, and
<root> = base_install_root's old default /opt/sglang (envs, locks, current, uv-cache, python,
eagle3-env, specforge). The root is read from the unit's link, so a host that had set its own
base_install_root migrates the same way.

Why the environments are rebuilt rather than moved: a uv venv holds absolute paths (the
shebangs of its bin/ scripts, pyvenv.cfg's home=, the interpreter under <root>/python), so a
moved venv breaks, and the old root must stay intact until the new unit is healthy, because a
rollback starts the old unit from it. The new root's environments are installed from the
stack's lock like any new environment; the old root's uv cache is moved to the new root first
(a cache holds no absolute path into the root; a venv built from it is a copy or hard link, not
a reference), so the rebuild downloads nothing. The old root goes only after the switch.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyinfra.api import FactBase

from roles.shared.shell import Shell, sh

LEGACY_UNIT = "sglang"
LEGACY_SECRET_DIR = "/etc/sglang"
LEGACY_SCRIPTS = ("sglang-cleanup", "sglang-wait-ready", "sglang-switch", "sglang-rolling")
UNIT_DIR = "/etc/systemd/system"
_LINK_TAIL = f"/current/serving/{LEGACY_UNIT}.service"


@dataclass(frozen=True)
class LegacyEngine:
    unit: str  # sglang.service
    root: str  # the old base_install_root, e.g. /opt/sglang
    wants_link: str  # what enabled it at boot
    unit_link: str  # /etc/systemd/system/sglang.service


def legacy_from_link(target: str | None) -> LegacyEngine | None:
    """The old layout, from where /etc/systemd/system/sglang.service points (None: not there)."""
    if not target or not target.endswith(_LINK_TAIL):
        return None
    unit = f"{LEGACY_UNIT}.service"
    return LegacyEngine(
        unit=unit,
        root=target[: -len(_LINK_TAIL)],
        unit_link=f"{UNIT_DIR}/{unit}",
        wants_link=f"{UNIT_DIR}/multi-user.target.wants/{unit}",
    )


class LegacyEngineLayout(FactBase):
    """Returns the pre-rename engine layout (LegacyEngine) on this host, or None: none there, or
    the host's unit still has the old name (serving_unit_name = "sglang": nothing to migrate)."""

    def command(self, unit_name: str) -> str:
        if unit_name == LEGACY_UNIT:
            return "true"
        return f"readlink {UNIT_DIR}/{LEGACY_UNIT}.service || true"

    def process(self, output: list[str]) -> LegacyEngine | None:
        return legacy_from_link("\n".join(output).strip() or None)


class CacheToAdopt(FactBase):
    """Returns True when the old root has a uv cache (a folder, or the lab's link to one) and
    the new root has none yet."""

    def command(self, old: str, new: str) -> Shell:
        return sh("if [ -e {old} ] && [ ! -e {new} ] && [ ! -L {new} ]; then echo yes; fi; true", old=old, new=new)

    def process(self, output: list[str]) -> bool:
        return "\n".join(output).strip() == "yes"


def legacy_engine(host, settings) -> LegacyEngine | None:
    """The old layout to migrate from (its root may be this deploy's own: then only the unit
    and the names outside the root go)."""
    return host.get_fact(LegacyEngineLayout, unit_name=settings.serving.unit_name)


def moves_root(legacy: LegacyEngine | None, settings) -> bool:
    return legacy is not None and legacy.root != settings.base.install_root


# rename-script: keep (this file names the layout before the rename on purpose: /work/w24b-rename.sh skips it)
