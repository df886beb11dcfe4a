"""`uv run pytest` runs the unit tests beside the lab tests (pytest-xdist, `-n auto` in
pyproject.toml), and every lab test on one worker, in order: they share one lab, and two
workers driving it at once would fight over its containers (a module fixture made twice under
one name). tests/lab/conftest.py's scheduler holds that; this test holds the scheduler."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from types import SimpleNamespace

from tests.lab import conftest as lab_conftest
from tests.lab.harness import PROJECT_ROOT


def _scheduler():
    config = SimpleNamespace(getvalue=lambda name: ["popen", "popen"])  # what `-n 2` leaves in --tx
    return lab_conftest.pytest_xdist_make_scheduler(config=config, log=None)


def _collected(folder: str) -> list[str]:
    listed = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", folder],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listed.returncode == 0, listed.stdout[-2000:] + listed.stderr[-2000:]
    return [line for line in listed.stdout.splitlines() if "::" in line]


def test_every_lab_test_is_in_the_one_scope_a_worker_takes_whole():
    ids = _collected("tests/lab")
    assert len(ids) > 50, ids[:5]
    assert {_scheduler()._split_scope(node_id) for node_id in ids} == {lab_conftest.LAB_SCOPE}


def test_unit_tests_are_spread_a_module_at_a_time():
    scheduler = _scheduler()
    assert scheduler._split_scope("tests/unit/test_docs.py::test_x") == "tests/unit/test_docs.py"
    assert scheduler._split_scope("tests/unit/test_site.py::test_y[a]") == "tests/unit/test_site.py"
    # Not fooled by a name that begins like the lab's folder.
    lookalike = lab_conftest.LAB_SCOPE + "els/test_z.py"
    assert scheduler._split_scope(lookalike + "::t") == lookalike


def test_the_readmes_test_command_distributes():
    options = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert "-n auto" in options["addopts"]


def test_the_lab_is_handed_out_first_whatever_its_size():
    from collections import OrderedDict

    scheduler = _scheduler()
    unit = "tests/unit/test_docs.py"
    ids = [f"{unit}::t1", f"{unit}::t2", "tests/lab/test_base.py::t3"]
    scheduler.workqueue = OrderedDict(
        [(unit, {ids[0]: False, ids[1]: False}), (lab_conftest.LAB_SCOPE, {ids[2]: False})]
    )
    sent: list[list[int]] = []

    class Worker:  # xdist's WorkerController, as far as the scheduler uses it
        send_runtest_some = staticmethod(sent.append)

    node = Worker()
    scheduler.registered_collections = {node: ids}
    scheduler._assign_work_unit(node)
    assert sent == [[2]] and list(scheduler.workqueue) == [unit]
