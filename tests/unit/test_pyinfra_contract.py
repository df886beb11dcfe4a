"""The private parts of pyinfra the project relies on, held to the pinned minor (pyproject.toml:
pyinfra==3.10.0), by what they do and not only by their names. A pyinfra release that
renames, reshapes or stops using one fails here in one line naming it, instead of as a strange
deploy. docs/layout.md says what each patch does and why.

- roles/shared/fact_batch.py (installed by config.py): replaces pyinfra.api.facts._get_fact,
  builds fact commands with _make_command and _handle_fact_kwargs, reads _MISSING_COMMAND_MARKER,
  and wraps execute() on PyinfraCommand and its subclasses to drop its answers before any
  command of an operation runs. Proved by running real operations through pyinfra's own run path
  (add_op, run_ops) on pyinfra's @local connector in a temporary folder: the batch answers a fact,
  an operation changes what the fact reads, and the next answer is the new one.
- roles/site/loading.py: calls pyinfra_cli.inventory's exec_file, _get_groups_from_filename and
  _is_inventory_group, make_inventory_from_files, and wraps pyinfra_cli.cli.make_inventory (which
  the CLI must call by that name) so that a bad inventory is one line. Proved by loading an
  inventory file through it.
- roles/shared/call_stack.py (installed by config.py): replaces `stack` and `getframeinfo` in
  pyinfra.api.util, which get_operation_order_from_stack reads to order operations. Proved by
  ordering the same call both ways (a deploy file's frame among them).
- roles/shared/host_key_check.py (installed by config.py): wraps the connect of pyinfra's SSH
  client (pyinfra.connectors.sshuserclient.client.SSHClient.connect), whose paramiko
  BadHostKeyException carries both keys, keyword `_pyinfra_ssh_known_hosts_file` included.
  Proved in tests/unit/test_host_keys.py (a changed key through the wrapper) and in the lab
  (tests/lab/test_health_ssh.py, a real swapped key).
- lab/profile.py: wraps every connector's run_shell_command and put_file, replaces run_ops in
  pyinfra.api.operations and pyinfra_cli.cli, and tells a fact's command from an operation's by
  the frames of pyinfra/api/facts.py (`cls`) and pyinfra/api/operation(s).py. Proved by profiling
  a fact and an operation on @local.

The plants at the end simulate the pyinfra changes this guards against (monkeypatching pyinfra
as a new release would change it) and hold the one line each one gives.
"""

from __future__ import annotations

import importlib
import inspect
import textwrap
from pathlib import Path

import pytest

CALLABLES = {
    "pyinfra.api.facts:_get_fact": ["state", "host", "cls", "args", "kwargs", "ensure_hosts", "apply_failed_hosts"],
    "pyinfra.api.facts:_make_command": ["command_attribute", "host_args"],
    "pyinfra.api.facts:_handle_fact_kwargs": ["state", "host", "cls", "args", "kwargs"],
    "pyinfra.api.command:PyinfraCommand.execute": ["self", "state", "host", "connector_arguments"],
    "pyinfra_cli.inventory:exec_file": ["filename", "return_locals", "is_deploy_code"],
    "pyinfra_cli.inventory:_get_groups_from_filename": ["inventory_filename"],
    "pyinfra_cli.inventory:_is_inventory_group": ["key", "value"],
    "pyinfra_cli.inventory:make_inventory_from_files": [
        "inventory_filename",
        "override_data",
        "cwd",
        "group_data_directories",
    ],
    "pyinfra_cli.cli:make_inventory": ["inventory", "override_data", "cwd", "group_data_directories"],
    "pyinfra.api.operations:run_ops": ["state", "serial", "no_wait"],
    "pyinfra.api.util:get_operation_order_from_stack": ["state"],
    "pyinfra_cli.cli:run_ops": ["state", "serial", "no_wait"],
    # roles/recording.py (the preview): @fake's lookup and delay, callbacks recorded, deploy.py loaded
    "pyinfra.connectors.fake:FakeConnector._lookup_response": ["self", "command_str"],
    "pyinfra.connectors.fake:FakeConnector._sleep": ["self"],
    "pyinfra.api.command:FunctionCommand.execute": ["self", "state", "host", "connector_arguments"],
    "pyinfra_cli.util:load_deploy_file": ["state", "filename"],
    "pyinfra.connectors.sshuserclient.client:SSHClient.connect": [
        "self",
        "hostname",
        "_pyinfra_ssh_forward_agent",
        "_pyinfra_ssh_config_file",
        "_pyinfra_ssh_known_hosts_file",
        "_pyinfra_ssh_strict_host_key_checking",
        "_pyinfra_ssh_paramiko_connect_kwargs",
        "kwargs",
    ],
}
VALUES = {
    "pyinfra.api.facts:_MISSING_COMMAND_MARKER": str,
    "pyinfra.api.arguments:CONNECTOR_ARGUMENT_KEYS": (list, tuple, set, frozenset),
}
USERS = (
    "roles/shared/fact_batch.py, roles/shared/call_stack.py, roles/shared/host_key_check.py,"
    " roles/site/loading.py, roles/recording.py or lab/profile.py; see docs/layout.md"
)


