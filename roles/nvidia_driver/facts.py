"""Facts of roles/nvidia_driver: the state of the NVIDIA driver on a host.

Each fact is a thin FactBase around a pure parser (text -> typed value), so that the health
checks and scripts/driver_state.py reuse the parsers on captured or live output. The parsers
are tested on real output captured on an NVIDIA host (tests/unit/data/gpu/).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from pyinfra.api import FactBase

Flavor = Literal["open", "proprietary", "unknown"]

# "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build ..."
# "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.129.03  Thu Oct 19 18:56:32 UTC 2023"
_NVRM_RE = re.compile(r"^NVRM version:\s*(?P<banner>.*?Kernel Module.*?)\s+(?P<version>\d{3}\.\d{2,3}(?:\.\d{2,3})?)\b")
_DRIVER_VERSION_RE = re.compile(r"^\d{3}\.\d{2,3}(?:\.\d{2,3})?$")
# nvidia-smi when the loaded module and the libraries differ:
#   Failed to initialize NVML: Driver/library version mismatch
#   NVML library version: 580.95
_NVML_MISMATCH = "Driver/library version mismatch"
_NVML_LIBRARY_RE = re.compile(r"NVML library version:\s*(?P<version>[\d.]+)")

# Sentinels our fact commands print, so that a missing tool is not mistaken for empty output.
NO_MODULE = "__ih_no_nvidia_module__"
NO_NVIDIA_SMI = "__ih_no_nvidia_smi__"
NO_MODINFO = "__ih_no_modinfo__"


@dataclass(frozen=True)
class KernelModule:
    """The NVIDIA kernel module that is loaded now."""

    version: str
    flavor: Flavor  # "open" (open GPU kernel modules) or "proprietary"


@dataclass(frozen=True)
class UserspaceDriver:
    """What nvidia-smi (the userspace driver, NVML) says about itself."""

    # Driver version(s) reported per GPU; empty when NVML could not initialise.
    versions: tuple[str, ...] = ()
    # Set when NVML reports a driver/library mismatch: the library version it names.
    mismatch_library_version: str | None = None
    # Any other failure, in nvidia-smi's own words.
    error: str | None = None

    @property
    def version(self) -> str | None:
        return self.versions[0] if len(set(self.versions)) == 1 else None


def parse_proc_driver_version(text: str) -> KernelModule | None:
    """/proc/driver/nvidia/version -> KernelModule; None when no NVIDIA module is loaded."""
    for line in text.splitlines():
        match = _NVRM_RE.match(line.strip())
        if match:
            flavor: Flavor = "open" if "Open Kernel Module" in match.group("banner") else "proprietary"
            return KernelModule(version=match.group("version"), flavor=flavor)
    return None


def parse_nvidia_smi_driver_version(text: str) -> UserspaceDriver:
    """Output of `nvidia-smi --query-gpu=driver_version --format=csv,noheader` -> UserspaceDriver."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if any(_NVML_MISMATCH in line for line in lines):
        library = next((m.group("version") for m in map(_NVML_LIBRARY_RE.search, lines) if m), None)
        return UserspaceDriver(mismatch_library_version=library or "unknown")
    versions = tuple(line for line in lines if _DRIVER_VERSION_RE.match(line))
    if versions and len(versions) == len(lines):
        return UserspaceDriver(versions=versions)
    return UserspaceDriver(error=" / ".join(lines) or "nvidia-smi printed nothing")


def parse_modinfo_license(text: str) -> Flavor:
    """`modinfo -F license nvidia` -> "open" (Dual MIT/GPL), "proprietary" (NVIDIA) or "unknown"."""
    value = text.strip()
    if value == "Dual MIT/GPL":
        return "open"
    if value == "NVIDIA":
        return "proprietary"
    return "unknown"  # modinfo absent (NO_MODINFO), module not installed, or a new license text


def driver_mismatch(kernel: KernelModule | None, userspace_version: str | None) -> str | None:
    """Plain words when the loaded kernel module and the userspace driver differ, else None."""
    if kernel is None or userspace_version is None:
        return None
    if _same_version(kernel.version, userspace_version):
        return None
    return (
        f"reboot required: the loaded NVIDIA kernel module is {kernel.version} but the installed"
        f" userspace driver is {userspace_version}; GPU programs fail with 'Driver/library version"
        " mismatch' until the host reboots into the new module"
    )


def _same_version(module: str, userspace: str) -> bool:
    # NVML's mismatch message names only major.minor ("580.95"): compare as far as both go.
    parts = min(len(module.split(".")), len(userspace.split(".")))
    return module.split(".")[:parts] == userspace.split(".")[:parts]


class NvidiaKernelModule(FactBase):
    """Returns the loaded NVIDIA kernel module (version, open/proprietary), or None if none is."""

    def command(self) -> str:
        return f"cat /proc/driver/nvidia/version 2>/dev/null || echo {NO_MODULE}"

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
