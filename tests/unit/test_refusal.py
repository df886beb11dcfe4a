"""A deploy's own refusal is one line, not a traceback (roles/shared/refusal.py), through the real
pyinfra CLI on its @local connector: a refusal raised while planning, and a failure found by a
callback while the operations run (the health verdict's). The same deploy raising a plain
RuntimeError prints the traceback these replaced: the check below can tell them apart."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.conftest import PROJECT_ROOT

MESSAGE = "inventory/site.py: host gpu1: serving_unit_name = 'ssh' is ssh.service; expected a unit name of its own"

PLANNING = """
from roles.shared.refusal import Refused
raise {error}({message!r})
"""

RUNNING = """
from pyinfra.api import FunctionCommand, operation
from roles.health import _fail

@operation()
def verdict():
    yield FunctionCommand(_fail, ({message!r},), {{}})

verdict(name="Health verdict")
"""


def _deploy(tmp_path: Path, code: str) -> subprocess.CompletedProcess:
    deploy = tmp_path / "deploy.py"
    deploy.write_text(code)
    return subprocess.run(
        [sys.executable, "-m", "pyinfra", "-y", "@local", str(deploy)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("error", ["Refused", "RuntimeError"])
def test_a_refusal_while_planning_is_one_line(tmp_path, error):
    run = _deploy(tmp_path, PLANNING.format(error=error, message=MESSAGE))
    assert run.returncode == 1, run.stdout + run.stderr
    line = f"--> pyinfra error in {tmp_path}/deploy.py line 3: {MESSAGE}"
    shown = "Traceback" not in run.stderr and line in run.stderr
    # A plain RuntimeError is how they were raised before: pyinfra prints its traceback.
    assert shown is (error == "Refused"), run.stderr[-2000:]


def test_a_failed_verdict_is_the_hosts_error_line(tmp_path):
    run = _deploy(tmp_path, RUNNING.format(message=MESSAGE))
    assert run.returncode == 1, run.stdout + run.stderr
    assert f"[@local] {MESSAGE}" in run.stderr and "Traceback" not in run.stderr, run.stderr[-2000:]
    assert "No hosts remaining" in run.stderr
