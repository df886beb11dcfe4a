"""roles/proxmox_host: prepare a Proxmox VE 8 node to hand its GPUs to guests.

IOMMU kernel arguments through the boot loader the node really uses (GRUB or systemd-boot via
proxmox-boot-tool), vfio modules loaded at boot, nouveau blacklisted (this role is the one owner
of that file on a node), the initramfs rebuilt when modules change, and /run/reboot-required
marked when any of that changed. When an LXC guest of this node has GPUs, the node needs the
NVIDIA kernel driver (deploy.py runs roles/nvidia_driver on it, see `needs_host_driver`).

Then `proxmox_reboot` reboots the node once, for every reason marked (with
proxmox_allow_reboot), or stops the deploy with one message saying what to do;
`guest_wait_reason` says why a guest's own deploy cannot start yet (None once its node has
made it); and `continue_in_guests`, the node's last step, runs the same command once more when
a guest waited, so that one command takes a bare node to serving guests.

The node's kernel settings (base_sysctl keys an LXC guest shares with it) are written here too.
"""

from __future__ import annotations

import os
import subprocess
import sys
from io import StringIO

from pyinfra import host, logger, state
from pyinfra.api import deploy
from pyinfra.operations import apt, files, python, server

from roles.shared import layout, reboot
from roles.shared.host_system import require_distro, sysctl_file
from roles.shared.proxmox_facts import (
    BootLoader,
    CpuVendor,
    KernelCmdline,
    KvmGuestState,
    LxcGuestState,
    PciDevices,
)
from roles.shared.refusal import Refused
from roles.shared.shell import sh
from roles.site import HostSettings, Site, current_host, current_site, node_sysctl

SUPPORTED = {("Debian", 12)}  # Proxmox VE 8 is Debian 12 (bookworm)

VFIO_MODULES = ["vfio", "vfio_iommu_type1", "vfio_pci"]  # vfio_virqfd is part of vfio since 6.2
MODULES_FILE = "/etc/modules-load.d/vfio.conf"
BLACKLIST_FILE = layout.NOUVEAU_BLACKLIST
GRUB_DROPIN = "/etc/default/grub.d/inference-host-iommu.cfg"
SYSTEMD_BOOT_CMDLINE = "/etc/kernel/cmdline"
SYSCTL_FILE = "/etc/sysctl.d/90-inference-host-node.conf"
NVIDIA_VENDOR = "0x10de"


def iommu_kernel_args(cpu_vendor: str) -> list[str]:
    """Kernel arguments for passthrough; iommu=pt keeps host-driver GPUs on the fast path."""
    return [f"{cpu_vendor}_iommu=on", "iommu=pt"]


def systemd_boot_cmdline(current: str, args: list[str]) -> str:
    """/etc/kernel/cmdline with args appended where missing; the root= part is kept as it is."""
    words = current.split()
    keys = {word.split("=", 1)[0] for word in words}
    for arg in args:
        if arg not in words and arg.split("=", 1)[0] not in keys:
            words.append(arg)
        elif arg not in words:  # same key, other value (intel_iommu=off): ours wins
            words = [arg if w.split("=", 1)[0] == arg.split("=", 1)[0] else w for w in words]
    return " ".join(words) + "\n"


def guests_of(node_name: str, site: Site | None = None) -> list[HostSettings]:
    return [
        h
        for h in (site or current_site()).hosts.values()
        if h.guest.node == node_name and (h.in_group("lxc_guests") or h.in_group("kvm_guests"))
    ]


@deploy("Proxmox host")
def proxmox_host() -> None:
    settings = current_host()
    require_distro(SUPPORTED, "roles/proxmox_host", "Proxmox VE 8, which is Debian 12")
    apt.packages(
        name="Install pciutils, kmod, initramfs-tools and curl",
        packages=["pciutils", "kmod", "initramfs-tools", "curl"],
        no_recommends=True,
        update=True,
        cache_time=24 * 3600,
    )
    _require_gpus_present(settings)
    boot_changed = _iommu_kernel_args(settings)
    modules_changed = _modules(settings)
    server.shell(
        name="Mark the node: reboot required (kernel arguments or modules changed)",
        commands=["touch /run/reboot-required && echo proxmox-host >> /run/reboot-required.pkgs"],
        _if=lambda: boot_changed() or modules_changed(),
    )
    _sysctl(settings)


