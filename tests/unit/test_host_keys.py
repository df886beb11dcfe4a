"""Pinned SSH host keys (docs/security.md#host-keys): strict checking against the inventory's own
known_hosts file by default, strict-off refused without a reason, `inference-host trust`, a
guest's key read on its node, and a changed key as one line with both fingerprints."""

from __future__ import annotations

import argparse
import base64
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from roles.site import SiteError, load_site
from roles.site import host_keys as keys
from tests.unit.conftest import PROJECT_ROOT, gpu_node

SITE = {"stack_file": "stack.yml"}


def _public_key(folder: Path, name: str = "host") -> str:
    """A real ed25519 public key line, made by OpenSSH's ssh-keygen."""
    path = folder / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", str(path)], check=True)
    return (folder / f"{name}.pub").read_text()


def _ssh_keygen_fingerprint(public_key: str) -> str:
    listed = subprocess.run(["ssh-keygen", "-lf", "-"], input=public_key, capture_output=True, text=True, check=True)
    return listed.stdout.split()[1]


# -- the site model: the pin's settings in every SSH host's data ---------------------------------


def test_every_ssh_host_gets_the_inventorys_known_hosts_and_strict_checking(inventory):
    path = inventory.groups(gpu_nodes=[gpu_node("gpu1", **SITE)])
    site = load_site(path)
    assert site.hosts["gpu1"].ssh.known_hosts_file == str(path.with_name("site.known_hosts"))
    assert site.hosts["gpu1"].ssh.strict_host_key_checking == "yes"


def test_the_deploys_own_inventory_gets_them_too(inventory):
    """pyinfra's CLI builds its Inventory from the file's own globals once the file returns: the
    pin's settings must be in them (require_valid_inventory puts them there), not only in the
    model's copy."""
    from pyinfra.api import State
    from pyinfra.context import ctx_state
    from pyinfra_cli.inventory import make_inventory_from_files

    path = inventory.write(
        "from validation import require_valid_inventory\n"
        f"gpu_nodes = [{gpu_node('gpu1', **SITE)!r}]\n"
        "proxmox_hosts = ['pve']\n"
        "_names = ['pve']\n"  # a helper list naming a host stays as written
        "require_valid_inventory(__file__, globals())\n",
        name="cli.py",
    )
    with ctx_state.use(State()):
        built = make_inventory_from_files(str(path), cwd=str(PROJECT_ROOT))
    from pyinfra_cli.inventory import exec_file

    with ctx_state.use(State()):
        assert exec_file(str(path), return_locals=True)["_names"] == ["pve"]
    for name in ("gpu1", "pve"):  # a (name, data) entry and a bare name
        data = built.get_host(name).data
        assert data.get("ssh_known_hosts_file") == str(path.with_name("cli.known_hosts")), name
        assert data.get("ssh_strict_host_key_checking") == "yes", name


def test_the_health_checks_connect_with_the_pin(inventory):
    from checks.connection import ssh_config_text
    from roles.site.testinfra import connection_data

    path = inventory.groups(gpu_nodes=[gpu_node("gpu1", **SITE)])
    text = ssh_config_text("gpu1", connection_data(path, "gpu1"))
    assert f"UserKnownHostsFile {path.with_name('site.known_hosts')}" in text
    assert "StrictHostKeyChecking yes" in text


def test_a_connectors_host_and_an_explicit_setting_are_left_alone(tmp_path):
    assert keys.connection_defaults("@docker/ih-gpu", {}, tmp_path / "lab.py") == {}
    own = {"ssh_known_hosts_file": "/keys/known", "ssh_strict_host_key_checking": "yes"}
    assert keys.connection_defaults("gpu1", own, tmp_path / "prod.py") == {}
    assert keys.connection_defaults("gpu1", {}, tmp_path / "prod.py") == {
        "ssh_known_hosts_file": str(tmp_path / "prod.known_hosts"),
        "ssh_strict_host_key_checking": "yes",
    }


