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


def test_the_weights_follower_runs_in_its_hosts_context_and_fails_in_one_line(monkeypatch):
    """roles/weights' callback is called by pyinfra with state and host (so that its return value is
    the status); follow() reads pyinfra's `host`, which the callback sets to the host it was given."""
    import types

    import pyinfra

    from roles import weights
    from roles.shared.refusal import Refused

    logged, seen = [], []
    host = types.SimpleNamespace(name="gpu1", log_styled=lambda message, **style: logged.append(message))
    state = types.SimpleNamespace(config=types.SimpleNamespace(copy=lambda: None))

    def follow(**arguments):
        seen.append((pyinfra.host.name, arguments))
        raise Refused("gpu1: inference-host-weights.service made no progress for 30 minutes")

    monkeypatch.setattr(weights, "follow", follow)
    assert weights._follow(state, host, unit="u", config="c") is False
    assert seen == [("gpu1", {"unit": "u", "config": "c"})]
    assert logged == ["gpu1: inference-host-weights.service made no progress for 30 minutes"]
    monkeypatch.setattr(weights, "follow", lambda **arguments: None)
    assert weights._follow(state, host, unit="u", config="c") is True
