"""The deploy, recorded: deploy.py run by pyinfra against hosts that answer from a stated state
(roles/stated_state.py) and record, instead of contacting anything, every command an operation
runs and every file it uploads. The preview (roles/render.py) writes what this records; the plan
tests' recorder (tests/unit/plans/record.py) records the same way under pyinfra's own CLI.

pyinfra 3.10 has the pieces: its `@fake` connector (pyinfra/connectors/fake.py) runs nothing and
answers each command from a table of canned outputs; a host's connector class is chosen when the
Inventory is built and instantiated only when the State connects (pyinfra/api/host.py, `init`),
so the inventory's own hosts, names and data unchanged, are pointed at the recorder here.
An operation's Python callback (`python.call`: the health checks, a download followed, a reboot
waited for) runs on this machine and would reach the real host: it is recorded by name instead
of run (pyinfra/api/command.py, FunctionCommand.execute, replaced while the deploy is recorded).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from pyinfra.connectors.fake import FakeConnector
from pyinfra.connectors.util import CommandOutput

Responses = dict  # command matcher (substring or re.Pattern) -> canned answer, as @fake's


@dataclass
class Recording:
    """One host's operations, in the order they ran: ("run", command), ("upload", path, text) or
    ("call", the Python callback's module.name)."""

    events: list[tuple] = field(default_factory=list)

    def uploads(self) -> dict[str, str | bytes]:
        """Each path's last upload (a file written twice ends as the second)."""
        return {event[1]: event[2] for event in self.events if event[0] == "upload"}

    def commands(self) -> list[str]:
        """Each command, and each Python callback as a shell comment, in order."""
        return [
            event[1] if event[0] == "run" else f"# on this machine: {event[1]}"
            for event in self.events
            if event[0] != "upload"
        ]


def _record(host_name: str, *event: str | bytes) -> None:
    RecordingConnector.recordings.setdefault(host_name, Recording()).events.append(event)


def record_call(host_name: str, what: str) -> None:
    """Something the deploy would run on this machine for the host, recorded instead."""
    _record(host_name, "call", what)


def _call_recorded(self, state, host, connector_arguments) -> bool:
    record_call(host.name, f"{self.function.__module__}.{self.function.__qualname__}")
    return True


def _asked_by_a_fact() -> bool:
    """A fact's command, not an operation's: pyinfra runs facts from pyinfra/api/facts.py (3.10),
    roles/shared/fact_batch.py its batch from _run_script (an operation's command passes through
    that module too: it wraps execute)."""
    frame = sys._getframe(2)
    while frame is not None:
        code = frame.f_code
        if code.co_filename.endswith("pyinfra/api/facts.py") or (
            code.co_filename.endswith("roles/shared/fact_batch.py") and code.co_name == "_run_script"
        ):
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def content_of(filename_or_io) -> str | bytes:
    """The upload's text, or its bytes when they are not UTF-8 (an archive)."""
    if hasattr(filename_or_io, "read"):
        filename_or_io.seek(0)
        content = filename_or_io.read()
        filename_or_io.seek(0)
    else:
        content = Path(filename_or_io).read_bytes()
    if isinstance(content, str):
        return content
    try:
        return content.decode()
    except UnicodeDecodeError:
        return content


class RecordingConnector(FakeConnector):
    """@fake, answering from `answers` and recording; instant (no simulated delay)."""

    recordings: dict[str, Recording] = {}
    answers: dict[str, Responses] = {}

    def _sleep(self) -> None:
        pass

    def _lookup_response(self, command_str: str) -> tuple[bool, CommandOutput]:
        self.data = {**self.data, "fake_responses": self.answers.get(self.host.name, {})}
        return super()._lookup_response(command_str)

    def run_shell_command(self, command, print_output=False, print_input=False, **arguments):
        """Nothing runs: the command is recorded (unless a fact asks it) and answered from the
        stated state, as @fake answers it (by its masked text)."""
        text = command if isinstance(command, str) else command.get_masked_value()
        if not _asked_by_a_fact():
            _record(self.host.name, "run", text)
        return self._lookup_response(text)

    def put_file(self, filename_or_io, remote_filename, *args, **kwargs):
        _record(self.host.name, "upload", remote_filename, content_of(filename_or_io))
        return super().put_file(filename_or_io, remote_filename, *args, **kwargs)


@contextmanager
def recording(inventory, answers_for: Callable[[str], Responses], local: dict) -> Iterator[dict[str, Recording]]:
    """Every host of the pyinfra inventory answers from answers_for(its name) and records, while
    the block runs (its State not made yet); Python callbacks are recorded, not run, and each
    (module, name) of `local`, a function the roles run on this machine that would reach a
    host, is its stand-in."""
    import importlib

    from pyinfra.api.command import FunctionCommand

    RecordingConnector.recordings = {}
    RecordingConnector.answers = {host.name: answers_for(host.name) for host in inventory}
    for host in inventory:
        host.connector_cls = RecordingConnector
    replaced: list[tuple[object, str, object]] = [(FunctionCommand, "execute", _call_recorded)]
    replaced += [(importlib.import_module(module), name, standin) for (module, name), standin in local.items()]
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in replaced]
    for owner, name, standin in replaced:
        setattr(owner, name, standin)
    try:
        yield RecordingConnector.recordings
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)


def record_deploy(inventory_file: str, answers_for: Callable[[str], Responses], local: dict) -> dict[str, Recording]:
    """deploy.py on every host of the inventory, each answering from answers_for(its name);
    nothing is contacted. It can run again in the same process: what a role does once per host
    and run is kept per pyinfra State (roles/shared/once.py)."""
    import pyinfra
    from pyinfra.api import Config, State
    from pyinfra.api.connect import connect_all
    from pyinfra.api.operations import run_ops
    from pyinfra.api.state import StateStage
    from pyinfra.context import ctx_config, ctx_inventory, ctx_state
    from pyinfra_cli.util import load_deploy_file

    from roles.shared.call_stack import install as order_without_source
    from roles.site.loading import _LOADED_INVENTORY, PROJECT_ROOT, _pyinfra_inventory

    # pyinfra orders (and identifies) operations across hosts by their call lines, as the deploy
    # does with config.py's patch (roles/shared/call_stack.py, its line numbers without source).
    order_without_source()
    inventory = _pyinfra_inventory(Path(inventory_file))
    _LOADED_INVENTORY.append(str(inventory_file))  # what current_site() reads, as the CLI's load leaves it
    config = Config()
    # pyinfra identifies an operation across hosts by its call lines only "in CLI mode"; the API
    # mode counts each host's operations (pyinfra/api/operation.py, solve_operation_consistency).
    cli = pyinfra.is_cli
    pyinfra.is_cli = True
    try:
        with recording(inventory, answers_for, local) as recorded, ctx_config.use(config):
            with ctx_inventory.use(inventory):
                # As `pyinfra -y INVENTORY deploy.py` runs it (pyinfra_cli/cli.py, _main): no change
                # detection before the run, deploy.py its only operations file, stage by stage.
                state = State(check_for_changes=False)
                with ctx_state.use(state):
                    state.init(inventory, config)  # (which makes each host's connector)
                    state.current_op_file_number = 0
                    state.set_stage(StateStage.Connect)
                    connect_all(state)
                    state.set_stage(StateStage.Prepare)
                    load_deploy_file(state, str(PROJECT_ROOT / "deploy.py"))
                    state.set_stage(StateStage.Execute)
                    run_ops(state)
    finally:
        pyinfra.is_cli = cli
    return {host.name: recorded.get(host.name, Recording()) for host in inventory}
