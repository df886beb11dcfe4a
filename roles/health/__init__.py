"""roles/health: the health checks (tests/infra) as the last step of every deploy.

A pyinfra operation rather than code in deploy.py: deploy.py stays dispatch-only, and an
operation runs at execution time, after every operation before it has changed the host, in
the deploy's own order and output, and a failed check fails the deploy like any other step.
The operation runs the checks from the controller (testinfra reaches the host the way pyinfra
does), prints the verdict table to stderr (stdout is pyinfra's, JSON with --json) and writes
the JSON report under reports/.

It is a check, not a change: pyinfra counts every python.call as "changed", so the lab's
idempotence test leaves operations named "Check health ..." out (tests/lab/harness.py).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import python

from roles.site import PROJECT_ROOT, current_host, inventory_file

CHECK_OPERATION_PREFIX = "Check health"


@deploy("Health")
def health() -> None:
    suites = current_host().health.after_deploy
    if not suites:
        return
    python.call(
        name=f"{CHECK_OPERATION_PREFIX} of {host.name}: {', '.join(suites)}",
        function=run_checks,
        inventory=inventory_file(),
        host_name=host.name,
        suites=list(suites),
    )


def check_command(inventory: str, host_name: str, suites: list[str], report: str) -> list[str]:
    return [sys.executable, "-m", "tests.infra", "--inventory", inventory, "--host", host_name,
            "--suites", ",".join(suites), "--report", report]


def run_checks(inventory: str, host_name: str, suites: list[str]) -> None:
    safe = host_name.replace("/", "_").replace("@", "")
    report = str(Path("reports") / f"health-{safe}-{time.strftime('%Y%m%d-%H%M%S')}.json")
    completed = subprocess.run(check_command(inventory, host_name, suites, report), cwd=PROJECT_ROOT,
                               stdout=sys.stderr, stderr=sys.stderr, check=False)
    if completed.returncode != 0:
        raise RuntimeError(
            f"health checks of {host_name} failed (exit {completed.returncode}): see the verdict "
            f"table above and {report}; re-run them alone with: uv run python -m tests.infra "
            f"--inventory {inventory} --host {host_name} --suites {','.join(suites)}"
        )
