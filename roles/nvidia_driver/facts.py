"""Facts of roles/nvidia_driver: thin FactBase classes over the parsers in
roles/shared/driver_state.py (which the health checks use too)."""

from __future__ import annotations

from pyinfra.api import FactBase

from roles.shared.driver_state import NO_MODULE, KernelModule, parse_proc_driver_version
from roles.shared.fact_batch import batched
from roles.shared.shell import Shell, sh


class NvidiaKernelModule(FactBase):
    """Returns the loaded NVIDIA kernel module (version, open/proprietary), or None if none is."""

    def command(self, proc_dir: str = "/proc/driver/nvidia") -> Shell:
        return sh(
            "cat -- {version} 2>/dev/null || echo {no_module}",
            version=proc_dir.rstrip("/") + "/version",
            no_module=NO_MODULE,
        )

    def process(self, output) -> KernelModule | None:
        return parse_proc_driver_version("\n".join(output))


@batched
class HeldPackages(FactBase):
    """Returns the set of packages apt-mark holds."""

    def command(self) -> str:
        return "apt-mark showhold 2>/dev/null || true"

    def process(self, output) -> set[str]:
        return {line.strip() for line in output if line.strip()}

    @staticmethod
    def default() -> set[str]:
        return set()
