"""The SSH public keys a new Proxmox guest gets, kept on its node for `pct create
--ssh-public-keys FILE` and `qm create --sshkeys FILE` (both CLIs read the file on the node:
pve-container 5.3.5 src/PVE/CLI/pct.pm, qemu-server 8.4.10 src/PVE/CLI/qm.pm, file mappings)."""

from __future__ import annotations

from io import StringIO

from pyinfra.operations import files

from roles.site import HostSettings

GUEST_KEYS_DIR = "/etc/inference-host/guest-keys"


def keys_file(guest: HostSettings) -> str:
    return f"{GUEST_KEYS_DIR}/{guest.guest.vmid}.pub"


def put_guest_keys(guest: HostSettings) -> None:
    """Write the guest's keys on the node (root-only), before the create that reads them."""
    if not guest.guest.ssh_public_keys:
        return
    files.directory(name=f"Create {GUEST_KEYS_DIR}", path=GUEST_KEYS_DIR, mode="0700")
    files.put(
        name=f"Public keys for guest {guest.guest.vmid} ({len(guest.guest.ssh_public_keys)})",
        src=StringIO("".join(f"{key}\n" for key in guest.guest.ssh_public_keys)),
        dest=keys_file(guest),
        mode="0600",
    )
