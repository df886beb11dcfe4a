"""The node's continuation (roles/proxmox_host, continue_in_guests): the same command line runs
again as the next pass, numbered, and a guest it deployed no longer fails the pass before it."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pyinfra.context import ctx_state

from roles import proxmox_host


class _State:
    def __init__(self, hosts):
        self.hosts = {name: object() for name in hosts}
        self.failed_hosts = set(self.hosts.values())
        self.inventory = self

    def get_host(self, name):
        return self.hosts[name]


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setattr(proxmox_host, "_continued", [])
    monkeypatch.delenv(proxmox_host.PASS_ENV, raising=False)


def _run(monkeypatch, returncode):
    calls = []

    def run(command, env, check):
        calls.append((command, env[proxmox_host.PASS_ENV]))
        return subprocess.CompletedProcess(command, returncode)

    monkeypatch.setattr(proxmox_host.subprocess, "run", run)
    monkeypatch.setattr(sys, "argv", ["/venv/bin/pyinfra", "--json", "inventory/prod.py", "deploy.py"])
    return calls


def test_next_pass_is_the_same_command_line_numbered(monkeypatch):
    calls = _run(monkeypatch, 0)
    fake = _State(["ct", "other"])
    with ctx_state.use(fake):
        proxmox_host._next_pass("pve", ["ct"])
        proxmox_host._next_pass("pve2", ["ct"])  # a second node: its guests are in the same pass
    assert calls == [([sys.executable, "-m", "pyinfra", "-y", "--json", "inventory/prod.py", "deploy.py"], "2")]
    # pass 2 deployed ct: pass 1 (which could not connect to it) no longer counts it as failed
    assert fake.failed_hosts == {fake.hosts["other"]}


def test_a_failed_pass_fails_the_one_that_started_it(monkeypatch):
    _run(monkeypatch, 1)
    monkeypatch.setenv(proxmox_host.PASS_ENV, "2")
    fake = _State(["ct"])
    with ctx_state.use(fake), pytest.raises(RuntimeError, match="pass 3 of the deploy .* exit status 1"):
        proxmox_host._next_pass("pve", ["ct"])
    assert fake.failed_hosts == {fake.hosts["ct"]}
