"""`inference-host teardown INVENTORY GUEST`: stop and destroy one Proxmox guest, keep the
node's model storage (docs/operations.md, "teardown").

What Proxmox VE 8 destroys (read in its source, branch stable-bookworm):
- `pct destroy` (pve-container 5.3.5 src/PVE/API2/LXC.pm destroy_vm -> src/PVE/LXC.pm
  destroy_lxc_container): every rootfs/mpN/unusedN volume the CT owns (the VMID in the volume's
  name, PVE::Storage::parse_volname) is freed; a mount point that is a node path ("bind",
  PVE::LXC::Config->classify_mountpoint) or a device is left as it is; another guest's volume is
  skipped with a warning. It refuses a running CT unless --force.
- `qm destroy` (qemu-server 8.4.10 src/PVE/API2/Qemu.pm destroy_vm -> src/PVE/QemuServer.pm
  destroy_vm): every drive, unusedN and vmstate the VM owns, cloud-init drive included; cdroms
  and paths are left. It refuses a running VM.
- Both: `--destroy-unreferenced-disks 1` also frees every volume named with the VMID on every
  enabled storage (shared ones too) that the config does not reference: never asked for here
  (passed as 0: a model volume detached from the guest keeps its data). `--purge` only removes
  the VMID from backup, replication and HA jobs (no data); not passed either, so a guest made
  again under the same VMID is in its jobs again.

So the weights survive exactly when they are on a node folder given to the guest as a bind mount
point (`guest_mount_points`, as roles/weights downloads them on the node). Before anything is
stopped, the guest's config on the node is read and the command refuses (exit 1, nothing
changed) when destroy would free a volume other than the guest's own system disk (its rootfs;
a VM's scsi0, efidisk0 and cloud-init drive, as roles/kvm_guest makes them). After the destroy
it checks that each kept folder is still there and says what it kept. The inventory still
describes the guest: the next deploy creates it again and continues inside it.

Every command on the node is built with roles/shared/shell.py and runs under `timeout -s KILL`;
the connection itself is waited for at most the same bound plus a margin.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass, field

from roles.shared import pve
from roles.shared.shell import Shell, argv, sh
from roles.site.command_line import FAILED, OK, UNREACHABLE, USAGE

READ_BOUND_S = 30  # reading the guest's state and config on the node
STOP_BOUND_S = 180  # `pct stop` / `qm stop`: a hard stop, but a VM's QEMU may take its time
DESTROY_BOUND_S = 600  # freeing large volumes (a thin LV, a ZFS dataset)
CONNECT_MARGIN_S = 20  # on top of a command's own bound: the connection (ssh, docker exec)

# The system disks roles/lxc_guest and roles/kvm_guest create for a guest: destroying them is
# what a teardown is for. Any other volume the guest owns is someone's data.
SYSTEM_DISKS = {"lxc": {"rootfs"}, "qemu": {"scsi0", "efidisk0", "ide2"}}


@dataclass
class DestroyPlan:
    """What `destroy` will do to each volume of the guest's config."""

    destroyed: list[tuple[str, str]] = field(default_factory=list)  # (key, volume id)
    kept: list[tuple[str, str, str]] = field(default_factory=list)  # (key, node path or volume, why)
    refused: list[str] = field(default_factory=list)  # one line each: data destroy would free


def volume_owner(volid: str) -> int | None:
    """PVE::Storage::parse_volname's owner: the VMID in the volume's name (`vm-101-disk-0`,
    `subvol-101-disk-0`, `101/vm-101-disk-0.raw`; a linked clone's last part); None for a
    template, an ISO or a backup, which no guest owns."""
    import re

    name = volid.partition(":")[2].rsplit("/", 1)[-1]
    match = re.match(r"(?:vm|subvol|base|basevol)-(\d+)-", name)
    return int(match.group(1)) if match else None


def _volumes(kind: str, conf: dict[str, str]) -> list[tuple[str, str, dict[str, str]]]:
    """(key, volume or path, its properties) of every key destroy looks at, in key order."""
    import re

    found = []
    for key in sorted(conf):
        value = conf[key]
        if kind == "lxc" and (key == "rootfs" or re.fullmatch(r"mp\d+", key)):
            props = pve.parse_property_string(value, "volume")
            found.append((key, props.get("volume", ""), props))
        elif re.fullmatch(r"unused\d+", key) or (kind == "qemu" and key == "vmstate"):
            found.append((key, value.strip(), {}))
        elif kind == "qemu" and re.fullmatch(r"(ide|sata|scsi|virtio)\d+|efidisk0|tpmstate0", key):
            props = pve.parse_property_string(value, "file")
            found.append((key, props.get("file", ""), props))
    return found


