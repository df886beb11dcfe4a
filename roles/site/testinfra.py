"""How testinfra (checks) reaches an inventory host."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from roles.site.loading import _pyinfra_inventory

# pyinfra 3's SSH connector data (pyinfra/connectors/ssh.py ConnectorData) that decides how a
# host is reached; the health checks connect with exactly these (checks/connection.py).
SSH_CONNECTION_KEYS = (
    "ssh_hostname",
    "ssh_port",
    "ssh_user",
    "ssh_key",
    "ssh_key_password",
    "ssh_password",
    "ssh_config_file",
    "ssh_known_hosts_file",
    "ssh_strict_host_key_checking",
    "ssh_allow_agent",
    "ssh_look_for_keys",
)


def connection_data(inventory_file: str | os.PathLike, host_name: str) -> dict[str, Any]:
    """The pyinfra connection settings of an inventory host (only those that are set)."""
    data = _pyinfra_inventory(Path(inventory_file)).get_host(host_name).data
    return {key: data.get(key) for key in SSH_CONNECTION_KEYS if data.get(key) is not None}


def testinfra_url(inventory_file: str | os.PathLike, host_name: str) -> str:
    """How testinfra reaches an inventory host without SSH options: docker, local, or a bare
    ssh:// URL (checks/connection.py adds pyinfra's key, known hosts and jump host)."""
    if host_name.startswith("@docker/"):
        return "docker://" + host_name.removeprefix("@docker/")
    if host_name == "@local":
        return "local://"
    data = connection_data(inventory_file, host_name)
    user = f"{data.get('ssh_user')}@" if data.get("ssh_user") else ""
    port = f":{data.get('ssh_port')}" if data.get("ssh_port") else ""
    return f"ssh://{user}{data.get('ssh_hostname') or host_name}{port}"
