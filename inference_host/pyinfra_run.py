"""pyinfra run from the operator's command (deploy, rollback, rotate): its command line, and the
run itself in a process group of its own, stopped whole on an interruption. A module of its own so
that inference_host/cli.py, rollback.py and rotate.py use it without importing each
other (tests/unit/test_layout.py holds the two without a circle)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from roles.site.command_line import UNREACHABLE

ROOT = Path(__file__).resolve().parent.parent
PROG = "inference-host"


def pyinfra_argv(inventory: str, check: bool, yes: bool, limit: list[str], extra: list[str]) -> list[str]:
    """The pyinfra command line a deploy runs (pyinfra 3.10's options, pyinfra_cli/cli.py):
    --check is its dry run (`--dry`: facts gathered, nothing executed) with `--diff` (every
    changed file's difference, printed while the operations are planned; secrets are never in a
    diff, docs/inventory.md). Without -y pyinfra also prints its "Detected changes" table, and
    --dry exits before the prompt that would follow it, so a check never asks."""
    argv = [str(Path(sys.executable).with_name("pyinfra")), inventory, "deploy.py"]
    if check:
        argv += ["--dry", "--diff"]
    if yes:
        argv.append("-y")
    for name in limit:
        argv += ["--limit", name]
    return argv + extra


def run_pyinfra(argv: list[str]) -> int:
    """pyinfra's status, or 3 with one line per host it could not connect to (config.py records
    them: roles/shared/cli_edges.py). pyinfra runs in its own process: it patches the standard
    library with gevent at import."""
    from checks.reach import next_step, plain_cause
    from roles.shared.cli_edges import UNREACHED_FILE

    with tempfile.TemporaryDirectory(prefix="inference-host-deploy-") as folder:
        record = Path(folder) / "unreached.jsonl"
        code = run_in_own_group(argv, env={**os.environ, UNREACHED_FILE: str(record)})
        found = [json.loads(line) for line in record.read_text().splitlines()] if record.is_file() else []
    said: dict[str, dict] = {}
    for host in found:  # once per host: a child pass may have tried it again
        said.setdefault(host["host"], host)
    for host in said.values():
        cause = plain_cause(" ".join(host["cause"].split()))[:200]
        print(
            f"{PROG}: {host['host']}: unreachable at {host['address']} port {host['port']}: {cause}; "
            f"what to do: {next_step(cause, host['address'], host['port'])}",
            file=sys.stderr,
        )
    return UNREACHABLE if said else code


STOP_GRACE_S = 5  # TERM to pyinfra's group, then KILL this much later (as checks/bounded.py's groups)


def run_in_own_group(argv: list[str], env: dict[str, str]) -> int:
    """pyinfra's status. It runs in a session of its own: a Ctrl-C reaches this process only
    (pyinfra's own SIGINT handler prints "Exiting upon user request!" and exits 0,
    pyinfra_cli/main.py 3.10), and an interruption (Ctrl-C, SIGTERM) stops pyinfra's whole group,
    the commands the @local connector runs included: TERM, STOP_GRACE_S, KILL, then waited for.
    With no controlling terminal of its own, pyinfra still reads its prompt from the terminal
    (job control stops only a background group of the terminal's own session)."""
    process = subprocess.Popen(argv, cwd=ROOT, env=env, start_new_session=True)
    try:
        return process.wait()
    except BaseException:
        stop_group(process)
        raise


def stop_group(process: subprocess.Popen) -> None:
    """TERM to the process's group, KILL after STOP_GRACE_S, and wait until its leader is reaped
    and no process of the group is left (a process that ignores TERM included)."""
    import signal

    for sig, grace in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, STOP_GRACE_S)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, sig)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=0.1)
            if process.returncode is not None and not _group_left(process.pid):
                return


def _group_left(group: int) -> bool:
    """Whether a live (not zombie) process of the group is left (/proc/PID/stat: the state, then
    ppid, then the group, after the command's closing parenthesis)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(") ", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) == group:
            return True
    return False
