"""roles/serving's inference-engine-wait-ready (the unit's ExecStartPost), run here as systemd runs
it: $MAINPID a session leader whose process group holds the server and what it started. A start
that never answers 200 ends that whole group within its bound, even when it ignores SIGTERM as
vLLM 0.16.0 did while its engine core started (the lab's rollback waited systemd's 120 s
TimeoutStopSec for it)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

from roles.shared import templates


def _script(tmp_path: Path) -> Path:
    path = tmp_path / "inference-engine-wait-ready"
    path.write_text(templates.render("roles/serving/templates/inference-engine-wait-ready.j2"))
    path.chmod(0o755)
    return path


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _never_ready(tmp_path: Path, server_shell: str) -> tuple[subprocess.CompletedProcess, int, float, bool]:
    """A server (its own session, as systemd starts ExecStart=) with a child, and the script
    waiting 1 s for a port nobody listens on. Returns the script's result, how the server ended,
    how long the script took, and whether its process group (the child too) was gone after it."""
    server = subprocess.Popen(["sh", "-c", server_shell], start_new_session=True)
    ended: list[int] = []
    reaper = threading.Thread(target=lambda: ended.append(server.wait()))  # as systemd reaps its main process
    reaper.start()
    time.sleep(0.5)  # the child started
    started = time.monotonic()
    try:
        done = subprocess.run(
            [str(_script(tmp_path)), f"http://127.0.0.1:{_closed_port()}/health", "1"],
            env={**os.environ, "MAINPID": str(server.pid)},
            capture_output=True,
            text=True,
            timeout=60,
        )
        took = time.monotonic() - started
        reaper.join(timeout=5)
        return done, ended[0] if ended else 0, took, _group_gone(server.pid)
    finally:
        try:
            os.killpg(server.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        reaper.join(timeout=5)


def _group_gone(pgid: int) -> bool:
    """No live process left in the group (/proc/PID/stat: state, then the group; an orphan's
    zombie waits for whatever reaps orphans here, which need not be an init that reaps at once)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            return False
    return True


def test_a_server_that_ignores_sigterm_is_killed_with_its_children(tmp_path):
    # Both ignore SIGTERM (an ignored signal stays ignored across exec): the server and its child.
    done, ended, took, gone = _never_ready(tmp_path, "trap '' TERM; sleep 300 & sleep 300; wait")
    assert done.returncode == 1, done.stderr
    assert "did not answer 200 within 1s" in done.stderr, done.stderr
    assert "ignored SIGTERM for 10s; killed" in done.stderr, done.stderr
    assert ended == -signal.SIGKILL
    assert took < 30, took  # the 1 s wait and the 10 s grace, not systemd's 120 s
    assert gone, "a process of the server's group is left"


def test_a_server_that_honours_sigterm_ends_by_it(tmp_path):
    done, ended, took, gone = _never_ready(tmp_path, "sleep 300 & sleep 300; wait")
    assert done.returncode == 1, done.stderr
    assert "did not answer 200 within 1s" in done.stderr, done.stderr
    assert "killed" not in done.stderr, done.stderr
    assert ended == -signal.SIGTERM
    assert took < 10, took
    assert gone, "a process of the server's group is left"
