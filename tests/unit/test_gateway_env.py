"""The gateway's environment: smg locked with hashes (roles/gateway/lock.py), the lock checked
for staleness when the inventory loads, installed exactly into a new stamped folder (plan), and
the role's template arguments."""

from __future__ import annotations

import dataclasses
import inspect
import json
import shlex
import subprocess
import sys
from pathlib import Path

from pyinfra.operations import files

from roles import gateway as gateway_role
from roles.gateway import lock as gateway_lock
from roles.shared import lock_compile
from roles.site import load_site
from roles.site import lock as site_lock
from tests.unit.conftest import (
    ADMIN,
    CLIENT_KEY,
    CONTROL,
    GATEWAY_PLAINTEXT,
    PROJECT_ROOT,
    ROLE_KEYS,
    SERVING_PLAINTEXT,
)
from tests.unit.test_engine_lock import _fake_uv
from tests.unit.test_gpu_stack_plans import PLANS, plan
from tests.unit.test_site import assert_names, only_problem, problems_of

STACK_FILE = PROJECT_ROOT / "inventory" / "stack.yml"
LOCK = STACK_FILE.parent / "locks" / "smg-1.13.0.txt"
GATEWAY = ("inventory_gateway_ubuntu2404.py", "@fake/gw-ubuntu2404")


def _site(inventory, gateway_data=None, name="gw.py"):
    inventory.vault(engine_api_key=CLIENT_KEY, **ROLE_KEYS)
    node = {
        "gpu_count": 8,
        "serving_host": "0.0.0.0",
        **SERVING_PLAINTEXT,
        "serving_api_key_secret": "engine_api_key",
        **ADMIN,
        "secrets_file": "secrets.vault.yml",
        "ssh_hostname": "10.0.0.1",
    }
    return inventory.groups(
        name,
        gpu_nodes=[("a", node)],
        gateways=[
            ("gw", {"secrets_file": "secrets.vault.yml", **CONTROL, **GATEWAY_PLAINTEXT, **(gateway_data or {})})
        ],
    )


def test_committed_gateway_lock_is_fresh_and_hashes_every_package():
    assert site_lock.stale_gateway_lock_problems(STACK_FILE, "inventory/stack.yml", {"1.13.0"}) == []
    text = LOCK.read_text()
    locked = site_lock.entries(text)
    # smg 1.13.0's Requires-Dist (its wheel's METADATA) and theirs.
    assert locked["smg"] == "1.13.0"
    assert {"setproctitle", "grpcio", "grpcio-health-checking", "pyyaml"} <= set(locked)
    body = text.split(site_lock.DIGEST_LINE, 1)[1].split("\n")[1:]
    starts = [i for i, line in enumerate(body) if "==" in line and not line[:1].isspace()]
    for start, end in zip(starts, [*starts[1:], len(body)], strict=True):
        assert "    --hash=sha256:" in "\n".join(body[start:end]), body[start]
    assert "# made by: uv run python -m roles.gateway.lock inventory/stack.yml 1.13.0" in text


def test_a_gateway_version_without_a_lock_is_one_clear_error(inventory):
    # (its command line was never captured either: a second problem, about roles/gateway/cli)
    problem = next(p for p in problems_of(_site(inventory, {"gateway_version": "1.12.0"})) if "lock" in p)
    assert_names(
        problem,
        "gateway_version 1.12.0",
        "no lock at locks/smg-1.12.0.txt",
        "uv run python -m roles.gateway.lock",
        "stack.yml 1.12.0`",
        "commit it",
    )


def test_an_edited_gateway_lock_target_is_stale(inventory):
    lock = inventory.dir / "locks" / "smg-1.13.0.txt"
    lock.write_text(lock.read_text().replace(site_lock.gateway_pins_digest("1.13.0"), "0" * 64))
    problem = only_problem(_site(inventory))
    assert_names(problem, "gateway_version 1.13.0", "smg==1.13.0, python 3.12", "changed since locks/smg-1.13.0.txt")


def test_an_inventory_without_gateways_needs_no_gateway_lock(inventory):
    (inventory.dir / "locks" / "smg-1.13.0.txt").unlink()
    load_site(inventory.groups(gpu_nodes=[("a", {"gpu_count": 8})]))


