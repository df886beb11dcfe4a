"""The lab's pyinfra connector (lab/pyinfra-connector) under pyinfra's own connect_all: hosts
connect in parallel greenlets, the lab is brought up once per process, the running container's
address reaches the deploy's site, and everything else goes through pyinfra's docker connector.

Substituted (no Docker here): lab.up, the stand-in servers' serve(), the container's address,
and the docker connector's connect (its `docker container inspect`). Each records its calls and
yields to the other greenlets (gevent.sleep) as a real `docker` subprocess would.
"""

from __future__ import annotations

import io

import gevent
import pytest
from pyinfra.api import Config, Inventory, State
from pyinfra.api.connect import connect_all
from pyinfra.connectors.docker import DockerConnector
from pyinfra.context import ctx_state

import lab
from lab.standins import hf_hub
from lab.standins.nvidia_apt_repo import repo as nvidia_apt


@pytest.fixture
def lab_calls(monkeypatch):
    calls = []

    def up(roles=lab.MAIN_LAB):
        calls.append(("up", tuple(roles)))
        gevent.sleep(0.05)  # another host's greenlet runs meanwhile
        return [lab.container_name(r) for r in roles]

    def serve(name):
        def served(prefix, **kwargs):
            calls.append(("serve", name))
            gevent.sleep(0.05)
            return f"http://172.17.0.1:1/{name}"

        return served

    monkeypatch.setattr(lab, "up", up)
    monkeypatch.setattr(nvidia_apt, "serve", serve("nvidia-apt"))
    monkeypatch.setattr(hf_hub, "serve", serve("hf-hub"))
    monkeypatch.setattr(lab, "container_address", lambda role: f"172.17.0.{50 + list(lab.HOSTS).index(role)}")
    monkeypatch.setattr(lab, "_brought_up", set())
    monkeypatch.setattr(lab, "_served", set())
    monkeypatch.setattr(lab, "CONNECT", "docker")
    monkeypatch.setattr(
        DockerConnector, "connect", lambda self: calls.append(("docker", self.data["docker_identifier"]))
    )
    return calls


def _connected(hosts: list[tuple[str, dict]]) -> State:
    inventory = Inventory((hosts, {}))
    state = State(inventory, Config(PARALLEL=10))
    with ctx_state.use(state):
        connect_all(state)
    return state


def test_hosts_connecting_at_once_bring_the_lab_up_once(lab_calls):
    state = _connected([("@lab/gpu", {}), ("@lab/pve", {})])
    assert all(host.connected for host in state.inventory)
    ups = [call for call in lab_calls if call[0] == "up"]
    # The node needs its guest's container: brought up first, by whichever connected first; never twice.
    assert sorted(role for _, roles in ups for role in roles) == ["gpu", "pve"], lab_calls
    assert [call for call in lab_calls if call[0] == "serve"] == [("serve", "nvidia-apt"), ("serve", "hf-hub")]
    assert sorted(call for call in lab_calls if call[0] == "docker") == [
        ("docker", lab.container_name("gpu")),
        ("docker", lab.container_name("pve")),
    ]


def test_a_host_named_by_its_address_gets_the_running_containers(lab_calls):
    """The replicas' ssh_hostname: the recorded (here stale) address at load, the live one once
    connected, which is what the deploy's site (built after connecting) reads."""
    from roles.site import address_of
    from roles.site.loading import site_from_inventory

    state = _connected([("@lab/rep-a", {"ssh_hostname": "172.17.0.250"}), ("@lab/gw", {})])
    rep_a = state.inventory.get_host(lab.pyinfra_name("rep-a"))
    assert rep_a.data.ssh_hostname == lab.container_address("rep-a")
    gateway = state.inventory.get_host(lab.pyinfra_name("gw"))
    assert gateway.data.get("ssh_hostname") is None  # not named by address: left alone
    assert [call for call in lab_calls if call[0] == "serve"] == [("serve", "nvidia-apt")]  # no Hub here
    site = site_from_inventory(state.inventory, "inventory/lab_replicas.py")
    assert address_of(site.hosts[rep_a.name]) == lab.container_address("rep-a")


def test_a_failed_bring_up_fails_that_host_only_in_one_line(lab_calls, monkeypatch):
    def broken(roles=lab.MAIN_LAB):
        raise lab.LabError("no Docker engine answers `docker info`; start one (docs/lab.md: Prerequisites)")

    monkeypatch.setattr(lab, "up", broken)
    state = _connected([("@lab/gpu", {}), ("@local", {})])
    assert not state.inventory.get_host(lab.pyinfra_name("gpu")).connected
    assert state.inventory.get_host("@local").connected
    assert state.failed_hosts == {state.inventory.get_host(lab.pyinfra_name("gpu"))}


