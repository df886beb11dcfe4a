"""roles/kvm_guest: a KVM virtual machine on a Proxmox node, its GPUs passed through as hostpciN.

Runs on the Proxmox node (deploy.py calls it once per guest of that node). Creates the VM with
`qm create` when it is absent (q35, OVMF with an EFI disk, cpu host, NUMA, no ballooning, a
disk, a network card); converges an existing VM with one `qm set` of the differences. With
guest_cloud_image the disk is imported from that cloud image (`import-from`, PVE >= 8.0) and a
cloud-init drive gives it a user, the deploy's SSH keys and its network, then the VM is
started; without one the VM is not started: it has no operating system until you install one
(README, "Describing guests").
Changes to a running VM other than its name wait for its next start: the deploy says so.
"""

from __future__ import annotations

import shlex

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.operations import server

from roles.shared import pve
from roles.shared.guest_keys import keys_file, put_guest_keys
from roles.shared.proxmox_facts import KvmGuestState
from roles.shared.pve import guest_hostname
from roles.site import HostSettings

# qemu-server: cloud-init keys change the cloud-init drive, regenerated at the next start.
HOTPLUGGED = {"name", "onboot", "balloon"}


def wanted_settings(guest: HostSettings) -> dict[str, str]:
    """Scalar keys the role owns, as `qm config` prints them."""
    settings = guest.guest
    wanted = {
        "name": guest_hostname(guest),
        "machine": settings.machine,
        "bios": settings.bios,
        "cpu": settings.cpu,
        "numa": "1",
        "balloon": "0",  # ballooning and passthrough do not mix: guest RAM is pinned for DMA
        "memory": str(settings.memory_mib),
        "cores": str(settings.cores),
        "sockets": "1",
        "ostype": "l26",
        "onboot": "1",
    }
    args = pve.mmio_window_args(settings.mmio_window_mb)
    if args:
        wanted["args"] = args
    if settings.cloud_image:
        wanted["ipconfig0"] = ipconfig0(guest)
        if settings.ciuser:
            wanted["ciuser"] = settings.ciuser
    return wanted


def ipconfig0(guest: HostSettings) -> str:
    """cloud-init's network for net0 (qemu-server $ipconfig_fmt: ip=dhcp | ip=CIDR,gw=IP)."""
    settings = guest.guest
    if settings.ip in ("dhcp", "manual"):
        return "ip=dhcp"
    return pve.print_property_string({"ip": settings.ip, "gw": settings.gateway})


def wanted_hostpci(guest: HostSettings) -> list[str]:
    settings = guest.guest
    return [pve.hostpci(address, settings.pcie, address in settings.x_vga_addresses)
            for address in settings.gpu_addresses]


def create_command(guest: HostSettings) -> str:
    settings = guest.guest
    args = ["qm", "create", str(settings.vmid)]
    for key, value in wanted_settings(guest).items():
        args += [f"--{key}", value]
    if settings.cloud_image:
        # The image is copied into a new volume; its size is the image's until the resize below.
        disk = f"{settings.storage}:0,import-from={settings.cloud_image},iothread=1"
        args += ["--ide2", f"{settings.storage}:cloudinit", "--boot", "order=scsi0",
                 "--serial0", "socket", "--vga", "serial0"]  # cloud images log to a serial console
        if settings.ssh_public_keys:
            args += ["--sshkeys", keys_file(guest)]
    else:
        disk = f"{settings.storage}:{settings.disk_gib},iothread=1"
    args += ["--scsihw", "virtio-scsi-single", "--scsi0", disk,
             "--net0", f"virtio,bridge={settings.bridge}"]
    if settings.bios == "ovmf":
        # Keys not pre-enrolled: Secure Boot would refuse the unsigned NVIDIA kernel module.
        args += ["--efidisk0", f"{settings.storage}:1,efitype=4m,pre-enrolled-keys=0"]
    for index, value in enumerate(wanted_hostpci(guest)):
        args += [f"--hostpci{index}", value]
    return shlex.join(args)


def plan_update(guest: HostSettings, config: pve.GuestConfig) -> pve.Plan:
    effective = config.effective()
    plan = pve.plan_scalars(effective, wanted_settings(guest))
    if "args" in effective and guest.guest.mmio_window_mb is None:
        plan = plan.merged(pve.Plan(delete=("args",)))
    if guest.guest.bios == "ovmf" and "efidisk0" not in effective:
        plan = plan.merged(pve.Plan(
            {"efidisk0": f"{guest.guest.storage}:1,efitype=4m,pre-enrolled-keys=0"}))
    return plan.merged(pve.plan_indexed(effective, pve.KVM_HOSTPCI_KEYS, wanted_hostpci(guest),
                                        pve.hostpci_address, pve.same_hostpci))


@deploy("KVM guest")
def kvm_guest(guest: HostSettings) -> None:
    settings = guest.guest
    vmid = settings.vmid
    state = host.get_fact(KvmGuestState, vmid=vmid)
    if state is None:
        if settings.cloud_image:
            put_guest_keys(guest)
        server.shell(
            name=f"Create KVM guest {vmid} ({guest_hostname(guest)}) with"
                 f" {len(settings.gpu_addresses)} GPUs",
            commands=[create_command(guest)],
        )
        if settings.cloud_image:
            server.shell(name=f"Grow KVM guest {vmid}'s disk to {settings.disk_gib}G and start it",
                         commands=[f"qm disk resize {vmid} scsi0 {settings.disk_gib}G",
                                   f"qm start {vmid}"])
        return
    plan = plan_update(guest, state["config"])
    if plan:
        changed = sorted(plan.set) + [f"-{key}" for key in plan.delete]
        server.shell(
            name=f"Update KVM guest {vmid}: {' '.join(changed)}",
            commands=[shlex.join(["qm", "set", str(vmid), *plan.arguments()])],
        )
    pending = pve.pending_keys(state, plan, HOTPLUGGED)
    if pending:
        logger.warning(
            f"{host.name}: KVM guest {vmid} has changes pending until it restarts"
            f" ({', '.join(pending)}): `qm reboot {vmid}` (a stop and start) applies them"
        )