def destroy_plan(kind: str, vmid: int, config: pve.GuestConfig, weights: set[str]) -> DestroyPlan:
    """What destroy frees and leaves, from the guest's config (its pending section included, as
    destroy reads both); `weights` are the node folders roles/weights fills for this guest."""
    plan = DestroyPlan()
    seen: set[str] = set()
    sections = (config.current, {k: v for k, v in config.pending.items() if k != "delete"})
    for conf in sections:
        for key, volume, props in _volumes(kind, conf):
            if not volume or volume in seen or volume in ("none", "cdrom"):  # an empty drive
                continue
            seen.add(volume)
            if volume.startswith("/"):
                target = props.get("mp", "")
                why = "the guest's weights" if volume in weights else "a node folder (bind mount)"
                plan.kept.append((key, volume, f"{why}{f', at {target} in the guest' if target else ''}"))
            elif kind == "qemu" and props.get("media") == "cdrom" and "cloudinit" not in volume:
                plan.kept.append((key, volume, "a cdrom image"))
            elif volume_owner(volume) != vmid:
                owner = volume_owner(volume)
                plan.kept.append((key, volume, f"owned by {owner}" if owner else "owned by no guest"))
            else:
                plan.destroyed.append((key, volume))
                if key not in SYSTEM_DISKS[kind]:
                    plan.refused.append(f"{key} ({volume}) is a volume the guest owns: destroy would delete its data")
    for path in sorted(weights):
        if path not in seen:
            plan.refused.append(f"the weights' folder {path} is not a mount point of the guest on the node")
    return plan


def state_command(kind: str, vmid: int) -> Shell:
    """The guest's status and config file in one command (the role's own fact)."""
    from roles.shared.proxmox_facts import KvmGuestState, LxcGuestState

    fact = LxcGuestState() if kind == "lxc" else KvmGuestState()
    return fact.command(vmid)


def bounded(seconds: int, command: Shell) -> Shell:
    """`timeout -s KILL`: the command is killed at its bound, not waited for."""
    return sh("timeout -s KILL {seconds} sh -c {command}", seconds=seconds, command=str(command))


def stop_command(kind: str, vmid: int) -> Shell:
    return argv("pct" if kind == "lxc" else "qm", "stop", vmid)


def destroy_command(kind: str, vmid: int) -> Shell:
    """`pct destroy` / `qm destroy` with unreferenced volumes left alone, said explicitly (pct's
    option has no default in its schema, qm's is 0; an operator's alias is not the schema)."""
    return argv("pct" if kind == "lxc" else "qm", "destroy", vmid, "--destroy-unreferenced-disks", "0")


def folders_command(paths: list[str]) -> Shell:
    """One line per path: `kept PATH` when the folder is there, `gone PATH` when not."""
    return sh(
        'for p in {paths}; do if test -d "$p"; then echo "kept $p"; else echo "gone $p"; fi; done',
        paths=paths,
    )


# -- running it ---------------------------------------------------------------------------------


class Unreachable(Exception):
    pass


def _on_node(inventory: str, node: str, command: Shell, bound: int):
    """The command's result on the node, waited for at most bound + a margin."""
    import testinfra

    from checks.connection import testinfra_url

    answer: dict = {}

    def run() -> None:
        try:
            answer["result"] = testinfra.get_host(testinfra_url(inventory, node)).run(str(bounded(bound, command)))
        except Exception as error:  # an unreachable node is one line, not a traceback
            answer["error"] = f"{type(error).__name__}: {str(error).strip()[:200]}"

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(bound + CONNECT_MARGIN_S)
    if thread.is_alive():
        raise Unreachable(f"{node}: no answer within {bound + CONNECT_MARGIN_S} s")
    if "error" in answer:
        raise Unreachable(f"{node}: {answer['error']}")
    return answer["result"]


def _confirmed(args, name: str, plan_text: str) -> str | None:
    """None when the operator typed the guest's name (or passed it with --yes-i-typed), else why not."""
    print(plan_text)
    if args.yes_i_typed is not None:
        return None  # already compared before any host was contacted
    try:
        typed = input(f"type the guest's name ({name}) to destroy it: ")
    except EOFError:
        typed = ""
    return None if typed.strip() == name else f"{typed.strip()[:60]!r} is not {name!r}; nothing changed"


def _last_line(text: str) -> str:
    return (text.strip().splitlines() or ["no output"])[-1][:200]


