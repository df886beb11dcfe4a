"""The plan of the first deploy on a host of main before the engine-neutral names (7c5257e;
roles/shared/legacy_layout.py): the old uv cache moves to the new root before the new root's
environment is built from the lock, and the one switch stops the old unit (and starts it again
if the new one fails its health gate). What the host then holds: tests/lab/test_sglang_engine.py."""

from __future__ import annotations

import os

from roles.shared.legacy_layout import LegacyEngineLayout, legacy_from_link
from tests.unit.test_gpu_stack_plans import plan

MIGRATING = ("inventory_migration_ubuntu2404.py", "@fake/gpu-migrating")
FRESH = ("inventory_ubuntu2404.py", "@fake/gpu-ubuntu2404")
LIBEXEC = "/usr/local/libexec/inference-host"


def test_the_old_root_is_read_from_the_old_units_link():
    old = legacy_from_link("/srv/engine/current/serving/sglang.service")
    assert (old.unit, old.root, old.unit_link, old.wants_link) == (
        "sglang.service",
        "/srv/engine",
        "/etc/systemd/system/sglang.service",
        "/etc/systemd/system/multi-user.target.wants/sglang.service",
    )
    assert legacy_from_link(None) is None
    assert legacy_from_link("/opt/inference-host/current/serving/inference-engine.service") is None
    # A host that kept the old unit name has nothing to migrate (the fact does not even look).
    assert LegacyEngineLayout().command(unit_name="sglang") == "true"


def test_the_cache_moves_before_the_new_environment_is_built():
    p = plan(*MIGRATING)
    move = p.index("mv -T -- /opt/sglang/uv-cache /opt/inference-host/uv-cache")
    build = next(i for i, c in enumerate(p.commands) if "uv pip sync" in c and "/opt/inference-host/envs/" in c)
    assert move < build


def test_the_one_switch_stops_the_old_unit():
    p = plan(*MIGRATING)
    switch = [c for c in p.commands if f"{LIBEXEC}/inference-engine-switch " in c]
    assert len(switch) == 1 and switch[0].endswith(" sglang.service"), switch
    assert f"{LIBEXEC}/inference-engine-switch inference-engine.service /opt/inference-host/current " in switch[0]


def test_a_fresh_host_plans_no_migration():
    p = plan(*FRESH)
    assert not any("uv-cache /opt/inference-host/uv-cache" in c or c.endswith(" sglang.service") for c in p.commands)
    assert any(f"{LIBEXEC}/inference-engine-switch inference-engine.service" in c for c in p.commands)


def _switch(tmp_path, *args, failing: str = ""):
    """Run the rendered switch script with a systemctl that logs its calls and fails to
    (re)start the units in `failing`; the current link lives in tmp_path."""
    import subprocess

    from roles.shared import templates

    bin_dir, log = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "systemctl").write_text(
        f'#!/bin/sh\necho "systemctl $*" >> {log}\n'
        f'case "$1" in restart|start) case " {failing} " in *" $2 "*) exit 1;; esac;; esac\nexit 0\n'
    )
    (bin_dir / "journalctl").write_text("#!/bin/sh\nexit 0\n")
    for tool in ("systemctl", "journalctl"):
        (bin_dir / tool).chmod(0o755)
    script = tmp_path / "switch"
    script.write_text(templates.render("roles/serving/templates/inference-engine-switch.j2"))
    script.chmod(0o755)
    result = subprocess.run(
        [str(script), *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
    )
    return result, (log.read_text().splitlines() if log.exists() else [])


def test_the_switch_stops_the_old_unit_right_before_the_new_one_starts(tmp_path):
    current, new = tmp_path / "current", tmp_path / "envs-new"
    result, calls = _switch(tmp_path, "inference-engine.service", str(current), str(new), "sglang.service")
    assert result.returncode == 0, result.stderr
    assert calls.index("systemctl stop sglang.service") < calls.index("systemctl restart inference-engine.service")
    assert os.readlink(current) == str(new)
    assert "systemctl start sglang.service" not in calls


def test_a_new_unit_that_never_gets_ready_hands_back_to_the_old_one(tmp_path):
    current, new = tmp_path / "current", tmp_path / "envs-new"
    result, calls = _switch(
        tmp_path,
        "inference-engine.service",
        str(current),
        str(new),
        "sglang.service",
        failing="inference-engine.service",
    )
    assert result.returncode == 3 and "sglang.service serves again" in result.stderr, result.stderr
    # The new unit stopped and off boot before the old one starts again.
    assert calls.index("systemctl stop inference-engine.service") < calls.index("systemctl start sglang.service")


def test_the_old_unit_failing_too_is_said(tmp_path):
    result, _ = _switch(
        tmp_path,
        "inference-engine.service",
        str(tmp_path / "current"),
        str(tmp_path / "e"),
        "sglang.service",
        failing="inference-engine.service sglang.service",
    )
    assert result.returncode == 4 and "ROLLBACK FAILED: sglang.service did not become ready" in result.stderr


# rename-script: keep (this file names the layout before the rename on purpose: /work/w24b-rename.sh skips it)
