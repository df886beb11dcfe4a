"""Facts about the host itself that several roles read."""

from __future__ import annotations

from pyinfra.api import FactBase


class ContainerVirtualization(FactBase):
    """Returns the container technology the host runs in ("docker", "lxc", ...), or None."""

    def command(self) -> str:
        return "systemd-detect-virt --container 2>/dev/null || true"

    def process(self, output) -> str | None:
        value = "".join(output).strip()
        return None if value in ("", "none") else value
