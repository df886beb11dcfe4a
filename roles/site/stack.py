"""The stack file: every version pin in one place (inventory/stack.yml), loaded and checked.

Its parts are pydantic dataclasses like the host settings' sections (strict types, unknown keys
refused, frozen; dataclasses.replace works on them): KernelPackage, EngineStack, MonitoringPins,
Stack. A field's rule is a check(predicate, "what is valid") (roles/site/fields.py), and a
ValidationError becomes the same one-line messages: FILE: field = value is invalid; expected
...; an unknown key lists the valid ones. What depends on another field (the pins of one engine
only, the driver version's branch, `active`) is checked here in the order the file reads.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import ConfigDict, ValidationError
from pydantic.dataclasses import dataclass

from roles.site import lock, yamlfile
from roles.site.errors import SiteError, display, shown, unknown_keys
from roles.site.fields import DRIVER_VERSION_RE, check, rule_text

VERSION_RE = re.compile(r"^\d+(\.\d+){0,3}((a|b|rc)\d+)?(\.post\d+)?$")
STACK_ID_RE = re.compile(r"^[a-z0-9][a-z0-9.+_-]{0,62}$")
OVERRIDE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*==[0-9][A-Za-z0-9.+!_-]*$")
# strict types, unknown keys refused; frozen is each class's own (frozen=True).
_CONFIG = ConfigDict(strict=True, extra="forbid")


def _matching(pattern: re.Pattern, valid: str):
    return check(lambda value: pattern.match(value) is not None, valid)


Version = Annotated[str, _matching(VERSION_RE, "a version like 2.9.1 (quoted string)")]
CudaVersion = Annotated[str, _matching(re.compile(r"^\d+\.\d+$"), "a CUDA major.minor like 12.8 (quoted string)")]
PythonVersion = Annotated[str, _matching(re.compile(r"^3\.\d+$"), "a Python minor version like 3.12 (quoted string)")]
VllmVersion = Annotated[str, _matching(VERSION_RE, "a vllm release like 0.16.0 (quoted string)")]
DriverBranch = Annotated[str, _matching(re.compile(r"^\d{3}$"), "a driver branch like 580 (quoted string)")]
DriverVersion = Annotated[str, _matching(DRIVER_VERSION_RE, "a full driver version like 580.95.05 (quoted string)")]
Sha256 = Annotated[str, _matching(re.compile(r"^[0-9a-f]{64}$"), "a sha256 in 64 lowercase hex digits (quoted string)")]


@dataclass(frozen=True, config=_CONFIG)
class KernelPackage:
    package: Annotated[str, check(lambda v: v in ("sgl-kernel", "sglang-kernel"), "'sgl-kernel' or 'sglang-kernel'")]
    version: Version
    source: Annotated[str, check(lambda v: v in ("prebuilt", "build"), "'prebuilt' or 'build'")] = "prebuilt"


ENGINES = ("sglang", "vllm")


@dataclass(frozen=True, config=_CONFIG)
class EngineStack:
    """One consistent engine stack; an upgrade points `active` at another one. `engine` says
    which server it runs: an SGLang stack pins sglang and its kernel package, a vLLM stack
    pins vllm (whose wheel carries its own kernels)."""

    id: str
    cuda: CudaVersion
    python: PythonVersion
    torch: Version
    sglang: Version | None
    kernel: KernelPackage | None
    flashinfer: Version
    flash_attn: Version | None = None
    flash_attn_source: Annotated[
        str, check(lambda v: v in ("build", "prebuilt", "none"), "'build', 'prebuilt' or 'none'")
    ] = "build"
    # The sha256 of flash-attn's source archive (flash_attn-<version>.tar.gz) a build fetches:
    # pinned here, not taken from the index that serves the archive.
    flash_attn_sha256: Sha256 | None = None
    engine: Literal["sglang", "vllm"] = "sglang"
    vllm: VllmVersion | None = None
    # Requirements that replace what the resolved packages pin (uv pip compile --overrides),
    # each with the reason the stack file gives: ((requirement, why), ...).
    overrides: tuple[tuple[str, str], ...] = ()

    @property
    def override_requirements(self) -> list[str]:
        return [requirement for requirement, _ in self.overrides]

    @property
    def cuda_major(self) -> int:
        return int(self.cuda.split(".")[0])

    @property
    def version(self) -> str:
        """The pinned release of the stack's engine (sglang or vllm)."""
        version = self.vllm if self.engine == "vllm" else self.sglang
        assert version is not None, "the stack's rules require its engine's pin"
        return version

    @property
    def label(self) -> str:
        """`sglang 0.5.9`, `vllm 0.16.0`: the engine and its release, for messages."""
        return f"{self.engine} {self.version}"


