"""The public behaviour of pyinfra the roles lean on, held on pyinfra's own @local connector
through its own run path (add_op, run_ops), for the pinned release (pyproject.toml pins it
exactly). test_pyinfra_contract.py holds the private parts the project patches; this file holds
what every role uses as documented:

- `_if=` (a callable, or pyinfra.operations.util.any_changed of operations) decides at run time
  whether an operation's commands run at all (the roles' restarts and rebuilds: ~40 uses);
- `OperationMeta.will_change` (a property, read while the deploy runs) answers before the run,
  `did_change()` after it, and a second run of the same state reports no change (the zero-change
  deploy rests on it);
- `files.put` detects change by content: the same bytes again are no change;
- `files.template(jinja_env_kwargs=...)` reaches jinja2's Environment, so the render-time
  encoding guards (roles/shared/templates.py: units, environment files, shell scripts) run.

A pyinfra release that changes one of these fails here by name instead of as a deploy that
restarts nothing, or everything, or writes an unguarded value.
"""

from __future__ import annotations

import io

import pytest


def _run(folder, build):
    """A fresh @local state (a new pyinfra process, in effect), the operations `build` adds, run."""
    from pyinfra.api import Config, Inventory, State
    from pyinfra.api.connect import connect_all
    from pyinfra.api.operations import run_ops

    inventory = Inventory((["@local"], {}))
    state = State(inventory, Config())
    connect_all(state)
    host = inventory.get_host("@local")
    from pyinfra.context import ctx_host, ctx_state

    metas = build(state, host)
    with ctx_state.use(state), ctx_host.use(host):  # as during a deploy: a property read in context
        before = {name: meta.will_change for name, meta in metas.items()}
    run_ops(state)
    return before, {name: meta.did_change() for name, meta in metas.items()}


def _op(state, host, operation, **kwargs):
    from pyinfra.api.operation import add_op

    return add_op(state, operation, **kwargs)[host]


def test_files_put_detects_change_by_content_and_a_second_run_changes_nothing(tmp_path):
    from pyinfra.operations import files

    dest = tmp_path / "put.txt"

    def build(state, host):
        return {"put": _op(state, host, files.put, src=io.StringIO("one\n"), dest=str(dest))}

    assert _run(tmp_path, build) == ({"put": True}, {"put": True})
    assert dest.read_text() == "one\n"
    assert _run(tmp_path, build) == ({"put": False}, {"put": False})
    dest.write_text("edited\n")
    assert _run(tmp_path, build) == ({"put": True}, {"put": True})


def test_if_runs_an_operation_only_when_what_it_follows_changed(tmp_path):
    from pyinfra.operations import files, server
    from pyinfra.operations.util import any_changed

    dest, marker, never = tmp_path / "conf", tmp_path / "restarted", tmp_path / "never"

    def build(state, host):
        conf = _op(state, host, files.put, src=io.StringIO("a\n"), dest=str(dest))
        restart = _op(state, host, server.shell, commands=[f"echo x >> {marker}"], _if=any_changed(conf))
        skipped = _op(state, host, server.shell, commands=[f"touch {never}"], _if=lambda: False)
        return {"conf": conf, "restart": restart, "skipped": skipped}

    _, changed = _run(tmp_path, build)
    assert changed["conf"] and changed["restart"] and not changed["skipped"]
    assert marker.read_text() == "x\n" and not never.exists()
    _, changed = _run(tmp_path, build)  # nothing new: the restart does not run again
    assert changed == {"conf": False, "restart": False, "skipped": False}
    assert marker.read_text() == "x\n"


def test_template_jinja_env_kwargs_reach_the_environment(tmp_path):
    """The finalize hook the roles pass is the one jinja2 applies to every `{{ ... }}`."""
    from pyinfra.operations import files

    template = tmp_path / "t.j2"
    template.write_text("value={{ value }}\n")
    dest = tmp_path / "out"

    def finalize(value):
        return f"<{value}>"

    def build(state, host):
        kwargs = {"finalize": finalize}
        return {
            "t": _op(state, host, files.template, src=str(template), dest=str(dest), value="v", jinja_env_kwargs=kwargs)
        }

    _run(tmp_path, build)
    assert dest.read_text() == "value=<v>\n"


def test_a_refusing_guard_stops_the_template_before_anything_is_written(tmp_path):
    """roles/shared/templates.py's shell-script guard, passed as the roles pass it: a plain str
    into launch.j2 stops the operation; the file is never written."""
    from pyinfra.api.exceptions import PyinfraError
    from pyinfra.operations import files

    from roles.shared import templates
    from roles.site import PROJECT_ROOT

    source = "roles/serving/templates/launch.j2"
    dest = tmp_path / "launch"

    def build(state, host):
        op = _op(
            state,
            host,
            files.template,
            src=str(PROJECT_ROOT / source),
            dest=str(dest),
            stack_id="s",
            engine_label="x",
            command="python $(id)",
            jinja_env_kwargs=templates.jinja_env_kwargs(source),
        )
        return {"t": op}

    with pytest.raises((PyinfraError, ValueError), match="not shell text|comment"):
        _run(tmp_path, build)
    assert not dest.exists()


def test_pyinfra_and_testinfra_are_pinned_exactly():
    """The contract tests hold one release each; a new one is taken on purpose (pyproject.toml)."""
    import tomllib

    from roles.site import PROJECT_ROOT

    dependencies = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = {d.split("==")[0]: d for d in dependencies if d.startswith(("pyinfra", "pytest-testinfra"))}
    assert pins == {"pyinfra": "pyinfra==3.10.0", "pytest-testinfra": "pytest-testinfra==10.2.2"}, pins
