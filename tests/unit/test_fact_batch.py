"""roles/shared/fact_batch.py: the facts a host was asked last run, asked in one command.

Run through pyinfra's own API on its @local connector (real /bin/sh, real files under tmp):
what the batch answers must equal what pyinfra's fact asks live, and an answer must never
outlive a change.
"""

from __future__ import annotations

import json
import subprocess

import pytest
from pyinfra.api import Config, FactBase, Inventory, State, StringCommand
from pyinfra.api import command as pyinfra_command
from pyinfra.api import facts as pyinfra_facts
from pyinfra.api.connect import connect_all
from pyinfra.context import ctx_host, ctx_state
from pyinfra.facts import files, server

from roles.shared import fact_batch


def run_sh(script: str) -> list[str]:
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True).stdout
    return [line.rstrip("\n") for line in out.splitlines()]


def test_each_command_keeps_its_own_lines_and_status():
    commands = [
        "printf 'a\\nb\\n'",  # ends with a newline
        "printf 'no newline'",  # the last line has none
        "true",  # no output
        "echo partial; exit 3",  # fails: not answered
        "echo '|pipe'  # a comment",  # a trailing comment must not eat the subshell's end
        f"echo '{fact_batch._MARK} 0 0'",  # output that looks like the marker
        "printf '\\n\\nx\\n\\n'",  # empty lines kept
        "cat",  # reads no stdin of the batch
    ]
    answers = fact_batch.parse_batch(run_sh(fact_batch.batch_script(commands)), len(commands))
    assert answers == {
        0: ["a", "b"],
        1: ["no newline"],
        2: [],
        4: ["|pipe"],
        5: [f"{fact_batch._MARK} 0 0"],
        6: ["", "", "x", ""],
        7: [],
    }