def teardown(args, parser) -> int:
    from inference_host.site_load import load as _load
    from roles.shared.proxmox_facts import parse_guest_state
    from roles.site.weights import weights_mount_points

    if args.yes_i_typed is not None and args.yes_i_typed != args.guest:
        parser.error(f"--yes-i-typed {args.yes_i_typed[:60]!r} is not the guest's name {args.guest!r}; nothing changed")
    if args.yes_i_typed is None and not sys.stdin.isatty():
        parser.error(f"not at a terminal: confirm with --yes-i-typed {args.guest} (the guest's name); nothing changed")
    site = _load(parser, args.inventory)
    guest = site.hosts.get(args.guest)
    guests = [h.name for h in site.hosts.values() if {"lxc_guests", "kvm_guests"} & set(h.groups)]
    if guest is None or guest.name not in guests:
        known = ", ".join(guests) or "none"
        parser.error(f"{args.guest!r} is not a Proxmox guest of {args.inventory}; guests: {known}")
    if not guest.guest.node or guest.guest.vmid is None:
        parser.error(f"{guest.name} has no guest_node or guest_vmid: no node made it, none can destroy it")
    kind, vmid, node = ("qemu" if guest.in_group("kvm_guests") else "lxc"), guest.guest.vmid, guest.guest.node
    label = f"{'VM' if kind == 'qemu' else 'CT'} {vmid} ({guest.name}) on {node}"
    started = time.monotonic()
    from checks.connection import testinfra_url
    from checks.reach import unreachable

    why = unreachable(testinfra_url(args.inventory, node), node)
    if why:
        print(f"inference-host teardown: {why}; nothing changed", file=sys.stderr)
        return UNREACHABLE
    try:
        read = _on_node(args.inventory, node, state_command(kind, vmid), READ_BOUND_S)
        if read.rc != 0:
            print(f"inference-host teardown: reading {label} failed: {_last_line(read.stderr)}", file=sys.stderr)
            return FAILED
        state = parse_guest_state(read.stdout.splitlines(), kind)
        if state is None:
            print(f"{label}: does not exist; nothing to tear down (deploy creates it)")
            return OK
        plan = destroy_plan(kind, vmid, state["config"], weights_mount_points(guest))
        if plan.refused:
            for line in plan.refused:
                print(f"inference-host teardown: {label}: {line}", file=sys.stderr)
            print(
                "inference-host teardown: refused, nothing changed: move such data off the guest first"
                " (a node folder given as guest_mount_points survives a destroy)",
                file=sys.stderr,
            )
            return FAILED
        not_confirmed = _confirmed(args, guest.name, render_plan(label, state["status"], plan))
        if not_confirmed:
            print(f"inference-host teardown: {not_confirmed}", file=sys.stderr)
            return USAGE
        tool = "pct" if kind == "lxc" else "qm"
        if state["status"] == "running":
            stopped = _on_node(args.inventory, node, stop_command(kind, vmid), STOP_BOUND_S)
            if stopped.rc != 0:
                return _failed(f"{tool} stop {vmid}", stopped, STOP_BOUND_S, "the guest still exists")
        destroyed = _on_node(args.inventory, node, destroy_command(kind, vmid), DESTROY_BOUND_S)
        if destroyed.rc != 0:
            return _failed(f"{tool} destroy {vmid}", destroyed, DESTROY_BOUND_S, "read `pct/qm config` on the node")
        folders = [path for _, path, _ in plan.kept if path.startswith("/")]
        checked = _on_node(args.inventory, node, folders_command(folders), READ_BOUND_S) if folders else None
    except Unreachable as error:
        print(f"inference-host teardown: {error}; see `inference-host status`", file=sys.stderr)
        return UNREACHABLE
    gone = [line[5:] for line in (checked.stdout.splitlines() if checked else []) if line.startswith("gone ")]
    print(f"destroyed {label} in {time.monotonic() - started:.1f} s: {', '.join(v for _, v in plan.destroyed)}")
    for key, path, why in plan.kept:
        print(f"kept {path} ({key}: {why}){' -- MISSING after the destroy' if path in gone else ''}")
    if gone:
        print(f"inference-host teardown: {', '.join(gone)} no longer on {node}", file=sys.stderr)
        return FAILED
    print(f"to bring {guest.name} back: inference-host deploy {args.inventory} (the inventory still has it)")
    return OK


def render_plan(label: str, status: str, plan: DestroyPlan) -> str:
    lines = [f"teardown of {label} ({status}): stop it, then destroy it"]
    lines += [f"  destroyed: {key} {volume}" for key, volume in plan.destroyed]
    lines += [f"  kept:      {key} {path} ({why})" for key, path, why in plan.kept]
    return "\n".join(lines)


def _failed(what: str, result, bound: int, state: str) -> int:
    if result.rc in (124, 137):
        print(f"inference-host teardown: {what} did not finish within {bound} s ({state})", file=sys.stderr)
    else:
        why = _last_line(result.stderr)
        print(f"inference-host teardown: {what} failed (exit {result.rc}): {why}", file=sys.stderr)
    return FAILED


def add_teardown_parser(commands) -> None:
    sub = commands.add_parser(
        "teardown",
        help="stop and destroy one Proxmox guest, keeping the node's model storage (typed confirmation)",
        description="Stop and destroy GUEST (pct/qm on its node) after you type its name. Its system "
        "disk goes; the node folders it mounts (the weights) stay, and the command says what it kept. "
        "It refuses, changing nothing, when destroy would delete another volume the guest owns. The "
        "inventory still describes the guest: the next deploy creates it again.",
    )
    sub.add_argument("inventory", help="inventory file, e.g. inventory/prod.py")
    sub.add_argument("guest", help="the guest's inventory host name (in lxc_guests or kvm_guests)")
    sub.add_argument(
        "--yes-i-typed",
        metavar="NAME",
        help="the guest's name, typed on the command line (for scripts; without it the command asks)",
    )
    sub.set_defaults(run=teardown)