@pytest.mark.parametrize("strict", ["accept-new", "no", "off", "ask"])
def test_strict_checking_off_without_a_reason_is_refused_in_one_line(inventory, strict):
    path = inventory.groups(gpu_nodes=[gpu_node("gpu1", ssh_strict_host_key_checking=strict, **SITE)])
    with pytest.raises(SiteError) as error:
        load_site(path)
    lines = [p for p in error.value.problems if "ssh_strict_host_key_checking" in p]
    assert [line.split("inventory/", 1)[1] for line in lines] == [
        f"site.py: host gpu1: ssh_strict_host_key_checking = {strict!r} accepts a key that is not"
        " pinned (whatever answers first at the host's address); expected it unset (strict, against"
        " the inventory's known_hosts) or ssh_host_key_checking_off_because = '<why>' beside it"
    ]


def test_strict_checking_off_with_a_reason_is_accepted(inventory):
    path = inventory.groups(
        gpu_nodes=[
            gpu_node(
                "gpu1",
                ssh_strict_host_key_checking="no",
                ssh_host_key_checking_off_because="a throwaway test host, rebuilt every hour",
                **SITE,
            )
        ]
    )
    assert load_site(path).hosts["gpu1"].ssh.strict_host_key_checking == "no"


def test_prod_pins_every_host(tmp_path):
    site = load_site(PROJECT_ROOT / "inventory" / "prod.py")
    for host in site.hosts.values():
        assert host.ssh.strict_host_key_checking == "yes", host.name
        assert host.ssh.known_hosts_file == str(PROJECT_ROOT / "inventory" / "prod.known_hosts"), host.name


# -- the known_hosts file ------------------------------------------------------------------------


def test_fingerprint_is_ssh_keygens(tmp_path):
    public = _public_key(tmp_path)
    assert keys.parse_public_key(public, "test").fingerprint == _ssh_keygen_fingerprint(public)


def test_a_key_is_pinned_once_and_a_different_one_is_refused(tmp_path):
    known = tmp_path / "site.known_hosts"
    first = keys.parse_public_key(_public_key(tmp_path, "a"), "a")
    second = keys.parse_public_key(_public_key(tmp_path, "b"), "b")
    assert keys.record_key(known, "gpu1", first) is True
    assert keys.record_key(known, "gpu1", first) is False  # already pinned: unchanged
    assert keys.record_key(known, "[gpu2]:2222", second) is True
    with pytest.raises(keys.HostKeyError) as error:
        keys.record_key(known, "gpu1", second)
    assert first.fingerprint in str(error.value) and second.fingerprint in str(error.value)
    assert keys.recorded_key(known, "gpu1", "ssh-ed25519") == first
    assert keys.record_key(known, "gpu1", second, replace=True) is True
    assert known.read_text().splitlines() == [second.line("[gpu2]:2222"), second.line("gpu1")]
    # OpenSSH reads the file as written: ssh-keygen -F finds each pattern
    found = subprocess.run(["ssh-keygen", "-F", "[gpu2]:2222", "-f", str(known)], capture_output=True, text=True)
    assert second.blob in found.stdout


def test_a_key_under_another_type_or_not_a_key_is_refused():
    blob = base64.b64encode(b"\x00\x00\x00\x07ssh-rsa" + b"x" * 20).decode()
    with pytest.raises(keys.HostKeyError, match="says ssh-ed25519 but its blob is ssh-rsa"):
        keys.parse_public_key(f"ssh-ed25519 {blob}", "pasted")
    with pytest.raises(keys.HostKeyError, match="expected an SSH public key"):
        keys.parse_public_key("hello world", "pasted")


# -- inference-host trust ----------------------------------------------------------------------


def _trust(path: Path, host: str, key_file: Path, **options) -> tuple[int, str]:
    from inference_host.trust import trust

    args = argparse.Namespace(inventory=str(path), host=host, key_file=str(key_file), yes=False, replace=False)
    vars(args).update(options)
    parser = argparse.ArgumentParser()
    return trust(args, parser), ""


