"""The lab's stand-in for NVIDIA's dcgm-exporter package: the program it installs serves
dcgm-exporter's default field names for each GPU the driver (stand-in) lists, with
dcgm-exporter's labels, in a format promtool accepts; a planted fault shows; the alert rules'
DCGM names are among those it serves."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from lab.standins.nvidia_apt_repo import dcgm_exporter
from roles.monitoring import config
from tests.unit.conftest import PROJECT_ROOT

SAMPLE = PROJECT_ROOT / "tests/unit/data/gpu/h200-1gpu/proc-gpus.txt"


def _site():
    from roles.site import load_site
    from tests.unit.conftest import InventoryFactory, gpu_node

    global _SITE
    if _SITE is None:
        import tempfile
        from pathlib import Path

        factory = InventoryFactory(Path(tempfile.mkdtemp()))
        _SITE = load_site(
            factory.groups(
                gpu_nodes=[gpu_node()], monitors=[("gpu1", {"monitoring_webhook_url": "http://127.0.0.1:9099/x"})]
            )
        )
    return _SITE


_SITE = None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(tmp_path, counters: str, *extra: str, profiling: bool = True):
    proc = tmp_path / "proc"
    for minor, bus in enumerate(("0000:01:00.0", "0000:21:00.0")):
        info = (
            SAMPLE.read_text()
            .split("\n", 1)[1]
            .replace("0000:00:06.0", bus)
            .replace("Device Minor: \t 0", f"Device Minor: \t {minor}")
        )
        (proc / "gpus" / bus).mkdir(parents=True)
        (proc / "gpus" / bus / "information").write_text(info)
    (tmp_path / "counters.csv").write_text(counters)
    program = tmp_path / "dcgm-exporter"
    program.write_text(dcgm_exporter.program("580.95.05"))
    port = _free_port()
    module = tmp_path / "libdcgmmoduleprofiling.so.4"  # what datacenter-gpu-manager-4-proprietary installs
    if profiling:
        module.write_text("stand-in")
    env = {
        **os.environ,
        "DCGM_STANDIN_PROC_DIRS": str(proc),
        "DCGM_STANDIN_FAULTS": str(tmp_path / "faults"),
        "DCGM_STANDIN_PROFILING_MODULE": str(module),
    }
    server = subprocess.Popen(
        [sys.executable, str(program), "-f", str(tmp_path / "counters.csv"), "-a", f"127.0.0.1:{port}", *extra],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}/metrics"
    for _ in range(50):
        try:
            urllib.request.urlopen(url, timeout=1)
            break
        except OSError:
            time.sleep(0.1)
    return server, url, tmp_path / "faults"


@pytest.fixture
def exporter(tmp_path):
    server, url, faults = _serve(tmp_path, dcgm_exporter.counters_csv())
    yield url, faults
    server.terminate()
    server.wait(5)


@pytest.fixture
def xid_exporter(tmp_path):
    """With the deploy's own counters file (the windowed Xid count on) and a 2 s window."""
    counters = (PROJECT_ROOT / "roles/monitoring/templates/inference-host-counters.csv.j2").read_text()
    server, url, faults = _serve(tmp_path, counters, "-x", "2000")
    faults.mkdir()
    yield url, faults
    server.terminate()
    server.wait(5)


def _get(url: str) -> str:
    return urllib.request.urlopen(url, timeout=5).read().decode()


def test_it_serves_the_default_fields_per_gpu_with_dcgm_exporters_labels(exporter):
    url, _ = exporter
    text = _get(url)
    for name, kind, _, _ in dcgm_exporter.COUNTERS:
        assert f"# TYPE {name} {kind}" in text
    assert (
        'DCGM_FI_DEV_GPU_TEMP{gpu="1",UUID="GPU-626a6486-103b-da2a-8f20-192347a59c5f",'
        'pci_bus_id="00000000:21:00.0",device="nvidia1",modelName="NVIDIA H200",'
    ) in text
    assert 'DCGM_FI_DRIVER_VERSION="580.95.05"} 38' in text
    # (not `promtool check metrics`: its naming lint refuses dcgm-exporter's own names, counters
    # without _total and camelCase labels such as modelName, which the stand-in must keep)
    samples = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert len(samples) == 2 * len(dcgm_exporter.COUNTERS)
    assert all(re.fullmatch(r'[A-Z_]+\{(\w+="[^"]*",)*\w+="[^"]*"\} [0-9.]+', line) for line in samples)


