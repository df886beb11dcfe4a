"""What pyinfra's CLI does at its edges, made the project's (installed by config.py, so the deploy
and its child passes get it):

- a host pyinfra could not connect to is written, one JSON line, to the file named by
  INFERENCE_HOST_UNREACHED_FILE (set by `inference-host deploy`, rollback and rotate): the
  command then says so in one line per host and exits 3, the status every command of the project
  gives an unreachable host (docs/operations.md). pyinfra itself exits 1 when no host is left,
  and 0 when some others were deployed (pyinfra/api/state.py `fail_hosts`, 3.10);
- NO_COLOR (https://no-color.org: set and not empty) turns pyinfra's colours off: pyinfra colours
  its output with click (pyinfra_cli/log.py), and click strips them only when the output is not
  a terminal (click/utils.py `echo`, `should_strip_ansi`);
- an operation that runs longer than PROGRESS_FIRST_S on a host says so at a terminal, a line
  with its host, its name and its time, then every PROGRESS_EVERY_S until it ends: the deploy's
  waits (the health-gated switch waits up to the unit's start timeout for the engine, a rolling
  step for the gateways, a driver build for DKMS) printed nothing but pyinfra's spinner for as
  long as they lasted. Nothing in a file or a pipe, nothing with pyinfra's --json (which sets
  PYINFRA_PROGRESS=off, pyinfra_cli/cli.py 3.10, as its own spinner reads it).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

UNREACHED_FILE = "INFERENCE_HOST_UNREACHED_FILE"
# The same cadence as the checks' and drain's progress lines (checks/bounded.py, PROGRESS_EVERY_S):
# the first line after 10 s, then one every 10 s for a minute, then every 30 s (a switch that
# waits 20 minutes for an engine is ~45 lines, not 120).
PROGRESS_FIRST_S = 10.0
PROGRESS_EVERY_S = 10.0
PROGRESS_LATER_S = 30.0
PROGRESS_LATER_AFTER_S = 60.0


def record_unreached_hosts() -> None:
    """Wrap pyinfra's Host.connect: a ConnectError (its message is the connector's: "Could not
    connect ([Errno 111] Connection refused)") is recorded, then handled as pyinfra handles it."""
    target = os.environ.get(UNREACHED_FILE)
    if not target:
        return
    from pyinfra.api.exceptions import ConnectError
    from pyinfra.api.host import Host

    connect = Host.connect
    if getattr(connect, "records_unreached", False):
        return

    def connect_and_record(self, reason=None, show_errors: bool = True, raise_exceptions: bool = False):
        try:
            return connect(self, reason, show_errors, raise_exceptions=True)
        except ConnectError as error:
            data = self.data
            line = {
                "host": self.name,
                "address": str(data.get("ssh_hostname") or self.name),
                "port": str(data.get("ssh_port") or 22),
                "cause": str(error.args[0] if error.args else error),
            }
            with open(target, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(line) + "\n")
            if raise_exceptions:
                raise
            return None

    connect_and_record.records_unreached = True  # type: ignore[attr-defined]  # a mark on the function
    Host.connect = connect_and_record  # type: ignore[method-assign]


def honour_no_color() -> None:
    if not os.environ.get("NO_COLOR"):
        return
    import click._compat
    import click.utils

    def strip(stream=None, color=None) -> bool:
        return True

    # both names, as click's own CliRunner replaces them (click/testing.py, 8.x)
    click.utils.should_strip_ansi = strip
    click._compat.should_strip_ansi = strip


def _progress_wanted(stream) -> bool:
    return bool(getattr(stream, "isatty", lambda: False)()) and os.environ.get("PYINFRA_PROGRESS") != "off"


def progress_due(elapsed_s: float) -> float:
    """Seconds from elapsed_s to the next progress line."""
    every = PROGRESS_EVERY_S if elapsed_s < PROGRESS_LATER_AFTER_S else PROGRESS_LATER_S
    return every


def say_long_operations(stream=None) -> None:
    """Wrap pyinfra's run_host_op (pyinfra/api/operations.py, 3.10: every operation on every host
    runs through it, in a greenlet per host; the module calls it by its global name): while it
    runs, a ticker (a greenlet under pyinfra's gevent patching, whose Event.wait yields) prints
    `[HOST] still running after N s: OPERATION` at a terminal. State callbacks cannot do it:
    state.init(), after config.py, replaces the list of callback handlers (pyinfra/api/state.py)."""
    from pyinfra.api import operations

    run_host_op = operations.run_host_op
    if getattr(run_host_op, "says_long_operations", False):
        return

    def run_and_say(state, host, op_hash):
        out = stream or sys.stderr
        if not _progress_wanted(out):
            return run_host_op(state, host, op_hash)
        try:
            names = sorted(state.get_op_meta(op_hash).names)
        except (AttributeError, KeyError):
            names = []
        what = ", ".join(names) or "an operation"
        what = what if len(what) <= 160 else what[:157] + "..."
        done = threading.Event()
        started = time.monotonic()

        def tick() -> None:
            wait = PROGRESS_FIRST_S
            while not done.wait(wait):
                elapsed = time.monotonic() - started
                print(f"[{host.name}] still running after {elapsed:.0f} s: {what}", file=out, flush=True)
                wait = progress_due(elapsed)

        ticker = threading.Thread(target=tick, daemon=True)
        ticker.start()
        try:
            return run_host_op(state, host, op_hash)
        finally:
            done.set()

    run_and_say.says_long_operations = True  # type: ignore[attr-defined]  # a mark on the function
    operations.run_host_op = run_and_say
