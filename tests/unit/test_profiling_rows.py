"""checks/profiling_rows.py: the acceptance line on one DCGM_FI_PROF_* row, present or absent with
its reason, judged on exporter output as the DCGM exporter (stand-in and real format) serves it."""

from __future__ import annotations

from dataclasses import replace

from checks.profiling_rows import (
    ROW,
    Facts,
    judge,
    restricted_value,
    series,
    unprivileged_from_uid_map,
)

# The exposition format of NVIDIA/dcgm-exporter's /metrics (labels as its README's sample).
LABELS = 'gpu="0",UUID="GPU-1",pci_bus_id="00000000:01:00.0",device="nvidia0",modelName="NVIDIA H200",Hostname="g"'
WITH = (
    "# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).\n# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n"
    f"DCGM_FI_DEV_GPU_TEMP{{{LABELS}}} 31\n"
    f"# HELP {ROW} Ratio of time the graphics engine is active.\n# TYPE {ROW} gauge\n{ROW}{{{LABELS}}} 0.000000\n"
)
WITHOUT = "\n".join(line for line in WITH.splitlines() if ROW not in line) + "\n"
HEALTHY = Facts(
    metrics=WITH,
    container="none",
    unprivileged=False,
    restricted=1,
    module_installed=True,
    gpm=True,
    exporter_said=None,
)
LOGGED = (
    "Not collecting DCP metrics: Error getting supported metrics: This request is serviced by a module of DCGM "
    "that is not currently loaded"
)


def test_the_row_present_passes_naming_it():
    verdict = judge(HEALTHY)
    assert verdict.verdict == "PASS" and verdict.observed.startswith("present: 1 series") and ROW in verdict.observed


def test_a_help_line_alone_is_no_series():
    assert series(f"# HELP {ROW} x\n# TYPE {ROW} gauge\n") == []
    assert judge(replace(HEALTHY, metrics=f"# HELP {ROW} x\n")).verdict == "FAIL"


def test_absent_in_an_unprivileged_lxc_guest_under_the_admin_restriction_names_the_nodes_option():
    facts = replace(HEALTHY, metrics=WITHOUT, container="lxc", unprivileged=True, exporter_said=LOGGED)
    verdict = judge(facts)
    assert verdict.verdict == "FAIL" and verdict.observed.startswith("absent:")
    assert "admin restriction" in verdict.observed and "NVreg_RestrictProfilingToAdminUsers=0" in verdict.observed
    assert "on the Proxmox node" in verdict.observed and "the exporter logged: Not collecting DCP" in verdict.observed
    # the same guest with the restriction lifted on the node is not blamed on it
    assert "admin restriction" not in judge(replace(facts, restricted=0)).observed
    # a privileged guest's root is the node's: the restriction does not bar it
    assert "admin restriction" not in judge(replace(facts, unprivileged=False)).observed


def test_absent_without_the_module_on_a_gpu_without_gpm_says_module():
    verdict = judge(replace(HEALTHY, metrics=WITHOUT, module_installed=False, gpm=False))
    assert verdict.verdict == "FAIL" and "profiling module not installed" in verdict.observed
    # with GPM, DCGM's core answers the metric groups: the module is not the reason
    other = judge(replace(HEALTHY, metrics=WITHOUT, module_installed=False, gpm=True))
    assert "profiling module not installed" not in other.observed and "cause not identified" in other.observed


def test_absent_for_no_reason_found_says_so_with_what_was_read():
    verdict = judge(replace(HEALTHY, metrics=WITHOUT, restricted=None))
    assert verdict.verdict == "FAIL"
    assert "cause not identified here (module installed, GPM yes, RmProfilingAdminOnly unknown)" in verdict.observed


def test_an_unread_exporter_is_unreached_not_absent():
    assert judge(replace(HEALTHY, metrics=None)).verdict == "UNREACHED"


def test_the_drivers_params_file_and_the_uid_map_are_read():
    # /proc/driver/nvidia/params prints the registry key (nv-procfs.c, nv-reg.h at 580.95.05)
    assert restricted_value("ResmanDebugLevel: 4294967295\nRmProfilingAdminOnly: 1\nEnableMSI: 1\n") == 1
    assert restricted_value("RmProfilingAdminOnly: 0\n") == 0
    assert restricted_value("EnableMSI: 1\n") is None
    assert unprivileged_from_uid_map("         0          0 4294967295\n") is False
    assert unprivileged_from_uid_map("         0     100000      65536\n") is True
    assert unprivileged_from_uid_map("") is None
