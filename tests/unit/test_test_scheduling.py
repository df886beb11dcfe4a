"""`uv run pytest` runs the unit tests beside the lab tests (pytest-xdist, `-n auto` in
pyproject.toml), and every lab test on one worker, in order: they share one lab, and two
workers driving it at once would fight over its containers (a module fixture made twice under
one name). tests/lab/conftest.py's scheduler holds that; this test holds the scheduler."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path
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
    scopes = {node_id.split("::")[0]: _scheduler()._split_scope(node_id) for node_id in ids}
    beside = {module for module, scope in scopes.items() if scope != lab_conftest.LAB_SCOPE}
    assert beside == lab_conftest.BESIDE_THE_LAB, beside ^ lab_conftest.BESIDE_THE_LAB
    assert all(scope == module for module, scope in scopes.items() if module in beside)


# What only the lab's own worker may touch: its session fixtures (tests/lab/conftest.py), its
# deploys, and its hosts' containers.
SHARED_FIXTURES = {
    "lab_walk",
    "lab_first_deploy",
    "lab_second_deploy",
    "gpu_guest",
    "replicas_first_deploy",
    "replicas_second_deploy",
}
SHARED_CALLS = {"run_deploy", "up", "fresh", "bring_up", "down", "ensure_container"}


def _shared_uses(path: Path) -> list[str]:
    import ast

    import lab

    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.arg) and node.arg in SHARED_FIXTURES:
            found.append(f"line {node.lineno}: fixture {node.arg}")
        elif isinstance(node, ast.Call):
            name = getattr(node.func, "attr", None) or getattr(node.func, "id", None)
            if name in SHARED_CALLS:
                found.append(f"line {node.lineno}: {name}()")
            elif name == "container_name" and not (
                node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value not in lab.HOSTS
            ):
                found.append(f"line {node.lineno}: container_name of a lab host")
    return found


def test_what_runs_beside_the_lab_touches_none_of_it():
    for module in sorted(lab_conftest.BESIDE_THE_LAB):
        assert _shared_uses(PROJECT_ROOT / module) == [], module


def test_the_check_finds_a_module_that_uses_the_lab():
    # Each kind of use, found where modules of the lab worker make it: the check can fail.
    assert any("fixture gpu_guest" in use for use in _shared_uses(PROJECT_ROOT / "tests/lab/test_dcgm.py"))
    assert any("run_deploy()" in use for use in _shared_uses(PROJECT_ROOT / "tests/lab/test_wheels.py"))
    assert any(
        "container_name of a lab host" in use for use in _shared_uses(PROJECT_ROOT / "tests/lab/test_weights.py")
    )


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