def resolve(target: str):
    """The object named `module:attribute.path`, or a LookupError with the contract's line."""
    module, _, path = target.partition(":")
    value = importlib.import_module(module)
    for part in path.split("."):
        value = getattr(value, part, None)
        if value is None:
            raise LookupError(f"pyinfra contract: {target} is gone (relied on by {USERS})")
    return value


def name_problems() -> list[str]:
    problems = []
    for target, expected in sorted(CALLABLES.items()):
        try:
            found = list(inspect.signature(resolve(target)).parameters)
        except LookupError as error:
            problems.append(str(error))
            continue
        if found != expected:
            problems.append(f"pyinfra contract: {target} takes ({', '.join(found)}), expected ({', '.join(expected)})")
    for target, kind in sorted(VALUES.items()):
        try:
            value = resolve(target)
        except LookupError as error:
            problems.append(str(error))
            continue
        if not isinstance(value, kind):
            problems.append(f"pyinfra contract: {target} is a {type(value).__name__} now")
    from pyinfra.api import util
    from pyinfra_cli import cli

    # roles/shared/call_stack.py replaces these module globals of pyinfra's util: they must be what
    # the ordering reads (their signatures are inspect's, or call_stack's once config.py ran).
    if not {"stack", "getframeinfo"} <= set(util.get_operation_order_from_stack.__code__.co_names):
        problems.append(
            "pyinfra contract: pyinfra.api.util.get_operation_order_from_stack no longer reads stack and"
            " getframeinfo (roles/shared/call_stack.py replaces them)"
        )
    # The wrapper of roles/site/loading.py is reached only while the CLI looks the name up.
    if "make_inventory" not in cli._main.__code__.co_names:
        problems.append(
            "pyinfra contract: pyinfra_cli.cli no longer calls make_inventory (roles/site/loading.py wraps it)"
        )
    return problems


@pytest.fixture
def local_pyinfra(tmp_path, monkeypatch):
    """pyinfra's own API on its @local connector, the fact batch installed as config.py installs
    it, everything it patches restored afterwards, its memory in tmp_path."""
    from pyinfra.api import facts as pyinfra_facts

    from roles.shared import fact_batch

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("INFERENCE_HOST_FACT_BATCH", raising=False)
    monkeypatch.setattr(pyinfra_facts, "_get_fact", fact_batch._live_get_fact)
    for cls in fact_batch._command_classes():
        if "execute" in cls.__dict__:
            monkeypatch.setattr(cls, "execute", cls.__dict__["execute"])
    monkeypatch.setattr(fact_batch.atexit, "register", lambda function: None)
    for name, fresh in (
        ("_answers", {}),
        ("_fetched", set()),
        ("_asked", {}),
        ("stats", dict.fromkeys(fact_batch.stats, 0)),
    ):
        monkeypatch.setattr(fact_batch, name, fresh)
    return tmp_path


def _local_host():
    from pyinfra.api import Config, Inventory, State
    from pyinfra.api.connect import connect_all

    inventory = Inventory((["@local"], {}))
    state = State(inventory, Config())
    connect_all(state)
    return state, inventory.get_host("@local")


def _new_run() -> None:
    """What ends one pyinfra process and starts the next: the asked facts remembered, the run's
    answers gone."""
    from roles.shared import fact_batch

    fact_batch.remember()
    fact_batch._answers.clear()
    fact_batch._fetched.clear()
    fact_batch._asked.clear()