def test_gateway_lock_command_writes_a_lock_that_loading_accepts(tmp_path, monkeypatch, capsys):
    stack_file = tmp_path / "stack.yml"
    stack_file.write_text(STACK_FILE.read_text())
    body = site_lock.body(LOCK.read_text())
    monkeypatch.setattr(lock_compile, "uv_binary", lambda: _fake_uv(tmp_path, body))
    assert gateway_lock.main([str(stack_file), "1.13.0"]) == 0
    assert (tmp_path / "stdin").read_text().split() == ["smg==1.13.0"]
    argv = (tmp_path / "argv").read_text()
    assert_names(
        argv, "pip compile -", "--generate-hashes", "--python-version 3.12", "--python-platform x86_64-manylinux_2_39"
    )
    made = (tmp_path / "locks" / "smg-1.13.0.txt").read_text()
    assert made.endswith(body) and site_lock.stale_gateway_lock_problems(stack_file, "s", {"1.13.0"}) == []
    assert "smg 1.13.0: 7 packages locked" in capsys.readouterr().out


def test_gateway_lock_command_refuses_a_resolution_without_smg(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(
        lock_compile, "uv_binary", lambda: _fake_uv(tmp_path, "pyyaml==6.0.4 \\\n    --hash=sha256:00\n")
    )
    assert gateway_lock.main([str(STACK_FILE), "1.13.0"]) == 2
    assert "the resolution has no smg==1.13.0" in capsys.readouterr().err


def test_the_environment_folder_follows_the_lock_and_the_interpreter(inventory, monkeypatch):
    site = load_site(_site(inventory))
    gw = site.hosts["gw"]
    base = gateway_role.env_path(site, gw)
    assert base.startswith("/opt/smg/envs/smg-1.13.0-")
    other = dataclasses.replace(gw, gateway=gw.gateway.model_copy(update={"python": "/usr/bin/python3"}))
    assert gateway_role.env_path(site, other) != base
    original = site.stack.lock_text
    monkeypatch.setattr(
        type(site.stack), "lock_text", lambda self, name: original(name).replace("pyyaml==6.0.4", "pyyaml==6.0.3")
    )
    assert gateway_role.env_path(site, gw) != base


def test_bad_gateway_python_is_refused(inventory):
    problem = only_problem(_site(inventory, {"gateway_python": "python3"}))
    assert_names(problem, "gateway_python = 'python3'", "a Python version like 3.12 or an absolute path")


def test_gateway_install_is_exact_from_the_lock_into_a_new_folder():
    p = plan(*GATEWAY)
    build = next(c for c in p.commands if "uv pip sync" in c)
    lock = next(path for path in p.uploads if path.startswith("/opt/smg/locks/"))
    target = f"/opt/smg/envs/{Path(lock).stem}"
    assert p.uploads[lock] == site_lock.unsealed(LOCK.read_text())  # without its seal line
    assert_names(
        build,
        "umask 022;",
        f"uv venv --quiet --python 3.12 {target}.building",
        f"uv pip sync --quiet --require-hashes --compile-bytecode --python {target}.building/bin/python {lock}",
        "uv pip check",
        f"mv -T {target}.building {target}",
        "was not touched and still serves",
    )
    assert "pip install" not in build and "--index-url" not in build
    assert p.index(f"ln -s {target} /opt/smg/current") > p.commands.index(build)
    assert not any("python3 -m venv /opt/smg" in c for c in p.commands)


def test_template_arguments_leave_files_templates_own_keywords_alone(inventory):
    site = load_site(_site(inventory))
    own = set(inspect.signature(files.template).parameters) | {"user", "group", "mode", "src", "dest"}
    for path, _, _, kwargs in gateway_role.templates(site.hosts["gw"], site.hosts):
        assert not own & set(kwargs), (path, own & set(kwargs))


def test_the_service_user_has_no_home():
    p = plan(*GATEWAY)
    assert any(c.startswith("useradd ") and "-d /nonexistent" in c and " smg" in c for c in p.commands), p.commands
    assert not any(shlex.split(c)[:2] == ["mkdir", "-p"] and "/home/smg" in c for c in p.commands)


def test_the_gateway_starts_once_the_replicas_have_switched():
    """pyinfra orders each host's operations on its own: without the barrier (replicas_serving
    in deploy.py) smg started before the replicas, and the first requests through it got 404
    "No worker serves model" until smg's next worker check (30 s later, by default)."""
    done = subprocess.run(
        [sys.executable, str(PLANS / "record.py"), str(PLANS / GATEWAY[0]), "deploy.py"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    commands = [(r["host"], r.get("command", "")) for r in map(json.loads, done.stdout.splitlines())]
    switches = [
        i
        for i, (_, c) in enumerate(commands)
        if c.startswith("/usr/local/libexec/inference-host/inference-engine-rolling")
    ]
    start = commands.index(("@fake/gw-ubuntu2404", "systemctl start smg.service"))
    wait = next(i for i, (_, c) in enumerate(commands) if "/readiness" in c)
    assert len(switches) == 2 and max(switches) < start < wait