# Distributions the monitoring packages are pinned for (the lab is Debian 12, the guests Ubuntu
# 24.04; the key is the ID and VERSION_ID of /etc/os-release, without the dot).
MONITORING_DISTROS = ("debian12", "ubuntu2404")
MONITORING_PACKAGES = ("prometheus", "prometheus-alertmanager", "prometheus-node-exporter")
# An exact apt version: [epoch:]upstream[-revision] (deb-version(7)).
# dcgm-exporter's release -> the DCGM it is built against (NVIDIA/dcgm-exporter tag 4.5.3-4.8.2,
# hack/VERSION: NEW_DCGM_VERSION=4.5.3, NEW_EXPORTER_VERSION=4.8.2). The one place of this pairing:
# roles/nvidia_driver installs DCGM at it, roles/monitoring the exporter (docs/upstream.md).
DCGM_FOR_EXPORTER = {"4.8.2": "4.5.3"}
DCGM_EXPORTER_RELEASES = tuple(DCGM_FOR_EXPORTER)
APT_VERSION_RE = re.compile(r"^(\d+:)?[0-9][A-Za-z0-9.+~-]*$")


@dataclass(frozen=True, config=_CONFIG)
class MonitoringPins:
    """roles/monitoring's package versions: the distribution's Prometheus packages per
    distribution (their versions differ), NVIDIA's DCGM exporter (its upstream version: the host's
    index gives the epoch and revision, roles/shared/apt_resolve.py)."""

    distro_packages: dict[str, dict[str, str]]
    dcgm_exporter: str

    def for_distro(self, distro: str) -> dict[str, str]:
        return self.distro_packages[distro]


@dataclass(frozen=True, config=_CONFIG)
class Stack:
    file: str
    uv: Version
    driver_branch: DriverBranch
    driver_version: DriverVersion
    active: EngineStack
    stacks: dict[str, EngineStack]
    # Absolute path of the stack file: its stacks' locks live beside it (roles/site/lock.py).
    path: str = ""
    # None: the stack file pins no monitoring packages (required with a monitors group).
    monitoring: MonitoringPins | None = None

    def lock_text(self, stack_id: str) -> str:
        return lock.unsealed(lock.lock_path(Path(self.path), stack_id).read_text())

    def uv_lock_text(self) -> str:
        """uv's hashed lock (roles/shared/tool_locks.py), checked fresh when the inventory loaded."""
        return lock.unsealed(lock.uv_lock_path(Path(self.path), self.uv).read_text())


STACK_FIELDS = {"uv", "nvidia_driver", "active", "stacks", "monitoring"}
DRIVER_FIELDS = {"branch", "version"}
ENGINE_FIELDS = {
    "engine",
    "cuda",
    "python",
    "torch",
    "sglang",
    "vllm",
    "kernel",
    "flashinfer",
    "flash_attn",
    "flash_attn_source",
    "flash_attn_sha256",
    "overrides",
}
# Pins that belong to one engine only: a vLLM stack naming sglang's kernel is a mistake.
ENGINE_ONLY_FIELDS = {"sglang": {"vllm"}, "vllm": {"sglang", "kernel", "flash_attn", "flash_attn_sha256"}}
KERNEL_FIELDS = {"package", "version", "source"}


def _field_rule(cls: type, name: str) -> str:
    """The `valid` text of a field's check (its own, or inside `X | None`)."""
    field = cls.__pydantic_fields__[name]  # type: ignore[attr-defined]  # a pydantic dataclass
    return rule_text(Annotated[field.annotation, *field.metadata] if field.metadata else field.annotation) or "?"


