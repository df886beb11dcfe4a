"""Operations that only read or tell report no change (roles/health, roles/shared/note.py):
pyinfra counts an operation as changed when its generator yields a command."""

from __future__ import annotations

import types
from inspect import getfullargspec

import pytest
from pyinfra.api import FunctionCommand

import roles.health as health
from roles.shared import note as note_module


@pytest.fixture
def executing(monkeypatch):
    def set_to(value: bool):
        monkeypatch.setattr(health, "state", types.SimpleNamespace(is_executing=value))
        monkeypatch.setattr(note_module, "state", types.SimpleNamespace(is_executing=value))

    return set_to


def commands(generator) -> list:
    return list(generator)


def test_verdict_runs_no_check_while_pyinfra_prepares(executing, monkeypatch):
    executing(False)
    monkeypatch.setattr(health, "run_checks", lambda *a: pytest.fail("checks ran while preparing"))
    assert commands(health.verdict._inner("inv.py", "h", ["service"])) == []


def test_passing_checks_yield_no_command(executing, monkeypatch):
    executing(True)
    ran = []
    monkeypatch.setattr(health, "run_checks", lambda *a: ran.append(a))
    assert commands(health.verdict._inner("inv.py", "h", ["service"])) == []
    assert ran == [("inv.py", "h", ["service"])]


def test_failing_checks_yield_a_command_that_fails(executing, monkeypatch):
    executing(True)
    monkeypatch.setattr(health, "run_checks", lambda *a: "health checks of h failed (exit 1)")
    (command,) = commands(health.verdict._inner("inv.py", "h", ["service"]))
    assert isinstance(command, FunctionCommand)
    logged = []
    host = types.SimpleNamespace(log_styled=lambda message, **style: logged.append(message))
    # pyinfra takes a callback's return value as its status when it takes state and host first
    # (FunctionCommand.execute): False fails the operation, with the message and no traceback.
    assert getfullargspec(command.function).args[:2] == ["state", "host"]
    assert command.function(None, host, *command.args, **command.kwargs) is False
    assert logged == ["health checks of h failed (exit 1)"]


def test_note_yields_nothing(executing, monkeypatch):
    logged = []
    monkeypatch.setattr(note_module, "logger", types.SimpleNamespace(info=logged.append))
    monkeypatch.setattr(note_module, "host", types.SimpleNamespace(print_prefix="[h] "))
    executing(False)
    assert commands(note_module.note._inner("job cap 2")) == [] and logged == []
    executing(True)
    assert commands(note_module.note._inner("job cap 2")) == [] and logged == ["[h] job cap 2"]
