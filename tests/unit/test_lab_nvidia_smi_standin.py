"""The lab's nvidia-smi stand-in (lab/standins/nvidia_apt_repo/nvidia_smi.py): without the lab's
planted GPUs it fails as the real one without a driver; with them it answers what the checks'
parsers read as eight healthy GPUs, lists a process the lab made hold a GPU while it lives, and
the GPU suite itself (checks/test_gpus.py, run as the checks' timer runs it) passes on those
answers but for the one check the lab cannot answer (CUDA: no torch, no GPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import lab
from checks import gpu_parsers as parse
from lab.standins.nvidia_apt_repo import nvidia_smi

ROOT = Path(__file__).resolve().parents[2]
DRIVER = "580.95.05"
RTX = "NVIDIA RTX PRO 6000 Blackwell Server Edition"


@pytest.fixture
def smi(tmp_path, request):
    """The package's two files in a folder on PATH, and the state folder lab.up plants (the driver
    version: DRIVER unless the test is parametrized indirectly with another)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    program = tmp_path / "nvidia_smi.py"
    program.write_text(nvidia_smi.program(getattr(request, "param", DRIVER)))
    (folder / "nvidia-smi").write_text(nvidia_smi.WRAPPER.replace("/usr/bin/python3", sys.executable))
    (folder / "nvidia-smi").chmod(0o755)
    state = tmp_path / "state"
    env = {
        **os.environ,
        "PATH": f"{folder}:{os.environ['PATH']}",
        "NVIDIA_SMI_STANDIN_STATE": str(state),
        "NVIDIA_SMI_STANDIN_PROGRAM": str(program),
    }

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, env=env, timeout=30)

    def plant() -> None:
        for address, info in lab.replica_gpu_information().items():
            (state / "gpus-source" / "gpus" / address).mkdir(parents=True)
            (state / "gpus-source" / "gpus" / address / "information").write_text(info + "\n")
        (state / "compute-apps").mkdir()
        (state / "proc-driver-nvidia").symlink_to(state / "gpus-source")

    run.plant, run.state, run.env = plant, state, env
    return run


def test_without_the_labs_gpus_it_fails_as_without_a_driver(smi):
    done = smi()
    assert done.returncode == 9
    assert done.stdout.startswith("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")


def test_with_them_it_answers_the_checks_queries_from_the_captures(smi):
    smi.plant()
    query = smi(f"--query-gpu={','.join(parse.GPU_QUERY_FIELDS)}", "--format=csv,noheader,nounits")
    gpus = parse.parse_gpu_query(query.stdout)
    assert [(g.index, g.bus, g.name, g.compute_cap, g.memory_mib, g.driver_version) for g in gpus] == [
        (i, address, RTX, "12.0", 97887, DRIVER) for i, address in enumerate(lab.PVE_GPUS)
    ]
    # The captured row's other cells, as captured (h200-1gpu-health/query-gpu-health.csv).
    assert query.stdout.splitlines()[0].endswith(", 580.95.05, Enabled, P0, 5, 5, 5, 16, 16")
    with_header = smi("--query-gpu=index,name,memory.total", "--format=csv").stdout.splitlines()
    assert with_header[:2] == ["index, name, memory.total [MiB]", f"0, {RTX}, 97887 MiB"]
    health = parse.parse_gpu_health(smi("-q").stdout)
    assert sorted(health) == lab.PVE_GPUS
    assert {h.ecc_current for h in health.values()} == {True} and {h.recovery_action for h in health.values()} == {
        "None"
    }
    remapped = parse.parse_remapped_rows(
        smi(f"--query-remapped-rows={','.join(parse.REMAPPED_FIELDS)}", "--format=csv,noheader").stdout
    )
    assert [(parse.normalize_bus_id(r.bus_id), r.failure, r.pending) for r in remapped] == [
        (address, False, False) for address in lab.PVE_GPUS
    ]
    assert parse.parse_smi_version(smi("--version").stdout)["DRIVER version"] == DRIVER
    assert smi().returncode == 0 and "No running processes found" in smi().stdout
    assert smi("topo", "-m").returncode == 2 and "stand-in" in smi("topo", "-m").stderr


