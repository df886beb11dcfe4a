"""`inference-host status`: the script each host runs (bounded, quoted, valid shell) and the
reading of its answers, on output shaped as each tool prints it."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from inference_host import operations, rollback
from roles.shared.shell import sh
from roles.site import load_site
from tests.unit.conftest import PROJECT_ROOT

REPLICAS = PROJECT_ROOT / "inventory" / "lab_replicas.py"


@pytest.fixture(scope="module")
def site():
    return load_site(str(REPLICAS))


def _section(name: str, text: str, code: int) -> str:
    return f"{operations.SECTION}{name}\n{text}\n{operations.SECTION}rc {name} {code}\n"


def test_every_hosts_script_is_valid_shell_and_bounds_its_commands(site):
    for host in site.hosts.values():
        script = operations.status_script(site, host)
        subprocess.run(["sh", "-n", "-c", script], check=True, timeout=10)
        for line in script.splitlines():
            if any(tool in line for tool in ("nvidia-smi", "amtool", "systemctl", "readlink")):
                assert "timeout -s KILL" in line, line
            if "curl" in line:
                assert "-m 3" in line, line


def test_the_script_runs_and_its_sections_read_back(tmp_path):
    # Run for real with sh: commands that are not here (nvidia-smi) report their status, the
    # others answer; the reader finds every section with its exit status.
    script = operations.sections_script(
        {
            "clock": sh("date +%s"),
            "gone": operations.time_bounded(sh("no-such-tool-here")),
            "two": sh("printf 'a\\nb\\n'"),
            "unended": sh("printf 'no newline at the end, as curl -w writes'"),
        }
    )
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=10).stdout
    sections = operations.split_sections(out)
    assert sections["two"] == ("a\nb", 0)
    assert sections["unended"] == ("no newline at the end, as curl -w writes", 0)
    assert sections["gone"][1] == 127
    assert abs(int(sections["clock"][0]) - time.time()) < 5


def test_a_hung_command_is_killed_at_its_bound():
    script = operations.sections_script({"hang": operations.time_bounded(sh("sleep 30"), 1)})
    started = time.monotonic()
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=20).stdout
    assert time.monotonic() - started < 5
    assert operations.split_sections(out)["hang"][1] == 137


def test_reading_a_gpu_nodes_answer(site):
    node = site.group("gpu_nodes")[0]
    root = node.base.install_root
    out = (
        _section("clock", "1733356800", 0)
        + _section("uptime", "5000.50 9000.00", 0)
        + _section("current", f"{root}/envs/sglang-0.5.9-cu128-0123abcd", 0)
        + _section("kept", "sglang-0.5.9-cu128-0123abcd\nsglang-0.5.10-cu128-99ff00aa", 0)
        + _section(
            "unit",
            "ActiveState=active\nSubState=running\nActiveEnterTimestampMonotonic=4000500000",
            0,
        )
        + _section(
            "health",
            "# HELP inference_host_check_ok 1 passed\n"
            'inference_host_check_ok{suite="gpu",check="cuda works"} 0\n'
            'inference_host_check_ok{suite="server",check="chat answers"} 1\n'
            "inference_host_checks_last_run_timestamp_seconds 1733356500\n"
            "inference_host_checks_failed 1\n",
            0,
        )
        + _section("gpus", "0, 81000, 97887, 41\n1, 1, 97887, 35", 0)
        + _section("drained", "", 1)
    )
    status = operations.host_status(site, node, out)
    assert status.stack["active"] == "sglang-0.5.9-cu128" and status.stack["kept"] == ["sglang-0.5.10-cu128-99ff00aa"]
    assert status.stack["lock"] == f"{root}/locks/sglang-0.5.9-cu128-0123abcd.txt"
    assert status.engine["state"] == "active" and status.engine["up_seconds"] == pytest.approx(1000.0)
    assert status.health == {"verdict": "failed", "failed": 1, "failed_checks": ["cuda works"], "age_seconds": 300.0}
    assert status.gpus == {"count": 2, "memory_used_mib": 81001, "memory_total_mib": 195774, "temperature_c": [41, 35]}
    assert status.replica == {"drained_on_purpose": False}
    screen = operations.render([status], {node.name: "draining at gw (load 1)"})
    assert "failed (1 failed: cuda works), 5m 0s ago" in screen and "up 16m 40s" in screen
    assert "2, memory used 81001 of 195774 MiB, 35-41 C" in screen


def test_a_killed_nvidia_smi_and_a_missing_verdict_are_named(site):
    node = site.group("gpu_nodes")[0]
    out = _section("gpus", "", 137) + _section("health", "cat: x: No such file or directory", 1)
    status = operations.host_status(site, node, out)
    assert status.gpus["count"] is None and "no answer within 3 s" in status.gpus["problem"]
    assert status.health["verdict"] is None and "no periodic verdict yet" in status.health["problem"]
    assert status.stack["active"] is None


def test_reading_a_gateway_and_monitor_answer(site):
    from roles.shared.replicas import replicas, worker_url

    gateway = site.group("gateways")[0]
    first, second = replicas(site.hosts)
    workers = {
        "workers": [
            {"id": "1", "url": worker_url(first), "is_healthy": True, "status": "ready", "load": 0},
            {"id": "2", "url": worker_url(second), "is_healthy": True, "status": "draining", "load": 2},
        ],
        "total": 2,
    }
    from checks.server_checks import STATUS_MARKER

    alerts = [
        {"labels": {"alertname": "ChecksFailing", "severity": "critical"}, "status": {"state": "active"}},
        {"labels": {"alertname": "Silenced", "severity": "warning"}, "status": {"state": "suppressed"}},
    ]
    out = _section("workers", json.dumps(workers) + f"\n{STATUS_MARKER}200 0.004", 0) + _section(
        "alerts", json.dumps(alerts), 0
    )
    status = operations.host_status(site, gateway, out)
    assert [w["status"] for w in status.workers] == ["ready", "draining"]
    assert status.alerts == {"firing": [{"alertname": "ChecksFailing", "severity": "critical"}]}
    assert operations.worker_states(site, [status]) == {
        first.name: f"ready at {gateway.name} (load 0)",
        second.name: f"draining at {gateway.name} (load 2)",
    }
    status.workers = status.workers[:1]  # the drained entry dropped by smg after its settle time
    assert operations.worker_states(site, [status])[second.name] == "out (not listed)"


def test_an_unreachable_host_is_named_and_waited_for_no_longer_than_the_bound(monkeypatch):
    def hang(inventory, name, script, answer, timeout_s=None):
        time.sleep(30)

    monkeypatch.setattr(operations, "_on_host", hang)
    started = time.monotonic()
    answers = operations.run_everywhere("inventory/lab.py", {"a": "true", "b": "true"}, 1.0)
    assert time.monotonic() - started < 3
    assert answers["a"]["error"].startswith("no answer within 1 s; what to do: `ssh -v a true`")


# -- rollback -----------------------------------------------------------------------------------


def test_a_wedged_ssh_is_killed_not_left_running_after_status_exits(tmp_path):
    """An ssh that never connects (here a program named ssh that sleeps, as one stuck in a DNS
    lookup or on a wedged sshd): status answers for the other host within its bound, names the
    wedged one, and kills that ssh instead of leaving it running after it exits."""
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "ssh").write_text(f"#!/bin/sh\necho $$ >> {tmp_path}/ssh.pids\nexec sleep 1000\n")
    (folder / "ssh").chmod(0o755)
    inventory = tmp_path / "inventory.py"
    inventory.write_text('gpu_nodes = [("wedged.example.internal", {"ssh_user": "root"})]\n')
    program = (
        "from roles.site.testinfra import connection_data\n"  # loads pyinfra's inventory code first, as status does
        f"connection_data({str(inventory)!r}, 'wedged.example.internal')\n"
        "from inference_host import operations\n"
        f"scripts = {{'wedged.example.internal': 'true', '@local': 'echo {operations.SECTION}x'}}\n"
        f"answers = operations.run_everywhere({str(inventory)!r}, scripts, 4.0)\n"
        "print(answers['@local'].get('rc'), answers['wedged.example.internal']['error'])\n"
    )
    env = {**os.environ, "PATH": f"{folder}:{os.environ['PATH']}"}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", program], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert time.monotonic() - started < 30, done.stderr
    pids = [int(p) for p in (tmp_path / "ssh.pids").read_text().split()]
    time.sleep(0.5)
    alive = [pid for pid in pids if _running(pid)]
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    assert pids and not alive, f"ssh left running: {alive}"
    assert done.stdout.startswith("0 "), done.stdout + done.stderr  # the other host answered
    assert "`ssh -v wedged.example.internal true`" in done.stdout


def _running(pid: int) -> bool:
    """Whether the process runs (a zombie, killed and not yet reaped by PID 1, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_a_drain_whose_transport_never_connects_is_unreachable_within_the_bound(tmp_path, monkeypatch, capsys):
    """`inference-host drain` waited on its transport without a local bound: a `docker exec` (or
    an ssh) stuck before the host answers (here a program named docker that sleeps, as with a
    wedged dockerd) hung the command for ever."""
    import argparse
    import dataclasses

    from checks import bounded

    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "docker").write_text("#!/bin/sh\nexec sleep 1000\n")
    (folder / "docker").chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}:{os.environ['PATH']}")
    monkeypatch.setitem(bounded.KINDS, "connection", dataclasses.replace(bounded.KINDS["connection"], bound_s=1))
    import lab  # the replica's name under this worker's lab prefix (tests/conftest.py)

    replica, container = lab.pyinfra_name("rep-a"), lab.container_name("rep-a")
    args = argparse.Namespace(inventory=str(REPLICAS), replica=replica)
    started = time.monotonic()
    code = operations.drain(args, argparse.ArgumentParser())
    assert time.monotonic() - started < 10
    assert code == operations.UNREACHABLE
    line = capsys.readouterr().err.strip()
    assert line.startswith(f"{replica}: expected to reach docker://{container} within 1 s (connection)")
    assert "no session after 1 s, killed" in line