def test_commands_and_files_go_through_the_hosts_open_shell(lab_calls, monkeypatch):
    """By default a command and a small upload go through one `docker exec -i <container> sh` per
    host (shell.py), with pyinfra's own wrapping of the command; pyinfra's per-command docker exec
    is not used."""
    from inference_host_lab_connector.shell import ShellSession

    seen = []
    monkeypatch.delenv("INFERENCE_HOST_LAB_SHELL", raising=False)
    monkeypatch.setattr(
        DockerConnector, "run_shell_command", lambda *a, **kw: pytest.fail("docker exec per command was used")
    )
    monkeypatch.setattr(DockerConnector, "put_file", lambda *a, **kw: pytest.fail("docker cp was used"))
    monkeypatch.setattr(
        ShellSession, "run", lambda self, command, timeout=None: seen.append((self.argv, command)) or (0, ["ok"], [])
    )
    monkeypatch.setattr(
        ShellSession, "put", lambda self, data, dest: seen.append((self.argv, dest, data)) or (0, [], [])
    )
    state = _connected([("@lab/gpu", {})])
    host = state.inventory.get_host(lab.pyinfra_name("gpu"))
    host.connector.delegate.container_id = "c0ffee"
    with ctx_state.use(state):
        status, output = host.run_shell_command("true", _timeout=5)
        assert status and output.stdout == "ok"
        assert host.put_file(io.BytesIO(b"data"), "/tmp/x")
    shell = ["docker", "exec", "-i", "c0ffee", "sh"]
    assert seen == [(shell, "sh -c true"), (shell, "/tmp/x", b"data")]


def test_with_lab_shell_exec_commands_and_files_go_through_pyinfras_docker_connector(lab_calls, monkeypatch):
    monkeypatch.setenv("INFERENCE_HOST_LAB_SHELL", "exec")
    seen = []
    monkeypatch.setattr(
        DockerConnector,
        "run_shell_command",
        lambda self, command, **kw: seen.append(("run", self.data["docker_identifier"], command)) or (True, None),
    )
    monkeypatch.setattr(
        DockerConnector,
        "put_file",
        lambda self, source, dest, *a, **kw: seen.append(("put", self.data["docker_identifier"], dest)) or True,
    )
    state = _connected([("@lab/gpu", {})])
    host = state.inventory.get_host(lab.pyinfra_name("gpu"))
    with ctx_state.use(state):
        assert host.run_shell_command("true")[0]
        assert host.put_file("/dev/null", "/tmp/x")
    assert seen == [("run", lab.container_name("gpu"), "true"), ("put", lab.container_name("gpu"), "/tmp/x")]


def test_over_ssh_the_host_gets_its_address_and_sshd_before_pyinfras_ssh_connector(lab_calls, monkeypatch):
    from inference_host_lab_connector import LabConnector
    from pyinfra.connectors.ssh import SSHConnector

    monkeypatch.setattr(lab, "CONNECT", "ssh")
    monkeypatch.setattr(lab, "enable_ssh", lambda roles: lab_calls.append(("sshd", tuple(roles))))
    monkeypatch.setattr(SSHConnector, "connect", lambda self: lab_calls.append(("ssh", self.data["ssh_hostname"])))
    names = list(LabConnector.make_names_data("gpu"))
    assert names[0][0] == lab.container_name("gpu")  # the name pyinfra's ssh connector would have
    assert names[0][1]["ssh_known_hosts_file"] == str(lab.known_hosts_file())
    state = _connected([("@lab/gpu", {})])
    assert [c for c in lab_calls if c[0] in ("sshd", "ssh")] == [
        ("sshd", ("gpu",)),
        ("ssh", lab.container_address("gpu")),
    ]
    assert state.inventory.get_host(lab.container_name("gpu")).connected


def test_a_reconnect_keeps_the_connector_that_found_the_container_running(lab_calls, monkeypatch):
    """After the node's reboot pyinfra connects the host again: the docker connector that saw the
    container running at first (no_stop) must be the one asked, or a container caught mid-restart
    would be committed and removed on disconnect (pyinfra/connectors/docker.py disconnect)."""

    def connect(self):
        self.no_stop = getattr(self, "no_stop", False) or not lab_calls.count(("restarting",))
        self.container_id = self.data["docker_identifier"]

    monkeypatch.setattr(DockerConnector, "connect", connect)
    state = _connected([("@lab/pve", {})])
    host = state.inventory.get_host(lab.pyinfra_name("pve"))
    first = host.connector.delegate
    lab_calls.append(("restarting",))
    host.connected = False
    with ctx_state.use(state):
        host.connect()
    assert host.connector.delegate is first and first.no_stop
    assert [c for c in lab_calls if c[0] == "up"] == [("up", ("gpu", "pve"))]  # not brought up again