@deploy("Proxmox node reboot")
def proxmox_reboot() -> None:
    """Once the node is prepared: reboot it when anything asked for that (IOMMU arguments,
    modules, the NVIDIA kernel module), checked when the step runs; the deploy then continues
    on the rebooted node. Without proxmox_allow_reboot the node's deploy stops here, saying so.
    """
    settings = current_host()
    if settings.proxmox.allow_reboot:
        _reboots[host.name] = reboot.reboot_and_wait(
            name=f"Reboot the node when {reboot.MARKER} says so, and wait for it"
            f" (up to {settings.proxmox.reboot_timeout}s)",
            reboot_timeout=settings.proxmox.reboot_timeout,
            _if=reboot.required_now,
        )
        return
    server.shell(
        name=f"Stop if the node needs a reboot ({reboot.MARKER})",
        commands=[
            sh(
                "echo {head}{why}{tail} >&2; exit 1",
                head=f"{host.name} needs a reboot (",
                why=reboot.why(),
                tail="): reboot it (or set proxmox_allow_reboot = True to let the deploy do it), then run the same"
                " command again: it creates the guests and deploys inside them",
            )
        ],
        _if=reboot.required_now,
    )


def guest_wait_reason(guest: HostSettings) -> str | None:
    """Why a guest's own deploy cannot start yet (its node has not made it), or None.

    Read from the node's facts while pyinfra plans: a guest created in this run is converged
    by the next run of the same command. In production such a guest is not even reachable
    (pyinfra connects to every host first); in the lab its container already runs.
    """
    node_name = guest.guest.node
    if node_name is None or guest.guest.vmid is None:
        return None
    kvm = guest.in_group("kvm_guests")
    guest_state = _guest_state(guest)
    if guest_state is None:
        return (
            f"{guest.name}: {'VM' if kvm else 'container'} {guest.guest.vmid} does not exist"
            f" on {node_name} yet; the node creates it once it is ready, then continues the"
            " deploy inside it (continue_in_guests)"
        )
    if guest_state["status"] != "running":
        return (
            f"{guest.name}: {'VM' if kvm else 'container'} {guest.guest.vmid} on {node_name} is"
            f" {guest_state['status']}; the deploy continues inside it once it runs (start it, then run"
            " the same command again)"
        )
    return None


# --- one command from a bare node --------------------------------------------------------------
#
# pyinfra 3 plans every host before it runs anything (pyinfra_cli/cli.py: connect_all, then the
# deploy file is run once per host to collect operations, then api/operations.run_ops), and it
# connects to every host before planning. What the node does in a run (a rebooted kernel whose
# driver now lists the GPUs, a guest that now exists) therefore cannot change that run's plan:
# the guests' operations were decided, or left out, while the node was still bare. There is no
# API to add operations to a running plan. So the node's last operation runs the same command
# again, as a child process of this one, once the node is done: the child connects afresh
# (to the rebooted node and the new guests), plans with their real facts and deploys. Each pass
# makes progress (pass 1: node prepared and rebooted; pass 2: guests created; pass 3: inside
# them), at most MAX_PASSES in one command; the passes are numbered in PASS_ENV. A child of the
# CLI rather than a second State in-process: pyinfra's state, connectors and its output are
# process-wide (pyinfra.context), and the child is exactly what a user's next run would be.

PASS_ENV = "INFERENCE_HOST_DEPLOY_PASS"
MAX_PASSES = 3
_reboots: dict = {}  # node name -> its reboot operation (its did_change: it rebooted in this run)
_continued: list[str] = []  # the one child per run (several nodes: it covers all of them)


def deploy_pass() -> int:
    return int(os.environ.get(PASS_ENV, "1") or 1)