def test_the_active_line_is_replaced_and_reads_back_with_the_stack_loader(tmp_path):
    import yaml

    from roles.site.stack import load_stack

    text = (PROJECT_ROOT / "inventory" / "stack.yml").read_text()
    stack = load_stack(PROJECT_ROOT / "inventory" / "stack.yml")
    other = next(s for s in stack.stacks if s != stack.active.id)
    changed = rollback.with_active(text, other)
    assert yaml.safe_load(changed)["active"] == other
    assert changed.count("#") == text.count("#")  # the operator's comments stay
    (tmp_path / "stack.yml").write_text(changed)
    (tmp_path / "locks").symlink_to(PROJECT_ROOT / "inventory" / "locks")
    assert load_stack(tmp_path / "stack.yml").active.id == other
    # A nested `active:` (indented) is not the top-level key; two top-level ones are refused.
    assert rollback.with_active("a:\n  active: x\nactive: y  # why\n", "z") == "a:\n  active: x\nactive: z  # why\n"
    with pytest.raises(ValueError, match="found 2"):
        rollback.with_active("active: a\nactive: b\n", "c")


def test_the_rollback_target_is_the_newest_other_stack_kept_everywhere():
    stacks = ["new-cu128", "old-cu128", "older-cu128"]
    kept = {
        "gpu1": ["new-cu128-aaa", "old-cu128-bbb", "older-cu128-ccc"],
        "gpu2": ["new-cu128-aaa", "older-cu128-ccc", "old-cu128-bbb"],
    }
    assert rollback.rollback_target("new-cu128", stacks, kept, None) == "old-cu128"
    assert rollback.rollback_target("new-cu128", stacks, kept, "older-cu128") == "older-cu128"
    with pytest.raises(ValueError, match="not kept on gpu2"):
        rollback.rollback_target("new-cu128", stacks, {**kept, "gpu2": ["new-cu128-aaa"]}, None)
    with pytest.raises(ValueError, match="no stack 'nope'"):
        rollback.rollback_target("new-cu128", stacks, kept, "nope")
    with pytest.raises(ValueError, match="already the active"):
        rollback.rollback_target("new-cu128", stacks, kept, "new-cu128")
    with pytest.raises(ValueError, match="no environment of another stack"):
        rollback.rollback_target("new-cu128", stacks, {"gpu1": ["new-cu128-aaa"]}, None)


