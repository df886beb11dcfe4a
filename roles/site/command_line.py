"""What every command of the project does the same way at its edge (standard library only, so the
checks' bundle, the lab and the site model can all use it):

- a usage error is one line on stderr, `PROG: error: WHAT (see PROG --help)`, and exit status 2
  (argparse's own `error` prints the whole usage block first);
- output into a closed pipe (`... | head`) ends the program quietly, as `cat` does, instead of a
  BrokenPipeError traceback;
- Ctrl-C is one line and status 130 (128 + SIGINT, as a shell reports it), not a traceback; so
  is SIGTERM (the same status: an interrupted run, whatever stopped it);
- a terminal whose locale is not UTF-8 (LC_ALL=C, PYTHONIOENCODING=ascii) gets `?` for a
  character it cannot show, not a UnicodeEncodeError.

Every entry point runs its main through run_command(), which does all three.

Exit statuses, the same for every command (docs/operations.md): 0 ok, 1 a check or verdict
failed, 2 bad usage or invalid input (nothing contacted), 3 a host or service could not be reached.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable
from typing import NoReturn

OK, FAILED, USAGE, UNREACHABLE = 0, 1, 2, 3
INTERRUPTED = 130


class OneLineParser(argparse.ArgumentParser):
    """argparse, with a usage error in one line (exit 2) and -h/--help as usual (exit 0)."""

    def error(self, message: str):  # argparse's hook
        self.exit(USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def quiet_on_closed_pipe() -> None:
    """Die of SIGPIPE, as a Unix filter does, when the reader of stdout goes away.

    CPython ignores SIGPIPE at start-up, so a write to a closed pipe raises BrokenPipeError, and
    the interpreter prints a traceback (and another at shutdown while flushing stdout). Restoring
    the default action makes the process end silently with the status a shell reads as 141.
    """
    if hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)


def readable_in_any_locale() -> None:
    """stdout and stderr replace what their encoding cannot write (an ASCII or Latin-1 locale)
    instead of raising: the project's messages use a few non-ASCII characters (-, x, C)."""
    for stream in (sys.stdout, sys.stderr):
        encoding = (getattr(stream, "encoding", None) or "").lower().replace("-", "")
        if encoding != "utf8" and hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="replace")


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the program is, as Ctrl-C's KeyboardInterrupt is: every `except
    KeyboardInterrupt` that stops what the program started (a remote command's group, pyinfra's
    process group, a report marked interrupted) runs for it too."""


def interrupt_on_sigterm() -> None:
    """SIGTERM (systemd stopping a unit, `kill PID`) ends the run as Ctrl-C does. Python's default
    for SIGTERM ends the process at once: what it started (pyinfra, an ssh, a command on a host)
    went on running, and no report was written."""

    def terminated(signum, frame):
        raise Terminated(f"signal {signum}")

    if hasattr(signal, "SIGTERM"):
        signal.signal(signal.SIGTERM, terminated)


def run_command(main: Callable[[], int | None], prog: str) -> NoReturn:
    """An entry point's edge: a closed pipe ends quietly, any locale prints, Ctrl-C (and SIGTERM)
    is one line and 130. main() returns the status."""
    quiet_on_closed_pipe()
    readable_in_any_locale()
    interrupt_on_sigterm()
    try:
        code = main()
    except KeyboardInterrupt as interruption:
        how = "SIGTERM" if isinstance(interruption, Terminated) else "Ctrl-C"
        print(f"\n{prog}: interrupted ({how}); what was running was stopped", file=sys.stderr)
        code = INTERRUPTED
    raise SystemExit(code)
