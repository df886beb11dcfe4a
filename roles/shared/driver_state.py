"""Driver state of an NVIDIA host, parsed from its own tools' output: pure functions only.

The one implementation of this parsing. No pyinfra import here (standard library only): the
facts (roles/nvidia_driver/facts.py), the health checks (checks/gpu_parsers.py re-exports these
for checks) and this file run as a script (below) all use these parsers, the last two on
machines without pyinfra. Tested on real output (tests/unit/data/gpu/).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Flavor = Literal["open", "proprietary", "unknown"]

# "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build ..."
# "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.129.03  Thu Oct 19 18:56:32 UTC 2023"
_VERSION = r"\d{3}\.\d{2,3}(?:\.\d{2,3})?"
_BANNER = rf"(?P<banner>.*?Kernel Module.*?)\s+(?P<version>{_VERSION})\b"
_NVRM_RE = re.compile(rf"^NVRM version:\s*{_BANNER}")
# The kernel log's line when the module loads, with the same banner after dmesg's timestamp
# (or journalctl's prefix): "[    0.913251] NVRM: loading NVIDIA UNIX Open Kernel Module ..."
_NVRM_LOADING_RE = re.compile(rf"NVRM: loading\s+{_BANNER}")
_DRIVER_VERSION_RE = re.compile(rf"^{_VERSION}$")
# nvidia-smi when the loaded module and the libraries differ:
#   Failed to initialize NVML: Driver/library version mismatch
#   NVML library version: 580.95
_NVML_MISMATCH = "Driver/library version mismatch"
_NVML_LIBRARY_RE = re.compile(r"NVML library version:\s*(?P<version>[\d.]+)")
# The userspace library on disk, as `ldconfig -p` or `ls` name it: libnvidia-ml.so.580.159.04
_NVML_FILE_RE = re.compile(r"libnvidia-ml\.so\.(\d+\.\d+(?:\.\d+)?)")
# `modinfo nvidia` (all fields) labels the line; `modinfo -F license nvidia` prints the value only.
_MODINFO_LICENSE_RE = re.compile(r"^[ \t]*license:[ \t]*(?P<value>.*?)[ \t]*$", re.MULTILINE)

# Sentinels our fact commands print, so that a missing tool is not mistaken for empty output.
NO_MODULE = "__ih_no_nvidia_module__"
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


def _kernel_module(match: re.Match[str]) -> KernelModule:
    flavor: Flavor = "open" if "Open Kernel Module" in match.group("banner") else "proprietary"
    return KernelModule(version=match.group("version"), flavor=flavor)


def parse_proc_driver_version(text: str) -> KernelModule | None:
    """/proc/driver/nvidia/version -> KernelModule; None when no NVIDIA module is loaded."""
    for line in text.splitlines():
        match = _NVRM_RE.match(line.strip())
        if match:
            return _kernel_module(match)
    return None


def parse_kernel_log_driver_version(text: str) -> KernelModule | None:
    """The kernel log (dmesg, journalctl -k) -> the module its last "NVRM: loading ..." line
    names (a module reloaded since boot logs a line per load; the last one is the loaded one);
    None when the log has no such line. Evidence for where /proc/driver/nvidia is not readable."""
    module = None
    for line in text.splitlines():
        match = _NVRM_LOADING_RE.search(line)
        if match:
            module = _kernel_module(match)
    return module


def parse_nvml_mismatch(text: str) -> str | None:
    """nvidia-smi's output -> the NVML library version it names when it reports "Driver/library
    version mismatch" ("unknown" when it names none); None when it reports no mismatch."""
    lines = text.splitlines()
    if not any(_NVML_MISMATCH in line for line in lines):
        return None
    library = next((m.group("version") for m in map(_NVML_LIBRARY_RE.search, lines) if m), None)
    return library or "unknown"


# nvidia-smi(1), RETURN VALUE: "Return code 15 - The GPU has fallen off the bus or has otherwise
# become inaccessible" (NVML_ERROR_GPU_IS_LOST, nvml.h). Its own words then, per GPU: "Unable to
# determine the device handle for GPU0000:01:00.0: GPU is lost.  Reboot the system to recover
# this GPU"; the kernel log's: "NVRM: GPU 0000:01:00.0: GPU has fallen off the bus."
SMI_GPU_LOST_RC = 15
_GPU_LOST_RE = re.compile(r"GPU is lost|fallen off the bus", re.IGNORECASE)


def parse_gpu_lost(rc: int, text: str) -> str | None:
    """nvidia-smi's exit status and output -> the words that say a GPU is lost (exit 15, "GPU is
    lost", "fallen off the bus"): only a reboot of the node brings such a GPU back; None otherwise."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    said = next((line for line in lines if _GPU_LOST_RE.search(line)), None)
    if said is not None:
        return said[:300]
    if rc == SMI_GPU_LOST_RC:
        return "exit 15 (nvidia-smi(1): the GPU has fallen off the bus or has otherwise become inaccessible)"
    return None


def parse_nvidia_smi_driver_version(text: str) -> UserspaceDriver:
    """Output of `nvidia-smi --query-gpu=driver_version --format=csv,noheader` -> UserspaceDriver."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    mismatch = parse_nvml_mismatch(text)
    if mismatch is not None:
        return UserspaceDriver(mismatch_library_version=mismatch)
    versions = tuple(line for line in lines if _DRIVER_VERSION_RE.match(line))
    if versions and len(versions) == len(lines):
        return UserspaceDriver(versions=versions)
    return UserspaceDriver(error=" / ".join(lines) or "nvidia-smi printed nothing")


