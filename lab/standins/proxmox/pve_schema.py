"""STAND-IN for Proxmox VE 8 (lab only): the option schemas of `pct` and `qm` and the errors of
PVE's command-line handler, as pve_standin.py's docstring cites them (pve-container
src/PVE/LXC/Config.pm, qemu-server src/PVE/QemuServer.pm, PCI.pm, Machine.pm, pve-common
src/PVE/JSONSchema.pm and Exception.pm, branch stable-bookworm = PVE 8).

Kept apart from the state and config-file code in pve_standin.py: what a key accepts is one
concern, what the node keeps is another.
"""

from __future__ import annotations

import re

# ----------------------------------------------------------------------------------------------
# Schemas (key -> validator). Validators return the value to store or raise SchemaError(msg).


class SchemaError(Exception):
    pass


class PveError(Exception):
    """A plain `die "...\n"` in Proxmox: message on stderr, exit 255."""


class ParamError(Exception):
    """PVE::Exception with code 400: "400 Parameter verification failed." + key: message."""

    def __init__(self, errors: dict[str, str]):
        self.errors = errors
        super().__init__(errors)


def boolean(value: str) -> str:
    if re.fullmatch(r"1|true|yes|on", value, re.IGNORECASE):
        return "1"
    if re.fullmatch(r"0|false|no|off", value, re.IGNORECASE):
        return "0"
    raise SchemaError(f"type check ('boolean') failed - got '{value}'")


def integer(minimum=None, maximum=None):
    def check(value: str) -> str:
        if not re.fullmatch(r"[+-]?\d+", value):
            raise SchemaError(f"type check ('integer') failed - got '{value}'")
        number = int(value)
        if minimum is not None and number < minimum:
            raise SchemaError(f"value must have a minimum value of {minimum}")
        if maximum is not None and number > maximum:
            raise SchemaError(f"value must have a maximum value of {maximum}")
        return str(number)

    return check


def number(minimum=None, maximum=None):
    def check(value: str) -> str:
        try:
            parsed = float(value)
        except ValueError:
            raise SchemaError(f"type check ('number') failed - got '{value}'") from None
        if minimum is not None and parsed < minimum:
            raise SchemaError(f"value must have a minimum value of {minimum}")
        if maximum is not None and parsed > maximum:
            raise SchemaError(f"value must have a maximum value of {maximum}")
        return value

    return check


def enum(*choices):
    def check(value: str) -> str:
        if value not in choices:
            raise SchemaError(f"value '{value}' does not have a value in the enumeration '" + ", ".join(choices) + "'")
        return value

    return check


def pattern(regex: str):
    compiled = re.compile(regex)

    def check(value: str) -> str:
        if not compiled.fullmatch(value):
            raise SchemaError("value does not match the regex pattern")
        return value

    return check


def anything(value: str) -> str:
    return value


def property_string(fields: dict, default_key: str | None = None, required=(), aliases=None):
    """A comma-separated property string (JSONSchema.pm parse_property_string)."""
    aliases = aliases or {}

    def check(value: str) -> str:
        parsed = parse_property_string(value, fields, default_key, aliases)
        for key in required:
            if key not in parsed:
                raise SchemaError(f"invalid format - {key}: property is missing and it is not optional")
        return value

    return check


# pve-common 8.3.8 (PVE 8, branch stable-bookworm) src/PVE/JSONSchema.pm parse_property_string:
# `foreach my $part (split(/,/, $data))`, `next if $part =~ /^\s*$/`, then
# `/^([^=]+)=(.+)$/` (KEY=VALUE split at the first '='; the value is kept as it is, neither
# unescaped nor trimmed), else a part without '=' is the default key's value, else "missing key".
# Python's re reads these two patterns as Perl does ('.' stops at a newline, '$' also matches
# before a final one).
_PROPERTY_BLANK_RE = re.compile(r"^\s*$")
_PROPERTY_KEYED_RE = re.compile(r"^([^=]+)=(.+)$")


