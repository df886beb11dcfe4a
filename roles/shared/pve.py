"""Proxmox VE 8 guest configuration: parse what `pct config` / `qm config` print, render the
lines the roles want, and plan the smallest `set` / `--delete` that gets from one to the other.

Pure functions only (no pyinfra): roles/lxc_guest and roles/kvm_guest call them with facts and
settings, and the unit tests call them with sample output.

Formats follow the PVE 8 sources (branch stable-bookworm):
- pve-container src/PVE/LXC/Config.pm: parse_pct_config / write_pct_config, $dev_desc,
  $netconf_desc, $features_desc; dev0-dev255, mp0-mp255, net0-net31.
- qemu-server src/PVE/QemuServer/PCI.pm: $hostpci_fmt (default key `host`), hostpci0-hostpci15.
- pve-common src/PVE/JSONSchema.pm print_property_string: the default key is printed bare and
  first, then required keys, then the rest sorted by name.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from roles.site import HostSettings
from roles.site.fields import property_value_problem

LXC_DEVICE_KEYS = tuple(f"dev{i}" for i in range(256))
KVM_HOSTPCI_KEYS = tuple(f"hostpci{i}" for i in range(16))
LXC_MOUNT_KEYS = tuple(f"mp{i}" for i in range(256))

# Section headers, as each writer prints them (PVE 8, branch stable-bookworm):
# - pve-container 5.3.5 src/PVE/LXC/Config.pm parse_pct_config / write_pct_config:
#   "[pve:pending]", then "[<snapshot>]" sections.
# - qemu-server 8.4.10 src/PVE/QemuServer.pm parse_vm_config / write_vm_config: "[PENDING]",
#   then "[special:cloudinit]" / "[special:fleecing]", then "[<snapshot>]" sections; any other
#   bracketed line is an unknown section whose lines are skipped.
# The header is matched case-insensitively by both parsers; a container's "[PENDING]" would be
# a snapshot named PENDING, a VM's "[pve:pending]" an unknown section (neither writer does that).
_PENDING_HEADER = {
    "lxc": re.compile(r"^\[pve:pending\]\s*$", re.IGNORECASE),
    "qemu": re.compile(r"^\[PENDING\]\s*$", re.IGNORECASE),
}
_SPECIAL_RE = re.compile(r"^\[special:(cloudinit|fleecing)\]\s*$", re.IGNORECASE)
_SNAPSHOT_RE = re.compile(r"^\[([a-z][a-z0-9_\-]+)\]\s*$", re.IGNORECASE)
_UNKNOWN_SECTION_RE = re.compile(r"^\[([^\]]*)\]\s*$")
_LXC_RAW_RE = re.compile(r"^(lxc\.[a-z0-9_\-.]+)(:|\s*=)\s*(.*?)\s*$")
_KEY_RE = re.compile(r"^([a-z][a-z_\-]*\d*):\s*(.+?)\s*$")


@dataclass(frozen=True)
class GuestConfig:
    """A guest's configuration: values in effect, changes pending until restart, raw lxc.* lines."""

    current: dict[str, str]
    pending: dict[str, str] = field(default_factory=dict)
    pending_delete: frozenset[str] = frozenset()
    lxc: tuple[tuple[str, str], ...] = ()

    def effective(self) -> dict[str, str]:
        """What `pct config` / `qm config` print by default: pending values applied."""
        merged = {**self.current, **self.pending}
        for key in self.pending_delete:
            merged.pop(key, None)
        return merged

    @property
    def has_pending(self) -> bool:
        return bool(self.pending or self.pending_delete)


def parse_config(text: str, kind: str) -> GuestConfig:
    """Parse /etc/pve/lxc/<id>.conf (kind "lxc") or /etc/pve/qemu-server/<id>.conf ("qemu").

    Only the main section is current and only the writer's own pending section is pending;
    special (cloud-init, fleecing), snapshot and unknown sections never leak into either.
    `#` lines are the description (not needed here).
    """
    if kind not in _PENDING_HEADER:
        raise ValueError(f"kind must be 'lxc' or 'qemu', not {kind!r}")
    sections: dict[str, dict[str, str]] = {"current": {}, "pending": {}}
    lxc: list[tuple[str, str]] = []
    section: str | None = "current"
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        section, is_header = _section_of(line, kind, section)
        if is_header or section not in sections:
            continue
        raw = _LXC_RAW_RE.match(line) if kind == "lxc" else None
        if raw:
            if section == "current":
                lxc.append((raw.group(1), raw.group(3)))
            continue
        match = _KEY_RE.match(line)
        if match:
            sections[section][match.group(1)] = match.group(2)
    pending = sections["pending"]
    deletes = pending.pop("delete", "")
    # pve-guest-common AbstractConfig print_pending_delete: "k1,k2", "!key" a forced delete.
    delete_keys = frozenset(k.lstrip("!") for k in re.split(r"[,;\s]+", deletes) if k)
    return GuestConfig(sections["current"], pending, delete_keys, tuple(lxc))