def fact_batch_problems(folder: Path) -> list[str]:
    """The batch answers a fact, an operation run through pyinfra's run path changes what it
    reads, and the next answer must be the new one ("an answer is never older than the last
    change")."""
    from pyinfra.api.operation import add_op
    from pyinfra.api.operations import run_ops
    from pyinfra.facts.files import File
    from pyinfra.operations import server

    from roles.shared import fact_batch

    fact_batch.install()
    made = folder / "made-by-an-operation"
    state, host = _local_host()
    host.get_fact(File, path=str(made))
    if not fact_batch._asked.get(host.name):
        return [
            "pyinfra contract: host.get_fact no longer reaches pyinfra.api.facts._get_fact, which"
            " roles/shared/fact_batch.py replaces: the fact batch is never asked"
        ]
    _new_run()
    state, host = _local_host()
    before = host.get_fact(File, path=str(made))
    if before is not None or fact_batch.stats["served"] != 1:
        return [f"pyinfra contract: the fact batch did not answer File (got {before!r}, {fact_batch.stats})"]
    add_op(state, server.shell, commands=[f"touch {made}"])
    run_ops(state)
    if not made.exists():
        return ["pyinfra contract: run_ops did not run the operation on @local"]
    if host.get_fact(File, path=str(made)) is None:
        return [
            "pyinfra contract: an operation's command ran without PyinfraCommand.execute, which"
            " roles/shared/fact_batch.py wraps to drop its answers: a fact answered from before the change"
        ]
    return []


def loader_problems(folder: Path) -> list[str]:
    """roles/site/loading.py reads an inventory file through pyinfra's own loader."""
    from roles.site import loading

    inventory = folder / "contract_inventory.py"
    inventory.write_text('gpu_nodes = [("@local", {"marker": 1})]\n')
    try:
        built = loading._pyinfra_inventory(inventory)
        groups = loading._LISTED_GROUPS.pop(str(inventory.resolve()), None)
    except Exception as error:
        return [f"pyinfra contract: roles/site/loading.py cannot load an inventory: {type(error).__name__}: {error}"]
    if groups != {"gpu_nodes": [("@local", {"marker": 1})]} or built.get_host("@local").data.marker != 1:
        return [f"pyinfra contract: roles/site/loading.py read the groups {groups!r} from {inventory.name}"]
    return []


def profile_problems(monkeypatch) -> list[str]:
    """lab/profile.py times a fact's command as the fact's and an operation's as the operation's."""
    from pyinfra.api.operation import add_op
    from pyinfra.api.operations import run_ops
    from pyinfra.connectors.local import LocalConnector
    from pyinfra.facts.server import Hostname
    from pyinfra.operations import server

    from lab import profile

    for method in ("run_shell_command", "put_file"):
        monkeypatch.setattr(LocalConnector, method, LocalConnector.__dict__[method])
    monkeypatch.setattr(profile, "_records", [])
    profile._wrap(LocalConnector, "run_shell_command")
    state, host = _local_host()
    host.get_fact(Hostname)
    add_op(state, server.shell, name="Contract probe", commands=["true"])
    run_ops(state)
    kinds = {(kind, what) for _, kind, what, _ in profile._records}
    wanted = {("fact", "Hostname"), ("op", "Contract probe")}
    if not wanted <= kinds:
        return [f"pyinfra contract: lab/profile.py saw {sorted(kinds)}, not {sorted(wanted)} (the frames it reads)"]
    return []


def _order_here(state, depth: int = 20):
    """Operation order pyinfra computes at this call, from `depth` frames deeper."""
    from pyinfra.api import util

    return _order_here(state, depth - 1) if depth else util.get_operation_order_from_stack(state)