def _field_problems(cls: type, values: dict[str, Any], where: str, names: dict[str, str]):
    """(cls(**values), {}) or (None, {field: its one message}): the field named as `names` has
    it, the value as written (None when missing). Unknown keys are named before (unknown_keys)."""
    try:
        return cls(**values), {}
    except ValidationError as error:
        found: dict[str, str] = {}
        for detail in error.errors():
            name = str(detail["loc"][0])
            if name in found or detail["type"] == "unexpected_keyword_argument":
                continue
            valid = detail["ctx"]["valid"] if detail["type"] == "inference_host" else _field_rule(cls, name)
            found[name] = f"{where}: {names[name]} = {shown(values.get(name))} is invalid; expected {valid}"
        return None, found


def _validated(cls: type, values: dict[str, Any], where: str, problems: list[str], names: dict[str, str]):
    made, found = _field_problems(cls, values, where, names)
    problems.extend(found.values())
    return made


# The order a stack's problems are named in (the kernel's come first, then these).
_PIN_ORDER = (
    "flash_attn",
    "flash_attn_source",
    "flash_attn_sha256",
    "overrides",
    "cuda",
    "python",
    "torch",
    "sglang",
    "vllm",
    "flashinfer",
)


def _read(path: Path, where: str) -> dict:
    try:
        text = yamlfile.read_text(path)
        raw = yamlfile.load(text)
    except FileNotFoundError:
        raise SiteError([f"{where}: file not found; every inventory needs a stack file"]) from None
    except IsADirectoryError:
        raise SiteError([f"{where}: is a folder; expected the stack file (YAML), like inventory/stack.yml"]) from None
    except OSError as error:
        raise SiteError([f"{where}: cannot be read ({error.strerror}); expected a readable YAML file"]) from None
    except UnicodeDecodeError as error:
        raise SiteError(
            [
                f"{where}: byte {error.object[error.start]:#04x} at offset {error.start} is not UTF-8;"
                " expected a UTF-8 text file"
            ]
        ) from None
    except yaml.YAMLError as error:
        raise SiteError([f"{where}: {yamlfile.one_line(error)}"]) from None
    if not isinstance(raw, dict):
        raise SiteError([f"{where}: expected a mapping of uv, nvidia_driver, active, stacks"])
    foreign = yamlfile.foreign_keys_problem(text, list(raw), STACK_FIELDS.__contains__, "a stack file")
    if foreign:
        raise SiteError([f"{where}: {foreign}"])
    return raw


def load_stack(path: Path) -> Stack:
    problems: list[str] = []
    where = display(path)
    raw = _read(path, where)

    def bad(field_name: str, value: Any, valid: str) -> None:
        problems.append(f"{where}: {field_name} = {shown(value)} is invalid; expected {valid}")

    unknown_keys(raw, STACK_FIELDS, "", where, problems)
    driver = raw.get("nvidia_driver") or {}
    if not isinstance(driver, dict):
        bad("nvidia_driver", driver, "a mapping with branch and version")
        driver = {}
    unknown_keys(driver, DRIVER_FIELDS, "nvidia_driver.", where, problems)
    top = {"uv": raw.get("uv"), "driver_branch": driver.get("branch"), "driver_version": driver.get("version")}
    _validated(_TopPins, top, where, problems, _TOP_NAMES)
    branch, driver_version = top["driver_branch"], top["driver_version"]
    if (
        isinstance(branch, str)
        and isinstance(driver_version, str)
        and re.match(r"^\d{3}$", branch)
        and DRIVER_VERSION_RE.match(driver_version)
        and not driver_version.startswith(branch + ".")
    ):
        bad("nvidia_driver.version", driver_version, f"a version on branch {branch}")

    stacks: dict[str, EngineStack] = {}
    ids: list[str] = []  # every stack named well enough to be `active`, valid pins or not
    raw_stacks = raw.get("stacks")
    if not isinstance(raw_stacks, dict) or not raw_stacks:
        bad("stacks", raw_stacks, "a mapping of stack id -> pins, with at least one stack")
        raw_stacks = {}
    for stack_id, pins in raw_stacks.items():
        engine_stack = _engine_stack(stack_id, pins, where, problems, bad, ids)
        if engine_stack is not None:
            stacks[stack_id] = engine_stack
    monitoring = _monitoring_pins(raw.get("monitoring"), where, problems, bad) if "monitoring" in raw else None
    active_id = raw.get("active")
    if active_id not in ids:
        bad("active", active_id, "the id of one of the stacks: " + ", ".join(ids or ["(none)"]))
    if problems:
        raise SiteError(problems)
    # No problem: _TopPins checked each top pin, and `active` is one of the stacks.
    assert isinstance(top["uv"], str) and isinstance(branch, str) and isinstance(driver_version, str)
    assert isinstance(active_id, str)
    return Stack(
        file=where,
        uv=top["uv"],
        driver_branch=branch,
        driver_version=driver_version,
        active=stacks[active_id],
        stacks=stacks,
        path=str(path.resolve()),
        monitoring=monitoring,
    )


