"""Lab fixtures: one fresh rehearsal container per test session, deployed twice.

The first deploy converges a fresh container from nothing; the second must change nothing.
Set INFERENCE_HOST_LAB_REUSE=1 to keep existing containers between local runs (faster,
but the first deploy then proves less).
"""

from __future__ import annotations

import os

import pytest
import testinfra

import lab
from tests.lab.harness import DeployRun, require_docker, run_deploy


@pytest.fixture(scope="session")
def lab_first_deploy() -> DeployRun:
    require_docker()
    if os.environ.get("INFERENCE_HOST_LAB_REUSE") != "1":
        lab.down()
    run = run_deploy()
    assert run.returncode == 0, "first lab deploy failed\n" + run.explain()
    return run


@pytest.fixture(scope="session")
def lab_second_deploy(lab_first_deploy) -> DeployRun:
    run = run_deploy()
    assert run.returncode == 0, "second lab deploy failed\n" + run.explain()
    return run


@pytest.fixture(scope="session")
def gpu_guest(lab_first_deploy):
    """testinfra host for the lab's GPU-guest stand-in, after the first deploy."""
    return testinfra.get_host(f"docker://{lab.container_name('gpu')}")