def call_stack_problems(monkeypatch) -> list[str]:
    """The order from roles/shared/call_stack.py's frames is the order from inspect's."""
    from pyinfra.api import util

    from roles.shared import call_stack

    class DeployState:  # what get_operation_order_from_stack reads of the state
        current_deploy_filename = __file__  # this file's frames stand for the deploy file's
        current_op_file_number = 0

    monkeypatch.setattr(util, "stack", inspect.stack)  # pyinfra's own, whatever ran before
    monkeypatch.setattr(util, "getframeinfo", inspect.getframeinfo)
    orders = []
    for patched in (False, True):
        if patched:
            call_stack.install()
        orders.append(_order_here(DeployState))
    if orders[0] != orders[1] or len(orders[0]) < 20:
        return [f"pyinfra contract: roles/shared/call_stack.py orders operations {orders[1]}, pyinfra {orders[0]}"]
    return []


def contract_problems(folder: Path, monkeypatch) -> list[str]:
    return (
        name_problems()
        + fact_batch_problems(folder)
        + loader_problems(folder)
        + profile_problems(monkeypatch)
        + call_stack_problems(monkeypatch)
    )


def test_pyinfra_keeps_the_contract(local_pyinfra, monkeypatch):
    problems = contract_problems(local_pyinfra, monkeypatch)
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)


def test_pyinfra_is_the_tested_minor():
    from importlib.metadata import version

    assert version("pyinfra").startswith("3.10."), "pyproject.toml pins pyinfra to 3.10: test a new minor first"


# The simulated pyinfra releases. Each rewrites pyinfra's own function as a release would (its
# source with one call changed), so the rest of pyinfra runs as it is.


def _rewrite(module, name: str, old: str, new: str, **names):
    source = textwrap.dedent(inspect.getsource(getattr(module, name)))
    assert old in source, f"the plant no longer fits {module.__name__}.{name}"
    namespace = {**vars(module), **names}
    exec(compile(source.replace(old, new), module.__file__, "exec"), namespace)
    return namespace[name]


def _plant_exec_file_renamed(monkeypatch):
    from pyinfra_cli import inventory

    monkeypatch.setattr(inventory, "exec_file_v2", inventory.exec_file, raising=False)
    monkeypatch.delattr(inventory, "exec_file")


def _plant_get_fact_not_calling_get_fact(monkeypatch):
    from pyinfra.api import facts, host

    from roles.shared import fact_batch

    get_fact = _rewrite(
        facts, "get_fact", "return _get_fact(", "return _get_fact_v2(", _get_fact_v2=fact_batch._live_get_fact
    )
    monkeypatch.setattr(facts, "get_fact", get_fact)
    monkeypatch.setattr(host, "get_fact", get_fact)


def _unwatched_execute(command, *args, **kwargs):
    """A command run by what its execute wraps, the way a pyinfra that no longer calls execute()
    would run it."""
    execute = type(command).execute
    return getattr(execute, "__wrapped__", execute)(command, *args, **kwargs)


def _plant_commands_without_execute(monkeypatch):
    from pyinfra.api import operations

    run_host_op = _rewrite(
        operations,
        "_run_host_op",
        "command.execute(",
        "_unwatched_execute(command, ",
        _unwatched_execute=_unwatched_execute,
    )
    monkeypatch.setattr(operations, "_run_host_op", run_host_op)


PLANTS = {
    "exec_file renamed": (
        _plant_exec_file_renamed,
        [
            f"pyinfra contract: pyinfra_cli.inventory:exec_file is gone (relied on by {USERS})",
            "pyinfra contract: roles/site/loading.py cannot load an inventory: AttributeError:"
            " module 'pyinfra_cli.inventory' has no attribute 'exec_file'",
        ],
    ),
    "get_fact no longer calls _get_fact": (
        _plant_get_fact_not_calling_get_fact,
        [
            "pyinfra contract: host.get_fact no longer reaches pyinfra.api.facts._get_fact, which"
            " roles/shared/fact_batch.py replaces: the fact batch is never asked"
        ],
    ),
    "commands run without execute": (
        _plant_commands_without_execute,
        [
            "pyinfra contract: an operation's command ran without PyinfraCommand.execute, which"
            " roles/shared/fact_batch.py wraps to drop its answers: a fact answered from before the change"
        ],
    ),
}


@pytest.mark.parametrize("plant", sorted(PLANTS))
def test_a_simulated_pyinfra_change_fails_the_contract_in_one_line(plant, local_pyinfra, monkeypatch):
    planting, expected = PLANTS[plant]
    planting(monkeypatch)
    assert contract_problems(local_pyinfra, monkeypatch) == expected
