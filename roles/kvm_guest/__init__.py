"""roles/kvm_guest: a KVM virtual machine on a Proxmox node, its GPUs passed through as hostpciN.

Runs on the Proxmox node (deploy.py calls it once per guest of that node). Creates the VM with
`qm create` when it is absent (q35, OVMF with an EFI disk, cpu host, NUMA, no ballooning, a
disk, a network card); converges an existing VM with one `qm set` of the differences. The VM is
not started: it has no operating system until you install one (README, "Describing guests").
Changes to a running VM other than its name wait for its next start: the deploy says so.
"""

from __future__ import annotations

import shlex

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.operations import server

from roles.shared import pve
from roles.shared.proxmox_facts import KvmGuestState
from roles.shared.pve import guest_hostname
from roles.site import HostSettings

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
    return wanted


def wanted_hostpci(guest: HostSettings) -> list[str]:
    settings = guest.guest
    return [pve.hostpci(address, settings.pcie, address in settings.x_vga_addresses)
            for address in settings.gpu_addresses]


def create_command(guest: HostSettings) -> str:
    settings = guest.guest
    args = ["qm", "create", str(settings.vmid)]
    for key, value in wanted_settings(guest).items():
        args += [f"--{key}", value]
    args += ["--scsihw", "virtio-scsi-single",
             "--scsi0", f"{settings.storage}:{settings.disk_gib},iothread=1",
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
        server.shell(
            name=f"Create KVM guest {vmid} ({guest_hostname(guest)}) with"
                 f" {len(settings.gpu_addresses)} GPUs",
            commands=[create_command(guest)],
        )
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
