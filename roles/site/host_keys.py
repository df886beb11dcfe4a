"""The site's pinned SSH host keys: one known_hosts file beside each inventory.

Every host pyinfra reaches over SSH gets `ssh_known_hosts_file` = `<inventory>.known_hosts` and
`ssh_strict_host_key_checking` = "yes" in its data unless the inventory sets them (pyinfra 3.10's
own default is "accept-new", pyinfra/connectors/ssh.py: the first answer to an address would be
trusted). The keys are written there by the deploy, read from the node for a guest it creates
(roles/lxc_guest, roles/kvm_guest), or by `inference-host trust HOST` after its fingerprint was shown; nothing
here is learnt over the network silently. The file is OpenSSH's known_hosts format (sshd(8),
"SSH_KNOWN_HOSTS FILE FORMAT"): one `pattern keytype base64` line per key, the pattern
`name` for port 22 and `[name]:port` otherwise, which paramiko and OpenSSH both read.

Standard library only: the model, the roles, the checks and `inference-host` share it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

STRICT_DEFAULT = "yes"


def known_hosts_path(inventory_file: str | os.PathLike) -> Path:
    """inventory/prod.py -> inventory/prod.known_hosts (absolute: pyinfra reads it from any folder)."""
    path = Path(inventory_file).resolve()
    return path.with_name(f"{path.stem}.known_hosts")


def reached_over_ssh(name: str) -> bool:
    """pyinfra names a connector's host `@connector/...` (@local, @docker/..., @lab/...); a
    plain name is its SSH connector's."""
    return not name.startswith("@")


def connection_defaults(name: str, data: dict, inventory_file: str | os.PathLike) -> dict:
    """The host data the site adds for an SSH host: its pinned keys, checked strictly. What the
    inventory sets itself stays (the model refuses strict checking off without a reason)."""
    if not reached_over_ssh(name):
        return {}
    defaults = {
        "ssh_known_hosts_file": str(known_hosts_path(inventory_file)),
        "ssh_strict_host_key_checking": STRICT_DEFAULT,
    }
    return {key: value for key, value in defaults.items() if data.get(key) is None}


@dataclass(frozen=True)
class HostKey:
    """One public key: its type (ssh-ed25519) and its base64 blob."""

    type: str
    blob: str

    @property
    def fingerprint(self) -> str:
        """As `ssh-keygen -l` prints it: SHA256: then the unpadded base64 of the blob's digest."""
        digest = hashlib.sha256(base64.b64decode(self.blob)).digest()
        return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")

    def line(self, pattern: str) -> str:
        return f"{pattern} {self.type} {self.blob}"


class HostKeyError(ValueError):
    """A key that cannot be read, or a recorded key that differs: the message is the report."""


def parse_public_key(text: str, source: str) -> HostKey:
    """`ssh-ed25519 AAAA... [comment]` (a .pub file, ssh-keyscan's line without its host) ->
    HostKey; anything else is refused, naming source."""
    words = text.split()
    if len(words) >= 3 and not words[0].startswith(("ssh-", "ecdsa-", "sk-")):
        words = words[1:]  # ssh-keyscan prints the host first
    if len(words) < 2 or not words[0].startswith(("ssh-", "ecdsa-", "sk-")):
        raise HostKeyError(f"{source}: expected an SSH public key (ssh-ed25519 AAAA...), got {text.strip()[:80]!r}")
    try:
        blob = base64.b64decode(words[1], validate=True)
    except (binascii.Error, ValueError):
        raise HostKeyError(f"{source}: the key's base64 cannot be decoded: {words[1][:40]!r}") from None
    # The blob starts with its own type name (RFC 4253 6.6): a key pasted under another type is not the key.
    named = blob[4 : 4 + int.from_bytes(blob[:4], "big")].decode(errors="replace") if len(blob) > 4 else ""
    if named != words[0]:
        raise HostKeyError(f"{source}: the key says {words[0]} but its blob is {named or 'empty'}")
    return HostKey(words[0], words[1])


def host_pattern(address: str, port: int | None) -> str:
    """The known_hosts pattern OpenSSH and paramiko look up for address:port."""
    return address if port in (None, 22) else f"[{address}]:{port}"


def recorded_keys(path: Path) -> dict[str, list[HostKey]]:
    """The file's keys by pattern (plain patterns only; the file is the site's own, never hashed)."""
    keys: dict[str, list[HostKey]] = {}
    if not path.is_file():
        return keys
    for line in path.read_text().splitlines():
        words = line.split()
        if len(words) >= 3 and not line.lstrip().startswith("#"):
            for pattern in words[0].split(","):
                keys.setdefault(pattern, []).append(HostKey(words[1], words[2]))
    return keys


def recorded_key(path: Path, pattern: str, key_type: str) -> HostKey | None:
    return next((key for key in recorded_keys(path).get(pattern, []) if key.type == key_type), None)


def record_key(path: Path, pattern: str, key: HostKey, replace: bool = False) -> bool:
    """Pins key for pattern in path: True when the file changed, False when it already held it.
    A different key of the same type already there is refused unless replace (the deploy made
    the guest anew, or the user said so): the message names both fingerprints."""
    found = recorded_key(path, pattern, key.type)
    if found == key:
        return False
    if found is not None and not replace:
        raise HostKeyError(
            f"{path}: {pattern} already has another {key.type} key pinned ({found.fingerprint}), not"
            f" {key.fingerprint}; replacing it needs --replace, once you know why the host's key changed"
        )
    lines = [] if not path.is_file() else path.read_text().splitlines()
    kept = [line for line in lines if not _same_slot(line, pattern, key.type)]
    kept.append(key.line(pattern))
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text("\n".join(kept) + "\n")
    os.replace(partial, path)  # a concurrent reader sees the old file or the new one, never half
    return True


def _same_slot(line: str, pattern: str, key_type: str) -> bool:
    words = line.split()
    return len(words) >= 3 and words[0] == pattern and words[1] == key_type
