"""How testinfra (tests/infra) reaches an inventory host."""

from __future__ import annotations

import os
from pathlib import Path

from roles.site.loading import _pyinfra_inventory


def testinfra_url(inventory_file: str | os.PathLike, host_name: str) -> str:
    """How testinfra reaches an inventory host (tests/infra): pyinfra's own connector, user, port."""
    data = _pyinfra_inventory(Path(inventory_file)).get_host(host_name).data
    if host_name.startswith("@docker/"):
        return "docker://" + host_name.removeprefix("@docker/")
    if host_name == "@local":
        return "local://"
    user = f"{data.get('ssh_user')}@" if data.get("ssh_user") else ""
    port = f":{data.get('ssh_port')}" if data.get("ssh_port") else ""
    return f"ssh://{user}{data.get('ssh_hostname') or host_name}{port}"


_VALIDATING: set[str] = set()
