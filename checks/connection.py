"""The health checks reach a host exactly as pyinfra does.

pyinfra 3's SSH connector (pyinfra/connectors/ssh.py and sshuserclient/client.py) connects
with the inventory's ssh_hostname, ssh_port, ssh_user, ssh_key, ssh_known_hosts_file and
ssh_strict_host_key_checking (default "accept-new"), and reads ssh_config_file (default
~/.ssh/config) for everything else, a ProxyJump/ProxyCommand jump host included. testinfra's
ssh backend runs OpenSSH, so the same settings are written as an OpenSSH client config for
the host, its explicit values first (OpenSSH keeps the first value it reads, as pyinfra lets
explicit data win over ssh_config), the user's config included after them for the rest:

    Host gpu-node.example.internal
        User root
        Port 2222
        IdentityFile /path/key
        IdentitiesOnly yes
        UserKnownHostsFile /path/known_hosts
        StrictHostKeyChecking accept-new
        BatchMode yes
    Host *
        Include /home/me/.ssh/config

and the URL becomes ssh://gpu-node.example.internal?ssh_config=<that file>. The file holds
paths only, never a secret, and is written 0600 under the user's temporary folder.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from roles import site as site_model

# pyinfra's values of ssh_strict_host_key_checking -> OpenSSH's (sshuserclient/client.py:
# "no"/"off" warn and continue, "yes" rejects unknown keys, "accept-new" adds unknown ones).
STRICT = {"yes": "yes", "no": "no", "off": "no", "accept-new": "accept-new", "ask": "ask"}


class SshSettingsError(site_model.SiteError):
    pass


def ssh_config_text(host_name: str, data: dict) -> str:
    hostname = data.get("ssh_hostname") or host_name
    problems = []
    if data.get("ssh_password"):
        problems.append(
            f"{host_name}: ssh_password is set; the health checks connect with OpenSSH in "
            "batch mode (keys only): use ssh_key"
        )
    strict = str(data.get("ssh_strict_host_key_checking") or "accept-new")
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
    user_config = Path(data.get("ssh_config_file") or "~/.ssh/config").expanduser()
    if user_config.is_file():
        lines += ["Host *", f"    Include {user_config}"]
    return "\n".join(lines) + "\n"


def testinfra_url(inventory_file: str, host_name: str, folder: Path | None = None) -> str:
    url = site_model.testinfra_url(inventory_file, host_name)
    if not url.startswith("ssh://"):
        return url
    data = site_model.connection_data(inventory_file, host_name)
    text = ssh_config_text(host_name, data)
    folder = folder or Path(tempfile.gettempdir()) / f"inference-host-ssh-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    path = folder / f"{hashlib.sha256(text.encode()).hexdigest()[:16]}.config"
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(text)
    hostname = data.get("ssh_hostname") or host_name
    return f"ssh://{hostname}?ssh_config={path}"
