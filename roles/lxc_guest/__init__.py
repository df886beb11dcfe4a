"""roles/lxc_guest: an LXC container on a Proxmox node, with its GPUs as devN device entries.

Runs on the Proxmox node (deploy.py calls it once per guest of that node). Creates the guest
with `pct create` when it is absent and starts it; converges an existing guest by applying only
the differences with one `pct set` (`--delete` for entries no longer wanted). A devN change on a
running container stays pending until it restarts (PVE 8): the deploy says so.
"""

from __future__ import annotations

import shlex

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.operations import server

from roles.shared import pve
from roles.shared.proxmox_facts import LxcGuestState, NvidiaHostDevices
from roles.shared.pve import guest_hostname
from roles.site import HostSettings, current_host

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


def wanted_devices(guest: HostSettings, host_devices: dict) -> list[str]:
    """devN values for the guest's GPUs; fails when the host driver does not list one."""
    minors = []
    for address in guest.guest.gpu_addresses:
        if address not in host_devices["minors"]:
            raise RuntimeError(
                f"{guest.guest.node}: {guest.name} is given GPU {address}, but the node's NVIDIA driver"
                " lists no such GPU (/proc/driver/nvidia/gpus); install the host driver, reboot"
                " the node if proxmox_host asked for it, and deploy again"
            )
        minors.append(host_devices["minors"][address])
    present = set(host_devices["nodes"])
    paths = pve.lxc_device_paths(minors, present)
    missing = [path for path in paths if path not in present]
    if missing:
        raise RuntimeError(
            f"{guest.guest.node}: {guest.name} needs {', '.join(missing)}, missing on the node; Proxmox"
            " refuses to start a container whose devN path is absent (is nvidia-persistenced"
            " running? `nvidia-modprobe -u -c=0` creates the uvm nodes)"
        )
    return paths


def wanted_mount_points(guest: HostSettings) -> list[str]:
    return [pve.lxc_mount_point(src, dst) for src, dst in guest.guest.mount_points.items()]


def create_command(guest: HostSettings, devices: list[str]) -> str:
    settings = guest.guest
    args = ["pct", "create", str(settings.vmid), settings.template,
            "--unprivileged", "1" if settings.unprivileged else "0",  # explicit: PVE 9 changed the default
            "--rootfs", f"{settings.storage}:{settings.disk_gib}",
            "--net0", pve.lxc_net0(settings.bridge, settings.ip, settings.gateway)]
    for key, value in wanted_settings(guest).items():
        args += [f"--{key}", value]
    for index, value in enumerate(devices):
        args += [f"--dev{index}", value]
    for index, value in enumerate(wanted_mount_points(guest)):
        args += [f"--mp{index}", value]
    return shlex.join(args)


def plan_update(guest: HostSettings, config: pve.GuestConfig, devices: list[str]) -> pve.Plan:
    """The smallest `pct set` that makes the guest's effective config what the inventory says."""
    effective = config.effective()
    plan = pve.plan_scalars(effective, wanted_settings(guest))
    settings = guest.guest
    net0 = pve.lxc_net0(settings.bridge, settings.ip, settings.gateway)
    if not effective.get("net0") or not pve.same_net(effective["net0"], net0):
        plan = plan.merged(pve.Plan({"net0": pve.with_hwaddr(effective.get("net0"), net0)}))
    if "features" in effective and not settings.features:
        plan = plan.merged(pve.Plan(delete=("features",)))
    plan = plan.merged(pve.plan_indexed(effective, pve.LXC_DEVICE_KEYS, devices,
                                        pve.device_path, pve.same_device))
    return plan.merged(pve.plan_indexed(effective, pve.LXC_MOUNT_KEYS, wanted_mount_points(guest),
                                        pve.mount_identity, lambda a, b: a == b))


@deploy("LXC guest")
def lxc_guest(guest: HostSettings) -> None:
    node = current_host()
    settings = guest.guest
    vmid = settings.vmid
    host_devices = host.get_fact(NvidiaHostDevices, proc_dir=node.proxmox.nvidia_proc_dir)
    devices = wanted_devices(guest, host_devices)
    state = host.get_fact(LxcGuestState, vmid=vmid)
    if state is None:
        server.shell(
            name=f"Create LXC guest {vmid} ({guest_hostname(guest)}) from {settings.template}"
                 f" with {len(settings.gpu_addresses)} GPUs",
            commands=[create_command(guest, devices)],
        )
        server.shell(name=f"Start LXC guest {vmid}", commands=[f"pct start {vmid}"])
        return
    _require_same_privilege(guest, state["config"])
    plan = plan_update(guest, state["config"], devices)
    if plan:
        changed = sorted(plan.set) + [f"-{key}" for key in plan.delete]
        server.shell(
            name=f"Update LXC guest {vmid}: {' '.join(changed)}",
            commands=[shlex.join(["pct", "set", str(vmid), *plan.arguments()])],
        )
    _report_pending(guest, state, plan)


def _require_same_privilege(guest: HostSettings, config: pve.GuestConfig) -> None:
    have = config.effective().get("unprivileged", "0") == "1"
    if have != guest.guest.unprivileged:
        raise RuntimeError(
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
