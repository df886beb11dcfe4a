"""Lab fixtures: one fresh rehearsal lab per test session, brought up by the walk, then deployed
once more.

The lab starts bare (a node without NVIDIA driver or device nodes, no guest made yet). ONE run
of the README's main command converges it (in three passes the node starts itself: node
prepared and rebooted, guest created, deploy inside the guest; roles/proxmox_host,
continue_in_guests); "the first deploy" below is that run. The next deploy must change nothing.
Set INFERENCE_HOST_LAB_REUSE=1 to keep existing containers between local runs (faster,
but the first deploy then proves less). The replicas lab (inventory/lab_replicas.py) is deployed
once per session too, for the replicas' and the monitoring tests.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import testinfra

import lab
from tests.lab.cmdline_sampler import CmdlineSampler
from tests.lab.harness import PROJECT_ROOT, DeployRun, require_docker, run_deploy

LAB_SCOPE = "tests/lab"  # the node ids' prefix, relative to the rootdir (pyproject.toml's folder)
# Lab-tier modules that share nothing with the lab's hosts: no session fixture of this file, no
# deploy, no container of the lab (each makes its own, or none). They need the network or Docker,
# so they are lab tests, but they run beside the lab like the unit tests, a module at a time,
# which takes their 3-4 minutes off the lab worker's path. tests/unit/test_test_scheduling.py
# holds each of them to that.
BESIDE_THE_LAB = frozenset(
    f"{LAB_SCOPE}/{name}.py"
    for name in (
        "test_engine_preflight",  # each SGLang stack's lock installed on this machine
        "test_systemd_syntax",  # a throwaway systemd container of its own
        "test_health_ssh",  # an OpenSSH container of its own
        "test_health_runner",  # `python -m checks` on local://
        "test_sglang_release",  # the pinned wheels from PyPI
        "test_vllm_release",
    )
)


# The replicas lab's modules: their hosts (two replicas, the gateway and its monitor; the vLLM
# replicas) share nothing with the main lab's node and guest, so they run on a worker of their own,
# beside the main lab, under a lab prefix of their own (tests/conftest.py): 12-15 minutes off
# CI's longest worker. Within the scope, file order, as in the main lab's.
REPLICAS_LAB = frozenset(
    f"{LAB_SCOPE}/{name}.py" for name in ("test_monitoring", "test_replicas", "test_replicas_vllm")
)
REPLICAS_SCOPE = f"{LAB_SCOPE}:replicas"
LAB_SCOPES = (LAB_SCOPE, REPLICAS_SCOPE)  # the longest first: the first worker takes the main lab


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Every test of one lab runs on one pytest-xdist worker, in file order: they share that lab
    (its containers, its session fixtures) and each module leaves it whole for the next. The main
    lab and the replicas lab go to two workers (each its own prefix: tests/conftest.py); those
    BESIDE_THE_LAB share none of either and go with the unit tests, a module at a time, on
    whichever worker is free (pyproject.toml's addopts: `-n auto`), which is what keeps CI on 2
    cores within its budget. xdist's own `--dist loadgroup` cannot do it with this pytest: it
    renames each item's `_nodeid`, which pytest 9 no longer reads (nodes.py: `nodeid` is
    `str(self._id)`), so the group was silently lost."""
    from xdist.scheduler import LoadScopeScheduling

    class LabsOnTheirOwnWorkers(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = super()._split_scope(nodeid)
            if not nodeid.startswith(LAB_SCOPE + "/") or module in BESIDE_THE_LAB:
                return module
            return REPLICAS_SCOPE if module in REPLICAS_LAB else LAB_SCOPE

        def _assign_work_unit(self, node) -> None:
            # The labs first, one to each of the first workers: they are the longest by far, and
            # everything else runs beside them (xdist orders scopes by their number of tests, not
            # their time).
            for scope in reversed(LAB_SCOPES):
                if scope in self.workqueue:
                    self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

    return LabsOnTheirOwnWorkers(config, log)


@pytest.fixture(scope="session")
def lab_walk() -> DeployRun:
    """The main command, run once on a bare lab: it must end healthy."""
    require_docker()
    if os.environ.get("INFERENCE_HOST_LAB_REUSE") != "1":
        lab.down()
    started = time.monotonic()
    run = run_deploy()
    assert run.returncode == 0, "the one lab deploy from bare failed\n" + run.explain()
    reused = " (containers reused: not from bare)" if os.environ.get("INFERENCE_HOST_LAB_REUSE") == "1" else ""
    print(f"\nlab to healthy in one run{reused}: {time.monotonic() - started:.0f} s, {run.pass_count} pass(es)")
    return run


@pytest.fixture(scope="session")
def lab_first_deploy(lab_walk) -> DeployRun:
    return lab_walk


@pytest.fixture(scope="session")
def lab_second_deploy(lab_first_deploy) -> DeployRun:
    run = run_deploy()
    assert run.returncode == 0, "second lab deploy failed\n" + run.explain()
    return run


@pytest.fixture(scope="session")
def gpu_guest(lab_first_deploy):
    """testinfra host for the lab's GPU-guest stand-in, after the first deploy."""
    return testinfra.get_host(f"docker://{lab.container_name('gpu')}")


REPLICAS_INVENTORY = PROJECT_ROOT / "inventory" / "lab_replicas.py"
REPLICAS_ROLES = ("rep-a", "rep-b", "gw")


@pytest.fixture(scope="session")
def cmdline_sampler() -> Iterator[CmdlineSampler]:
    """Every process's command line sampled from before the replicas lab's first deploy on: its
    deploys, rolling upgrade and key rotation (tests/lab/test_replicas.py asserts and stops it).
    The values: every one in the lab's vault, and its password."""
    from roles.site.vault import decrypt_all

    vault, password_file = lab.throwaway_vault()
    password = Path(password_file).read_bytes().strip()
    values = {name: value.strip() for name, value in decrypt_all(Path(vault), password=password).items()}
    values["the vault's password"] = password.decode()
    sampler = CmdlineSampler(values, lab.PREFIX).start()
    yield sampler
    sampler.stop()  # when the test that reads it did not run


@pytest.fixture(scope="session")
def replicas_first_deploy(cmdline_sampler) -> DeployRun:
    """inventory/lab_replicas.py deployed once per session from fresh containers: two replicas
    and the gateway (tests/lab/test_replicas.py), the gateway's host also the monitor
    (tests/lab/test_monitoring.py). One deploy for both modules keeps CI's lab time."""
    require_docker()
    if os.environ.get("INFERENCE_HOST_LAB_REUSE") != "1":
        lab.down(REPLICAS_ROLES)
    started = time.monotonic()
    run = run_deploy(REPLICAS_INVENTORY)
    assert run.returncode == 0, "first deploy of the replicas lab failed\n" + run.explain()
    print(f"\nfirst deploy of two replicas, the gateway and its monitor: {time.monotonic() - started:.0f} s")
    return run


@pytest.fixture(scope="session")
def replicas_second_deploy(replicas_first_deploy) -> DeployRun:
    """The deploy after the first: it must change nothing (both modules assert it)."""
    started = time.monotonic()
    run = run_deploy(REPLICAS_INVENTORY)
    assert run.returncode == 0, "second deploy of the replicas lab failed\n" + run.explain()
    print(f"\nsecond deploy of the replicas lab (no change expected): {time.monotonic() - started:.0f} s")
    return run