@deploy("Proxmox guests continue")
def continue_in_guests() -> None:
    """The node's last step: when one of its guests did not exist as this pass was planned (the
    node makes it in this pass) or the node rebooted (its guests' plan predates the boot), the
    same command runs once more and deploys inside them. A guest that exists but stays stopped
    (a VM with no OS yet) is no reason: another pass would find it stopped again. A converged
    node plans this step and skips it."""
    settings = current_host()
    waiting = [g.name for g in guests_of(settings.name) if g.guest.vmid is not None and _guest_state(g) is None]
    rebooted = _reboots.get(host.name)
    if not waiting and rebooted is None:
        return
    if deploy_pass() >= MAX_PASSES:
        if waiting:
            logger.warning(
                f"{host.name}: {', '.join(waiting)} still wait{'s' if len(waiting) == 1 else ''}"
                f" after {MAX_PASSES} passes; see the messages above, then run the same command again"
            )
        return
    what = ", ".join(waiting) if waiting else "its guests"
    python.call(
        name=f"Continue the deploy inside {what}: pass {deploy_pass() + 1} of the same command"
        + ("" if waiting else " (when the node rebooted)"),
        function=_next_pass,
        node=host.name,
        guests=waiting,
        _if=lambda: bool(waiting) or (rebooted is not None and rebooted.did_change()),
    )


def _next_pass(node: str, guests: list[str]) -> None:
    """Runs on the control machine: the same pyinfra command line, as a child process sharing
    this terminal (its output follows this pass's; with --json its own JSON comes first)."""
    if _continued:
        logger.info(f"{node}: its guests are in the next pass started by {_continued[0]}")
        return
    _continued.append(node)
    number = deploy_pass() + 1
    logger.info(
        f"--> Pass {number} (of at most {MAX_PASSES}): the node is done; the same command runs"
        f" again for {', '.join(guests) or 'the guests of the rebooted node'} (pyinfra plans"
        " every host before it runs, so what this pass made is planned by the next)"
    )
    command = [sys.executable, "-m", "pyinfra", "-y", *sys.argv[1:]]
    sys.stdout.flush()
    sys.stderr.flush()
    done = subprocess.run(command, env={**os.environ, PASS_ENV: str(number)}, check=False)
    if done.returncode != 0:
        raise RuntimeError(
            f"pass {number} of the deploy (inside {', '.join(guests) or 'the guests'}) failed"
            f" with exit status {done.returncode}; its output is above"
        )
    # A guest that did not exist could not be connected to at the start of this pass: pyinfra
    # counted it as failed (pyinfra/api/connect.py, connect_all -> state.fail_hosts). The next
    # pass has deployed it, so this pass's exit status no longer holds that against the run.
    for name in guests:
        guest = state.inventory.get_host(name)
        if guest in state.failed_hosts:
            state.failed_hosts.discard(guest)
    logger.info(f"--> Pass {number} converged {', '.join(guests) or 'the guests'}; back to pass {number - 1}")


def _guest_state(guest: HostSettings) -> dict | None:
    """The guest as its node reports it while pyinfra plans (None: not made yet)."""
    assert guest.guest.node, "only a guest with a node is asked about (guest_wait_reason)"
    node = state.inventory.get_host(guest.guest.node)
    fact = KvmGuestState if guest.in_group("kvm_guests") else LxcGuestState
    return node.get_fact(fact, vmid=guest.guest.vmid)


@deploy("Proxmox guests ready")
def guests_ready() -> None:
    """An ordering barrier, called by every host at one place in deploy.py.

    pyinfra orders operations as a graph of each host's own sequence; an operation called from
    the same line on every host is one node of that graph. Placed after the node's guest
    operations and before the guests' own, it makes every guest wait until its node has created
    and configured it. It never runs anything itself.
    """
    server.shell(
        name="Continue inside the guests once the Proxmox nodes have created them",
        commands=["true"],
        _if=lambda: False,
    )


def _sysctl(settings: HostSettings) -> None:
    """The kernel settings of the node and of its LXC guests (roles/base leaves those out there)."""
    sysctl = node_sysctl(settings, current_site().hosts)
    if not sysctl:
        return
    sysctl_file(
        SYSCTL_FILE,
        "roles/proxmox_host/templates/90-inference-host-node.conf.j2",
        sysctl,
        name=f"Write {SYSCTL_FILE} ({', '.join(f'{k} = {v}' for k, v in sorted(sysctl.items()))})",
    )


