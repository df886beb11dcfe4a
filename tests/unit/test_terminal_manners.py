"""Every entry point at a terminal's edges (roles/site/command_line.py, run_command): a locale
that is not UTF-8, a reader that went away, a Ctrl-C. None of them is a traceback."""

from __future__ import annotations

import functools
import io
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.unit.conftest import PROJECT_ROOT, as_a_shell_starts_it
from tests.unit.test_exit_codes import replicas_inventory

# The commands these tests interrupt start with SIGINT as a shell gives it (tests/unit/conftest.py),
# and the worker's own state is reported when it is not Python's default.
pytestmark = pytest.mark.usefixtures("signals_of_this_worker")
_popen = functools.partial(subprocess.Popen, preexec_fn=as_a_shell_starts_it)

PYTHON = sys.executable
CONSOLE = str(Path(sys.executable).with_name("inference-host"))
ASCII = {"PYTHONIOENCODING": "ascii", "LC_ALL": "C", "LANG": "C"}

# Each entry point with something it echoes that ASCII cannot show.
ENTRY_POINTS = {
    "inference-host": [CONSOLE, "validate", "/nonexistent/é.py"],
    "inference-host --settings": [CONSOLE, "validate", "--settings"],
    "checks": [PYTHON, "-m", "checks", "--inventory", "/nonexistent/é.py"],
    "validation": [PYTHON, "-m", "validation", "/nonexistent/é.py"],
    "checks.bench": [PYTHON, "-m", "checks.bench", "--inventory", "/nonexistent/é.py"],
    "checks.acceptance": [PYTHON, "-m", "checks.acceptance", "--inventory", "/nonexistent/é.py"],
    "lab": [PYTHON, "-m", "lab", "é"],
}


@pytest.mark.parametrize("name", list(ENTRY_POINTS))
def test_each_entry_point_in_an_ascii_locale(name):
    done = subprocess.run(
        ENTRY_POINTS[name],
        cwd=PROJECT_ROOT,
        env={**os.environ, **ASCII},
        capture_output=True,
        timeout=300,
        check=False,
    )
    said = (done.stdout + done.stderr).decode("ascii", "replace")
    assert "Traceback" not in said, said[-2000:]
    assert done.returncode in (0, 2), (done.returncode, said[-2000:])
    assert said.strip(), "it said nothing"


def test_a_character_the_locale_cannot_show_is_a_question_mark():
    program = "from roles.site.command_line import run_command; run_command(lambda: print('a … b') or 0, 'x')"
    done = subprocess.run(
        [PYTHON, "-c", program], cwd=PROJECT_ROOT, env={**os.environ, **ASCII}, capture_output=True, timeout=60
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, b"a ? b\n", b"")


# Runs argv with its stdout a pipe whose reader is gone before the first byte (`| head -1` after
# its line). The pipe is made in a fresh, one-threaded process, which then becomes the command.
# Made in the test's own process, the command once exited 0 with nothing on stderr (a run of
# `.ci/run` on 2026-12-07, the worker having run the replicas lab first): its write went through,
# so a reader was alive. The one way seen for that: a fork by another thread of the worker between
# the pipe's making and the close of its reading end, whose child holds that end until it execs.
CLOSED_PIPE = "import os, sys; r, w = os.pipe(); os.close(r); os.dup2(w, 1); os.execvp(sys.argv[1], sys.argv[1:])"


@pytest.mark.parametrize(
    "argv",
    [
        [CONSOLE, "validate", "--settings"],
        [PYTHON, "-m", "roles.site", "--settings"],
        [PYTHON, "-m", "checks", "--help"],
        [PYTHON, "-m", "lab", "--help"],
    ],
    ids=["inference-host", "validation", "checks", "lab"],
)
def test_output_into_a_closed_pipe_ends_quietly(argv):
    done = subprocess.run(
        [PYTHON, "-c", CLOSED_PIPE, *argv], cwd=PROJECT_ROOT, stderr=subprocess.PIPE, timeout=300, check=False
    )
    assert done.stderr == b"", done.stderr.decode()[-2000:]
    assert done.returncode == -signal.SIGPIPE


