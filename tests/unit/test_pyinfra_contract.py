"""The private parts of pyinfra the project relies on, held to the pinned minor (pyproject.toml:
pyinfra>=3.10,<3.11). A pyinfra release that renames or reshapes one fails here in one line
naming it, instead of as a strange deploy. docs/layout.md says what each patch does and why.

- roles/shared/fact_batch.py (installed by config.py): replaces pyinfra.api.facts._get_fact,
  builds fact commands with _make_command and _handle_fact_kwargs, reads _MISSING_COMMAND_MARKER,
  and wraps execute() on PyinfraCommand and its subclasses.
- roles/site/loading.py: reads pyinfra_cli.inventory's _get_groups_from_filename and
  _is_inventory_group, calls make_inventory_from_files, and wraps pyinfra_cli.cli.make_inventory
  so that a bad inventory is one line.
"""

from __future__ import annotations

import importlib
import inspect

import pytest

CALLABLES = {
    "pyinfra.api.facts:_get_fact": ["state", "host", "cls", "args", "kwargs", "ensure_hosts", "apply_failed_hosts"],
    "pyinfra.api.facts:_make_command": ["command_attribute", "host_args"],
    "pyinfra.api.facts:_handle_fact_kwargs": ["state", "host", "cls", "args", "kwargs"],
    "pyinfra.api.command:PyinfraCommand.execute": ["self", "state", "host", "connector_arguments"],
    "pyinfra_cli.inventory:_get_groups_from_filename": ["inventory_filename"],
    "pyinfra_cli.inventory:_is_inventory_group": ["key", "value"],
    "pyinfra_cli.inventory:make_inventory_from_files": [
        "inventory_filename",
        "override_data",
        "cwd",
        "group_data_directories",
    ],
    "pyinfra_cli.cli:make_inventory": ["inventory", "override_data", "cwd", "group_data_directories"],
}
VALUES = {
    "pyinfra.api.facts:_MISSING_COMMAND_MARKER": str,
    "pyinfra.api.arguments:CONNECTOR_ARGUMENT_KEYS": (list, tuple, set, frozenset),
}


def resolve(target: str):
    module, _, path = target.partition(":")
    value = importlib.import_module(module)
    for part in path.split("."):
        value = getattr(value, part, None)
        if value is None:
            pytest.fail(
                f"pyinfra contract: {target} is gone (relied on by roles/shared/fact_batch.py or "
                "roles/site/loading.py; see docs/layout.md)",
                pytrace=False,
            )
    return value


@pytest.mark.parametrize("target", sorted(CALLABLES))
def test_private_callable_keeps_its_signature(target):
    found = list(inspect.signature(resolve(target)).parameters)
    if found != CALLABLES[target]:
        pytest.fail(
            f"pyinfra contract: {target} takes ({', '.join(found)}), expected ({', '.join(CALLABLES[target])})",
            pytrace=False,
        )


@pytest.mark.parametrize("target", sorted(VALUES))
def test_private_value_keeps_its_type(target):
    value = resolve(target)
    if not isinstance(value, VALUES[target]):
        pytest.fail(f"pyinfra contract: {target} is a {type(value).__name__} now", pytrace=False)


def test_pyinfra_is_the_tested_minor():
    from importlib.metadata import version

    assert version("pyinfra").startswith("3.10."), "pyproject.toml pins pyinfra to 3.10: test a new minor first"
