"""`uv run pytest` runs the unit tests beside the lab tests (pytest-xdist, `-n auto` in
pyproject.toml), and every test of one lab on one worker, in order: they share that lab, and two
workers driving it at once would fight over its containers (a module fixture made twice under
one name). The main lab and the replicas lab run on two workers, each under its own prefix
(tests/conftest.py). tests/lab/conftest.py's scheduler holds that; this test holds the scheduler."""

from __future__ import annotations

import os
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
    beside = {module for module, scope in scopes.items() if scope not in lab_conftest.LAB_SCOPES}
    assert beside == lab_conftest.BESIDE_THE_LAB, beside ^ lab_conftest.BESIDE_THE_LAB
    assert all(scope == module for module, scope in scopes.items() if module in beside)
    replicas = {module for module, scope in scopes.items() if scope == lab_conftest.REPLICAS_SCOPE}
    assert replicas == lab_conftest.REPLICAS_LAB, replicas ^ lab_conftest.REPLICAS_LAB


# The two labs' own session fixtures and hosts: a module of one lab that reached the other's would
# drive it from a second worker, under another prefix (a lab of its own, made again, or missing).
MAIN_LAB_FIXTURES = {"lab_walk", "lab_first_deploy", "lab_second_deploy", "gpu_guest"}
REPLICAS_LAB_FIXTURES = {"replicas_first_deploy", "replicas_second_deploy", "cmdline_sampler"}


def _lab_modules(scope: str) -> list[Path]:
    split = _scheduler()._split_scope
    return [
        path
        for path in sorted((PROJECT_ROOT / "tests" / "lab").glob("test_*.py"))
        if split(f"{path.relative_to(PROJECT_ROOT)}::t") == scope
    ]


def test_neither_lab_reaches_into_the_other():
    import lab

    replicas = _lab_modules(lab_conftest.REPLICAS_SCOPE)
    main = _lab_modules(lab_conftest.LAB_SCOPE)
    assert len(replicas) == len(lab_conftest.REPLICAS_LAB) and len(main) > 10
    for path in replicas:
        assert _fixture_uses(path, MAIN_LAB_FIXTURES) == [], path
        assert _host_uses(path, lab.MAIN_LAB) == [], path
    for path in main:
        assert _fixture_uses(path, REPLICAS_LAB_FIXTURES) == [], path
        assert _host_uses(path, ("rep-a", "rep-b", "gw")) == [], path


def _fixture_uses(path: Path, fixtures: set[str]) -> list[str]:
    import ast

    return [
        f"line {node.lineno}: fixture {node.arg}"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.arg) and node.arg in fixtures
    ]


def _host_uses(path: Path, hosts: tuple[str, ...]) -> list[str]:
    """container_name("<host>") or pyinfra_name("<host>") of one of `hosts`."""
    import ast

    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            name = getattr(node.func, "attr", None) or getattr(node.func, "id", None)
            if name in ("container_name", "pyinfra_name") and node.args[0].value in hosts:
                found.append(f"line {node.lineno}: {name}({node.args[0].value!r})")
    return found


def test_the_check_finds_a_module_that_reaches_into_the_other_lab():
    assert _fixture_uses(PROJECT_ROOT / "tests/lab/test_dcgm.py", MAIN_LAB_FIXTURES)
    assert _fixture_uses(PROJECT_ROOT / "tests/lab/test_replicas.py", REPLICAS_LAB_FIXTURES)
    assert _host_uses(PROJECT_ROOT / "tests/lab/test_weights.py", ("gpu",))
    assert _host_uses(PROJECT_ROOT / "tests/lab/test_monitoring.py", ("gw",))


def test_a_worker_but_the_first_gets_a_lab_prefix_of_its_own():
    def prefix(worker: str | None) -> str:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_XDIST_WORKER", "INFERENCE_HOST_LAB_PREFIX")}
        if worker:
            env["PYTEST_XDIST_WORKER"] = worker
        shown = subprocess.run(
            [sys.executable, "-c", "import tests.conftest, lab; print(lab.PREFIX)"],
            cwd=PROJECT_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert shown.returncode == 0, shown.stderr[-2000:]
        return shown.stdout.strip()

    assert prefix(None) == prefix("gw0") == "ih-lab"
    assert prefix("gw1") == "ih-lab1"
    # No other lab's name begins like it: `docker ps --filter name=^ih-lab-` must not list ih-lab1's.
    assert not prefix("gw1").startswith(prefix("gw0") + "-")


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
    ids.append("tests/lab/test_replicas.py::t4")
    scheduler.workqueue = OrderedDict(
        [
            (unit, {ids[0]: False, ids[1]: False}),
            (lab_conftest.REPLICAS_SCOPE, {ids[3]: False}),
            (lab_conftest.LAB_SCOPE, {ids[2]: False}),
        ]
    )
    sent: list[list[int]] = []

    class Worker:  # xdist's WorkerController, as far as the scheduler uses it
        send_runtest_some = staticmethod(sent.append)

    first, second = Worker(), Worker()
    scheduler.registered_collections = {first: ids, second: ids}
    scheduler._assign_work_unit(first)
    scheduler._assign_work_unit(second)
    # The main lab to the first worker that asks, the replicas lab to the next.
    assert sent == [[2], [3]] and list(scheduler.workqueue) == [unit]