# -- rotate -------------------------------------------------------------------------------------


def test_rotate_replaces_the_value_in_the_vault_and_never_prints_it(tmp_path, monkeypatch, capsys):
    import io
    import os
    import stat
    import types

    from inference_host import cli, rotate
    from roles.site import vault
    from tests.unit.conftest import PASSWORD

    vault_file = tmp_path / "s.vault.yml"
    vault.set_secret(vault_file, "engine_api_key", "old-key-value-0123456789abcdef0123456789", PASSWORD)
    (tmp_path / "pw").write_bytes(PASSWORD)
    monkeypatch.setenv(vault.PASSWORD_FILE_ENV, str(tmp_path / "pw"))
    fake = types.SimpleNamespace(secrets_file=str(vault_file), secret_names=frozenset({"engine_api_key"}))
    monkeypatch.setattr(rotate, "_load", lambda parser, inventory: fake)
    monkeypatch.setattr("sys.stdin", io.StringIO("new-key-value-0123456789abcdef0123456789\n"))
    assert cli.main(["rotate", "inventory/lab.py", "engine_api_key", "--no-deploy"]) == 0
    out, err = capsys.readouterr()
    assert "new-key-value" not in out + err and "old-key-value-0123456789abcdef0123456789" not in out + err
    new = "new-key-value-0123456789abcdef0123456789"
    assert vault.decrypt_all(vault_file, password=PASSWORD) == {"engine_api_key": new}
    assert stat.S_IMODE(os.stat(vault_file).st_mode) == 0o600
    with pytest.raises(SystemExit) as done:
        cli.main(["rotate", "inventory/lab.py", "hf_tokn", "--no-deploy"])
    assert done.value.code == 2 and "expected one of: engine_api_key" in capsys.readouterr().err


def test_the_drained_marker_is_where_the_rolling_script_leaves_it():
    from roles.shared import layout

    script = (PROJECT_ROOT / "roles/serving/templates/inference-engine-rolling.j2").read_text()
    assert "drained_marker=${pending%.restart-pending}.drained" in script
    unit = "inference-engine"
    assert (
        layout.drained_marker_file(unit)
        == layout.restart_pending_file(unit).removesuffix(".restart-pending") + ".drained"
    )


class _Terminal(io.StringIO):
    def __init__(self, tty: bool):
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_a_long_wait_says_so_every_few_seconds_at_a_terminal_only():
    for tty in (True, False):
        stream = _Terminal(tty)
        with operations.progress("rep-a: drain", 600, stream=stream, every_s=0.2):
            time.sleep(1.1)
        lines = stream.getvalue().splitlines()
        if tty:
            assert 3 <= len(lines) <= 6, lines
            assert lines[0].startswith("rep-a: drain: 0 s, still waiting (at most 600 s)"), lines
        else:
            assert lines == []
