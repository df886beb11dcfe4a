"""A Proxmox guest, LXC or KVM (guest_*): roles/lxc_guest, roles/kvm_guest."""

from __future__ import annotations

import re
from typing import Annotated, ClassVar

from pydantic import Field

from roles.site.fields import (
    DNS_NAME_RE,
    DriverVersion,
    PciAddresses,
    PveMountPoints,
    PveStorageId,
    Section,
    UnixName,
    check,
    is_cidr,
    is_ip,
    one_of,
    positive,
    property_value_problem,
)
from roles.site.grammars import image_path_problem

SSH_PUBLIC_KEY_RE = re.compile(
    r"^(ssh-(ed25519|rsa|dss)|ecdsa-sha2-nistp(256|384|521)|sk-(ssh-ed25519|ecdsa-sha2-nistp256)@openssh\.com)"
    r" [A-Za-z0-9+/]+={0,3}( [^\n]*)?$"
)


# qemu-server src/PVE/QemuServer/Machine.pm (stable-bookworm), machine type pattern.
QEMU_MACHINE_RE = re.compile(
    r"(pc|pc(-i440fx)?-\d+(\.\d+)+(\+pve\d+)?(\.pxe)?|q35|pc-q35-\d+(\.\d+)+(\+pve\d+)?(\.pxe)?)"
)
# PVE 8 limits (pve-container LXC/Config.pm, qemu-server PCI.pm): dev0-255, mp0-255, hostpci0-15.
LXC_MAX_DEVICES, LXC_MAX_MOUNT_POINTS, KVM_MAX_HOSTPCI = 256, 256, 16


# Bounds of a guest's size, so that a typo (10**30 cores, memory in bytes for MiB) stops here and
# not at `pct create`/`qm create`, or as a guest that cannot start. Cores: pve-container's
# limit for an LXC guest's cores (src/PVE/LXC/Config.pm, maximum 8192), far above any host a VM
# runs on too. Memory: both pct and qm take at least 16 MiB (their memory option's minimum);
# 64 TiB is above the largest x86 host sold, so more is a unit mistake. Disk: 1 PiB likewise.
MAX_CORES, MIN_MEMORY_MIB, MAX_MEMORY_MIB, MAX_DISK_GIB = 8192, 16, 64 * 1024 * 1024, 1024 * 1024


def _property_safe_path(path: str) -> bool:
    return property_value_problem(path) is None


GUEST_FEATURES = ("nesting", "keyctl", "fuse", "mknod", "mount", "force_rw_sys")


