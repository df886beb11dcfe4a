"""Driver-state parsers on real output captured on an H200 (tests/unit/data/gpu/h200-1gpu)."""

from __future__ import annotations

from pathlib import Path

import pytest

from roles.nvidia_driver.facts import HeldPackages, NvidiaKernelModule
from roles.shared import driver_state
from roles.shared.driver_state import (
    NO_MODINFO,
    KernelModule,
    driver_mismatch,
    parse_modinfo_license,
    parse_nvidia_smi_driver_version,
    parse_proc_driver_version,
)

H200 = Path(__file__).parent / "data" / "gpu" / "h200-1gpu"


def test_proc_version_of_the_h200_is_the_open_module_580_159_04():
    module = parse_proc_driver_version((H200 / "proc-version.txt").read_text())
    assert module == KernelModule(version="580.159.04", flavor="open")


def test_proprietary_banner_is_recognised():
    # The banner of the proprietary module: no "Open" before "Kernel Module".
    text = (
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.129.03  Thu Oct 19 18:56:32 UTC 2023\n"
        "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"
    )
    assert parse_proc_driver_version(text) == KernelModule("535.129.03", "proprietary")


@pytest.mark.parametrize("text", ["", "__ih_no_nvidia_module__", "GCC version: gcc 12\n"])
def test_no_module_loaded_is_none(text):
    assert parse_proc_driver_version(text) is None


def test_kernel_log_load_line_of_the_h200():
    # Where /proc/driver/nvidia is not readable, the kernel log's load line names the module.
    module = driver_state.parse_kernel_log_driver_version((H200 / "dmesg-nvrm.txt").read_text())
    assert module == KernelModule(version="580.159.04", flavor="open")
    # It is the kernel log's line, not /proc's: each parser reads its own source.
    assert parse_proc_driver_version((H200 / "dmesg-nvrm.txt").read_text()) is None


def test_kernel_log_after_a_module_reload_names_the_last_load():
    log = (
        "[    1.0] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.127.05  Tue Oct  8 2024\n"
        "[ 9000.0] NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build\n"
    )
    assert driver_state.parse_kernel_log_driver_version(log) == KernelModule("580.95.05", "open")
    journal = "Nov 29 10:00:01 gpu kernel: NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.129.03  Thu\n"
    assert driver_state.parse_kernel_log_driver_version(journal) == KernelModule("535.129.03", "proprietary")


@pytest.mark.parametrize("text", ["", "[    3.9] NVRM: Persistence mode is deprecated\n"])
def test_kernel_log_without_a_load_line_is_none(text):
    assert driver_state.parse_kernel_log_driver_version(text) is None


def test_fact_reads_the_same_file_the_parser_does():
    fact = NvidiaKernelModule()
    assert "/proc/driver/nvidia/version" in fact.command()
    lines = (H200 / "proc-version.txt").read_text().splitlines()
    assert fact.process(lines).version == "580.159.04"


def test_nvidia_smi_driver_version_of_the_h200():
    # The capture queried more columns; driver_version is its 6th field.
    row = (H200 / "query-gpu-noheader.csv").read_text().strip()
    driver_column = row.split(", ")[5]
    parsed = parse_nvidia_smi_driver_version(driver_column + "\n")
    assert parsed.versions == ("580.159.04",)
    assert parsed.version == "580.159.04"
    assert parsed.mismatch_library_version is None and parsed.error is None


def test_nvidia_smi_driver_version_with_eight_gpus():
    parsed = parse_nvidia_smi_driver_version("580.95.05\n" * 8)
    assert parsed.version == "580.95.05" and len(parsed.versions) == 8


def test_nvml_mismatch_message_is_recognised():
    # Wording of nvidia-smi after a userspace upgrade without reboot, as quoted in public
    # reports (NVIDIA/deepops#1186); not captured here: the 1 × H200 (580.159.04) is consistent.
    text = "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 580.95\n"
    parsed = parse_nvidia_smi_driver_version(text)
    assert parsed.mismatch_library_version == "580.95"
    assert parsed.version is None


