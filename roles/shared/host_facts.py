"""Facts about the host itself that several roles read."""

from __future__ import annotations

from pyinfra.api import FactBase

from roles.shared.shell import Shell, sh


class ContainerVirtualization(FactBase):
    """Returns the container technology the host runs in ("docker", "lxc", ...), or None."""

    def command(self) -> str:
        return "systemd-detect-virt --container 2>/dev/null || true"

    def process(self, output) -> str | None:
        value = "".join(output).strip()
        return None if value in ("", "none") else value


class WheelhouseEntry(FactBase):
    """Returns the wheel file names of a complete wheelhouse entry (a folder that has
    inputs.json, written last), or None when the entry is absent or incomplete."""

    def command(self, path: str) -> Shell:
        return sh("if [ -f {path}/inputs.json ]; then echo present; ls -1 -- {path}; fi; true", path=path)

    def process(self, output) -> list[str] | None:
        lines = [line.strip() for line in output]
        if not lines or lines[0] != "present":
            return None
        return sorted(name for name in lines[1:] if name.endswith(".whl"))


class UnitActiveState(FactBase):
    """Returns `systemctl is-active` of a unit: active, activating, failed, inactive, ...
    (roles/serving and roles/gateway decide from it whether their switch must start the unit)."""

    def command(self, unit: str) -> Shell:
        return sh("systemctl is-active -- {unit} || true", unit=unit)

    def process(self, output: list[str]) -> str:
        return "\n".join(output).strip() or "unknown"