def _samples(url: str, name: str) -> list[tuple[str, str]]:
    """(labels after the common ones, value) of each series of `name`, GPU 0 first."""
    out = []
    for line in _get(url).splitlines():
        if line.startswith(name + "{"):
            labels, value = line.rsplit(" ", 1)
            out.append((labels.split('DCGM_FI_DRIVER_VERSION="580.95.05"')[1].rstrip("}"), value))
    return out


def _plant_xid(faults, gpu: int, code: int) -> None:
    with open(faults / f"{gpu}.xid", "a") as f:
        f.write(f"{time.time():.3f} {code}\n")


def test_a_planted_xid_is_kept_as_the_last_one_while_its_count_leaves_with_the_window(xid_exporter):
    url, faults = xid_exporter
    assert _samples(url, "DCGM_EXP_XID_ERRORS_COUNT") == [(',window_size_in_ms="2000"', "0")] * 2
    _plant_xid(faults, 1, 79)
    _plant_xid(faults, 1, 79)
    assert [v for _, v in _samples(url, "DCGM_FI_DEV_XID_ERRORS")] == ["0", "79"]
    assert _samples(url, "DCGM_EXP_XID_ERRORS_COUNT") == [
        (',window_size_in_ms="2000"', "0"),
        (',window_size_in_ms="2000",xid="79"', "2"),
    ]
    (faults / "1.xid").unlink()  # the fault is long gone; DCGM still reads the last Xid
    time.sleep(2.2)
    assert [v for _, v in _samples(url, "DCGM_FI_DEV_XID_ERRORS")] == ["0", "79"]
    assert _samples(url, "DCGM_EXP_XID_ERRORS_COUNT") == [(',window_size_in_ms="2000"', "0")] * 2


def test_the_old_rule_on_the_last_xid_never_resolves_against_the_exporter(xid_exporter):
    """Planted once: `DCGM_FI_DEV_XID_ERRORS > 0` (our rule before) stays true a window after the
    Xid, where the windowed count the rule reads now is back at 0."""
    url, faults = xid_exporter
    _plant_xid(faults, 0, 13)
    time.sleep(2.2)
    old_rule = [float(v) > 0 for _, v in _samples(url, "DCGM_FI_DEV_XID_ERRORS")]
    new_rule = [float(v) > 0 for _, v in _samples(url, "DCGM_EXP_XID_ERRORS_COUNT")]
    assert old_rule == [True, False] and new_rule == [False, False]


def test_the_help_and_type_come_from_the_counters_file_as_upstreams_do(xid_exporter):
    url, _ = xid_exporter
    text = _get(url)
    assert "# HELP DCGM_EXP_XID_ERRORS_COUNT reported XIDs during last window" in text
    assert "# TYPE DCGM_EXP_XID_ERRORS_COUNT counter" in text
    assert "# HELP DCGM_FI_DEV_XID_ERRORS Value of the last XID error encountered." in text
    assert "DCGM_FI_DRIVER_VERSION{" not in text  # a label row, not a series


