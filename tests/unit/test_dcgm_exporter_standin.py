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
        _SITE = load_site(factory.groups(gpu_nodes=[gpu_node()], monitors=[
            ("gpu1", {"monitoring_webhook_url": "http://127.0.0.1:9099/x"})]))
    return _SITE


_SITE = None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def exporter(tmp_path):
    proc = tmp_path / "proc"
    for minor, bus in enumerate(("0000:01:00.0", "0000:21:00.0")):
        info = SAMPLE.read_text().split("\n", 1)[1].replace("0000:00:06.0", bus).replace(
            "Device Minor: \t 0", f"Device Minor: \t {minor}")
        (proc / "gpus" / bus).mkdir(parents=True)
        (proc / "gpus" / bus / "information").write_text(info)
    (tmp_path / "counters.csv").write_text(dcgm_exporter.counters_csv())
    program = tmp_path / "dcgm-exporter"
    program.write_text(dcgm_exporter.program("580.95.05"))
    port = _free_port()
    env = {**os.environ, "DCGM_STANDIN_PROC_DIRS": str(proc), "DCGM_STANDIN_FAULTS": str(tmp_path / "faults")}
    server = subprocess.Popen([sys.executable, str(program), "-f", str(tmp_path / "counters.csv"),
                               "-a", f"127.0.0.1:{port}"], env=env)
    url = f"http://127.0.0.1:{port}/metrics"
    for _ in range(50):
        try:
            urllib.request.urlopen(url, timeout=1)
            break
        except OSError:
            time.sleep(0.1)
    yield url, tmp_path / "faults"
    server.terminate()
    server.wait(5)


def _get(url: str) -> str:
    return urllib.request.urlopen(url, timeout=5).read().decode()


def test_it_serves_the_default_fields_per_gpu_with_dcgm_exporters_labels(exporter):
    url, _ = exporter
    text = _get(url)
    for name, kind, _, _ in dcgm_exporter.COUNTERS:
        assert f"# TYPE {name} {kind}" in text
    assert ('DCGM_FI_DEV_GPU_TEMP{gpu="1",UUID="GPU-626a6486-103b-da2a-8f20-192347a59c5f",'
            'pci_bus_id="00000000:21:00.0",device="nvidia1",modelName="NVIDIA H200",') in text
    assert 'DCGM_FI_DRIVER_VERSION="580.95.05"} 38' in text
    # (not `promtool check metrics`: its naming lint refuses dcgm-exporter's own names, counters
    # without _total and camelCase labels such as modelName, which the stand-in must keep)
    samples = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert len(samples) == 2 * len(dcgm_exporter.COUNTERS)
    assert all(re.fullmatch(r'[A-Z_]+\{(\w+="[^"]*",)*\w+="[^"]*"\} [0-9.]+', line) for line in samples)


def test_a_planted_xid_shows_on_its_gpu_only(exporter):
    url, faults = exporter
    faults.mkdir()
    (faults / "1.json").write_text('{"DCGM_FI_DEV_XID_ERRORS": 79}')
    lines = [line for line in _get(url).splitlines() if line.startswith("DCGM_FI_DEV_XID_ERRORS{")]
    assert [line.rsplit(" ", 1)[1] for line in lines] == ["0", "79"]


def test_without_gpus_it_exits_like_the_real_exporter(tmp_path):
    program = tmp_path / "dcgm-exporter"
    program.write_text(dcgm_exporter.program("580.95.05"))
    (tmp_path / "c.csv").write_text(dcgm_exporter.counters_csv())
    env = {**os.environ, "DCGM_STANDIN_PROC_DIRS": str(tmp_path / "none")}
    done = subprocess.run([sys.executable, str(program), "-f", str(tmp_path / "c.csv")], env=env,
                          capture_output=True, text=True, timeout=10)
    assert done.returncode == 1 and "Failed to initialize NVML" in done.stderr


def test_the_alert_rules_use_names_the_exporter_serves():
    served = {name for name, *_ in dcgm_exporter.COUNTERS}
    site_rules = " ".join(a.expr for a in config.alerts(_site(), _site().hosts["gpu1"]))
    used = set(re.findall(r"DCGM_FI_[A-Z_]*[A-Z]", site_rules))
    assert used and used <= served, used - served
