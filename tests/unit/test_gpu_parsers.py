"""checks.gpu_parsers on real captured output (tests/unit/data/gpu/, see the READMEs there)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from checks import gpu_parsers as parse
from roles.shared import driver_state

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parent / "data" / "gpu"
ONE = DATA / "h200-1gpu"
ONE_HEALTH = DATA / "h200-1gpu-health"
TWO = DATA / "h200-2gpu"


def read(path: Path) -> str:
    return path.read_text()


def test_gpu_query_of_the_health_suite_two_h200():
    gpus = parse.parse_gpu_query(read(TWO / "query-gpu-health.csv"))
    assert [g.index for g in gpus] == [0, 1]
    first = gpus[0]
    assert first.name == "NVIDIA H200"
    assert first.bus_id == "00000000:00:06.0" and first.bus == "0000:00:06.0"
    assert first.compute_cap == "9.0"
    assert first.memory_mib == 143771
    assert first.driver_version == "580.159.04"
    assert first.persistence_mode is True
    assert first.pstate == "P0"
    assert (first.pcie_gen_current, first.pcie_gen_max, first.pcie_gen_gpu_max) == (5, 5, 5)
    assert (first.pcie_width_current, first.pcie_width_max) == (16, 16)
    assert gpus[1].bus == "0000:00:07.0"


def test_gpu_query_with_header_and_units_from_the_foundation_capture():
    fields = (
        "index",
        "pci.bus_id",
        "name",
        "uuid",
        "compute_cap",
        "memory.total",
        "driver_version",
        "persistence_mode",
        "pcie.link.gen.current",
        "pcie.link.gen.max",
        "pcie.link.width.current",
        "pcie.link.width.max",
    )
    gpus = parse.parse_gpu_query(read(ONE / "query-gpu.csv"), fields)
    assert len(gpus) == 1
    assert gpus[0].memory_mib == 143771  # "143771 MiB" with units
    assert gpus[0].uuid == "GPU-626a6486-103b-da2a-8f20-192347a59c5f"
    assert gpus[0].pcie_gen_gpu_max is None and gpus[0].pstate is None  # not asked for


def test_gpu_query_rejects_a_row_of_the_wrong_shape():
    with pytest.raises(ValueError, match="columns"):
        parse.parse_gpu_query("0, 00000000:01:00.0, NVIDIA H200\n")


def test_retired_pages_not_supported_on_h200_is_none_not_zero():
    pages = parse.parse_retired_pages(read(ONE / "query-retired.csv"))
    assert len(pages) == 1
    assert pages[0].supported is False
    assert pages[0].double_bit is None


def test_retired_pages_with_counts():
    pages = parse.parse_retired_pages("0, Yes, 3, 1\n1, No, 0, 0\n")
    assert pages[0].pending is True and pages[0].double_bit == 1 and pages[0].supported
    assert pages[1].pending is False and pages[1].single_bit == 0


@pytest.mark.parametrize("path", [ONE / "query-remapped.csv", ONE_HEALTH / "query-remapped-noheader.csv"])
def test_remapped_rows_with_and_without_header(path):
    rows = parse.parse_remapped_rows(read(path))
    assert len(rows) == 1
    assert rows[0].correctable == 0 and rows[0].uncorrectable == 0
    assert rows[0].pending is False and rows[0].failure is False
    assert parse.normalize_bus_id(rows[0].bus_id) == "0000:00:06.0"


def test_compute_apps_empty_capture_and_a_process():
    assert parse.parse_compute_apps(read(ONE / "compute-apps.csv")) == []
    assert parse.parse_compute_apps(read(TWO / "compute-apps.csv")) == []
    apps = parse.parse_compute_apps("4242, /opt/inference-host/venv/bin/python, 81234, 00000000:01:00.0\n")
    assert apps == [parse.ComputeApp(4242, "/opt/inference-host/venv/bin/python", 81234, "00000000:01:00.0")]


def test_driver_parsers_are_driver_states_own():
    # One implementation: the health checks read the driver role's parsers, not copies.
    for name in (
        "KernelModule",
        "parse_proc_driver_version",
        "parse_kernel_log_driver_version",
        "parse_modinfo_license",
        "parse_nvml_mismatch",
        "parse_smi_version",
        "parse_userspace_versions",
    ):
        assert getattr(parse, name) is getattr(driver_state, name), name


@pytest.mark.parametrize("module", ["checks.gpu_parsers", "roles.shared.driver_state"])
def test_importable_with_the_standard_library_only(module):
    # checks runs on GPU machines without pyinfra (or yaml): importing these must not
    # need either, also not through a package's __init__ (roles/nvidia_driver/__init__.py).
    code = (
        "import sys\n"
        "sys.modules['pyinfra'] = sys.modules['yaml'] = None  # importing them fails\n"
        "before = set(sys.modules)\n"
        f"import {module}\n"
        "loaded = {name.split('.')[0] for name in set(sys.modules) - before}\n"
        "print(sorted(loaded - set(sys.stdlib_module_names) - {'roles', 'checks'}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_proc_driver_version_open_module():
    module = parse.parse_proc_driver_version(read(ONE / "proc-version.txt"))
    assert module == parse.KernelModule(version="580.159.04", flavor="open")


def test_proc_driver_version_proprietary_module():
    text = (
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.127.05  Tue Oct  8 03:22:07 UTC 2024\n"
        "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"
    )
    assert parse.parse_proc_driver_version(text) == parse.KernelModule("550.127.05", flavor="proprietary")


def test_kernel_module_from_the_dmesg_load_line():
    module = parse.parse_kernel_log_driver_version(read(ONE / "dmesg-nvrm.txt"))
    assert module == parse.KernelModule(version="580.159.04", flavor="open")


def test_smi_version():
    values = parse.parse_smi_version(read(ONE / "smi-version.txt"))
    assert values["DRIVER version"] == "580.159.04"
    assert values["CUDA Version"] == "13.0"


def test_userspace_versions_from_library_names():
    assert parse.parse_userspace_versions(read(ONE_HEALTH / "userspace-nvml.txt")) == {"580.159.04"}


def test_version_mismatch_message():
    # The text nvidia-smi prints after a driver upgrade without reboot (NVIDIA/deepops #1186).
    assert (
        parse.parse_nvml_mismatch(
            "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 580.159"
        )
        == "580.159"
    )
    assert parse.parse_nvml_mismatch(read(ONE / "nvidia-smi.txt")) is None


def test_modinfo_license():
    assert parse.parse_modinfo_license("license:        Dual MIT/GPL") == "open"
    assert parse.parse_modinfo_license("license:        NVIDIA") == "proprietary"
    assert parse.parse_modinfo_license("") == "unknown"


def test_no_xid_in_the_real_kernel_log():
    # The real log has NVRM lines (load, FBHUB interrupt, persistence) but no Xid.
    assert "NVRM" in read(ONE / "dmesg-nvrm.txt")
    assert parse.parse_xid_events(read(ONE / "dmesg-nvrm.txt")) == []


def test_xid_lines_are_found_with_bus_and_code():
    log = read(ONE / "dmesg-nvrm.txt") + (
        "[ 8812.123456] NVRM: Xid (PCI:0000:01:00): 79, pid='<unknown>', name=<unknown>, "
        "GPU has fallen off the bus.\n"
        "[ 9000.000001] NVRM: Xid (PCI:0000:c1:00): 48, pid=1234, name=python, An uncorrectable "
        "double bit error (DBE) has been detected on GPU in the framebuffer at partition 6.\n"
    )
    events = parse.parse_xid_events(log)
    assert [(e.bus, e.code) for e in events] == [("0000:01:00.0", 79), ("0000:c1:00.0", 48)]
    assert events[0].message.endswith("GPU has fallen off the bus.")


def test_topology_one_gpu():
    topology = parse.parse_topology(read(ONE / "topo.txt"))
    assert topology.gpus == ["GPU0"]
    assert topology.links == {}
    assert topology.cpu_affinity == {"GPU0": "0-15"}
    assert topology.numa_affinity == {"GPU0": "0"}


def test_topology_two_gpus_nvlink():
    topology = parse.parse_topology(read(TWO / "topo.txt"))
    assert topology.gpus == ["GPU0", "GPU1"]
    assert topology.links == {("GPU0", "GPU1"): "NV18", ("GPU1", "GPU0"): "NV18"}
    assert topology.link_kinds() == {"NV18"}
    assert topology.cpu_affinity == {"GPU0": "0-31", "GPU1": "0-31"}


def test_topology_pcie_two_sockets():
    # The target's layout: 4 + 4 GPUs on two sockets, cross-socket pairs are SYS.
    header = "\tGPU0\tGPU1\tGPU2\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
    rows = (
        "GPU0\t X \tNODE\tSYS\t0-31,64-95\t0\t\tN/A\n"
        "GPU1\tNODE\t X \tSYS\t0-31,64-95\t0\t\tN/A\n"
        "GPU2\tSYS\tSYS\t X \t32-63,96-127\t1\t\tN/A\n\nLegend:\n"
    )
    topology = parse.parse_topology(header + rows)
    assert topology.links[("GPU0", "GPU2")] == "SYS"
    assert topology.links[("GPU0", "GPU1")] == "NODE"
    assert topology.numa_affinity == {"GPU0": "0", "GPU1": "0", "GPU2": "1"}


def test_allreduce_program_output_real_p2p_on_and_off():
    on = parse.parse_json_line(read(TWO / "allreduce-p2p-on.txt"), "IH-ALLREDUCE ")
    off = parse.parse_json_line(read(TWO / "allreduce-p2p-off.txt"), "IH-ALLREDUCE ")
    assert on["world_size"] == off["world_size"] == 2
    assert on["correct"] and off["correct"]
    assert "NCCL_P2P_DISABLE" in off["nccl_env"] and "NCCL_P2P_DISABLE" not in on["nccl_env"]
    # NVLink P2P vs the host-memory path: about ten times apart on this machine.
    assert on["busbw_gbps"] > 5 * off["busbw_gbps"]


def test_json_line_missing_marker():
    with pytest.raises(ValueError, match="IH-CUDA"):
        parse.parse_json_line("Traceback ...\n", "IH-CUDA ")


def test_normalize_bus_id_forms():
    assert parse.normalize_bus_id("00000000:C1:00.0") == "0000:c1:00.0"
    assert parse.normalize_bus_id("0000:01:00") == "0000:01:00.0"
    assert parse.normalize_bus_id("01:00.0") == "0000:01:00.0"


def test_real_health_reports_have_the_documented_shape():
    report = json.loads(read(TWO / "report-pass.json"))
    assert report["verdict"] == "healthy"
    assert {c["suite"] for c in report["checks"]} == {"gpu", "interconnect"}
    wrong = json.loads(read(TWO / "report-wrong.json"))
    failed = {c["check"] for c in wrong["checks"] if c["verdict"] == "FAIL"}
    assert {"gpu count", "compute capability", "driver version equals pin"} <= failed
