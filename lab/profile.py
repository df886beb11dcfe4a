"""Where a deploy's time goes: the real pyinfra CLI, with every command it runs on a host timed.

    INFERENCE_HOST_LAB_PREFIX=... uv run python -m lab.profile -y inventory/lab.py deploy.py

Arguments are pyinfra's own. Each command a connector runs (a fact's or an operation's) and
each file upload is timed where pyinfra calls the connector (pyinfra/api/facts.py for facts,
pyinfra/api/operation.py for operations); a summary goes to stderr when pyinfra exits: wall
time, time until the first operation starts (connecting and planning), commands per host and
kind, and the slowest facts and operations by total time. Nothing is changed in what runs.
"""

from __future__ import annotations

import atexit
import sys
import time
from collections import defaultdict
from types import FrameType

import gevent
from pyinfra.connectors.base import BaseConnector

_started = time.monotonic()
_records: list[tuple[str, str, str, float]] = []  # host, kind, what, seconds
_marks: dict[str, float] = {}


def _caller() -> tuple[str, str]:
    """("fact", FactClass) or ("op", operation name) of the command being run."""
    frame: FrameType | None = sys._getframe(2)
    kind_seen = False
    while frame is not None:
        filename = frame.f_code.co_filename
        kind_seen = kind_seen or filename.endswith(("pyinfra/api/operation.py", "pyinfra/api/operations.py"))
        if filename.endswith("pyinfra/api/facts.py"):
            fact = frame.f_locals.get("cls") or frame.f_locals.get("fact")
            return "fact", getattr(fact, "__name__", type(fact).__name__)
        if filename.endswith(("pyinfra/api/operation.py", "pyinfra/api/operations.py")):
            # _run_host_op (operations.py) holds the state and the op's hash; a frame further
            # out (_run_single_op) its meta.
            local = frame.f_locals
            meta = local.get("op_meta")
            if meta is None and "op_hash" in local and hasattr(local.get("state"), "get_op_meta"):
                meta = local["state"].get_op_meta(local["op_hash"])
            names = getattr(meta, "names", None)
            if names:
                return "op", sorted(names)[0]
        frame = frame.f_back
    if kind_seen:
        return "op", "operation"
    return "other", "python.call / _if"


# Greenlets inside a timed call: a connector that runs through another (docker -> local) is
# counted once; hosts run in parallel greenlets (pyinfra uses gevent), each counted on its own.
_inside: set[int] = set()


def _wrap(cls, method: str) -> None:
    original = getattr(cls, method, None)
    if original is None or getattr(original, "_profiled", False):
        return

    def timed(self, *args, **kwargs):
        me = id(gevent.getcurrent())
        if me in _inside:
            return original(self, *args, **kwargs)
        kind, what = _caller()
        begin = time.monotonic()
        _inside.add(me)
        try:
            return original(self, *args, **kwargs)
        finally:
            _inside.discard(me)
            _records.append(
                (self.host.name, kind if method == "run_shell_command" else "upload", what, time.monotonic() - begin)
            )

    timed._profiled = True  # type: ignore[attr-defined]  # a mark on the function
    setattr(cls, method, timed)


def _summary() -> None:
    wall = time.monotonic() - _started
    out = sys.stderr
    first_op = _marks.get("first_op")
    print(
        f"\n=== profile: wall {wall:.1f} s; connecting and planning {first_op - _started:.1f} s"
        if first_op
        else f"\n=== profile: wall {wall:.1f} s",
        file=out,
    )
    by_host: defaultdict[str, defaultdict[str, list]] = defaultdict(lambda: defaultdict(lambda: [0, 0.0]))
    by_what: defaultdict[tuple[str, str], list] = defaultdict(lambda: [0, 0.0])
    for host, kind, what, seconds in _records:
        by_host[host][kind][0] += 1
        by_host[host][kind][1] += seconds
        by_what[(kind, what)][0] += 1
        by_what[(kind, what)][1] += seconds
    for host, kinds in by_host.items():
        line = ", ".join(f"{kind} {n} in {s:.1f} s" for kind, (n, s) in sorted(kinds.items()))
        print(f"  {host}: {line}", file=out)
    print("  slowest (total s, count, kind, what):", file=out)
    for (kind, what), (n, seconds) in sorted(by_what.items(), key=lambda i: -i[1][1])[:25]:
        print(f"    {seconds:6.2f} {n:4d}  {kind:6s} {what}", file=out)


def main() -> None:
    import pyinfra.connectors.docker  # the connectors the lab and a site use
    import pyinfra.connectors.local
    import pyinfra.connectors.ssh  # noqa: F401

    for connector in BaseConnector.__subclasses__():
        for method in ("run_shell_command", "put_file"):
            _wrap(connector, method)
    from pyinfra.api import operations

    run_ops = operations.run_ops

    def marked(*args, **kwargs):
        _marks["first_op"] = time.monotonic()
        return run_ops(*args, **kwargs)

    operations.run_ops = marked
    import pyinfra_cli.cli as cli

    cli.run_ops = marked
    atexit.register(_summary)
    from pyinfra_cli.main import main as pyinfra_main

    sys.argv = ["pyinfra", *sys.argv[1:]]
    pyinfra_main()


if __name__ == "__main__":
    main()