def test_trust_pins_after_confirmation_and_refuses_a_different_key(inventory, tmp_path, capsys, monkeypatch):
    path = inventory.groups(proxmox_hosts=[("pve", {"ssh_port": 2222, **SITE})])
    known = path.with_name("site.known_hosts")
    _public_key(tmp_path, "a"), _public_key(tmp_path, "b")
    first = keys.parse_public_key((tmp_path / "a.pub").read_text(), "a")
    # not a terminal and no --yes: shown, not pinned
    monkeypatch.setattr("sys.stdin.isatty", lambda: False)
    assert _trust(path, "pve", tmp_path / "a.pub")[0] == 2
    out = capsys.readouterr()
    assert first.fingerprint in out.out and "--yes" in out.err and not known.exists()
    # at a terminal, answered y
    monkeypatch.setattr("sys.stdin.isatty", lambda: True)
    monkeypatch.setattr("builtins.input", lambda question: "y")
    assert _trust(path, "pve", tmp_path / "a.pub")[0] == 0
    assert known.read_text() == first.line("[pve]:2222") + "\n"
    # once: the same key again changes nothing
    assert _trust(path, "pve", tmp_path / "a.pub", yes=True)[0] == 0
    assert "already pinned" in capsys.readouterr().out
    # a different key: refused, both fingerprints named, the pin kept
    second = keys.parse_public_key((tmp_path / "b.pub").read_text(), "b")
    assert _trust(path, "pve", tmp_path / "b.pub", yes=True)[0] == 1
    err = capsys.readouterr().err
    assert first.fingerprint in err and second.fingerprint in err and "--replace" in err
    assert known.read_text() == first.line("[pve]:2222") + "\n"
    assert _trust(path, "pve", tmp_path / "b.pub", yes=True, replace=True)[0] == 0
    assert known.read_text() == second.line("[pve]:2222") + "\n"


def test_trust_refuses_an_unknown_host_and_a_connectors_host(inventory, tmp_path):
    path = inventory.groups(gpu_nodes=[gpu_node("@docker/ih-gpu", **SITE)])
    with pytest.raises(SystemExit):
        _trust(path, "nohost", tmp_path / "a.pub")
    with pytest.raises(SystemExit):
        _trust(path, "@docker/ih-gpu", tmp_path / "a.pub")


# -- a guest's key read on its node ---------------------------------------------------------------


class _Node:
    """The node as a python.call callback sees it: run_shell_command answers with the key."""

    name = "pve"

    def __init__(self, stdout: str, ok: bool = True):
        self.answer = (ok, SimpleNamespace(stdout=stdout, stderr="" if ok else "no such file"))
        self.commands: list[str] = []
        self.logged: list[str] = []

    def run_shell_command(self, command):
        self.commands.append(str(command))
        return self.answer

    def log_styled(self, message, **kwargs):
        self.logged.append(message)


def test_a_created_guests_key_is_read_on_the_node_and_pinned(tmp_path):
    from roles.shared.guest_host_keys import _read_and_pin, read_lxc_key_command

    known = tmp_path / "prod.known_hosts"
    public = _public_key(tmp_path, "guest")
    node = _Node(public)
    command = read_lxc_key_command(201)
    assert command.startswith("pct exec 201 -- sh -c ")
    assert _read_and_pin(None, node, command, "LXC guest 201", str(known), "gpu-lxc", replace=True)
    assert known.read_text() == keys.parse_public_key(public, "").line("gpu-lxc") + "\n"
    # an unreadable key is one line on the node's output, nothing pinned; the node's operation
    # stands (a guest not ready is reported, not an error: nothing connects to it unpinned)
    failing = _Node("", ok=False)
    assert _read_and_pin(None, failing, command, "LXC guest 202", str(known), "gpu-vm", replace=True)
    assert "gpu-vm" not in known.read_text()
    assert "could not be read" in failing.logged[-1] and "inference-host trust" in failing.logged[-1]


# -- a KVM guest's key, read from its serial console on the node ----------------------------------