def test_a_planted_process_is_listed_while_it_lives(smi):
    smi.plant()
    apps = f"--query-compute-apps={','.join(parse.COMPUTE_APP_FIELDS)}"
    assert smi(apps, "--format=csv,noheader,nounits").stdout == ""  # as captured: h200-1gpu/compute-apps.csv
    stray = subprocess.Popen(["sleep", "60"])
    try:
        (smi.state / "compute-apps" / str(stray.pid)).write_text("3 4096\n")
        listed = parse.parse_compute_apps(smi(apps, "--format=csv,noheader,nounits").stdout)
        assert [(a.pid, a.process_name, a.used_memory_mib, parse.normalize_bus_id(a.gpu_bus_id)) for a in listed] == [
            (stray.pid, "sleep", 4096, lab.PVE_GPUS[3])
        ]
        assert smi(apps, "--format=csv").stdout.splitlines() == [
            "pid, process_name, used_gpu_memory [MiB], gpu_bus_id",
            f"{stray.pid}, sleep, 4096 MiB, 00000000:61:00.0",
        ]
        assert f"Process ID                                       : {stray.pid}" in smi("-q").stdout
    finally:
        stray.kill()
        stray.wait()
    assert smi(apps, "--format=csv,noheader,nounits").stdout == ""  # its context ended with it


SYSTEM_PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


def test_the_gpu_suite_passes_on_its_healthy_answers_but_cuda(smi, tmp_path):
    """`python -m checks` on this machine with the stand-in first on PATH and the replicas'
    expectations (8 RTX PRO 6000, the pinned driver): every check passes or has no evidence here
    (kernel log, module), but 'cuda works', which needs torch and a GPU."""
    smi.plant()
    report = tmp_path / "report.json"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "checks",
            "--hosts",
            "local://",
            "--suites",
            "gpu",
            "--no-bandwidth-probes",
            "--report",
            str(report),
            "--expect",
            "gpu_count=8",
            "--expect",
            f"driver_version={DRIVER}",
            "--expect",
            # Debian's python, not this checkout's venv: a clone under /tmp would make that a
            # program run from a folder every user may write, which the site model refuses.
            f"health_engine_python={SYSTEM_PYTHON}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=smi.env,
        timeout=300,
    )
    checks = json.loads(report.read_text())["checks"]
    failed = {(c["check"], c["gpu"]) for c in checks if c["verdict"] == "FAIL"}
    assert failed == {("cuda works", 0)}, run.stdout[-3000:]
    passed = {c["check"] for c in checks if c["verdict"] == "PASS"}
    assert {
        "nvidia smi present",
        "gpu count",
        "driver version equals pin",
        "no compute process outside service",
        "gpu name",
        "compute capability",
        "memory",
        "persistence mode",
        "no row remap failure",
        "ecc enabled no uncorrectable errors",
        "recovery action none",
        "no active clock slowdown",
        "temperature margin",
        "power limit as expected",
        "bar1 covers memory",
        "mig mode as expected",
    } <= passed


@pytest.mark.parametrize("smi", ["535.104.05"], indirect=True)
def test_in_container_mode_an_old_driver_lists_the_nodes_pids_or_none_and_counts_the_memory(smi):
    """As NVML answers inside an LXC guest on a driver before PID translation (535.104.05 lacks
    os_find_ns_pid): the node's PID (planted as the third field), not named; a process planted
    without one is not listed; memory.used counts both, and a holder outside the guest too."""
    smi.plant()
    (smi.state / "pid-namespace").write_text("container\n")
    (smi.state / "outside").mkdir()
    (smi.state / "outside" / "other-guest").write_text("0 4096 777001\n")
    apps = f"--query-compute-apps={','.join(parse.COMPUTE_APP_FIELDS)}"
    engine, stray = subprocess.Popen(["sleep", "60"]), subprocess.Popen(["sleep", "60"])
    try:
        (smi.state / "compute-apps" / str(engine.pid)).write_text("0 81920 913377\n")
        (smi.state / "compute-apps" / str(stray.pid)).write_text("0 20480\n")
        listed = parse.parse_compute_apps(smi(apps, "--format=csv,noheader,nounits").stdout)
        assert [(a.pid, a.process_name, a.used_memory_mib) for a in listed] == [
            (913377, "[Not Found]", 81920),
            (777001, "[Not Found]", 4096),
        ]
        used = smi("--query-gpu=memory.used", "--format=csv,noheader,nounits").stdout.split()
        # three contexts on GPU 0: 9 MiB for the first, 6 for each further (captured, 580.159.04)
        assert used[0] == str(81920 + 20480 + 4096 + 9 + 6 + 6) and set(used[1:]) == {"0"}
        assert "Process ID                                       : 913377" in smi("-q").stdout
        assert f": {stray.pid}" not in smi("-q").stdout
    finally:
        for process in (engine, stray):
            process.kill()
            process.wait()