class GuestSettings(Section):
    """A Proxmox guest (LXC or KVM) that receives GPUs."""

    PREFIX: ClassVar[str] = "guest_"

    vmid: Annotated[int, check(lambda v: 100 <= v <= 999999999, "an integer >= 100")] | None = Field(
        None, description=("Proxmox VMID of this guest (>= 100, unique across LXC and KVM).")
    )
    node: str | None = Field(None, description=("Inventory name of the node (proxmox_hosts) that runs this guest."))
    gpu_addresses: PciAddresses = Field(
        [],
        description=(
            "PCI addresses of the node's GPUs given to this guest (LXC: /dev/nvidiaN entries; KVM: "
            "hostpciN). A GPU belongs to one guest."
        ),
    )
    cores: Annotated[int, check(lambda v: 1 <= v <= MAX_CORES, f"1 to {MAX_CORES} cores")] = Field(
        64, description=("CPU cores of the guest.")
    )
    memory_mib: Annotated[
        int,
        check(lambda v: MIN_MEMORY_MIB <= v <= MAX_MEMORY_MIB, f"{MIN_MEMORY_MIB} to {MAX_MEMORY_MIB} MiB (64 TiB)"),
    ] = Field(512 * 1024, description=("Memory of the guest in MiB (swap 0)."))
    disk_gib: Annotated[int, check(lambda v: 1 <= v <= MAX_DISK_GIB, f"1 to {MAX_DISK_GIB} GiB (1 PiB)")] = Field(
        500, description=("Root disk size in GiB (KVM: scsi0, grown after a cloud-image import).")
    )
    storage: PveStorageId = Field("local-lvm", description="Proxmox storage of the guest's disks.")
    unprivileged: bool = Field(True, description=("LXC: an unprivileged container; cannot change on an existing one."))
    features: Annotated[
        list[str],
        check(
            lambda v: set(v) <= set(GUEST_FEATURES) and len(set(v)) == len(v),
            "features from: " + ", ".join(GUEST_FEATURES) + ", each once (pct refuses a repeated key)",
        ),
    ] = Field(
        ["nesting", "keyctl"],
        description=(
            "LXC features (nesting, keyctl, fuse, mknod, mount, force_rw_sys); keyctl only when unprivileged."
        ),
    )
    hostname: Annotated[str, check(DNS_NAME_RE.match, "a DNS name")] | None = Field(
        None, description=("The guest's hostname; None: Proxmox's default.")
    )
    # A Linux interface name: at most IFNAMSIZ - 1 = 15 bytes (include/uapi/linux/if.h), in
    # ASCII (Python's \w takes a Cyrillic letter), not beginning with '-' (an option to ip(8)).
    bridge: Annotated[
        str,
        check(
            re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,14}").fullmatch,
            "a bridge name: 1 to 15 ASCII letters, digits, '_', '.', '-', not beginning with '-' (IFNAMSIZ)",
        ),
    ] = Field("vmbr0", description=("Bridge of the guest's net0 (LXC and KVM)."))
    firewall: bool = Field(
        False,
        description=(
            "firewall=1 on the guest's net0 (LXC and KVM): its traffic passes the node's firewall bridge, where"
            " the Proxmox firewall's rules for it apply (/etc/pve/firewall/<vmid>.fw, pve-firewall(8))."
        ),
    )
    ip: Annotated[
        str, check(lambda v: v in ("dhcp", "manual") or is_cidr(v), "'dhcp', 'manual', an IPv4/CIDR or an IPv6/CIDR")
    ] = Field(
        "dhcp",
        description=(
            "net0 address: 'dhcp', 'manual' or an address with prefix (LXC net0, KVM cloud-init "
            "ipconfig0); an IPv6/CIDR is written as Proxmox takes it (ip6=/gw6=)."
        ),
    )
    gateway: Annotated[str, check(lambda v: is_ip(v) and "%" not in v, "an IPv4 or IPv6 address (no %zone)")] | None = (
        Field(None, description=("Default gateway for a static guest_ip, of the same family."))
    )
    template: Annotated[
        str,
        check(
            re.compile(r"^[a-zA-Z][\w.-]*:vztmpl/[^/\s,]+$").match,
            "a template volume like local:vztmpl/ubuntu-24.04-standard_24.04-2_amd64.tar.zst",
        ),
    ] = Field(
        "local:vztmpl/ubuntu-24.04-standard_24.04-2_amd64.tar.zst",
        description=("LXC only: the OS template volume the container is created from."),
    )
    mount_points: PveMountPoints = Field(
        {},
        description=(
            "LXC only: {host path: path in the guest} bind mounts (mp0, mp1, ...); one holding "
            "serving_model_path makes the node download the weights. Both absolute, without ',' (nor"
            " '=' in the host path) or spaces at either end: Proxmox's property strings cannot hold"
            " them (docs/inventory.md)."
        ),
    )
    machine: Annotated[str, check(QEMU_MACHINE_RE.fullmatch, "q35, pc, pc-q35-8.1, ...")] = Field(
        "q35", description=("KVM only: QEMU machine type; pcie=1 needs q35.")
    )
    bios: Annotated[str, one_of("ovmf", "seabios")] = Field(
        "ovmf", description=("KVM only: firmware; large-BAR GPUs need ovmf.")
    )
    cpu: Annotated[
        str,
        check(
            re.compile(r"^[\w.+-]+(,phys-bits=(host|\d+))?$").match, "a CPU type like host or x86-64-v3,phys-bits=host"
        ),
    ] = Field(
        "host",
        description=(
            "KVM only: CPU type; large-BAR GPUs need host (the host's physical address bits) or phys-bits=host."
        ),
    )
    pcie: bool = Field(True, description=("KVM only: pass GPUs as PCIe devices (hostpciN ...,pcie=1)."))
    x_vga_addresses: PciAddresses = Field(
        [], description=("KVM only: the guest's GPU (at most one) passed with x-vga=1.")
    )
    mmio_window_mb: Annotated[int, positive] | None = Field(
        None,
        description=(
            "KVM only: OVMF's 64-bit MMIO window in MB (args: -fw_cfg name=opt/ovmf/X-PciMmio64Mb); None: OVMF's own."
        ),
    )
    driver_version: DriverVersion | None = Field(
        None,
        description=("LXC only: the userspace driver version; None: the stack's driver. Must equal the node's module."),
    )
    ssh_public_keys: Annotated[
        list[str],
        check(
            lambda v: all(SSH_PUBLIC_KEY_RE.match(k) for k in v),
            "OpenSSH public key lines like 'ssh-ed25519 AAAA... comment'",
        ),
    ] = Field(
        [],
        description=(
            "OpenSSH public key lines for the guest, so the deploy can continue in it: LXC root's "
            "authorized_keys (at creation, then kept exactly from the node), KVM cloud-init. Empty: "
            "left alone."
        ),
    )
    cloud_image: (
        Annotated[
            str,
            check(
                lambda v: (
                    (v.startswith("/") and _property_safe_path(v) and not image_path_problem(v))
                    or re.match(r"^[a-zA-Z][\w.-]*:import/[^/\s,=]+$", v)
                ),
                "a volume like local:import/noble-server-cloudimg-amd64.img or an absolute path in the node's image"
                " storage (/var/lib/vz or /mnt/pve/<storage>), without ',' or spaces at either end (qm's --scsi0"
                " import-from=...): not in /etc, /root, /home, /var/lib/pve-cluster or anywhere else (qm, as root,"
                " copies it into the guest)",
            ),
        ]
        | None
    ) = Field(
        None,
        description=(
            "KVM only: a cloud image on the node (STORAGE:import/<file> or an absolute path) imported "
            "as scsi0, with a cloud-init drive; None: an empty VM whose OS you install."
        ),
    )
    ciuser: UnixName | None = Field(
        None, description=("KVM only: cloud-init's user; None: the image's default user (e.g. ubuntu).")
    )