def _section_of(line: str, kind: str, section: str | None) -> tuple[str | None, bool]:
    """(section the line belongs to, whether it is a header), in the writers' precedence."""
    if _PENDING_HEADER[kind].match(line):
        return "pending", True
    if kind == "qemu" and _SPECIAL_RE.match(line):
        return "special", True
    if _SNAPSHOT_RE.match(line):
        return "snapshot", True
    if _UNKNOWN_SECTION_RE.match(line):
        return None, True
    return section, False


def parse_property_string(value: str, default_key: str | None = None) -> dict[str, str]:
    """`/dev/nvidia0,mode=0666` -> {"path": "/dev/nvidia0", "mode": "0666"} (default_key="path")."""
    result: dict[str, str] = {}
    for part in value.split(","):
        if not part:
            continue
        if "=" in part:
            key, _, item = part.partition("=")
            result[key.strip()] = item.strip()
        elif default_key:
            result[default_key] = part.strip()
        else:
            raise ValueError(f"value without key, but schema does not define a default key: {value!r}")
    return result


class PropertyString(str):
    """A Proxmox property string written by print_property_string from checked values: the only
    kind of value option_args lets reach a property-string option of pct/qm."""


# Options pct/qm read with parse_property_string (pve-container $confdesc: rootfs, mpN, netN,
# devN, features; qemu-server $confdesc: netN, the disks, efidisk0, hostpciN, ipconfigN, cpu).
PROPERTY_OPTION_RE = re.compile(
    r"(rootfs|mp\d+|net\d+|dev\d+|features|hostpci\d+|ipconfig\d+|cpu"
    r"|(scsi|ide|sata|virtio)\d+|efidisk0)"
)


def option_args(key: str, value: str) -> list[str]:
    """`--key value` for pct/qm; a property-string option takes a PropertyString only, so a raw
    setting cannot reach one by mistake (a TypeError names it)."""
    if PROPERTY_OPTION_RE.fullmatch(key) and not isinstance(value, PropertyString):
        raise TypeError(f"--{key} takes a property string built by roles/shared/pve.py, not the raw {value!r}")
    return [f"--{key}", value]


def print_property_string(
    data: Mapping[str, object], default_key: str | None = None, required: tuple[str, ...] = ()
) -> PropertyString:
    """The inverse of parse_property_string, in JSONSchema.pm print_property_string order.

    The one writer of every property string the roles pass to pct/qm: a value Proxmox would
    read back as something else (roles/site/fields.py property_value_problem: a ',', a '=' in
    the bare default-key value, blank or space-edged) is a ValueError here, never written; the
    site model refuses such settings before this runs."""
    for key, value in data.items():
        problem = None if value is None else property_value_problem(str(value), key == default_key)
        if problem:
            raise ValueError(f"{key}={value!r} cannot be written into a Proxmox property string: it {problem}")
    parts: list[str] = []
    done: set[str] = set()
    if default_key and data.get(default_key) is not None:
        parts.append(str(data[default_key]))
        done.add(default_key)
    for key in [k for k in sorted(data) if k in required] + sorted(data):
        if key in done or data[key] is None:
            continue
        done.add(key)
        parts.append(f"{key}={data[key]}")
    return PropertyString(",".join(parts))


# ----------------------------------------------------------------------------------------------
# Planning: from what is there to what is wanted, with the fewest keys touched.


@dataclass(frozen=True)
class Plan:
    """Keys to set (key -> value) and keys to delete, for one `pct set` / `qm set` call."""

    set: dict[str, str] = field(default_factory=dict)
    delete: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.set or self.delete)

    def arguments(self) -> list[str]:
        args: list[str] = []
        for key, value in self.set.items():
            args += option_args(key, value)
        if self.delete:
            args += ["--delete", ",".join(self.delete)]
        return args

    def merged(self, other: Plan) -> Plan:
        return Plan({**self.set, **other.set}, self.delete + other.delete)


