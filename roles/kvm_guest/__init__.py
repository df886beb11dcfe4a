"""roles/kvm_guest: a KVM virtual machine on a Proxmox node, its GPUs passed through as hostpciN.

Runs on the Proxmox node (deploy.py calls it once per guest of that node). Creates the VM with
`qm create` when it is absent (q35, OVMF with an EFI disk, cpu host, NUMA, no ballooning, a
disk, a network card); converges an existing VM with one `qm set` of the differences. With
guest_cloud_image the disk is imported from that cloud image (`import-from`, PVE >= 8.0) and a
cloud-init drive gives it a user, the deploy's SSH keys and its network, then the VM is
started; without one the VM is not started: it has no operating system until you install one
(docs/guests-and-gpus.md).
Changes to a running VM other than its name wait for its next start: the deploy says so.
A changed guest_ssh_public_keys on a VM with a cloud-init drive is set with `qm set --sshkeys`
and the drive regenerated with `qm cloudinit update`; the guest's cloud-init applies it at the
VM's next boot (see plan_sshkeys). The SSH host key of a VM the deploy creates from a cloud image
is read from its serial console on the node at its first boot and pinned in the inventory's
known_hosts file (roles/shared/guest_host_keys.py); any other VM's key is pinned with
`inference-host trust`: until then the deploy says so and does not connect to the VM.
"""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.operations import server

from roles.shared import pve
from roles.shared.guest_host_keys import needs_pin, pin_kvm_key_at_first_boot
from roles.shared.guest_keys import keys_file, put_guest_keys, qm_sshkeys
from roles.shared.proxmox_facts import KvmGuestState
from roles.shared.pve import guest_hostname
from roles.shared.shell import Shell, argv, sh
from roles.site import HostSettings

# Applied at once on a running VM (qemu-server 8.4.10 src/PVE/QemuServer.pm $fast_plug_option,
# which includes every cloud-init option; those reach the guest through its cloud-init drive,
# regenerated at the next start or by `qm cloudinit update`), and balloon (hotplugged).
CLOUD_INIT = {"ciuser", "sshkeys", "ipconfig0"}
HOTPLUGGED = {"name", "onboot", "balloon", *CLOUD_INIT}


# What `qm start` dies with when a passed-through GPU cannot be given to the VM (qemu-server
# src/PVE/QemuServer/PCI.pm, read at commit 058e0f65: reserve_pci_usage, prepare_pci_device),
# and the next step for each; the deploy prints it under qm's own line.
START_REFUSALS = (
    (
        "IOMMU not present",
        "the node has no IOMMU for PCI passthrough: turn VT-d (Intel) or AMD-Vi/IOMMU (AMD) on in the"
        " firmware, keep intel_iommu=on or amd_iommu=on on the kernel command line (roles/proxmox_host"
        " writes it), reboot the node, then deploy again",
    ),
    (
        "already in use by VMID",
        "one of guest_gpu_addresses is passed through to the running VM named above: stop that VM"
        " (`qm stop <vmid>`) or take the GPU out of one of the two guests' guest_gpu_addresses, then deploy again",
    ),
)


def start_command(vmid: int) -> Shell:
    """`qm start VMID` for the root shell: on a refusal, qm's own line and then the one of
    START_REFUSALS it matches, prefixed with the guest, on stderr; qm's exit status kept."""
    (iommu, iommu_hint), (in_use, in_use_hint) = START_REFUSALS
    return sh(
        'out=$(qm start {vmid} 2>&1); rc=$?; [ "$rc" -eq 0 ] && exit 0; printf \'%s\\n\' "$out" >&2;'
        " case $out in *{iommu}*) echo {iommu_hint} >&2 ;; *{in_use}*) echo {in_use_hint} >&2 ;; esac;"
        ' exit "$rc"',
        vmid=vmid,
        iommu=iommu,
        iommu_hint=f"KVM guest {vmid}: {iommu_hint}",
        in_use=in_use,
        in_use_hint=f"KVM guest {vmid}: {in_use_hint}",
    )