def parse_property_string(value: str, fields: dict, default_key=None, aliases=None) -> dict:
    aliases = aliases or {}
    result: dict[str, str] = {}
    for part in value.split(","):
        if _PROPERTY_BLANK_RE.match(part):
            continue
        keyed = _PROPERTY_KEYED_RE.match(part)
        if keyed is None and "=" in part:
            raise SchemaError("invalid format - missing key in comma-separated list property")
        if keyed:
            key, item = keyed.group(1), keyed.group(2)
            if key in aliases and aliases[key] is None:  # qm net: "virtio=MAC"
                if "model" in result:
                    raise SchemaError("invalid format - duplicate key in comma-separated list property: model")
                result["model"], result["macaddr"] = key, item
                continue
            key = aliases.get(key, key)
            if key in result:
                raise SchemaError(f"invalid format - duplicate key in comma-separated list property: {key}")
            if key not in fields:
                raise SchemaError(f"invalid format - invalid key in comma-separated list property: {key}")
            try:
                result[key] = fields[key](item)
            except SchemaError as error:
                raise SchemaError(f"invalid format - {key}: {error}") from None
        elif part in aliases and aliases[part] is None:
            result["model"] = part
        elif default_key:
            if default_key in result:
                raise SchemaError(f"invalid format - duplicate key in comma-separated list property: {default_key}")
            try:
                result[default_key] = fields[default_key](part)
            except SchemaError as error:
                raise SchemaError(f"invalid format - {default_key}: {error}") from None
        else:
            raise SchemaError("invalid format - value without key, but schema does not define a default key")
    return result


def dns_name(value: str) -> str:
    if not re.fullmatch(
        r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9\-]*[a-zA-Z0-9])?\.)*"
        r"[a-zA-Z0-9](?:[a-zA-Z0-9\-]*[a-zA-Z0-9])?",
        value,
    ):
        raise SchemaError("invalid format - value does not look like a valid DNS name")
    return value


def lxc_dev_path(value: str) -> str:
    # pve-container verify_lxc_dev_string
    if re.search(r"/\.\.?(?:/|$)", value) or not value.startswith("/dev/"):
        raise SchemaError(f"{value} is not a valid device path")
    return value


def mp_path(value: str) -> str:
    if re.search(r"/\.\.?/", value) or re.search(r"/\.\.?$", value) or value.startswith("../"):
        raise SchemaError(f"{value} contains illegal character sequences")
    return value


DISK_SIZE = pattern(r"\d+(\.\d+)?[KMGT]?")
VOLUME = anything

LXC_FEATURES = {
    "mount": pattern(r"[a-zA-Z0-9_; ]+"),
    "nesting": boolean,
    "keyctl": boolean,
    "fuse": boolean,
    "mknod": boolean,
    "force_rw_sys": boolean,
}
LXC_ROOTFS = {
    "volume": mp_path,
    "size": DISK_SIZE,
    "acl": boolean,
    "mountoptions": anything,
    "ro": boolean,
    "quota": boolean,
    "replicate": boolean,
    "shared": boolean,
}
LXC_MP = {**LXC_ROOTFS, "backup": boolean, "mp": mp_path}
LXC_DEV = {
    "path": lxc_dev_path,
    "mode": pattern(r"0[0-7]{3}"),
    "uid": integer(0),
    "gid": integer(0),
    "deny-write": boolean,
}
LXC_NET = {
    "type": enum("veth"),
    "name": pattern(r"[-_.\w\d]+"),
    "bridge": pattern(r"[-_.\w\d]+"),
    "hwaddr": pattern(r"[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}"),
    "mtu": integer(64, 65535),
    "ip": anything,
    "gw": anything,
    "ip6": anything,
    "gw6": anything,
    "firewall": boolean,
    "tag": integer(1, 4094),
    "trunks": pattern(r"\d+(?:;\d+)*"),
    "rate": number(),
    "link_down": boolean,
}