@dataclass(frozen=True, config=_CONFIG)
class _TopPins:
    """uv and the driver pins, checked before the stacks (Stack takes them as they are here)."""

    uv: Version
    driver_branch: DriverBranch
    driver_version: DriverVersion


_TOP_NAMES = {"uv": "uv", "driver_branch": "nvidia_driver.branch", "driver_version": "nvidia_driver.version"}


def _engine_stack(stack_id: Any, pins: Any, where: str, problems: list[str], bad, ids: list[str]) -> EngineStack | None:
    prefix = f"stacks.{stack_id}"
    if not isinstance(stack_id, str) or not STACK_ID_RE.match(stack_id):
        bad(prefix, stack_id, "a stack id of lower-case letters, digits, '.', '_', '-'")
        return None
    if not isinstance(pins, dict):
        bad(prefix, pins, "a mapping of pins")
        return None
    unknown_keys(pins, ENGINE_FIELDS, prefix + ".", where, problems)
    engine = pins.get("engine", "sglang")
    if engine not in ENGINES:
        bad(prefix + ".engine", engine, "'sglang' or 'vllm'")
        return None
    ids.append(stack_id)
    for other in sorted(ENGINE_ONLY_FIELDS[engine] & set(pins)):
        bad(f"{prefix}.{other}", pins[other], f"no {other} pin in a stack of engine {engine}")
    count = len(problems)
    kernel = None
    if engine == "sglang":
        raw_kernel = pins.get("kernel")
        if not isinstance(raw_kernel, dict):
            bad(prefix + ".kernel", raw_kernel, "a mapping with package, version, source")
            raw_kernel = {}
        unknown_keys(raw_kernel, KERNEL_FIELDS, prefix + ".kernel.", where, problems)
        kernel = _validated(
            KernelPackage,
            {k: raw_kernel.get(k) for k in ("package", "version")}
            | {k: v for k, v in raw_kernel.items() if k == "source"},
            where,
            problems,
            {k: f"{prefix}.kernel.{k}" for k in KERNEL_FIELDS},
        )
    found: dict[str, list[str]] = {name: [] for name in _PIN_ORDER}

    def pin_problem(field_name: str, value: Any, valid: str) -> None:
        found[field_name[len(prefix) + 1 :].split(".")[0]].append(
            f"{where}: {field_name} = {shown(value)} is invalid; expected {valid}"
        )

    # vLLM's wheel carries its own flash-attention build (vllm/vllm_flash_attn).
    flash_attn_source = pins.get("flash_attn_source", "build" if engine == "sglang" else "none")
    values = {
        "id": stack_id,
        "engine": engine,
        "cuda": pins.get("cuda"),
        "python": pins.get("python"),
        "torch": pins.get("torch"),
        "flashinfer": pins.get("flashinfer"),
        "sglang": pins.get("sglang") if engine == "sglang" else None,
        "vllm": pins.get("vllm") if engine == "vllm" else None,
        "flash_attn": pins.get("flash_attn") if engine == "sglang" else None,
        "flash_attn_source": flash_attn_source,
        "flash_attn_sha256": pins.get("flash_attn_sha256") if engine == "sglang" else None,
        "kernel": kernel,
        "overrides": _overrides(pins.get("overrides", {}), prefix + ".overrides", pin_problem),
    }
    if (
        engine == "sglang"
        and flash_attn_source == "build"
        and pins.get("flash_attn")
        and not pins.get("flash_attn_sha256")
    ):
        pin_problem(
            prefix + ".flash_attn_sha256",
            None,
            f"the sha256 of flash_attn-{pins.get('flash_attn')}.tar.gz, the source a build fetches"
            " (PyPI's simple index lists it; checked against the archive, not taken from the index)",
        )
    if engine == "vllm" and flash_attn_source in ("build", "prebuilt"):
        pin_problem(prefix + ".flash_attn_source", flash_attn_source, "'none' in a vllm stack")
        values["flash_attn_source"] = "none"
    stack, invalid = _field_problems(EngineStack, values, where, {k: f"{prefix}.{k}" for k in values})
    for name, message in invalid.items():
        found.setdefault(name, []).append(message)
    if values[engine] is None:  # `X | None` for the other engine; its own engine's pin is required
        pin_problem(f"{prefix}.{engine}", None, _field_rule(EngineStack, engine))
    problems.extend(message for messages in found.values() for message in messages)
    return stack if len(problems) == count else None