def test_without_gpus_it_exits_like_the_real_exporter(tmp_path):
    program = tmp_path / "dcgm-exporter"
    program.write_text(dcgm_exporter.program("580.95.05"))
    (tmp_path / "c.csv").write_text(dcgm_exporter.counters_csv())
    env = {**os.environ, "DCGM_STANDIN_PROC_DIRS": str(tmp_path / "none")}
    done = subprocess.run(
        [sys.executable, str(program), "-f", str(tmp_path / "c.csv")],
        env=env,
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert done.returncode == 1 and "Failed to initialize NVML" in done.stderr


def test_the_alert_rules_use_names_the_exporter_serves():
    served = {name for name, *_ in dcgm_exporter.COUNTERS}
    site_rules = " ".join(a.expr for a in config.alerts(_site(), _site().hosts["gpu1"]))
    used = set(re.findall(r"DCGM_(?:FI|EXP)_[A-Z_]*[A-Z]", site_rules))
    assert used and used <= served | {dcgm_exporter.XID_COUNT}, used - served


DEPLOY_COUNTERS = PROJECT_ROOT / "roles/monitoring/templates/inference-host-counters.csv.j2"


def _prof_rows() -> list[str]:
    return [line.split(",")[0] for line in DEPLOY_COUNTERS.read_text().splitlines() if line.startswith("DCGM_FI_PROF_")]


@pytest.mark.parametrize("profiling", [True, False], ids=["with the profiling module", "core only"])
def test_profiling_rows_are_served_only_with_dcgms_profiling_module(tmp_path, profiling):
    """As the real exporter: with DCGM's core alone, the counters file's DCGM_FI_PROF_* rows are
    dropped at start with one log line (pkg/cmd/app.go queryDCPMetrics, counter_config.go
    fieldIsSupported), the other rows served; with datacenter-gpu-manager-4-proprietary's module,
    all of them."""
    rows = _prof_rows()
    assert len(rows) == 5, rows  # the five rows the dashboard's panels read
    server, url, _ = _serve(tmp_path, DEPLOY_COUNTERS.read_text(), profiling=profiling)
    try:
        text = _get(url)
    finally:
        server.terminate()
        server.wait(5)
    served = {name for name in rows if f"\n{name}{{" in text}
    assert served == (set(rows) if profiling else set()), served
    assert "\nDCGM_FI_DEV_GPU_TEMP{" in text
    log = server.stderr.read()
    assert ("Not collecting DCP metrics" in log) is (not profiling), log
    # counter_config.go ExtractCounters: each dropped row warned, by its record's index (Go's
    # csv reader with Comment '#': comment and blank lines are not records)
    records = [line.split(",")[0].strip() for line in DEPLOY_COUNTERS.read_text().splitlines()]
    records = [name for name in records if name and not name.startswith("#")]
    skipped = [f"Skipping line {i} ('{name}'): metric not enabled" for i, name in enumerate(records) if name in rows]
    warned = [line for line in log.splitlines() if line.startswith("Skipping line")]
    assert warned == ([] if profiling else skipped), log


def test_the_lab_repository_ships_the_profiling_module_at_the_cores_version():
    from lab.standins.nvidia_apt_repo import dcgm

    class Package:
        def __init__(self, name, version, depends=(), files=None, **_):
            self.name, self.version, self.depends, self.files = name, version, list(depends), files or {}

    packages = {p.name: p for p in dcgm.dcgm_packages(Package)}
    proprietary, core = packages["datacenter-gpu-manager-4-proprietary"], packages["datacenter-gpu-manager-4-core"]
    assert proprietary.version == core.version == "1:4.5.3-1"
    assert proprietary.depends == [f"datacenter-gpu-manager-4-core (= {core.version})"]
    assert dcgm.PROFILING_MODULE in proprietary.files and dcgm.PROFILING_MODULE not in core.files


def test_the_unit_logs_where_the_pinned_exporters_unit_does():
    """dcgm-exporter 4.5.3-4.8.2 packaging/config-files/systemd/nvidia-dcgm-exporter.service
    appends both streams to /var/log/dcgm-exporter.log (FHS, NVIDIA/dcgm-exporter PR #556)."""
    service = dict(
        line.split("=", 1) for line in dcgm_exporter.UNIT.splitlines() if "=" in line and not line.startswith("#")
    )
    assert service["StandardOutput"] == service["StandardError"] == "append:/var/log/dcgm-exporter.log"
    assert service["ExecStart"] == "/usr/bin/dcgm-exporter -f /etc/dcgm-exporter/default-counters.csv"
