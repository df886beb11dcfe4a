"""roles/health: the health checks (checks) as the last step of every deploy.

A pyinfra operation rather than code in deploy.py: deploy.py stays dispatch-only, and an
operation runs at execution time, after every operation before it has changed the host, in
the deploy's own order and output, and a failed check fails the deploy like any other step.
The operation runs the checks from the controller (testinfra reaches the host the way pyinfra
does), prints the verdict table to stderr (stdout is pyinfra's, JSON with --json) and writes
the JSON report under reports/.

It reads and changes nothing, so it reports no change: pyinfra 3 (pyinfra/api/operation.py,
3.10) runs an operation's generator once while preparing when it checks for changes, and again
when it executes; an operation that yields no command is counted as "No changes"
(pyinfra/api/operations.py, run_host_op). Here the generator runs the checks only when the
deploy executes (state.is_executing) and yields nothing when they pass; when they fail it
yields one Python command that raises, which fails the operation and the deploy. A no-change
deploy therefore reports zero changed operations and still prints the verdict.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from pyinfra import host, state
from pyinfra.api import FunctionCommand, deploy, operation

from roles.shared.refusal import failed
from roles.site import PROJECT_ROOT, current_host, current_site

CHECK_OPERATION_PREFIX = "Check health"
# `python -m checks` bounds every command and ends within its --deadline-s (900 s by default,
# checks/bounded.py) plus a kill grace; this bound is for the rest (a Python that never starts).
CHECKS_DEADLINE_S = 900
CHECKS_LOCAL_BOUND_S = CHECKS_DEADLINE_S + 120


@deploy("Health")
def health() -> None:
    suites = current_host().health.after_deploy
    if not suites:
        return
    verdict(
        name=f"{CHECK_OPERATION_PREFIX} of {host.name}: {', '.join(suites)}",
        inventory=str(Path(current_site().inventory_file).resolve()),
        host_name=host.name,
        suites=list(suites),
    )


@operation(is_idempotent=True)
def verdict(inventory: str, host_name: str, suites: list[str]):
    """The health checks' verdict on host_name: no change when they pass, a failure when not."""
    if not state.is_executing:
        return  # preparing: the checks judge the host as the deploy leaves it, not before
    failure = run_checks(inventory, host_name, suites)
    if failure:
        yield FunctionCommand(_fail, (failure,), {})


def _fail(state, host, message: str) -> bool:
    """The verdict's failure as the host's error line (the table above says which checks), no
    traceback (roles/shared/refusal.py)."""
    return failed(host, message)


def check_command(inventory: str, host_name: str, suites: list[str], report: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "checks",
        "--inventory",
        inventory,
        "--host",
        host_name,
        "--suites",
        ",".join(suites),
        "--report",
        report,
        f"--deadline-s={CHECKS_DEADLINE_S}",
    ]


def run_checks(inventory: str, host_name: str, suites: list[str]) -> str | None:
    """Runs the suites against host_name; returns why they failed, or None when they passed."""
    safe = host_name.replace("/", "_").replace("@", "")
    # The deploy's own report folder (git-ignored): made here, since checks refuses a
    # --report whose folder is missing (a mistyped path of the user's is not made).
    (PROJECT_ROOT / "reports").mkdir(exist_ok=True)
    report = str(Path("reports") / f"health-{safe}-{time.strftime('%Y%m%d-%H%M%S')}.json")
    try:
        completed = subprocess.run(
            check_command(inventory, host_name, suites, report),
            cwd=PROJECT_ROOT,
            stdout=sys.stderr,
            stderr=sys.stderr,
            check=False,
            timeout=CHECKS_LOCAL_BOUND_S,
        )
    except subprocess.TimeoutExpired:
        return (
            f"health checks of {host_name} did not end within {CHECKS_LOCAL_BOUND_S} s (their own "
            f"deadline is {CHECKS_DEADLINE_S} s): killed; likely cause: the controller's Python or "
            "its connection to the host hangs; what to do: re-run them alone with: uv run python -m "
            f"checks --inventory {inventory} --host {host_name} --suites {','.join(suites)}"
        )
    if completed.returncode == 0:
        return None
    return (
        f"health checks of {host_name} failed (exit {completed.returncode}): see the verdict "
        f"table above and {report}; re-run them alone with: uv run python -m checks "
        f"--inventory {inventory} --host {host_name} --suites {','.join(suites)}"
    )