def _monitoring_pins(raw: Any, where: str, problems: list[str], bad) -> MonitoringPins | None:
    valid = (
        "a mapping of "
        + ", ".join(MONITORING_DISTROS)
        + " (each: "
        + ", ".join(MONITORING_PACKAGES)
        + " -> exact apt version) and dcgm_exporter"
    )
    if not isinstance(raw, dict):
        bad("monitoring", raw, valid)
        return None
    unknown_keys(raw, set(MONITORING_DISTROS) | {"dcgm_exporter"}, "monitoring.", where, problems)
    distros: dict[str, dict[str, str]] = {}
    for distro in MONITORING_DISTROS:
        pins = raw.get(distro)
        if not isinstance(pins, dict):
            bad(f"monitoring.{distro}", pins, "a mapping of " + ", ".join(MONITORING_PACKAGES) + " -> version")
            continue
        unknown_keys(pins, set(MONITORING_PACKAGES), f"monitoring.{distro}.", where, problems)
        for package in MONITORING_PACKAGES:
            value = pins.get(package)
            if not isinstance(value, str) or not APT_VERSION_RE.match(value):
                bad(
                    f"monitoring.{distro}.{package}",
                    value,
                    "an exact apt version like 2.42.0+ds-5+deb12u1"
                    " (quoted string; `apt-cache policy " + package + "` shows it)",
                )
        distros[distro] = {package: str(pins.get(package)) for package in MONITORING_PACKAGES}
    dcgm = raw.get("dcgm_exporter")
    if dcgm not in DCGM_EXPORTER_RELEASES:
        bad(
            "monitoring.dcgm_exporter",
            dcgm,
            "the upstream version of NVIDIA's datacenter-gpu-manager-exporter,"
            " one of " + ", ".join(DCGM_EXPORTER_RELEASES) + " (quoted string; the deploy reads the epoch and"
            " revision from the host's index and pins DCGM to what that release is built against)",
        )
    return MonitoringPins(distro_packages=distros, dcgm_exporter=str(dcgm))


def _overrides(raw: Any, where: str, bad) -> tuple[tuple[str, str], ...]:
    """`overrides:` maps an exact requirement (name==version) to why it replaces the pin the
    resolved packages carry; the reason is required, and travels into the lock's header."""
    if not isinstance(raw, dict):
        bad(where, raw, "a mapping of 'package==version' to the reason for the override")
        return ()
    found = []
    for requirement, why in raw.items():
        if not isinstance(requirement, str) or not OVERRIDE_RE.match(requirement):
            bad(f"{where}.{requirement}", requirement, "an exact requirement like nvidia-cudnn-cu12==9.16.0.29")
        elif not isinstance(why, str) or not why.strip():
            bad(f"{where}.{requirement}", why, "the reason for the override (a non-empty string)")
        else:
            found.append((requirement, " ".join(why.split())))
    return tuple(sorted(found))