def parse_modinfo_license(text: str) -> Flavor:
    """`modinfo -F license nvidia` (or the "license:" line of `modinfo nvidia`) -> "open"
    (Dual MIT/GPL), "proprietary" (NVIDIA) or "unknown"."""
    labelled = _MODINFO_LICENSE_RE.search(text)
    value = labelled.group("value") if labelled else text.strip()
    if value == "Dual MIT/GPL":
        return "open"
    if value == "NVIDIA":
        return "proprietary"
    return "unknown"  # modinfo absent (NO_MODINFO), module not installed, or a new license text


def parse_smi_version(text: str) -> dict[str, str]:
    """`nvidia-smi --version` -> {"NVIDIA-SMI version": ..., "DRIVER version": ..., ...}."""
    values = {}
    for line in text.splitlines():
        if ":" in line:
            key, _, value = line.partition(":")
            values[key.strip()] = value.strip()
    return values


def parse_userspace_versions(text: str) -> set[str]:
    """The versions of libnvidia-ml.so.<version> named in `ldconfig -p` or `ls` output: the
    userspace driver as installed on disk (readable when nvidia-smi itself fails)."""
    return set(_NVML_FILE_RE.findall(text))


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


# ----------------------------------------------------------------------------------------------
# Read-only check of the machine it runs on, with the same parsers (stdlib only):
#
#     python3 roles/shared/driver_state.py [--expect 580.95.05] [--json]
#
# Exit status: 0 consistent, 1 reboot required / not the expected version, 2 no NVIDIA driver.


def _read(path: str) -> str:
    try:
        with open(path) as handle:
            return handle.read()
    except OSError:
        return ""


def _output(*command: str) -> str | None:
    """stdout+stderr of a command, or None when the program does not exist."""
    import os
    import shutil
    import subprocess

    # modinfo lives in /sbin, which a non-root PATH may lack.
    search = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    program = shutil.which(command[0], path=search)
    if program is None:
        return None
    done = subprocess.run([program, *command[1:]], capture_output=True, text=True, timeout=60, check=False)
    return done.stdout + done.stderr


def check_this_machine(expect: str | None = None) -> tuple[int, dict]:
    """Reads the driver state of this machine; returns (exit status, report)."""
    module = parse_proc_driver_version(_read("/proc/driver/nvidia/version"))
    smi_text = _output("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader")
    userspace = parse_nvidia_smi_driver_version(smi_text) if smi_text is not None else None
    modinfo = _output("modinfo", "-F", "license", "nvidia")
    license_flavor = parse_modinfo_license(modinfo if modinfo is not None else NO_MODINFO)
    user_version = None
    if userspace is not None:
        user_version = userspace.version or userspace.mismatch_library_version
    problems = []
    if module is None:
        problems.append("no NVIDIA kernel module is loaded (/proc/driver/nvidia/version is absent)")
    if userspace is None:
        problems.append("nvidia-smi is not installed (no userspace driver)")
    elif userspace.error:
        problems.append(f"nvidia-smi failed: {userspace.error}")
    mismatch = driver_mismatch(module, user_version)
    if mismatch:
        problems.append(mismatch)
    installed = user_version or (module.version if module else None)
    if expect and installed and installed != expect:
        # Not a reboot: the wrong driver is installed. (A module that differs from a pinned
        # userspace is the mismatch above, which a reboot does fix.)
        problems.append(
            f"not the pinned driver: {installed} is installed, the pin is {expect};"
            " run the deploy to install the pinned driver (then reboot when it says so)"
        )
    report = {
        "kernel_module": None if module is None else {"version": module.version, "flavor": module.flavor},
        "modinfo_license_flavor": license_flavor,
        "modinfo_present": modinfo is not None,
        "userspace_versions": list(userspace.versions) if userspace else [],
        "nvml_mismatch_library_version": userspace.mismatch_library_version if userspace else None,
        "expected": expect,
        "problems": problems,
    }
    if module is None and userspace is None:
        return 2, report
    return (1 if problems else 0), report


def _print_report(report: dict) -> None:
    module = report["kernel_module"]
    print(
        "kernel module   :",
        "none loaded"
        if module is None
        else f"{module['version']} ({module['flavor']}, from /proc/driver/nvidia/version)",
    )
    print(
        "modinfo license :",
        report["modinfo_license_flavor"] + ("" if report["modinfo_present"] else " (modinfo is not installed)"),
    )
    print("userspace (smi) :", ", ".join(report["userspace_versions"]) or "unavailable")
    if report["expected"]:
        print("expected (pin)  :", report["expected"])
    print("verdict         :", "; ".join(report["problems"]) or "consistent: module and userspace match")


if __name__ == "__main__":
    import argparse
    import json
    import sys

    parser = argparse.ArgumentParser(description="Read-only NVIDIA driver state check (no changes).")
    parser.add_argument("--expect", help="the driver version the host should run (stack.yml pin)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    options = parser.parse_args()
    status, result = check_this_machine(options.expect)
    if options.json:
        print(json.dumps(result, indent=2))
    else:
        _print_report(result)
    sys.exit(status)