def test_the_first_line_into_head(tmp_path):
    done = subprocess.run(
        f"{CONSOLE} validate --settings | head -1",
        shell=True,
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.stderr == "" and len(done.stdout.splitlines()) == 1, done.stderr[-2000:]


def _children(pid: int) -> list[str]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            try:
                found.append(Path(f"/proc/{child}/comm").read_text().strip())
            except OSError:
                pass
    return found


def test_ctrl_c_is_one_line_and_status_130(tmp_path):
    """A status run waiting on a host that accepts and never speaks, interrupted as a terminal
    does it: SIGINT to the whole foreground process group (the ssh it waits on included)."""
    listener = socket.socket()
    listener.bind(("127.0.0.2", 0))
    listener.listen(8)
    inventory = replicas_inventory(tmp_path / "silent", listener.getsockname()[1])
    try:
        process = _popen(
            [CONSOLE, "status", str(inventory), "--timeout", "60"],
            cwd=PROJECT_ROOT,
            env={**os.environ, "INFERENCE_HOST_VAULT_PASSWORD_FILE": str(inventory.parent / "password")},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        deadline = time.monotonic() + 120
        while "ssh" not in _children(process.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "ssh" in _children(process.pid), "status never asked the host"
        # The other hosts' pre-checks fork at about the same time and end at once (refused); a
        # SIGINT inside a child between fork and exec prints Python's "Exception ignored in
        # _after_fork" there (seen here about 1 run in 6; open, docs/operations.md). The Ctrl-C
        # this test is about comes while status waits on the silent host.
        time.sleep(1.5)
        assert "ssh" in _children(process.pid), "the silent host's ssh ended before the Ctrl-C"
        os.killpg(process.pid, signal.SIGINT)
        out, err = process.communicate(timeout=30)
    finally:
        listener.close()
    assert process.returncode == 130, (out, err)
    assert "Traceback" not in err
    assert [line for line in err.splitlines() if line.strip()] == [
        "inference-host: interrupted (Ctrl-C); what was running was stopped"
    ], err


def test_no_color_reaches_pyinfras_output(monkeypatch):
    """pyinfra colours with click, which strips colours only off a terminal; NO_COLOR strips them
    at a terminal too (roles/shared/cli_edges.py, installed by config.py)."""
    import click
    import click._compat
    import click.utils

    from roles.shared import cli_edges

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    # restored after the test: honour_no_color replaces both names
    monkeypatch.setattr(click.utils, "should_strip_ansi", click.utils.should_strip_ansi)
    monkeypatch.setattr(click._compat, "should_strip_ansi", click._compat.should_strip_ansi)
    coloured = Terminal()
    click.echo(click.style("Connected", "green"), file=coloured)
    assert "\x1b[" in coloured.getvalue()  # a terminal gets colours by default
    monkeypatch.setenv("NO_COLOR", "1")
    cli_edges.honour_no_color()
    plain = Terminal()
    click.echo(click.style("Connected", "green"), file=plain)
    assert plain.getvalue() == "Connected\n"


class _Terminal(io.StringIO):
    def __init__(self, tty: bool = True):
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_a_long_deploy_operation_says_so_at_a_terminal_only(monkeypatch):
    """pyinfra runs every operation through run_host_op (pyinfra/api/operations.py, 3.10), as
    _run_host_op_with_context calls it; config.py installs the wrapper (roles/shared/cli_edges.py)."""
    from types import SimpleNamespace

    from pyinfra.api import operations

    from roles.shared import cli_edges

    def slow_op(state, host, op_hash):
        time.sleep(1.3)
        return True

    monkeypatch.setattr(cli_edges, "PROGRESS_FIRST_S", 0.5)
    monkeypatch.setattr(cli_edges, "PROGRESS_EVERY_S", 0.3)
    monkeypatch.delenv("PYINFRA_PROGRESS", raising=False)
    name = "Restart inference-engine.service and wait until /health_generate answers"
    state = SimpleNamespace(get_op_meta=lambda op_hash: SimpleNamespace(names={name}))
    host = SimpleNamespace(name="gpu-lxc.example.internal")
    seen = {}
    for case, tty, env in (("terminal", True, None), ("pipe", False, None), ("json", True, "off")):
        monkeypatch.setattr(operations, "run_host_op", slow_op)
        if env:
            monkeypatch.setenv("PYINFRA_PROGRESS", env)
        stream = _Terminal(tty)
        cli_edges.say_long_operations(stream)
        cli_edges.say_long_operations(stream)  # once: a second install keeps the first
        assert operations._run_host_op_with_context(state, host, "op-1") is True
        seen[case] = stream.getvalue().splitlines()
    assert 2 <= len(seen["terminal"]) <= 4, seen
    assert all(
        re.fullmatch(rf"\[gpu-lxc\.example\.internal\] still running after \d+ s: {re.escape(name)}", line)
        for line in seen["terminal"]
    ), seen
    assert seen["pipe"] == [] and seen["json"] == [], seen


def test_progress_comes_every_10_s_for_a_minute_then_every_30():
    from roles.shared import cli_edges

    assert cli_edges.PROGRESS_FIRST_S == 10
    assert [cli_edges.progress_due(s) for s in (10, 50, 60, 600)] == [10, 10, 30, 30]


def test_config_installs_the_progress_lines():
    """pyinfra runs config.py before it loads the inventory (pyinfra_cli/cli.py, 3.10)."""
    program = (
        "import runpy; from pyinfra.api import operations; runpy.run_path('config.py');"
        " print(getattr(operations.run_host_op, 'says_long_operations', False))"
    )
    done = subprocess.run([PYTHON, "-c", program], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "True", done.stderr[-2000:]


STUBBORN_PYINFRA = """#!/bin/sh
# A stand-in for pyinfra in the middle of a step: it ignores TERM, and so does the command it runs
# (a driver call stuck in the kernel often does); it says it started, then waits.
trap '' TERM
sh -c "trap '' TERM; exec sleep {seconds}" >/dev/null 2>&1 &
echo started >&2
wait
"""


def _left(*marks: str) -> list[str]:
    """The live processes (not zombies) whose command line holds one of the marks."""
    left = []
    for folder in Path("/proc").glob("[0-9]*"):
        try:
            words = (folder / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (folder / "stat").read_text().rsplit(") ", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z" and any(mark in words for mark in marks):
            left.append(f"{folder.name}: {words}")
    return left


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_an_interrupted_deploy_stops_pyinfras_whole_group(tmp_path, how):
    """`inference-host deploy` (and rollback, rotate: pyinfra_run.run_pyinfra) interrupted while pyinfra
    runs a step that ignores TERM: one line, 130, and nothing pyinfra started is left."""
    import random

    seconds = str(random.randint(3000, 3999))  # this run's own mark
    fake = tmp_path / "pyinfra"
    fake.write_text(STUBBORN_PYINFRA.replace("{seconds}", seconds))
    fake.chmod(0o755)
    program = (
        "import sys; from roles.site.command_line import run_command; from inference_host import pyinfra_run;"
        " pyinfra_run.STOP_GRACE_S = 1; run_command(lambda: pyinfra_run.run_pyinfra([sys.argv[1]]), 'inference-host')"
    )
    process = _popen(
        [PYTHON, "-c", program, str(fake)],
        cwd=PROJECT_ROOT,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a terminal's foreground group: Ctrl-C goes to all of it
    )
    assert process.stderr is not None
    try:
        assert process.stderr.readline().startswith("started")
        deadline = time.monotonic() + 10
        while len(_left(str(fake), f"sleep {seconds}")) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        if how == signal.SIGINT:
            os.killpg(process.pid, signal.SIGINT)
        else:
            os.kill(process.pid, signal.SIGTERM)  # systemd's stop, or `kill PID`
        _, err = process.communicate(timeout=30)
        assert process.returncode == 130, err
        words = "Ctrl-C" if how == signal.SIGINT else "SIGTERM"
        assert [x for x in err.splitlines() if x.strip()] == [
            f"inference-host: interrupted ({words}); what was running was stopped"
        ], err
        assert _left(str(fake), f"sleep {seconds}") == [], "what pyinfra started outlived the interruption"
    finally:
        if process.poll() is None:
            process.kill()
        for entry in _left(str(fake), f"sleep {seconds}"):  # a failed run leaves nothing behind either
            os.kill(int(entry.split(":")[0]), signal.SIGKILL)


FORK_RACE = """
import os, sys, time
import pyinfra_cli  # noqa: F401  # gevent's patching, as in `inference-host status` (roles/site/loading.py)
from roles.site.command_line import run_command
from checks import reach

# The window between fork and exec, widened: Python's at-fork hooks run in the child there.
os.register_at_fork(after_in_child=lambda: time.sleep(2))
print("ready", flush=True)
run_command(lambda: reach._ask(["sleep", sys.argv[1]], 60, None), "inference-host")
"""


def test_a_ctrl_c_between_fork_and_exec_is_still_one_line():
    """status asks each host with an ssh (checks/reach.py, _ask); a Ctrl-C that lands in the child
    before its exec raised KeyboardInterrupt inside Python's at-fork hooks there, which printed
    "Exception ignored in ... _after_fork" and a traceback beside the one line."""
    import random

    seconds = str(random.randint(4000, 4999))
    process = _popen(
        [PYTHON, "-c", FORK_RACE, seconds],
        cwd=PROJECT_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "ready"
        time.sleep(1.0)  # the child is in its at-fork hook now
        os.killpg(process.pid, signal.SIGINT)
        _, err = process.communicate(timeout=60)
        assert _left(f"sleep {seconds}") == [], "the child went on to its exec"
    finally:
        if process.poll() is None:
            process.kill()
        for entry in _left(f"sleep {seconds}"):
            os.kill(int(entry.split(":")[0]), signal.SIGKILL)
    lines = [line for line in err.splitlines() if line.strip() and "MonkeyPatchWarning" not in line]
    lines = [line for line in lines if "monkey.patch_all()" not in line]
    assert lines == ["inference-host: interrupted (Ctrl-C); what was running was stopped"], err
    assert process.returncode == 130, err


@pytest.mark.parametrize("kind", ["engines", "gateway", "eagle3"])
def test_each_lock_with_no_arguments_refuses_in_one_line_naming_the_command(kind, capsys):
    """`inference-host lock KIND` with nothing more writes nothing, says so in one line (exit 2),
    and names the command that was typed, not the module behind it."""
    from inference_host import cli

    with pytest.raises(SystemExit) as done:
        code = cli.main(["lock", kind])
        raise SystemExit(code)
    said = capsys.readouterr().err.strip().splitlines()
    assert done.value.code == 2 and len(said) == 1, said
    assert said[0].startswith(f"inference-host lock {kind}: error: "), said
    assert said[0].endswith(f"(see inference-host lock {kind} --help)"), said


@pytest.mark.parametrize("command", ["preview", "check", "accept", "bench"])
def test_a_wrapped_subcommands_usage_error_names_the_command_typed(command, capsys):
    """`inference-host check INVENTORY --nosuch` said `python -m checks: error: ... (see python
    -m checks --help)`: the module behind it, not what the operator typed."""
    from inference_host import cli

    code = cli.main([command, "inventory/prod.py", "--no-such-option"])
    said = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(said) == 1, said
    assert said[0].startswith(f"inference-host {command}: error: unrecognized arguments: --no-such-option"), said
    assert said[0].endswith(f"(see inference-host {command} --help)"), said