def pending_keys(state: dict, plan: Plan, hotplugged: set[str]) -> list[str]:
    """Keys of a running guest that wait for its restart: those Proxmox already lists as
    pending, and those this plan changes that the guest cannot take while it runs."""
    if state["status"] != "running":
        return []
    config = state["config"]
    pending = set(config.pending) | set(config.pending_delete)
    pending |= {key for key in (*plan.set, *plan.delete) if key not in hotplugged}
    return sorted(pending)


def plan_scalars(effective: dict[str, str], wanted: dict[str, str]) -> Plan:
    """Set every wanted key whose value differs (compared as Proxmox prints them)."""
    return Plan({k: v for k, v in wanted.items() if effective.get(k) != v})


def plan_indexed(effective: dict[str, str], slots: tuple[str, ...], wanted: Sequence[str], identity, same) -> Plan:
    """Converge a family of numbered keys (dev0.., hostpci0..) without renumbering.

    identity(value) names what an entry points at (a device path, a PCI address); an entry whose
    identity is still wanted keeps its index (rewritten only if same() says its options differ),
    unwanted entries are deleted, and new ones take the lowest free indices. Moving one GPU
    therefore touches one key on each guest, never the whole list.
    """
    wanted_by_id = {identity(value): value for value in wanted}
    present = {key: effective[key] for key in slots if key in effective}
    to_set: dict[str, str] = {}
    to_delete: list[str] = []
    kept: set[str] = set()
    for key, value in present.items():
        ident = identity(value)
        if ident in wanted_by_id and ident not in kept:
            kept.add(ident)
            if not same(value, wanted_by_id[ident]):
                to_set[key] = wanted_by_id[ident]
        else:
            to_delete.append(key)
    free = (key for key in slots if key not in present or key in to_delete)
    for value in wanted:
        if identity(value) not in kept:
            key = next(free)
            if key in to_delete:
                to_delete.remove(key)  # reuse the slot: one set instead of delete + set
            to_set[key] = value
    return Plan(to_set, tuple(to_delete))


# ----------------------------------------------------------------------------------------------
# LXC: device entries and the settings the role converges.


def device_path(value: str) -> str:
    return parse_property_string(value, "path").get("path", "")


def same_device(a: str, b: str) -> bool:
    return parse_property_string(a, "path") == parse_property_string(b, "path")


def lxc_device_paths(minors: list[int], present: set[str]) -> list[PropertyString]:
    """The /dev nodes a GPU-using container needs, in devN order.

    One /dev/nvidiaN per assigned GPU (N is its minor on the host), the control and UVM nodes,
    then /dev/nvidia-modeset and /dev/nvidia-caps/* only when the host has them: Proxmox refuses
    to start a container whose devN path is missing.
    """
    if not minors:
        return []
    paths = [f"/dev/nvidia{minor}" for minor in sorted(minors)]
    paths += ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    if "/dev/nvidia-modeset" in present:
        paths.append("/dev/nvidia-modeset")
    paths += sorted(p for p in present if p.startswith("/dev/nvidia-caps/"))
    return [print_property_string({"path": path}, "path") for path in paths]


def lxc_features(features: list[str]) -> str:
    return print_property_string({name: 1 for name in features})


def address_keys(ip: str, gateway: str | None) -> dict[str, str | None]:
    """guest_ip / guest_gateway under the keys Proxmox takes them: an IPv6 address is ip6= and
    gw6= (pve-container src/PVE/LXC/Config.pm $netconf_desc: ip `pve-ipv4-config`, gw `ipv4`,
    ip6 `pve-ipv6-config`, gw6 `ipv6`; qemu-server src/PVE/QemuServer.pm $ipconfig_fmt has the
    same four keys), never ip=, which Proxmox refuses for one."""
    if ":" in ip:  # an IPv6/CIDR (the site model admits only dhcp, manual and CIDRs)
        return {"ip6": ip, "gw6": gateway}
    return {"ip": ip, "gw": gateway}


def lxc_net0(bridge: str, ip: str, gateway: str | None, hwaddr: str | None = None, firewall: bool = False) -> str:
    """firewall=1 (pve-container $netconf_desc, a boolean) only when asked: a guest made before
    the setting keeps its net0 as Proxmox printed it."""
    return print_property_string(
        {
            "name": "eth0",
            "bridge": bridge,
            "firewall": 1 if firewall else None,
            "hwaddr": hwaddr,
            **address_keys(ip, gateway),
            "type": "veth",
        },
        required=("name",),
    )


def same_net(current: str, wanted: str) -> bool:
    """hwaddr is generated by Proxmox on create; every other key must match."""
    have = parse_property_string(current)
    have.pop("hwaddr", None)
    return have == parse_property_string(wanted)


