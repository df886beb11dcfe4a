"""roles/lxc_guest: an LXC container on a Proxmox node, with its GPUs as devN device entries.

Runs on the Proxmox node (deploy.py calls it once per guest of that node). Creates the guest
with `pct create` when it is absent (root's SSH keys from guest_ssh_public_keys, so the deploy
can continue inside it) and starts it; converges an existing guest by applying only
the differences with one `pct set` (`--delete` for entries no longer wanted). A devN change on a
running container stays pending until it restarts (PVE 8): the deploy says so. Root's keys
in a running container are converged from the node too (`pct push`, roles/shared/guest_keys.py),
so a changed key reaches a guest the deploy could otherwise no longer enter. The guest's own SSH
host key is read on the node (`pct exec`) and pinned in the inventory's known_hosts file, when
the deploy creates it or finds it running with none pinned (roles/shared/guest_host_keys.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.operations import server

from roles.shared import pve
from roles.shared.guest_host_keys import needs_pin, pin_lxc_key
from roles.shared.guest_keys import (
    AUTHORIZED_KEYS,
    keys_file,
    push_keys_commands,
    put_guest_keys,
    same_keys_file,
    with_pve_block,
)
from roles.shared.proxmox_facts import LxcAuthorizedKeys, LxcGuestState, NvidiaHostDevices
from roles.shared.pve import guest_hostname
from roles.shared.refusal import Refused
from roles.shared.shell import Shell, argv
from roles.site import HostSettings, current_host, weights_mount_points

# Changed on a running container without a restart (pve-container $LXC_FASTPLUG_OPTIONS and
# the hotplug branch of vmconfig_hotplug_pending); everything else waits for a restart.
HOTPLUGGED = {"cores", "hostname", "onboot", "memory", "swap", "net0"}


def wanted_settings(guest: HostSettings) -> dict[str, str]:
    """Scalar keys the role owns, as `pct config` prints them."""
    settings = guest.guest
    wanted = {
        "hostname": guest_hostname(guest),
        "cores": str(settings.cores),
        "memory": str(settings.memory_mib),
        "swap": "0",  # no swap on the node; a container must not pretend to have any
        "onboot": "1",
    }
    if settings.features:
        wanted["features"] = pve.lxc_features(settings.features)
    return wanted


def wanted_devices(guest: HostSettings, host_devices: dict) -> tuple[Sequence[str], str | None]:
    """devN values for the guest's GPUs, or why they cannot be known yet.

    The node's driver lists its GPUs only once its kernel module is loaded (after the reboot
    that follows its install), and the uvm nodes exist only once nvidia-uvm-devices.service ran:
    until then the guest waits for a later run of the same command (no exception: an exception
    while planning would stop the node's own driver install too).
    """
    unlisted = [a for a in guest.guest.gpu_addresses if a not in host_devices["minors"]]
    if unlisted:
        return [], (
            f"the node's NVIDIA driver lists no GPU {', '.join(unlisted)} yet"
            " (no kernel module loaded before the node's reboot, or the GPU is bound to"
            " vfio-pci by a VM)"
        )
    minors = [host_devices["minors"][address] for address in guest.guest.gpu_addresses]
    present = set(host_devices["nodes"])
    paths = pve.lxc_device_paths(minors, present)
    missing = [path for path in paths if path not in present]
    if missing:
        return [], (
            f"{', '.join(missing)} missing on the node (Proxmox refuses to start a"
            " container whose devN path is absent; nvidia-uvm-devices.service makes the"
            " uvm nodes at boot with `nvidia-modprobe -u -c0`)"
        )
    return paths, None


def wanted_mount_points(guest: HostSettings) -> list[str]:
    # Weights the node keeps for this guest (roles/weights) are mounted read-only: ro=1.
    read_only = weights_mount_points(guest)
    return [pve.lxc_mount_point(src, dst, read_only=src in read_only) for src, dst in guest.guest.mount_points.items()]


def create_command(guest: HostSettings, devices: Sequence[str]) -> Shell:
    settings = guest.guest
    args = [
        "pct",
        "create",
        str(settings.vmid),
        settings.template,
        "--unprivileged",
        "1" if settings.unprivileged else "0",  # explicit: PVE 9 changed the default
        *pve.option_args("rootfs", pve.lxc_rootfs(settings.storage, settings.disk_gib)),
        *pve.option_args(
            "net0", pve.lxc_net0(settings.bridge, settings.ip, settings.gateway, firewall=settings.firewall)
        ),
    ]
    for key, value in wanted_settings(guest).items():
        args += pve.option_args(key, value)
    for index, value in enumerate(devices):
        args += pve.option_args(f"dev{index}", value)
    for index, value in enumerate(wanted_mount_points(guest)):
        args += pve.option_args(f"mp{index}", value)
    if settings.ssh_public_keys:  # root's authorized_keys in the new container
        args += ["--ssh-public-keys", keys_file(guest)]
    return argv(*args)


def plan_update(guest: HostSettings, config: pve.GuestConfig, devices: Sequence[str]) -> pve.Plan:
    """The smallest `pct set` that makes the guest's effective config what the inventory says."""
    effective = config.effective()
    plan = pve.plan_scalars(effective, wanted_settings(guest))
    settings = guest.guest
    net0 = pve.lxc_net0(settings.bridge, settings.ip, settings.gateway, firewall=settings.firewall)
    if not effective.get("net0") or not pve.same_net(effective["net0"], net0):
        plan = plan.merged(pve.Plan({"net0": pve.with_hwaddr(effective.get("net0"), net0)}))
    if "features" in effective and not settings.features:
        plan = plan.merged(pve.Plan(delete=("features",)))
    plan = plan.merged(pve.plan_indexed(effective, pve.LXC_DEVICE_KEYS, devices, pve.device_path, pve.same_device))
    return plan.merged(
        pve.plan_indexed(
            effective, pve.LXC_MOUNT_KEYS, wanted_mount_points(guest), pve.mount_identity, lambda a, b: a == b
        )
    )


@deploy("LXC guest")
def lxc_guest(guest: HostSettings) -> None:
    node = current_host()
    settings = guest.guest
    vmid = settings.vmid
    assert vmid is not None  # a guest has one (the site model requires guest_vmid)
    host_devices = host.get_fact(NvidiaHostDevices, proc_dir=node.proxmox.nvidia_proc_dir)
    devices, waiting = wanted_devices(guest, host_devices)
    state = host.get_fact(LxcGuestState, vmid=vmid)
    if waiting:
        logger.warning(
            f"{host.name}: LXC guest {vmid} ({guest.name}) waits: {waiting}; the next"
            " pass of the same command, once the node has rebooted, goes on with it"
        )
        return
    put_guest_keys(guest)
    if state is None:
        server.shell(
            name=f"Create LXC guest {vmid} ({guest_hostname(guest)}) from {settings.template}"
            f" with {len(settings.gpu_addresses)} GPUs",
            commands=[create_command(guest, devices)],
        )
        server.shell(name=f"Start LXC guest {vmid}", commands=[argv("pct", "start", vmid)])
        pin_lxc_key(guest, created=True)  # before the next pass connects to it (strictly)
        return
    _require_same_privilege(guest, state["config"])
    plan = plan_update(guest, state["config"], devices)
    if plan:
        changed = sorted(plan.set) + [f"-{key}" for key in plan.delete]
        server.shell(
            name=f"Update LXC guest {vmid}: {' '.join(changed)}",
            commands=[argv("pct", "set", vmid, *plan.arguments())],
        )
    _report_pending(guest, state, plan)
    _converge_keys(guest, state)
    if state["status"] == "running" and needs_pin(guest):  # made before keys were pinned, or by hand
        # A line, not an operation every run: a deploy that changes nothing plans none, and
        # `inference-host trust` reads the key through the node the same way (pct exec).
        logger.warning(
            f"{host.name}: LXC guest {vmid} ({guest.name}) has no SSH host key pinned, and the deploy"
            f" connects only to a pinned key: inference-host trust INVENTORY {guest.name} reads it on this"
            " node (pct exec) and shows its fingerprint"
        )


def plan_keys(guest: HostSettings, status: str, found: dict | None) -> tuple[list[Shell], str | None]:
    """Commands that make root's authorized_keys hold exactly the setting's keys in its PVE
    block, or why they cannot run yet. An empty setting leaves the guest's keys alone."""
    keys = guest.guest.ssh_public_keys
    if not keys:
        return [], None
    if status != "running":
        return [], (
            f"its SSH keys are converged once it runs ({AUTHORIZED_KEYS} is written"
            " with `pct push`, which needs a running container)"
        )
    if found is None:
        return [], (f"{AUTHORIZED_KEYS} could not be read with `pct exec`; its SSH keys are left as they are this run")
    wanted = with_pve_block(found["content"], keys)
    if same_keys_file(found["content"], wanted):
        return [], None
    assert guest.guest.vmid is not None  # a guest found running has its VMID
    return push_keys_commands(guest.guest.vmid, wanted, make_ssh_dir=not found["ssh_dir"]), None


def _converge_keys(guest: HostSettings, state: dict) -> None:
    vmid = guest.guest.vmid
    found = (
        host.get_fact(LxcAuthorizedKeys, vmid=vmid)
        if state["status"] == "running" and guest.guest.ssh_public_keys
        else None
    )
    commands, waiting = plan_keys(guest, state["status"], found)
    if waiting:
        logger.warning(f"{host.name}: LXC guest {vmid} is {state['status']}: {waiting}")
    if commands:
        server.shell(
            name=f"Put {len(guest.guest.ssh_public_keys)} SSH public key(s) in {AUTHORIZED_KEYS}"
            f" of LXC guest {vmid} (pct push)",
            commands=commands,  # type: ignore[arg-type]  # Shell is a str; pyinfra's list[str] is invariant
        )


def _require_same_privilege(guest: HostSettings, config: pve.GuestConfig) -> None:
    have = config.effective().get("unprivileged", "0") == "1"
    if have != guest.guest.unprivileged:
        raise Refused(
            f"{host.name}: LXC guest {guest.guest.vmid} is {'un' if have else ''}privileged but"
            f" {guest.name} has guest_unprivileged = {guest.guest.unprivileged}; Proxmox cannot"
            " change this on an existing container (back it up and restore it with the other setting)"
        )


def _report_pending(guest: HostSettings, state: dict, plan: pve.Plan) -> None:
    """A running container applies devN, features and mpN changes only at its next start."""
    pending = pve.pending_keys(state, plan, HOTPLUGGED)
    if pending:
        logger.warning(
            f"{host.name}: LXC guest {guest.guest.vmid} has changes pending until it restarts"
            f" ({', '.join(pending)}): `pct reboot {guest.guest.vmid}` applies them"
        )
