"""Lab fixtures: one fresh rehearsal lab per test session, brought up by the walk, then deployed
once more.

The lab starts bare (a node without NVIDIA driver or device nodes, no guest made yet). The
README's main command, repeated as documented (three runs: node prepared and rebooted, guest
created, deploy inside the guest), converges it; "the first deploy" below is that walk, its
runs' operations together. The next deploy must change nothing.
Set INFERENCE_HOST_LAB_REUSE=1 to keep existing containers between local runs (faster,
but the first deploy then proves less).
"""

from __future__ import annotations

import os

import pytest
import testinfra

import lab
from tests.lab.harness import DeployRun, require_docker, run_deploy

BARE_TO_HEALTHY_RUNS = 3  # README, "First deploy of a new guest"


@pytest.fixture(scope="session")
def lab_walk() -> list[DeployRun]:
    """The main command, run as many times as the README says a bare node takes."""
    require_docker()
    if os.environ.get("INFERENCE_HOST_LAB_REUSE") != "1":
        lab.down()
    runs = []
    for number in range(1, BARE_TO_HEALTHY_RUNS + 1):
        run = run_deploy()
        assert run.returncode == 0, f"lab deploy {number} of the walk failed\n" + run.explain()
        runs.append(run)
    return runs


@pytest.fixture(scope="session")
def lab_first_deploy(lab_walk) -> DeployRun:
    return DeployRun.joined(lab_walk)


@pytest.fixture(scope="session")
def lab_second_deploy(lab_first_deploy) -> DeployRun:
    run = run_deploy()
    assert run.returncode == 0, "second lab deploy failed\n" + run.explain()
    return run


@pytest.fixture(scope="session")
def gpu_guest(lab_first_deploy):
    """testinfra host for the lab's GPU-guest stand-in, after the first deploy."""
    return testinfra.get_host(f"docker://{lab.container_name('gpu')}")
