"""The health checks reach a host exactly as pyinfra does.

pyinfra 3's SSH connector (pyinfra/connectors/ssh.py and sshuserclient/client.py) connects
with the inventory's ssh_hostname, ssh_port, ssh_user, ssh_key, ssh_known_hosts_file and
ssh_strict_host_key_checking (the site sets "yes" and the inventory's own known_hosts file for
every SSH host, roles/site/host_keys.py; data without them is checked strictly too), and reads
ssh_config_file (default ~/.ssh/config) for everything else, a ProxyJump/ProxyCommand jump host
included. testinfra's ssh backend runs OpenSSH, so the same settings are written as an OpenSSH client config for
the host, its explicit values first (OpenSSH keeps the first value it reads, as pyinfra lets
explicit data win over ssh_config), the user's config included after them for the rest:

    Host gpu-node.example.internal
        User root
        Port 2222
        IdentityFile /path/key
        IdentitiesOnly yes
        UserKnownHostsFile /path/known_hosts
        StrictHostKeyChecking yes
        BatchMode yes
        ServerAliveInterval 10
        ServerAliveCountMax 3
        ControlMaster auto
        ControlPath /tmp/inference-host-ssh-0/%C
        ControlPersist 60s
    Host *
        Include /home/me/.ssh/config

and the URL becomes ssh://gpu-node.example.internal?ssh_config=<that file>. The file holds
paths only, never a secret, and is written 0600 under the user's temporary folder.

The control lines: testinfra's ssh backend (testinfra/backend/ssh.py, 10.x) starts one `ssh`
per command and passes `-o ControlMaster=auto -o ControlPersist=60s`, but no ControlPath unless
told, and OpenSSH multiplexes only with one (ssh_config(5), ControlMaster): so every command of the
checks was a new connection (key exchange, authentication, a new session on the host: about a
third of a second each over the lab's real OpenSSH). With the path, the first command's connection
stays open as the master and the others are sessions on it, as pyinfra's own connector keeps one
connection per host. The socket lives in the same private folder (0700, this user's); `%C` is
OpenSSH's hash of the local host, remote host, port and user, and the name's prefix a hash of the
host's trust settings (key, known hosts, strict checking), since a session on a master is not
checked again; the master exits 60 s after the last command.
"""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
from pathlib import Path

from roles import site as site_model

# pyinfra's values of ssh_strict_host_key_checking -> OpenSSH's (sshuserclient/client.py:
# "no"/"off" warn and continue, "yes" rejects unknown keys, "accept-new" adds unknown ones).
STRICT = {"yes": "yes", "no": "no", "off": "no", "accept-new": "accept-new", "ask": "ask"}


class SshSettingsError(site_model.SiteError):
    pass


def ssh_config_path(path: Path, token: str = "") -> str:
    """A path as one argument of an OpenSSH client config line: double-quoted (ssh_config(5):
    "Arguments may optionally be enclosed in double quotes"), each `%` doubled (OpenSSH expands
    %-tokens in ControlPath), then `token` (e.g. "/%C") kept as OpenSSH's. A double quote or a
    line break cannot be written at all."""
    value = str(path)
    if any(bad in value for bad in ('"', "\n", "\r")):
        raise SshSettingsError([f"{value!r}: a path with a double quote or a line break cannot be an ssh_config value"])
    return '"' + value.replace("%", "%%") + token + '"'


def private_folder(folder: Path) -> Path:
    """folder, made 0700 if missing; refused unless it is this user's own directory that no one
    else may enter (the control socket in it is a way into the host)."""
    folder.mkdir(mode=0o700, exist_ok=True)
    found = folder.lstat()
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid() or found.st_mode & 0o077:
        raise SshSettingsError(
            [f"{folder}: not a folder of this user's that only it may enter (mode 0700); remove it and retry"]
        )
    return folder


def ssh_config_text(host_name: str, data: dict, control_dir: Path | None = None) -> str:
    hostname = data.get("ssh_hostname") or host_name
    problems = []
    if data.get("ssh_password"):
        problems.append(
            f"{host_name}: ssh_password is set; the health checks connect with OpenSSH in "
            "batch mode (keys only): use ssh_key"
        )
    # Strict when unset: never trust the first answer (the site model sets it; this is the floor).
    strict = str(data.get("ssh_strict_host_key_checking") or "yes")
    if strict not in STRICT:
        problems.append(
            f"{host_name}: ssh_strict_host_key_checking = {strict!r} is invalid; expected one of " + ", ".join(STRICT)
        )
    if problems:
        raise SshSettingsError(problems)
    lines = [f"# how pyinfra reaches {host_name} (inventory data), for the health checks", f"Host {hostname}"]
    if data.get("ssh_user"):
        lines.append(f"    User {data['ssh_user']}")
    if data.get("ssh_port"):
        lines.append(f"    Port {data['ssh_port']}")
    if data.get("ssh_key"):
        lines += [f"    IdentityFile {Path(data['ssh_key']).expanduser()}", "    IdentitiesOnly yes"]
    known_hosts = data.get("ssh_known_hosts_file")
    if known_hosts:
        lines.append(f"    UserKnownHostsFile {Path(known_hosts).expanduser()}")
    lines += [f"    StrictHostKeyChecking {STRICT[strict]}", "    BatchMode yes"]
    # A host lost mid-command (its network, its node) sends nothing more: without keepalives ssh
    # waits until the command's bound, and the overrun would be blamed on the command; with
    # them it exits 255 "Timeout, server ... not responding" after 3 x 10 s (ssh_config(5)).
    lines += ["    ServerAliveInterval 10", "    ServerAliveCountMax 3"]
    user_config = Path(data.get("ssh_config_file") or "~/.ssh/config").expanduser()
    tail = ["Host *", f"    Include {user_config}"] if user_config.is_file() else []
    if control_dir is not None:  # one connection for all of the checks' commands (the docstring)
        # A master is shared only by runs with the same trust settings (key, known hosts, strict
        # checking): a session on a master skips the host key check, so another inventory's
        # settings for the same host must not ride on it.
        trust = hashlib.sha256("\n".join(lines + tail).encode()).hexdigest()[:12]
        control = ssh_config_path(control_dir, f"/{trust}-%C")
        lines += ["    ControlMaster auto", f"    ControlPath {control}", "    ControlPersist 60s"]
    return "\n".join(lines + tail) + "\n"


def testinfra_url(inventory_file: str, host_name: str, folder: Path | None = None) -> str:
    url = site_model.testinfra_url(inventory_file, host_name)
    if not url.startswith("ssh://"):
        return url
    data = site_model.connection_data(inventory_file, host_name)
    folder = folder or Path(tempfile.gettempdir()) / f"inference-host-ssh-{os.getuid()}"
    private_folder(folder)
    text = ssh_config_text(host_name, data, control_dir=folder)
    path = folder / f"{hashlib.sha256(text.encode()).hexdigest()[:16]}.config"
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(text)
    hostname = data.get("ssh_hostname") or host_name
    return f"ssh://{hostname}?ssh_config={path}"