def _console(path: Path, lines: list[str], hold: threading.Event) -> threading.Thread:
    """QEMU's serial0 socket as the node has it: one reader, sent what the VM prints (tty line
    ends), then held open like a running VM's console until hold is set."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)

    def serve():
        connection, _ = server.accept()
        with connection, server:
            connection.sendall("".join(f"{line}\r\n" for line in lines).encode())
            hold.wait(30)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


def _first_boot(public: str) -> list[str]:
    """What an Ubuntu cloud image prints on ttyS0 around cloud-init's keys (keys_to_console)."""
    return [
        "[  12.345678] cloud-init[812]: Cloud-init v. 24.1 running 'modules:final'",
        "<14>Dec  7 04:30:01 ec2: -----BEGIN SSH HOST KEY FINGERPRINTS-----",
        "<14>Dec  7 04:30:01 ec2: 256 SHA256:abc root@gpu-vm (ED25519)",
        "<14>Dec  7 04:30:01 ec2: -----END SSH HOST KEY FINGERPRINTS-----",
        "-----BEGIN SSH HOST KEY KEYS-----",
        "ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTY= root@gpu-vm",
        public,
        "-----END SSH HOST KEY KEYS-----",
        "gpu-vm login: ",
    ]


def test_a_vms_key_is_read_from_its_serial_console_and_the_reader_stops_at_the_block(tmp_path):
    from roles.shared.guest_host_keys import console_key, read_console_keys_command, read_kvm_console_key_command

    public = _public_key(tmp_path, "vm").strip()
    path = Path(tempfile.mkdtemp(prefix="ih-")) / "102.serial0"  # AF_UNIX paths are short
    hold = threading.Event()
    _console(path, _first_boot(public), hold)
    started = time.monotonic()
    run = subprocess.run(
        ["sh", "-c", read_console_keys_command(str(path), 20)], capture_output=True, text=True, timeout=30
    )
    hold.set()
    assert run.returncode == 0, run.stderr
    assert time.monotonic() - started < 10  # done at the block's end, the console still open
    assert console_key(run.stdout, "vm") == public
    assert "login" not in run.stdout and "FINGERPRINTS" not in run.stdout
    assert read_kvm_console_key_command(102).startswith("perl -e ")
    assert "/var/run/qemu-server/102.serial0 1200 " in read_kvm_console_key_command(102)


def test_a_silent_console_is_a_bounded_wait_with_a_named_failure(tmp_path):
    from roles.shared.guest_host_keys import read_console_keys_command

    path = Path(tempfile.mkdtemp(prefix="ih-")) / "103.serial0"
    hold = threading.Event()
    _console(path, ["[    0.000000] Linux version 6.8.0"], hold)
    run = subprocess.run(
        ["sh", "-c", read_console_keys_command(str(path), 1)], capture_output=True, text=True, timeout=30
    )
    hold.set()
    assert run.returncode != 0
    assert f"no SSH host keys on {path} within 1 s" in run.stderr
    missing = subprocess.run(
        ["sh", "-c", read_console_keys_command(str(path.with_name("none")), 1)], capture_output=True, text=True
    )
    assert missing.returncode != 0 and "cannot connect to" in missing.stderr


class _Nodes(_Node):
    """A node answering each command in turn (the start, then the console)."""

    def __init__(self, *answers: tuple[bool, str, str]):
        super().__init__("")
        self.answers = [(ok, SimpleNamespace(stdout=out, stderr=err)) for ok, out, err in answers]

    def run_shell_command(self, command):
        self.commands.append(str(command))
        return self.answers.pop(0)


def test_a_created_vm_is_started_then_its_console_key_replaces_an_old_pin(tmp_path):
    from roles.shared.guest_host_keys import _start_and_pin

    known = tmp_path / "prod.known_hosts"
    old = keys.parse_public_key(_public_key(tmp_path, "destroyed"), "")
    known.write_text(old.line("10.0.0.22") + "\n")
    public = _public_key(tmp_path, "vm").strip()
    node = _Nodes((True, "", ""), (True, "\r\n".join(_first_boot(public)), ""))
    assert _start_and_pin(None, node, "qm start 102", "perl -e READ", "KVM guest 102", str(known), "10.0.0.22")
    assert node.commands == ["qm start 102", "perl -e READ"]  # the console read right after the start
    assert known.read_text() == keys.parse_public_key(public, "").line("10.0.0.22") + "\n"