def with_hwaddr(current: str | None, wanted: str) -> str:
    """Keep the MAC Proxmox generated, so a net0 change does not change the guest's MAC."""
    if not current:
        return wanted
    hwaddr = parse_property_string(current).get("hwaddr")
    data: dict[str, object] = {**parse_property_string(wanted), "hwaddr": hwaddr}
    return print_property_string(data, required=("name",))


def lxc_rootfs(storage: str, size_gib: int) -> str:
    """pct create's --rootfs: a new volume of size_gib on storage (pve-container $rootfs_desc,
    volume `STORAGE:SIZE_IN_GiB`)."""
    return print_property_string({"volume": f"{storage}:{size_gib}"}, "volume")


def lxc_mount_point(host_path: str, guest_path: str, read_only: bool = False) -> str:
    data: dict[str, object] = {"volume": host_path, "mp": guest_path}
    if read_only:
        data["ro"] = 1  # pve-container LXC/Config.pm mp option `ro` (boolean)
    return print_property_string(data, "volume", ("mp",))


def mount_identity(value: str) -> str:
    data = parse_property_string(value, "volume")
    return f"{data.get('volume')}->{data.get('mp')}"


# ----------------------------------------------------------------------------------------------
# KVM: hostpci entries and the MMIO window.


def hostpci(address: str, pcie: bool, x_vga: bool) -> str:
    return print_property_string({"host": address, "pcie": 1 if pcie else None, "x-vga": 1 if x_vga else None}, "host")


def hostpci_address(value: str) -> str:
    return parse_property_string(value, "host").get("host", "")


def same_hostpci(a: str, b: str) -> bool:
    return parse_property_string(a, "host") == parse_property_string(b, "host")


def kvm_disk(storage: str, size_gib: int, import_from: str | None = None) -> str:
    """qm create's --scsi0 (qemu-server $drive_fmt, default key `file`): a new volume of size_gib
    on storage, or one copied from import_from (`STORAGE:0,import-from=...`, the image's size)."""
    return print_property_string(
        {"file": f"{storage}:{0 if import_from else size_gib}", "import-from": import_from, "iothread": 1}, "file"
    )


def kvm_efidisk(storage: str) -> str:
    """OVMF's EFI vars disk; keys not pre-enrolled: Secure Boot would refuse the unsigned NVIDIA
    kernel module."""
    return print_property_string({"file": f"{storage}:1", "efitype": "4m", "pre-enrolled-keys": 0}, "file")


def kvm_cloudinit_drive(storage: str) -> str:
    return print_property_string({"file": f"{storage}:cloudinit"}, "file")


def kvm_cpu(cpu: str) -> PropertyString:
    """guest_cpu (`host`, `x86-64-v3,phys-bits=host`) as qm's cpu option (qemu-server
    $cpu_fmt, default key `cputype`)."""
    return print_property_string(parse_property_string(cpu, "cputype"), "cputype")


def kvm_net0(bridge: str, firewall: bool = False) -> str:
    """qemu-server $net_fmt: the model is written bare (`virtio`), as qm prints it; firewall=1
    (a boolean of $net_fmt) only when asked."""
    return print_property_string({"model": "virtio", "bridge": bridge, "firewall": 1 if firewall else None}, "model")


def kvm_net0_firewall(current: str | None, firewall: bool) -> str | None:
    """The VM's net0 as it is (its MAC, model and bridge kept) with firewall=1 set or removed,
    or None when its firewall flag already is the setting's. qm prints the model and MAC as
    `virtio=MAC` (qemu-server $net_fmt: each model name is an alias of macaddr)."""
    if not current:
        return None
    data: dict[str, object] = dict(parse_property_string(current, "model"))
    if (data.get("firewall") == "1") == firewall:
        return None
    data["firewall"] = 1 if firewall else None
    return print_property_string(data, "model" if "model" in data else None)


def mmio_window_args(megabytes: int | None) -> str | None:
    """OVMF's 64-bit PCI MMIO window, for GPUs whose BARs do not fit the default."""
    if megabytes is None:
        return None
    return f"-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string={megabytes}"


def guest_hostname(guest: HostSettings) -> str:
    """guest_hostname, else the inventory name's last path part (`@docker/ih-gpu` -> ih-gpu)."""
    if guest.guest.hostname:
        return guest.guest.hostname
    return guest.name.rsplit("/", 1)[-1].lstrip("@").split(".")[0]
