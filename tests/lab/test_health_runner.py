"""`python -m checks` refuses bad input with exit 2 and one clear line before contacting
any host, never calls "nothing ran" healthy, and runs DCGM's long levels with the serving unit
stopped and started again. Run as a user would run it: the real command line, real processes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.lab.harness import PROJECT_ROOT

pytestmark = pytest.mark.lab

H200 = ["--expect", "gpu_arch=sm90", "--expect", "gpu_model=NVIDIA H200", "--expect", "gpu_memory_gib=140"]


def runner(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "checks", *args],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


BAD_INPUT = [
    (["--hosts", "local://", "--suites", ","], "--suites ',': unknown (empty), (empty); expected a comma list"),
    (["--hosts", "local://", "--suites", "gpu,,server"], "unknown (empty)"),
    (["--hosts", "local://", "--suites", "gpus"], "--suites 'gpus': unknown gpus"),
    (
        ["--hosts", "local://", "--expect", "gpu_count=0"],
        "--expect gpu_count=0 is invalid; a gpu node needs an integer >= 1",
    ),
    (["--hosts", "local://", "--expect", "gpu_count=-2"], "gpu_count=-2 is invalid"),
    (
        ["--hosts", "local://", "--expect", "driver_version="],
        "--expect driver_version='' is invalid; expected a driver version",
    ),
    (["--hosts", "local://", "--expect", "driver_version=latest"], "driver_version='latest' is invalid"),
    (["--hosts", "local://", "--expect", "health_gpu_link=nvswitch"], "health_gpu_link = 'nvswitch' is invalid"),
    (["--hosts", "local://", "--expect", "gpu_count"], "--expect 'gpu_count' is invalid; expected KEY=VALUE"),
    (["--hosts", "sssh://root@gpu-node"], "--hosts 'sssh://root@gpu-node': unknown connection"),
    (["--hosts", "gpu-node"], "--hosts 'gpu-node': unknown connection"),
    (["--hosts", "ssh://"], "no host after ssh://"),
    (["--inventory", "inventory/prod.py", "--host", "no-such-host"], "no host no-such-host"),
    ([], "give --inventory"),
]


@pytest.mark.parametrize(("args", "message"), BAD_INPUT, ids=[" ".join(a) or "nothing" for a, _ in BAD_INPUT])
def test_bad_input_exits_2_with_one_clear_line_and_contacts_no_host(args, message):
    run = runner(*args)
    assert run.returncode == 2, run.stdout + run.stderr
    problems = [line for line in run.stderr.splitlines() if line.startswith("  - ")]
    assert len(problems) == 1 and message in problems[0], run.stderr
    assert "### health checks of" not in run.stdout  # pytest never started: no host contacted


def test_nothing_collected_is_not_healthy(tmp_path):
    """pytest's exit 5 (no test collected) is a failed run, not a healthy one."""
    plugin = tmp_path / "deselect_all.py"
    plugin.write_text(
        "def pytest_collection_modifyitems(items, config):\n"
        "    config.hook.pytest_deselected(items=list(items))\n    items[:] = []\n"
    )
    run = runner(
        "--hosts",
        "local://",
        "--suites",
        "gpu",
        "--expect",
        "gpu_count=1",
        *H200,
        env={"PYTHONPATH": str(tmp_path), "PYTEST_PLUGINS": "deselect_all"},
    )
    assert run.returncode == 1, run.stdout + run.stderr
    assert "no check ran on local:// (pytest collected nothing): not healthy" in run.stderr


def _fake_tools(folder: Path, log: Path) -> dict:
    sample = (PROJECT_ROOT / "tests/unit/data/gpu/dcgm/diag-r1-fail.json").read_text()
    (folder / "dcgmi").write_text(f"#!/bin/sh\necho \"dcgmi $*\" >> {log}\ncat <<'EOF'\n{sample}EOF\n")
    (folder / "systemctl").write_text(
        f'#!/bin/sh\necho "systemctl $*" >> {log}\n[ "$1" = is-active ] && echo active\nexit 0\n'
    )
    (folder / "nvidia-smi").write_text("#!/bin/sh\nexit 1\n")
    for tool in ("dcgmi", "systemctl", "nvidia-smi"):
        (folder / tool).chmod(0o755)
    return {"PATH": f"{folder}:{os.environ['PATH']}"}


def test_dcgm_level_2_stops_the_unit_runs_the_diag_and_starts_it_again(tmp_path):
    """Stand-ins for dcgmi (printing DCGM 4.6.0's JSON of a failed run, -j) and systemctl record the
    order; the runner says what it does and fails on DCGM's Fail."""
    log = tmp_path / "calls.log"
    env = _fake_tools(tmp_path, log)
    run = runner(
        "--hosts", "local://", "--suites", "service", "--expect", "gpu_count=1", *H200, "--dcgm-level", "2", env=env
    )
    calls = log.read_text().splitlines()
    stop, diag, start = (
        calls.index("systemctl stop inference-engine"),
        calls.index("dcgmi diag -r 2 -j"),
        calls.index("systemctl start inference-engine"),
    )
    assert stop < diag < start
    assert (
        "stopping inference-engine.service for the run" in run.stdout
        and "starting inference-engine.service again" in run.stdout
    )
    assert "dcgmi diag -r 2: FAIL" in run.stdout and "software Fail" in run.stdout
    assert run.returncode == 1


def test_dcgm_level_must_be_2_or_3():
    run = runner("--hosts", "local://", "--dcgm-level", "1")
    assert run.returncode == 2 and "invalid choice: 1" in run.stderr