def wanted_settings(guest: HostSettings) -> dict[str, str]:
    """Scalar keys the role owns, as `qm config` prints them."""
    settings = guest.guest
    wanted = {
        "name": guest_hostname(guest),
        "machine": settings.machine,
        "bios": settings.bios,
        "cpu": pve.kvm_cpu(settings.cpu),
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


def ipconfig0(guest: HostSettings) -> pve.PropertyString:
    """cloud-init's network for net0 (qemu-server $ipconfig_fmt: ip=dhcp | ip=CIDR,gw=IP |
    ip6=CIDR,gw6=IP)."""
    settings = guest.guest
    if settings.ip in ("dhcp", "manual"):
        return pve.print_property_string({"ip": "dhcp"})
    return pve.print_property_string(pve.address_keys(settings.ip, settings.gateway))


def wanted_hostpci(guest: HostSettings) -> list[str]:
    settings = guest.guest
    return [
        pve.hostpci(address, settings.pcie, address in settings.x_vga_addresses) for address in settings.gpu_addresses
    ]


def create_command(guest: HostSettings) -> Shell:
    settings = guest.guest
    args = ["qm", "create", str(settings.vmid)]
    for key, value in wanted_settings(guest).items():
        args += pve.option_args(key, value)
    if settings.cloud_image:
        # The image is copied into a new volume; its size is the image's until the resize below.
        args += [
            *pve.option_args("ide2", pve.kvm_cloudinit_drive(settings.storage)),
            "--boot",
            "order=scsi0",
            "--serial0",
            "socket",
            "--vga",
            "serial0",
        ]  # cloud images log to a serial console
        if settings.ssh_public_keys:
            args += ["--sshkeys", keys_file(guest)]
    args += [
        "--scsihw",
        "virtio-scsi-single",
        *pve.option_args("scsi0", pve.kvm_disk(settings.storage, settings.disk_gib, settings.cloud_image)),
        *pve.option_args("net0", pve.kvm_net0(settings.bridge, firewall=settings.firewall)),
    ]
    if settings.bios == "ovmf":
        args += pve.option_args("efidisk0", pve.kvm_efidisk(settings.storage))
    for index, value in enumerate(wanted_hostpci(guest)):
        args += pve.option_args(f"hostpci{index}", value)
    return argv(*args)


def plan_update(guest: HostSettings, config: pve.GuestConfig) -> pve.Plan:
    effective = config.effective()
    plan = pve.plan_scalars(effective, wanted_settings(guest))
    if "args" in effective and guest.guest.mmio_window_mb is None:
        plan = plan.merged(pve.Plan(delete=("args",)))
    net0 = pve.kvm_net0_firewall(effective.get("net0"), guest.guest.firewall)
    if net0 is not None:
        plan = plan.merged(pve.Plan({"net0": net0}))
    if guest.guest.bios == "ovmf" and "efidisk0" not in effective:
        plan = plan.merged(pve.Plan({"efidisk0": pve.kvm_efidisk(guest.guest.storage)}))
    return plan.merged(
        pve.plan_indexed(effective, pve.KVM_HOSTPCI_KEYS, wanted_hostpci(guest), pve.hostpci_address, pve.same_hostpci)
    )


@deploy("KVM guest")
def kvm_guest(guest: HostSettings) -> None:
    settings = guest.guest
    vmid = settings.vmid
    assert vmid is not None  # a guest has one (the site model requires guest_vmid)
    state = host.get_fact(KvmGuestState, vmid=vmid)
    if settings.cloud_image:
        put_guest_keys(guest)
    if state is None:
        server.shell(
            name=f"Create KVM guest {vmid} ({guest_hostname(guest)}) with {len(settings.gpu_addresses)} GPUs",
            commands=[create_command(guest)],
        )
        if settings.cloud_image:
            server.shell(
                name=f"Grow KVM guest {vmid}'s disk to {settings.disk_gib}G",
                commands=[argv("qm", "disk", "resize", vmid, "scsi0", f"{settings.disk_gib}G")],
            )
            if not pin_kvm_key_at_first_boot(guest, start_command(vmid)):
                server.shell(name=f"Start KVM guest {vmid}", commands=[start_command(vmid)])
            return
        _say_unpinned(guest)
        return
    plan = plan_update(guest, state["config"])
    if plan:
        changed = sorted(plan.set) + [f"-{key}" for key in plan.delete]
        server.shell(
            name=f"Update KVM guest {vmid}: {' '.join(changed)}",
            commands=[argv("qm", "set", vmid, *plan.arguments())],
        )
    _converge_sshkeys(guest, state)
    _say_unpinned(guest)
    pending = pve.pending_keys(state, plan, HOTPLUGGED)
    if pending:
        logger.warning(
            f"{host.name}: KVM guest {vmid} has changes pending until it restarts"
            f" ({', '.join(pending)}): `qm reboot {vmid}` (a stop and start) applies them"
        )


def _say_unpinned(guest: HostSettings) -> None:
    """The key of a VM the deploy did not just create from a cloud image is not read by it
    (cloud-init prints it on the console only at an instance's first boot; docs/security.md#host-keys):
    until it is pinned, nothing connects to the VM, and this says how to pin it."""
    if needs_pin(guest):
        logger.warning(
            f"{host.name}: KVM guest {guest.guest.vmid} ({guest.name}) has no SSH host key pinned, and the"
            " deploy connects only to a pinned key: compare its fingerprint on the VM's console"
            " (ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub), then: inference-host trust INVENTORY"
            f" {guest.name}"
        )


def plan_sshkeys(guest: HostSettings, config: pve.GuestConfig) -> list[Shell]:
    """`qm set --sshkeys` and `qm cloudinit update` when the VM's keys differ from the setting.

    qemu-server 8.4.10: `sshkeys` is a fast-plug option (src/PVE/QemuServer.pm
    vmconfig_hotplug_pending), written to the config at once even on a running VM, the drive's
    old value recorded under [special:cloudinit]; `qm cloudinit update` (API2/Qemu.pm
    cloudinit_update) regenerates the drive now (a running VM gets the new medium). Inside, the
    NoCloud instance-id is a hash of the user data (Cloudinit.pm nocloud_gen_metadata), so at
    the next boot cloud-init sees a new instance and runs its ssh module: the keys are added
    to the user's authorized_keys (cloud-init adds, it does not remove old ones) and, by
    cloud-init's default (ssh_deletekeys), the VM's SSH host keys are made anew.
    Only for a VM created from a cloud image (it has the cloud-init drive); an empty setting
    leaves the keys alone.
    """
    settings = guest.guest
    if not (settings.cloud_image and settings.ssh_public_keys):
        return []
    if config.effective().get("sshkeys") == qm_sshkeys(guest):
        return []
    return [
        argv("qm", "set", str(settings.vmid), "--sshkeys", keys_file(guest)),
        argv("qm", "cloudinit", "update", str(settings.vmid)),
    ]


def _converge_sshkeys(guest: HostSettings, state: dict) -> None:
    vmid = guest.guest.vmid
    commands = plan_sshkeys(guest, state["config"])
    if not commands:
        return
    server.shell(
        name=f"Set {len(guest.guest.ssh_public_keys)} SSH public key(s) of KVM guest {vmid}"
        " (cloud-init) and regenerate its cloud-init drive",
        commands=commands,  # type: ignore[arg-type]  # Shell is a str; pyinfra's list[str] is invariant
    )
    if state["status"] == "running":
        logger.warning(
            f"{host.name}: KVM guest {vmid} gets its new SSH keys from cloud-init at its next boot"
            f" (`qm reboot {vmid}`); cloud-init adds keys without removing old ones and, by"
            " default, regenerates the VM's SSH host keys then"
        )
