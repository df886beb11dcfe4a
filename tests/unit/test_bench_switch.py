"""checks/bench_switch.py's A/B drop-ins, run by a real shell (bash, as on the host) against a
folder of the test's own, with systemctl a recorder: the assignment and the variant launcher
arrive as written, whatever they hold, and the unit is restarted by its name."""

from __future__ import annotations

import os
import shlex
import subprocess
from types import SimpleNamespace

import pytest

from checks import bench_switch

HOSTILE = 'NCCL_ALGO=Ring\'$(touch pwned)`touch pwned`; touch pwned \\n %s "x"'


@pytest.fixture
def node(tmp_path, monkeypatch):
    """A host whose commands run here: drop-ins in tmp_path/dropins, systemctl recorded."""
    folder = tmp_path / "dropins"
    stubs = tmp_path / "bin"
    stubs.mkdir()
    launcher = tmp_path / "launch"
    (stubs / "systemctl").write_text(
        "#!/bin/sh\n"
        f'printf "%s\\n" "$*" >> {shlex.quote(str(tmp_path / "systemctl.log"))}\n'
        f'[ "$2" = "-p" ] && echo "{{ path={launcher} ; argv[]={launcher} }}"\n'
        "exit 0\n"
    )
    (stubs / "systemctl").chmod(0o755)
    monkeypatch.setattr(bench_switch, "unit_dropin_dir", lambda unit: str(folder))
    monkeypatch.setattr(bench_switch, "_wait_healthy", lambda host, expect, timeout_s: None)
    work = tmp_path / "cwd"
    work.mkdir()

    def run(command):
        done = subprocess.run(
            ["sh", "-c", command],
            cwd=work,
            env={"PATH": f"{stubs}:/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=30,
        )
        return SimpleNamespace(rc=done.returncode, stdout=done.stdout, stderr=done.stderr)

    return SimpleNamespace(
        host=SimpleNamespace(run=run), folder=folder, launcher=launcher, log=tmp_path / "systemctl.log", work=work
    )


def test_an_assignment_reaches_the_env_file_as_written(node):
    expect = SimpleNamespace(unit_name="inference-engine")
    bench_switch.set_environment(node.host, expect, HOSTILE, 60)
    assert (node.folder / bench_switch.AB_ENV).read_text() == HOSTILE + "\n"
    assert (node.folder / bench_switch.AB_DROPIN).read_text() == (
        f"[Service]\nEnvironmentFile={node.folder}/{bench_switch.AB_ENV}\n"
    )
    assert node.log.read_text().splitlines() == ["daemon-reload", "restart -- inference-engine"]
    assert list(node.work.iterdir()) == []  # nothing ran: no `pwned`
    bench_switch.set_environment(node.host, expect, None, 60)
    assert list(node.folder.iterdir()) == []


def test_the_speculative_variant_runs_the_deployed_argv_read_back(node):
    server = ["/opt/ih envs/x/bin/python", "-m", "sglang.launch_server", "--model-path", "/models/k2 $(x)'"]
    node.launcher.write_text("#!/bin/sh\nexec " + shlex.join(server + ["--speculative-algorithm", "EAGLE3"]) + "\n")
    bench_switch.set_speculative(node.host, SimpleNamespace(unit_name="inference-engine"), False, 60)
    variant = (node.folder / bench_switch.SPEC_LAUNCHER).read_text()
    exec_line = variant.splitlines()[-1]
    assert shlex.split(exec_line.removeprefix("exec ")) == server
    assert os.access(node.folder / bench_switch.SPEC_LAUNCHER, os.X_OK)
    assert (node.folder / bench_switch.SPEC_DROPIN).read_text() == (
        f"[Service]\nExecStart=\nExecStart={node.folder}/{bench_switch.SPEC_LAUNCHER}\n"
    )
    assert list(node.work.iterdir()) == []