def test_in_container_mode_the_pinned_driver_lists_the_guests_own_pids_and_hides_outside_holders(smi):
    """As open-gpu-kernel-modules 580.95.05 os_find_ns_pid does (docs/upstream.md) and as captured
    on an H100 with 580.159.04 (tests/unit/data/nvidia-smi-pidns, 03-pidns-inside.txt): inside a
    PID namespace the driver names this namespace's processes under their own PIDs and leaves out
    the rest; memory.used still counts an outside holder, and a few MiB per context beyond."""
    smi.plant()
    (smi.state / "pid-namespace").write_text("container\n")
    (smi.state / "outside").mkdir()
    (smi.state / "outside" / "node-holder").write_text("0 2048 777001\n")
    apps = f"--query-compute-apps={','.join(parse.COMPUTE_APP_FIELDS)}"
    engine = subprocess.Popen(["sleep", "60"])
    try:
        (smi.state / "compute-apps" / str(engine.pid)).write_text("0 81920 913377\n")
        listed = parse.parse_compute_apps(smi(apps, "--format=csv,noheader,nounits").stdout)
        assert [(a.pid, a.process_name, a.used_memory_mib) for a in listed] == [(engine.pid, "sleep", 81920)]
        used = smi("--query-gpu=memory.used", "--format=csv,noheader,nounits").stdout.split()
        assert used[0] == str(81920 + 2048 + 15)  # two contexts: 15 MiB beyond them, as captured
        assert "777001" not in smi("-q").stdout and "913377" not in smi("-q").stdout
        assert f"Process ID                                       : {engine.pid}" in smi("-q").stdout
    finally:
        engine.kill()
        engine.wait()


@pytest.mark.parametrize("smi", ["580.159.04"], indirect=True)
def test_in_container_mode_it_answers_as_the_captured_driver_did(smi):
    """The capture's case 03-pidns-inside (tests/unit/data/nvidia-smi-pidns): a 2658 MiB holder
    outside the namespace and one inside; the stand-in, planted alike, lists what the driver
    listed there (only the inside one) and the memory.used it reported (both, and 15 MiB more)."""
    from tests.unit.test_gpu_processes_captured import seen

    captured_apps, captured_used, driver = seen("03-pidns-inside.txt")
    smi.plant()
    (smi.state / "pid-namespace").write_text("container\n")
    (smi.state / "outside").mkdir()
    (smi.state / "outside" / "machine-holder").write_text("0 2658 536\n")
    holder = subprocess.Popen(["sleep", "60"])
    try:
        (smi.state / "compute-apps" / str(holder.pid)).write_text("0 2658\n")
        listed = parse.parse_compute_apps(
            smi(f"--query-compute-apps={','.join(parse.COMPUTE_APP_FIELDS)}", "--format=csv,noheader,nounits").stdout
        )
        used = smi("--query-gpu=memory.used,driver_version", "--format=csv,noheader,nounits").stdout.splitlines()[0]
    finally:
        holder.kill()
        holder.wait()
    assert [app.used_memory_mib for app in listed] == [app.used_memory_mib for app in captured_apps] == [2658]
    assert [app.pid for app in listed] == [holder.pid]  # its own PID here, as the capture's 24 there
    assert used == f"{captured_used}, {driver}"


def test_the_hang_switch_makes_it_block_as_on_a_wedged_driver(smi):
    smi.plant()
    (smi.state / "hang").write_text("")
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess.run(["nvidia-smi", "-q"], capture_output=True, env=smi.env, timeout=2)


def test_its_driver_rule_is_the_checks_rule():
    """The stand-in imports no checks: its copy of the PID-translation rule must stay the same."""
    from checks.gpu_processes import translates_pids

    versions = ["580.95.05", "535.113.01", "535.104.12", "535.43.24", "535.43.23", "530.41.03", "545.23.06", "x", None]
    assert [nvidia_smi.translates_pids(v) for v in versions] == [translates_pids(v) for v in versions]
