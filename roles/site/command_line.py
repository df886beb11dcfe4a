"""What every command of the project does the same way at its edge (standard library only, so the
checks' bundle, the lab and the site model can all use it):

- a usage error is one line on stderr, `PROG: error: WHAT (see PROG --help)`, and exit status 2
  (argparse's own `error` prints the whole usage block first);
- output into a closed pipe (`... | head`) ends the program quietly, as `cat` does, instead of a
  BrokenPipeError traceback.

Exit statuses, the same for every command (docs/operations.md): 0 ok, 1 a check or verdict
failed, 2 bad usage or invalid input (nothing contacted), 3 a host or service could not be reached.
"""

from __future__ import annotations

import argparse
import signal

OK, FAILED, USAGE, UNREACHABLE = 0, 1, 2, 3


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
