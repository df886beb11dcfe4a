"""pyinfra's SSH connector data (ssh_*), typed so that a mistake stops before connecting."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, ClassVar

from pydantic import Field

from roles.site.fields import (
    DNS_NAME_RE,
    PROJECT_ROOT,
    Section,
    check,
    is_ip,
    tcp_port,
)


def _key_file_exists(value: str) -> bool:
    """As pyinfra looks for it (pyinfra/connectors/ssh_util.py _resolve_key_paths, 3.x): the
    path with ~ expanded, then relative to the deploy's folder (the project root)."""
    key = Path(value).expanduser()
    return key.is_file() or (PROJECT_ROOT / key).is_file()


HOSTNAME_OR_IP = check(lambda v: is_ip(v) or DNS_NAME_RE.match(v) is not None,
                       "a DNS name or an IP address")


class SshSettings(Section):
    """How pyinfra reaches the host over SSH: pyinfra's own connector data keys
    (pyinfra/connectors/ssh.py, 3.x), typed here so that a mistake stops before connecting.
    pyinfra's other ssh_* keys (ssh_password, ssh_known_hosts_file, ...) pass to it unchecked.
    Unset: pyinfra's defaults (the inventory name, port 22, the local user, ~/.ssh/config)."""

    PREFIX: ClassVar[str] = "ssh_"

    hostname: Annotated[str, HOSTNAME_OR_IP] | None = Field(None, description=(
        "The address pyinfra connects to, when the inventory name is not it."))
    port: Annotated[int, tcp_port] | None = Field(None, description="The SSH port (pyinfra's default: 22).")
    user: Annotated[str, check(re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.@-]*$").match,
                               "a user name (letters, digits, _ . @ -)")] | None = Field(None, description=(
        "The SSH user (pyinfra's default: the local user or ~/.ssh/config)."))
    key: Annotated[str, check(_key_file_exists, "an existing private key file on this machine")] | None = Field(
        None, description=("A private key file on the machine that runs pyinfra (~ expanded; a relative"
                           " path from the current folder or the project root, where pyinfra looks)."))