@pytest.fixture
def local(tmp_path, monkeypatch):
    """pyinfra's @local host, with the batch installed for this test only."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("INFERENCE_HOST_FACT_BATCH", raising=False)
    for name in ("_answers", "_asked"):
        monkeypatch.setattr(fact_batch, name, {})
    monkeypatch.setattr(fact_batch, "_fetched", set())
    monkeypatch.setattr(fact_batch, "stats", {"batches": 0, "served": 0, "dropped": 0})
    monkeypatch.setattr(fact_batch.atexit, "register", lambda f: None)
    monkeypatch.setattr(pyinfra_facts, "_get_fact", pyinfra_facts._get_fact)
    for cls in fact_batch._command_classes():
        if "execute" in cls.__dict__:
            monkeypatch.setattr(cls, "execute", cls.__dict__["execute"])
    fact_batch.install()
    inventory = Inventory((["@local"], {}))
    state = State(inventory, Config())
    connect_all(state)
    host = inventory.get_host("@local")
    commands = []
    real_run = type(host.connector).run_shell_command

    def counted(connector, command, **kwargs):
        commands.append(str(command))
        return real_run(connector, command, **kwargs)

    monkeypatch.setattr(type(host.connector), "run_shell_command", counted)
    with ctx_state.use(state), ctx_host.use(host):
        yield state, host, commands


def new_run(monkeypatch):
    """What a next run of the CLI starts with: what this one asked is remembered, nothing else."""
    fact_batch.remember()
    monkeypatch.setattr(fact_batch, "_answers", {})
    monkeypatch.setattr(fact_batch, "_asked", {})
    monkeypatch.setattr(fact_batch, "_fetched", set())


def ask(host, paths):
    # atime left out: the first run's sha1sum read the files, which moves it (relatime).
    def stat(p):
        found = host.get_fact(files.File, path=str(p))
        return found and {k: v for k, v in found.items() if k != "atime"}

    return (
        [stat(p) for p in paths]
        + [host.get_fact(files.Sha1File, path=str(p)) for p in paths]
        + [host.get_fact(files.Directory, path=str(paths[0].parent)), host.get_fact(server.Os)]
    )


def test_a_second_run_asks_in_one_command_and_gets_the_same_answers(local, tmp_path, monkeypatch):
    state, host, commands = local
    (tmp_path / "etc").mkdir()  # not tmp_path itself: the remembered questions go there
    paths = [tmp_path / "etc" / "a.conf", tmp_path / "etc" / "missing", tmp_path / "etc" / "b.conf"]
    paths[0].write_text("one\n")
    paths[2].write_text("two")
    live = ask(host, paths)
    assert len(commands) == 8  # pyinfra: one command per fact
    assert live[1] is None and live[4] is None and live[0]["size"] == 4 and len(live[3]) == 40
    new_run(monkeypatch)
    commands.clear()
    assert ask(host, paths) == live
    assert len(commands) == 1 and fact_batch.stats["served"] == 8


def test_an_answer_is_dropped_when_any_operation_runs_a_command(local, tmp_path, monkeypatch):
    state, host, commands = local
    path = tmp_path / "unit.conf"
    path.write_text("old\n")
    before = host.get_fact(files.Sha1File, path=str(path))
    new_run(monkeypatch)
    assert host.get_fact(files.Sha1File, path=str(path)) == before  # from the batch
    # An operation's command (what run_host_op executes) changes the file:
    StringCommand(f"echo new > {path}").execute(state, host, {"_shell_executable": "sh"})
    commands.clear()
    after = host.get_fact(files.Sha1File, path=str(path))
    assert after != before and len(commands) == 1  # asked live again, the new content
    assert fact_batch.stats["dropped"] == 1


def test_every_operation_command_kind_drops_answers(local):
    kinds = [
        cls
        for cls in fact_batch._command_classes()
        if "execute" in cls.__dict__ and cls is not pyinfra_command.PyinfraCommand
    ]
    assert {cls.__name__ for cls in kinds} >= {"StringCommand", "FileUploadCommand", "FunctionCommand"}
    assert all(getattr(cls.__dict__["execute"], "_drops_fact_batches", False) for cls in kinds)


class Failing(FactBase):
    """Returns the output of a command that exits 4 (pyinfra: a fact that cannot be loaded)."""

    def command(self, path):
        return f"echo {path}; exit 4"


def test_a_failing_or_unknown_fact_is_asked_live(local, tmp_path, monkeypatch):
    state, host, commands = local
    monkeypatch.setattr(fact_batch, "FACTS", set(fact_batch.FACTS))
    monkeypatch.setattr(fact_batch, "_BY_NAME", dict(fact_batch._BY_NAME))
    fact_batch.batched(Failing)
    assert host.get_fact(Failing, path="x", _ignore_errors=True) is None
    new_run(monkeypatch)
    commands.clear()
    assert host.get_fact(Failing, path="x", _ignore_errors=True) is None
    assert len(commands) == 2 and fact_batch.stats["served"] == 0  # the batch, then live
    host.get_fact(server.Date)  # a clock: never batched
    assert not any("Date" in json.dumps(e) for e in fact_batch._asked["@local"].values())


def test_what_is_remembered_is_the_questions_never_the_answers(local, tmp_path, monkeypatch):
    state, host, commands = local
    secret = tmp_path / "token"
    secret.write_text("hf_secret_value\n")
    assert host.get_fact(files.FileContents, path=str(secret)) == ["hf_secret_value"]
    fact_batch.remember()
    stored = (fact_batch.cache_dir() / "_local.json").read_text()
    assert "hf_secret_value" not in stored and str(secret) in stored


def test_turned_off_it_changes_nothing(monkeypatch):
    monkeypatch.setenv("INFERENCE_HOST_FACT_BATCH", "0")
    monkeypatch.setattr(pyinfra_facts, "_get_fact", pyinfra_facts._get_fact)
    original = pyinfra_facts._get_fact
    fact_batch.install()
    assert pyinfra_facts._get_fact is original


def test_a_host_asked_for_many_files_is_asked_in_batches_under_the_argument_limit(local, tmp_path, monkeypatch):
    # The replicas lab's monitor asks ~300 files: one script passed 128 KiB, and Linux refused
    # the connector's `sh -c SCRIPT` with E2BIG (MAX_ARG_STRLEN) before anything ran.
    state, host, commands = local
    folder = tmp_path / "etc" / ("deep-" * 30)
    folder.mkdir(parents=True)
    paths = [folder / f"file-{i:03d}.conf" for i in range(300)]
    for path in paths:
        path.write_text(path.name)
    live = [host.get_fact(files.Sha1File, path=str(p)) for p in paths]
    new_run(monkeypatch)
    commands.clear()
    assert [host.get_fact(files.Sha1File, path=str(p)) for p in paths] == live
    assert 1 < len(commands) < 30 and fact_batch.stats["served"] == 300
    assert max(len(c.encode()) for c in commands) < 128 * 1024


def test_the_chunks_keep_every_command_in_order():
    commands = [f"echo {i}" + " " * (i * 97 % 5000) for i in range(400)]
    chunks = fact_batch.script_chunks(commands)
    assert [c for chunk in chunks for c in chunk] == commands
    assert all(len(fact_batch.batch_script(chunk).encode()) < fact_batch.MAX_SCRIPT_BYTES + 5200 for chunk in chunks)