LXC_SCHEMA: dict = {
    "lock": enum(
        "backup",
        "create",
        "destroyed",
        "disk",
        "fstrim",
        "migrate",
        "mounted",
        "rollback",
        "snapshot",
        "snapshot-delete",
    ),
    "onboot": boolean,
    "startup": anything,
    "template": boolean,
    "arch": enum("amd64", "i386", "arm64", "armhf", "riscv32", "riscv64"),
    "ostype": enum(
        "debian",
        "devuan",
        "ubuntu",
        "centos",
        "fedora",
        "opensuse",
        "archlinux",
        "alpine",
        "gentoo",
        "nixos",
        "unmanaged",
    ),
    "console": boolean,
    "tty": integer(0, 6),
    "cores": integer(1, 8192),
    "cpulimit": number(0, 8192),
    "cpuunits": integer(0, 500000),
    "memory": integer(16),
    "swap": integer(0),
    "hostname": dns_name,
    "description": anything,
    "searchdomain": anything,
    "nameserver": anything,
    "timezone": anything,
    "rootfs": property_string(LXC_ROOTFS, "volume"),
    "parent": anything,
    "snaptime": integer(0),
    "cmode": enum("shell", "console", "tty"),
    "protection": boolean,
    "unprivileged": boolean,
    "features": property_string(LXC_FEATURES),
    "hookscript": anything,
    "tags": anything,
    "debug": boolean,
}
LXC_SCHEMA.update({f"net{i}": property_string(LXC_NET, required=("name",)) for i in range(32)})
LXC_SCHEMA.update({f"mp{i}": property_string(LXC_MP, "volume", required=("mp",)) for i in range(256)})
LXC_SCHEMA.update({f"unused{i}": anything for i in range(256)})
LXC_SCHEMA.update({f"dev{i}": property_string(LXC_DEV, "path") for i in range(256)})

PCIRE = r"(?:[a-f0-9]{4,}:)?[a-f0-9]{2}:[a-f0-9]{2}(?:\.[a-f0-9])?"
HOSTPCI = {
    "host": pattern(rf"{PCIRE}(;{PCIRE})*"),
    "mapping": pattern(r"[a-zA-Z][a-zA-Z0-9_\-]{0,63}"),
    "rombar": boolean,
    "romfile": pattern(r"[^,;]+"),
    "pcie": boolean,
    "x-vga": boolean,
    "legacy-igd": boolean,
    "mdev": pattern(r"[^/.:]+"),
    "vendor-id": pattern(r"^0x[0-9a-fA-F]{4}$"),
    "device-id": pattern(r"^0x[0-9a-fA-F]{4}$"),
    "sub-vendor-id": pattern(r"^0x[0-9a-fA-F]{4}$"),
    "sub-device-id": pattern(r"^0x[0-9a-fA-F]{4}$"),
}


def hostpci(value: str) -> str:
    parsed = parse_property_string(value, HOSTPCI, "host")
    # qemu-server PCI.pm parse_hostpci
    if ("host" in parsed) == ("mapping" in parsed):
        raise SchemaError("invalid format - either 'host' or 'mapping' must be set.")
    return value


MACHINE = pattern(
    r"(pc|pc(-i440fx)?-\d+(\.\d+)+(\+pve\d+)?(\.pxe)?|q35|pc-q35-\d+(\.\d+)+"
    r"(\+pve\d+)?(\.pxe)?|virt(?:-\d+(\.\d+)+)?(\+pve\d+)?)"
)
CPU = {
    "cputype": pattern(r"[\w.+\-]+"),
    "flags": anything,
    "hidden": boolean,
    "hv-vendor-id": anything,
    "phys-bits": pattern(r"host|\d+"),
    "reported-model": anything,
}
NIC_MODELS = (
    "e1000",
    "e1000-82540em",
    "e1000-82544gc",
    "e1000-82545em",
    "e1000e",
    "i82551",
    "i82557b",
    "i82559er",
    "ne2k_isa",
    "ne2k_pci",
    "pcnet",
    "rtl8139",
    "virtio",
    "vmxnet3",
)
QM_NET = {
    "model": enum(*NIC_MODELS),
    "macaddr": anything,
    "bridge": pattern(r"[-_.\w\d]+"),
    "firewall": boolean,
    "link_down": boolean,
    "mtu": integer(1, 65520),
    "queues": integer(0, 64),
    "rate": number(0),
    "tag": integer(1, 4094),
    "trunks": pattern(r"\d+(?:-\d+)?(?:;\d+(?:-\d+)?)*"),
}
DRIVE = {
    "file": VOLUME,
    "size": DISK_SIZE,
    "iothread": boolean,
    "cache": anything,
    "discard": enum("ignore", "on"),
    "ssd": boolean,
    "backup": boolean,
    "format": anything,
    "aio": anything,
    "replicate": boolean,
    "media": anything,
    "snapshot": boolean,
    "efitype": enum("2m", "4m"),
    "pre-enrolled-keys": boolean,
    "ms-cert": anything,
    "import-from": anything,
}

