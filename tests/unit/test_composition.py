"""One table of roles (roles/composition.py's STEPS) that deploy.py runs; the preview
(roles/render.py) records deploy.py itself, so it has no list of roles of its own
(tests/unit/test_preview_is_the_deploy.py holds it equal to the deploy). deploy.py calls no role
of its own, and every role under roles/ is in the table."""

from __future__ import annotations

import ast

from roles import composition
from tests.unit.conftest import PROJECT_ROOT

# What deploy.py may import from the project: the table and what builds a host's scope.
DEPLOY_IMPORTS = {
    ("roles.composition", "Scope"),
    ("roles.composition", "steps_for"),
    ("roles.proxmox_host", "guest_wait_reason"),  # a fact read while planning: the scope's `waiting`
    ("roles.shared.host_key_check", "refuse_changed"),  # a changed host key stops the deploy first
    ("roles.site", "current_host"),
    ("roles.site", "current_site"),
}


def role_packages() -> set[str]:
    """Every package under roles/ that holds a role (a function decorated with @deploy)."""
    found = set()
    for init in (PROJECT_ROOT / "roles").glob("*/__init__.py"):
        tree = ast.parse(init.read_text())
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and any(
                isinstance(d, ast.Call) and getattr(d.func, "id", "") == "deploy" for d in node.decorator_list
            ):
                found.add(init.parent.name)
    return found


def differences(steps=None) -> list[str]:
    """A role package the table does not run, one line each."""
    steps = composition.STEPS if steps is None else steps
    table = {role for step in steps if not step.barrier for role in (step.role, *step.also)}
    return sorted(f"role {r}: a role package the table does not run" for r in role_packages() - table)


def deploy_py_imports() -> set[tuple[str, str]]:
    tree = ast.parse((PROJECT_ROOT / "deploy.py").read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] != "pyinfra":
            found |= {(node.module, alias.name) for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {(alias.name, "") for alias in node.names if alias.name.split(".")[0] != "pyinfra"}
    return found


def test_the_table_runs_every_role():
    assert differences() == []


def test_deploy_py_runs_the_table_and_calls_no_role_of_its_own():
    extra = deploy_py_imports() - DEPLOY_IMPORTS
    assert not extra, f"deploy.py imports {sorted(extra)}: add the role to roles/composition.py's STEPS instead"


def test_a_role_package_the_table_does_not_run_is_found():
    unrun = tuple(step for step in composition.STEPS if step.role != "cuda")
    assert differences(steps=unrun) == ["role cuda: a role package the table does not run"]


def test_each_step_calls_its_role_from_a_line_of_its_own_in_table_order():
    # pyinfra identifies an operation across hosts by the lines of the calls that led to it and
    # orders operations by them (pyinfra/api/operation.py, 3.10): a call line shared by two steps
    # made the node's nvidia_driver and the guest's one operation, a cycle in the lab's run.
    lines = [step.run.__code__.co_firstlineno for step in composition.STEPS]
    assert all(step.run.__name__ == "<lambda>" for step in composition.STEPS)
    assert lines == sorted(set(lines)), "each step's run: a lambda on the step's own line, in table order"
