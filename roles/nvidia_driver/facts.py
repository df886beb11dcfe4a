"""Facts of roles/nvidia_driver: thin FactBase classes over the parsers in driver_state.py."""

from __future__ import annotations

import shlex

from pyinfra.api import FactBase

from roles.shared.driver_state import (  # noqa: F401  (re-exported for role.py and its tests)
    NO_MODINFO,
    NO_MODULE,
    NO_NVIDIA_SMI,
    Flavor,
    KernelModule,
    UserspaceDriver,
    driver_mismatch,
    parse_modinfo_license,
    parse_nvidia_smi_driver_version,
    parse_proc_driver_version,
)


class NvidiaKernelModule(FactBase):
    """Returns the loaded NVIDIA kernel module (version, open/proprietary), or None if none is."""

    def command(self, proc_dir: str = "/proc/driver/nvidia") -> str:
        return f"cat {shlex.quote(proc_dir.rstrip('/'))}/version 2>/dev/null || echo {NO_MODULE}"

    def process(self, output) -> KernelModule | None:
        return parse_proc_driver_version("\n".join(output))


class NvidiaSmiDriver(FactBase):
    """Returns what nvidia-smi reports as the driver version, or None if nvidia-smi is absent."""

    def command(self) -> str:
        return (
            "if command -v nvidia-smi >/dev/null 2>&1;"
            " then nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>&1 || true;"
            f" else echo {NO_NVIDIA_SMI}; fi"
        )

    def process(self, output) -> UserspaceDriver | None:
        text = "\n".join(output)
        if NO_NVIDIA_SMI in text:
            return None
        return parse_nvidia_smi_driver_version(text)


class NvidiaModuleLicense(FactBase):
    """Returns the flavor the installed nvidia module's license says: open, proprietary or unknown."""

    def command(self) -> str:
        return (
            "if command -v modinfo >/dev/null 2>&1; then modinfo -F license nvidia 2>/dev/null || true;"
            f" else echo {NO_MODINFO}; fi"
        )

    def process(self, output) -> Flavor:
        return parse_modinfo_license("\n".join(output))

    @staticmethod
    def default() -> Flavor:
        return "unknown"


class HeldPackages(FactBase):
    """Returns the set of packages apt-mark holds."""

    def command(self) -> str:
        return "apt-mark showhold 2>/dev/null || true"

    def process(self, output) -> set[str]:
        return {line.strip() for line in output if line.strip()}

    @staticmethod
    def default() -> set[str]:
        return set()
