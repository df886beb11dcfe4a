"""A guest's SSH host key, read through its node and pinned in the inventory's known_hosts file
before anything connects to the guest (docs/security.md#host-keys).

The node is reached over a pinned key itself, so what it reads from inside the guest (`pct exec`:
lxc-attach on the node, no network between) is the guest's key, whoever answers at the guest's
address. The deploy reaches a guest it has created in its next pass (roles/proxmox_host
continue_in_guests): the pin is written in this pass, on the control machine, so that pass
connects strictly.
"""

from __future__ import annotations

from pathlib import Path

from pyinfra.operations import python

from roles.shared.refusal import failed
from roles.shared.shell import Shell, argv
from roles.site import HostSettings
from roles.site.host_keys import (
    HostKeyError,
    host_pattern,
    parse_public_key,
    reached_over_ssh,
    record_key,
    recorded_keys,
)
from roles.site.schema import address_of

HOST_KEY_FILE = "/etc/ssh/ssh_host_ed25519_key.pub"
# A container just started may still be running its first boot: the key is waited for, bounded.
KEY_WAIT_S = 30
# Looped in the container's own shell (POSIX sh, no seq): the key file, once it is not empty.
_WAIT_FOR_KEY = 'i=0; while [ "$i" -lt "$1" ]; do [ -s "$2" ] && exec cat "$2"; i=$((i + 1)); sleep 1; done; exit 1'


def read_lxc_key_command(vmid: int) -> Shell:
    return argv("pct", "exec", vmid, "--", "sh", "-c", _WAIT_FOR_KEY, "sh", KEY_WAIT_S, HOST_KEY_FILE)


def pin_target(guest: HostSettings) -> tuple[Path, str] | None:
    """(known_hosts file, pattern) the guest's key is pinned under; None when the deploy does not
    reach the guest over SSH (a connector's host, like the lab's)."""
    known_hosts = guest.ssh.known_hosts_file
    if not reached_over_ssh(guest.name) or not known_hosts:
        return None
    return Path(known_hosts).expanduser(), host_pattern(address_of(guest), guest.ssh.port)


def pin_lxc_key(guest: HostSettings, created: bool) -> None:
    """An operation that reads the LXC guest's ed25519 host key on the node and pins it: replacing
    a pin when the deploy created the guest (an old pin is a destroyed guest's), else only where
    none is pinned yet (a different pin is the connection's business: it refuses)."""
    target = pin_target(guest)
    if target is None:
        return
    path, pattern = target
    vmid = guest.guest.vmid
    assert vmid is not None  # a guest has one (the site model requires guest_vmid)
    python.call(
        name=f"Pin the SSH host key of LXC guest {vmid} ({pattern}) in {path}, read on the node (pct exec)",
        function=_read_and_pin,
        command=read_lxc_key_command(vmid),
        source=f"LXC guest {vmid}'s {HOST_KEY_FILE}",
        path=str(path),
        pattern=pattern,
        replace=created,
    )


def _read_and_pin(state, host, command: Shell, source: str, path: str, pattern: str, replace: bool) -> bool:
    """python.call's callback (state and host first: its return value is the status)."""
    ok, output = host.run_shell_command(command)
    if not ok:
        return failed(
            host,
            f"{host.name}: {source} could not be read within {KEY_WAIT_S} s ({output.stderr.strip()[:200]});"
            " its key is not pinned, and the deploy will not connect to the guest until it is"
            " (inference-host trust INVENTORY HOST, once you have checked its fingerprint)",
        )
    try:
        key = parse_public_key(output.stdout, f"{host.name}: {source}")
        if record_key(Path(path), pattern, key, replace=replace):
            host.log_styled(f"Pinned {pattern} {key.type} {key.fingerprint} in {path}", fg="green")
    except HostKeyError as error:
        return failed(host, str(error))
    return True


def needs_pin(guest: HostSettings) -> bool:
    """No key of the guest pinned yet (read on the control machine while planning)."""
    target = pin_target(guest)
    return target is not None and not recorded_keys(target[0]).get(target[1])