def test_a_vm_that_does_not_start_or_prints_no_key_is_one_line_and_no_pin(tmp_path):
    from roles.shared.guest_host_keys import _start_and_pin

    known = tmp_path / "prod.known_hosts"
    refused = _Nodes((False, "", "IOMMU not present\nKVM guest 102: the node has no IOMMU ..."))
    assert not _start_and_pin(None, refused, "qm start 102", "perl -e READ", "KVM guest 102", str(known), "vm")
    assert refused.commands == ["qm start 102"] and "IOMMU not present" in refused.logged[0]
    silent = _Nodes((True, "", ""), (False, "", "no SSH host keys on /var/run/qemu-server/102.serial0 within 1200 s"))
    assert _start_and_pin(None, silent, "qm start 102", "perl -e READ", "KVM guest 102", str(known), "vm")
    assert "within 1200 s" in silent.logged[0] and "inference-host trust" in silent.logged[0]
    no_ed25519 = [line for line in _first_boot("ssh-ed25519 AAAA root@vm") if not line.startswith("ssh-ed25519")]
    blacklisted = _Nodes((True, "", ""), (True, "\r\n".join(no_ed25519), ""))
    assert not _start_and_pin(None, blacklisted, "qm start 102", "perl -e READ", "KVM guest 102", str(known), "vm")
    assert "found 0" in blacklisted.logged[0] and "inference-host trust" in blacklisted.logged[0]
    assert not known.exists()


# -- a changed key while pyinfra connects ----------------------------------------------------------


def test_a_changed_key_is_one_line_with_both_fingerprints_and_stops_the_deploy(tmp_path, monkeypatch):
    import paramiko
    from pyinfra.api.exceptions import ConnectError
    from pyinfra.connectors.sshuserclient import client

    from roles.shared import host_key_check
    from roles.shared.refusal import Refused

    pinned, presented = paramiko.ECDSAKey.generate(), paramiko.ECDSAKey.generate()

    def answered_by_another(self, hostname, **kwargs):
        raise paramiko.BadHostKeyException(hostname, presented, pinned)

    monkeypatch.setattr(client.SSHClient, "connect", answered_by_another)
    monkeypatch.setattr(host_key_check, "CHANGED", {})
    host_key_check.install()
    with pytest.raises(ConnectError) as error:
        client.SSHClient().connect("10.0.0.5", _pyinfra_ssh_known_hosts_file="/site/prod.known_hosts")
    line = str(error.value)
    as_key = keys.HostKey  # the fingerprints as ssh-keygen -l prints them
    for key in (pinned, presented):
        assert as_key(key.get_name(), base64.b64encode(key.asbytes()).decode()).fingerprint in line
    assert "10.0.0.5" in line and "/site/prod.known_hosts" in line and "\n" not in line
    with pytest.raises(Refused) as stopped:
        host_key_check.refuse_changed()
    assert str(stopped.value) == line


def test_an_unpinned_key_is_one_line_that_says_how_to_pin(monkeypatch):
    import paramiko
    from pyinfra.api.exceptions import ConnectError
    from pyinfra.connectors.sshuserclient import client

    from roles.shared import host_key_check

    def unknown(self, hostname, **kwargs):
        raise paramiko.SSHException(f"StrictPolicy: No host key for {hostname} found in known_hosts")

    monkeypatch.setattr(client.SSHClient, "connect", unknown)
    monkeypatch.setattr(host_key_check, "CHANGED", {})
    host_key_check.install()
    with pytest.raises(ConnectError, match="no SSH host key of gpu1 is pinned in /k.*inference-host trust"):
        client.SSHClient().connect("gpu1", _pyinfra_ssh_known_hosts_file="/k")
    host_key_check.refuse_changed()  # an unpinned host is no reason to stop the others