def test_nvml_mismatch_without_a_library_version():
    text = "Failed to initialize NVML: Driver/library version mismatch\n"
    assert driver_state.parse_nvml_mismatch(text) == "unknown"
    assert parse_nvidia_smi_driver_version(text).mismatch_library_version == "unknown"
    assert driver_state.parse_nvml_mismatch("580.159.04\n") is None


def test_other_nvidia_smi_failures_are_kept_in_its_words():
    text = (
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
        " Make sure that the latest NVIDIA driver is installed and running.\n"
    )
    parsed = parse_nvidia_smi_driver_version(text)
    assert parsed.version is None and "couldn't communicate" in parsed.error


@pytest.mark.parametrize(
    "text, flavor",
    [
        ("Dual MIT/GPL\n", "open"),
        ("NVIDIA\n", "proprietary"),
        (NO_MODINFO + "\n", "unknown"),  # the 1 × H200 machine has no modinfo (tools.txt)
        ("", "unknown"),
        # `modinfo nvidia` without -F: the labelled line among the others
        (
            "filename:       /lib/modules/6.8.0/updates/dkms/nvidia.ko\nlicense:        Dual MIT/GPL\n"
            "version:        580.95.05\n",
            "open",
        ),
        ("license:        NVIDIA\n", "proprietary"),
    ],
)
def test_modinfo_license(text, flavor):
    assert parse_modinfo_license(text) == flavor


def test_modinfo_is_really_absent_on_the_capture_machine():
    assert "modinfo: missing" in (H200 / "tools.txt").read_text()
    assert parse_modinfo_license(NO_MODINFO + "\n") == "unknown"


def test_no_mismatch_on_the_h200():
    module = parse_proc_driver_version((H200 / "proc-version.txt").read_text())
    userspace = parse_nvidia_smi_driver_version("580.159.04\n")
    assert driver_mismatch(module, userspace.version) is None


def test_mismatch_says_reboot_required_in_plain_words():
    message = driver_mismatch(KernelModule("580.82.07", "open"), "580.95.05")
    assert message.startswith("reboot required")
    assert "580.82.07" in message and "580.95.05" in message


def test_mismatch_against_nvml_major_minor():
    assert driver_mismatch(KernelModule("580.95.05", "open"), "580.95") is None
    assert driver_mismatch(KernelModule("580.82.07", "open"), "580.95") is not None


def test_userspace_versions_from_ldconfig():
    text = "\tlibnvidia-ml.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libnvidia-ml.so.1\nlibnvidia-ml.so.580.95.05\n"
    assert driver_state.parse_userspace_versions(text) == {"580.95.05"}
    assert driver_state.parse_userspace_versions("libcuda.so.1\n") == set()


def test_held_packages_fact():
    assert HeldPackages().process(["nvidia-open\n", "libcuda1"]) == {"nvidia-open", "libcuda1"}
    assert HeldPackages.default() == set()


def test_standalone_check_on_the_h200_captures(monkeypatch):
    """scripts' view: roles/shared/driver_state.py run against the captured H200 output."""
    driver_column = (H200 / "query-gpu-noheader.csv").read_text().split(", ")[5] + "\n"
    monkeypatch.setattr(driver_state, "_read", lambda path: (H200 / "proc-version.txt").read_text())
    monkeypatch.setattr(driver_state, "_output", lambda *command: driver_column if command[0] == "nvidia-smi" else None)
    status, report = driver_state.check_this_machine()
    assert status == 0, report["problems"]
    assert report["kernel_module"] == {"version": "580.159.04", "flavor": "open"}
    assert report["modinfo_license_flavor"] == "unknown" and report["modinfo_present"] is False
    # Another driver installed than the pin: a reboot would not help, a deploy would.
    status, report = driver_state.check_this_machine(expect="580.95.05")
    assert status == 1 and report["problems"] == [
        "not the pinned driver: 580.159.04 is installed, the pin is 580.95.05; run the deploy to"
        " install the pinned driver (then reboot when it says so)"
    ]