QM_SCHEMA: dict = {
    key: anything
    for key in [
        "autostart",
        "hotplug",
        "reboot",
        "lock",
        "amd-sev",
        "shares",
        "keyboard",
        "description",
        "boot",
        "bootdisk",
        "smp",
        "vcpus",
        "acpi",
        "agent",
        "kvm",
        "tdf",
        "localtime",
        "freeze",
        "vga",
        "watchdog",
        "startdate",
        "startup",
        "template",
        "args",
        "tablet",
        "migrate_speed",
        "migrate_downtime",
        "cdrom",
        "parent",
        "snaptime",
        "vmstate",
        "vmstatestorage",
        "runningmachine",
        "runningcpu",
        "arch",
        "smbios1",
        "protection",
        "vmgenid",
        "hookscript",
        "ivshmem",
        "audio0",
        "spice_enhancements",
        "tags",
        "rng0",
        "meta",
        "affinity",
        "hugepages",
        "keephugepages",
        "citype",
        "ciuser",
        "cipassword",
        "ciupgrade",
        "cicustom",
        "searchdomain",
        "nameserver",
        "sshkeys",
    ]
}
QM_SCHEMA.update(
    {
        "onboot": boolean,
        "cpulimit": number(0, 128),
        "cpuunits": integer(1, 262144),
        "memory": property_string({"current": integer(16)}, "current"),
        "balloon": integer(0),
        "name": dns_name,
        "scsihw": enum("lsi", "lsi53c810", "virtio-scsi-pci", "virtio-scsi-single", "megasas", "pvscsi"),
        "ostype": enum(
            "other", "wxp", "w2k", "w2k3", "w2k8", "wvista", "win7", "win8", "win10", "win11", "l24", "l26", "solaris"
        ),
        "sockets": integer(1),
        "cores": integer(1),
        "numa": boolean,
        "cpu": property_string(CPU, "cputype"),
        "machine": property_string(
            {"type": MACHINE, "viommu": enum("intel", "virtio"), "enable-s3": boolean, "enable-s4": boolean}, "type"
        ),
        "bios": enum("seabios", "ovmf"),
        "protection": boolean,
        "template": boolean,
        "efidisk0": property_string(DRIVE, "file"),
        "tpmstate0": property_string(DRIVE, "file"),
    }
)
QM_SCHEMA.update({f"net{i}": property_string(QM_NET, aliases={m: None for m in NIC_MODELS}) for i in range(32)})
QM_SCHEMA.update({f"ipconfig{i}": anything for i in range(32)})
QM_SCHEMA.update({f"numa{i}": anything for i in range(8)})
QM_SCHEMA.update({f"serial{i}": anything for i in range(4)})
QM_SCHEMA.update({f"parallel{i}": anything for i in range(3)})
QM_SCHEMA.update({f"usb{i}": anything for i in range(14)})
QM_SCHEMA.update({f"hostpci{i}": hostpci for i in range(16)})
QM_SCHEMA.update({f"virtiofs{i}": anything for i in range(10)})
for bus, count in (("ide", 4), ("sata", 6), ("scsi", 31), ("virtio", 16)):
    QM_SCHEMA.update({f"{bus}{i}": property_string(DRIVE, "file") for i in range(count)})
QM_SCHEMA.update({f"unused{i}": anything for i in range(256)})

# Applied at once on a running guest; the rest waits in the pending section for the next start.
LXC_HOTPLUG = {
    "description",
    "onboot",
    "startup",
    "protection",
    "hostname",
    "hookscript",
    "cores",
    "tags",
    "lock",
    "memory",
    "swap",
    "cpulimit",
    "cpuunits",
} | {f"net{i}" for i in range(32)}
# qemu-server 8.4.10 src/PVE/QemuServer.pm: $confdesc_cloudinit (its keys are fast-plug options:
# written at once, the drive regenerated at the next start or by `qm cloudinit update`).
QM_CLOUD_INIT = {"citype", "ciuser", "cipassword", "ciupgrade", "cicustom", "searchdomain", "nameserver", "sshkeys"} | {
    f"ipconfig{i}" for i in range(32)
}
QM_HOTPLUG = (
    {
        "name",
        "onboot",
        "shares",
        "startup",
        "description",
        "protection",
        "vmstatestorage",
        "hookscript",
        "tags",
        "lock",
        "balloon",
    }
    | QM_CLOUD_INIT
    | {f"net{i}" for i in range(32)}
    | {f"{b}{i}" for b, n in (("ide", 4), ("sata", 6), ("scsi", 31), ("virtio", 16)) for i in range(n)}
)
