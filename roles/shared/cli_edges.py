"""What pyinfra's CLI does at its edges, made the project's (installed by config.py, so the deploy
and its child passes get it):

- a host pyinfra could not connect to is written, one JSON line, to the file named by
  INFERENCE_HOST_UNREACHED_FILE (set by `inference-host deploy`, rollback and rotate): the
  command then says so in one line per host and exits 3, the status every command of the project
  gives an unreachable host (docs/operations.md). pyinfra itself exits 1 when no host is left,
  and 0 when some others were deployed (pyinfra/api/state.py `fail_hosts`, 3.10);
- NO_COLOR (https://no-color.org: set and not empty) turns pyinfra's colours off: pyinfra colours
  its output with click (pyinfra_cli/log.py), and click strips them only when the output is not
  a terminal (click/utils.py `echo`, `should_strip_ansi`).
"""

from __future__ import annotations

import json
import os

UNREACHED_FILE = "INFERENCE_HOST_UNREACHED_FILE"


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