def _require_gpus_present(settings: HostSettings) -> None:
    """Every GPU the inventory names must be an NVIDIA device here, in the IOMMU group given."""
    devices = host.get_fact(PciDevices)
    for address in settings.proxmox.gpu_addresses:
        device = devices.get(address)
        if device is None or device.get("vendor") != NVIDIA_VENDOR:
            found = ", ".join(a for a, d in devices.items() if d.get("vendor") == NVIDIA_VENDOR)
            raise Refused(
                f"{host.name}: proxmox_gpu_addresses has {address}, which is not an NVIDIA device"
                f" on this node; NVIDIA devices here: {found or '(none)'}"
            )
        expected = settings.proxmox.iommu_groups.get(address)
        if expected is not None and device.get("iommugroup") != expected:
            raise Refused(
                f"{host.name}: proxmox_iommu_groups says {address} is in group {expected}, the node"
                f" reports group {device.get('iommugroup')}; correct the inventory"
            )


def _iommu_kernel_args(settings: HostSettings):
    vendor = settings.proxmox.cpu_vendor
    if vendor == "auto":
        vendor = host.get_fact(CpuVendor)
        if vendor is None:
            raise Refused(f"{host.name}: CPU vendor not recognised; set proxmox_cpu_vendor")
    args = iommu_kernel_args(vendor)
    loader = settings.proxmox.boot_loader
    if loader == "auto":
        loader = host.get_fact(BootLoader)
    if loader == "systemd-boot":
        return _systemd_boot_args(args)
    return _grub_args(args)


def _grub_args(args: list[str]):
    files.directory(name="Create /etc/default/grub.d", path="/etc/default/grub.d", mode="0755")
    dropin = files.template(
        name=f"Add {' '.join(args)} to GRUB's kernel command line ({GRUB_DROPIN})",
        src="roles/proxmox_host/templates/inference-host-iommu.cfg.j2",
        dest=GRUB_DROPIN,
        kernel_args=args,
        mode="0644",
    )
    server.shell(
        name="Regenerate the GRUB configuration (update-grub)", commands=["update-grub"], _if=dropin.did_change
    )
    return dropin.did_change


def _systemd_boot_args(args: list[str]):
    current = host.get_fact(KernelCmdline)
    if current is None:
        raise Refused(
            f"{host.name}: the node boots with systemd-boot but {SYSTEMD_BOOT_CMDLINE} is missing;"
            " run `proxmox-boot-tool status` on it, or set proxmox_boot_loader = 'grub'"
        )
    cmdline = files.put(
        name=f"Add {' '.join(args)} to {SYSTEMD_BOOT_CMDLINE}",
        src=StringIO(systemd_boot_cmdline(current, args)),
        dest=SYSTEMD_BOOT_CMDLINE,
        mode="0644",
    )
    server.shell(
        name="Copy the kernel command line to the ESPs (proxmox-boot-tool refresh)",
        commands=["proxmox-boot-tool refresh"],
        _if=cmdline.did_change,
    )
    return cmdline.did_change


def _modules(settings: HostSettings):
    modules = files.template(
        name=f"Load {', '.join(VFIO_MODULES)} at boot ({MODULES_FILE})",
        src="roles/proxmox_host/templates/vfio.conf.j2",
        dest=MODULES_FILE,
        modules=VFIO_MODULES,
        mode="0644",
    )
    blacklist = files.template(
        name=f"Blacklist nouveau ({BLACKLIST_FILE})",
        src="roles/proxmox_host/templates/blacklist-nouveau.conf.j2",
        dest=BLACKLIST_FILE,
        mode="0644",
    )

    def changed() -> bool:
        return modules.did_change() or blacklist.did_change()

    server.shell(
        name="Rebuild the initramfs for all kernels (update-initramfs -u -k all)",
        commands=["update-initramfs -u -k all"],
        _if=changed,
    )
    return changed


def needs_host_driver(settings: HostSettings, site: Site | None = None) -> bool:
    """Whether this node gets the NVIDIA kernel driver: one of its LXC guests has GPUs.

    deploy.py then runs roles/nvidia_driver on the node (full mode: the node is no LXC guest)
    at the stack's exact version, which its LXC guests' userspace must match; with
    proxmox_host_driver = False the driver is left to the user.
    """
    if not any(g.in_group("lxc_guests") and g.guest.gpu_addresses for g in guests_of(settings.name, site)):
        return False
    if not settings.proxmox.host_driver:
        logger.warning(
            f"{settings.name}: proxmox_host_driver = False: the NVIDIA host driver, the"
            " nvidia-uvm device nodes and nvidia-persistenced are left to you (LXC guests"
            " need them)"
        )
        return False
    return True
