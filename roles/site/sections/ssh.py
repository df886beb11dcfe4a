"""pyinfra's SSH connector data (ssh_*), typed so that a mistake stops before connecting."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, ClassVar

from pydantic import AfterValidator, Field
from pydantic_core import PydanticCustomError

from roles.site.fields import (
    _RULE_TEXT,
    DNS_NAME_RE,
    PROJECT_ROOT,
    Section,
    check,
    is_ip,
    one_of,
    tcp_port,
)


def _key_file_exists(value: str) -> bool:
    """As pyinfra looks for it (pyinfra/connectors/ssh_util.py _resolve_key_paths, 3.x): the
    path with ~ expanded, then relative to the deploy's folder (the project root)."""
    key = Path(value).expanduser()
    return key.is_file() or (PROJECT_ROOT / key).is_file()


def _key_file_private(value: str) -> bool:
    """Only its owner can read or write it, the rule OpenSSH applies before it uses a private key
    (authfile.c sshkey_perm_ok: any of mode 077 is "UNPROTECTED PRIVATE KEY FILE", the key is
    ignored): refused here, so the deploy (paramiko, which does not check) and the health checks
    (OpenSSH, which refuses) agree, and a key others can copy is named before it is used."""
    key = Path(value).expanduser()
    key = key if key.is_file() else PROJECT_ROOT / key
    return not key.stat().st_mode & 0o077


# A name whose last label is all digits is no DNS name (RFC 3696 section 2: a top-level domain is
# never all-numeric): ssh and the resolver read 010.0.0.1 (octal: 8.0.0.1) and 167772161 (one
# 32-bit number: 10.0.0.1) as IPv4 addresses through inet_aton(3), so the host reached is not
# the one written, and two spellings of one address would pass as two hosts.
def _hostname_or_ip(value: str) -> str:
    if is_ip(value):
        return value
    if DNS_NAME_RE.match(value) is None:
        raise PydanticCustomError("inference_host", "{valid}", {"valid": "a DNS name or an IP address"})
    if value.rsplit(".", 1)[-1].isdigit():
        raise PydanticCustomError(
            "inference_host",
            "{valid}",
            {
                "valid": "a DNS name or an IP address; its last label is all digits, which ssh reads as an IPv4"
                " address through inet_aton(3) (010.0.0.1 is 8.0.0.1, 167772161 is 10.0.0.1)"
            },
        )
    return value


HOSTNAME_OR_IP = AfterValidator(_hostname_or_ip)
_RULE_TEXT[id(HOSTNAME_OR_IP)] = "a DNS name or an IP address"


class SshSettings(Section):
    """How pyinfra reaches the host over SSH: pyinfra's own connector data keys
    (pyinfra/connectors/ssh.py, 3.x), typed here so that a mistake stops before connecting.
    pyinfra's other ssh_* keys pass to it with the checks every value gets; ssh_password and
    ssh_key_password are refused (a password in clear: schema.PASSWORD_DATA). Unset: pyinfra's
    defaults (the inventory name, port 22, the local user, ~/.ssh/config), except host keys:
    checked strictly against the inventory's own known_hosts file (roles/site/host_keys.py)."""

    PREFIX: ClassVar[str] = "ssh_"

    hostname: Annotated[str, HOSTNAME_OR_IP] | None = Field(
        None, description=("The address pyinfra connects to, when the inventory name is not it.")
    )
    port: Annotated[int, tcp_port] | None = Field(None, description="The SSH port (pyinfra's default: 22).")
    user: (
        Annotated[
            str, check(re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.@-]*$").match, "a user name (letters, digits, _ . @ -)")
        ]
        | None
    ) = Field(None, description=("The SSH user (pyinfra's default: the local user or ~/.ssh/config)."))
    key: (
        Annotated[
            str,
            check(_key_file_exists, "an existing private key file on this machine"),
            check(
                _key_file_private,
                "a private key file only its owner can read (chmod 600 it; OpenSSH refuses a key open to others)",
            ),
        ]
        | None
    ) = Field(
        None,
        description=(
            "A private key file on the machine that runs pyinfra (~ expanded; a relative"
            " path from the current folder or the project root, where pyinfra looks)."
        ),
    )
    known_hosts_file: Annotated[str, check(lambda v: bool(v.strip()), "a file path")] | None = Field(
        None,
        description=(
            "The known_hosts file the host's SSH key is pinned in. Unset: `<inventory>.known_hosts`"
            " beside the inventory (inventory/prod.known_hosts), which the deploy fills for the guests it"
            " creates and `inference-host trust HOST` for the others (docs/security.md#host-keys)."
        ),
    )
    strict_host_key_checking: Annotated[str, one_of("yes", "no", "off", "accept-new", "ask")] | None = Field(
        None,
        description=(
            "pyinfra's host key policy. Unset: 'yes' (only a pinned key is accepted). Anything else"
            " trusts an unknown key (the first answer to the address) and needs"
            " ssh_host_key_checking_off_because."
        ),
    )
    host_key_checking_off_because: Annotated[str, check(lambda v: bool(v.strip()), "a reason in words")] | None = Field(
        None,
        description=(
            "Why this host may be reached without strict host key checking (required with"
            " ssh_strict_host_key_checking other than 'yes'; e.g. a throwaway test host)."
        ),
    )


def host_key_problem(strict: str | None, because: str | None) -> str | None:
    """Strict checking off without a written reason, as the part of a message after the host."""
    if strict in (None, "yes") or because:
        return None
    return (
        f"ssh_strict_host_key_checking = {strict!r} accepts a key that is not pinned"
        " (whatever answers first at the host's address);"
        " expected it unset (strict, against the inventory's known_hosts) or"
        " ssh_host_key_checking_off_because = '<why>' beside it"
    )
