"""The vocabulary every settings section is written in: the Section base class and the rules
of a field (``check(predicate, "what is valid")``, ``one_of(...)``, ``positive``, the aliases
below), with the texts the one-line messages and the settings reference quote.

A field is declared as ``name: type = Field(default, description="what it means")``, with its
rule as ``Annotated[type, rule]``; the description is the settings reference (docs/settings.md).
"""

from __future__ import annotations

import ipaddress
import re
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, ClassVar, get_args

from pydantic import AfterValidator, BaseModel, ConfigDict
from pydantic_core import PydanticCustomError

from roles.site.grammars import (
    DEBIAN_PACKAGE_TEXT,
    HOST_PATH_TEXT,
    SYSCTL_TEXT,
    UNIT_NAME_TEXT,
    URL_TEXT,
    debian_package_problem,
    host_folder_problem,
    host_path_problem,
    normal_path,
    sysctl_problem,
    unit_name_problem,
    url_problem,
    world_writable_problem,
)

PROJECT_ROOT = Path(__file__).resolve().parents[2]

DRIVER_VERSION_RE = re.compile(r"^\d{3}\.\d{2,3}(\.\d{2,3})?$")
PCI_ADDRESS_RE = re.compile(r"^(?:[a-fA-F0-9]{4,8}:)?[a-fA-F0-9]{2}:[a-fA-F0-9]{2}\.[0-7]$")
UNIX_NAME_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
SECRET_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
DNS_NAME_RE = re.compile(r"^[a-zA-Z0-9]([a-zA-Z0-9-]{0,62})(\.[a-zA-Z0-9]([a-zA-Z0-9-]{0,62}))*$")


# ----------------------------------------------------------------------------------------------
# Rules of a field: an AfterValidator (it runs once the strict type check passed) whose error
# carries "what would be valid" for the one-line message.


_RULE_TEXT: dict[int, str] = {}  # id of a check()'s validator (module-level, never freed) -> its text


def check(predicate: Callable[[Any], Any], valid: str) -> AfterValidator:
    def run(value):
        if not predicate(value):
            raise PydanticCustomError("inference_host", "{valid}", {"valid": valid})
        return value

    validator = AfterValidator(run)
    _RULE_TEXT[id(validator)] = valid  # what a wrong type's message names too (rule_text)
    return validator


def one_of(*choices) -> AfterValidator:
    return check(lambda v: v in choices, "one of " + ", ".join(repr(c) for c in choices))


# An IPv6 zone (fe80::1%eth0): Python's ipaddress (3.9+) takes any text after '%' as the zone,
# `$(reboot)` included. RFC 4007 section 11 leaves the zone's form to the system and RFC 6874
# (section 2: ZoneID = 1*( unreserved / pct-encoded )) writes it in URLs with unreserved
# characters; on Linux it is an interface name (at most IFNAMSIZ - 1 = 15 bytes) or an index.
# Accepted: 1 to 15 of RFC 3986's unreserved characters, so no shell, URL or property-string
# syntax ever follows the '%'.
ZONE_RE = re.compile(r"[A-Za-z0-9._~-]{1,15}")


def is_cidr(value: str) -> bool:
    """An address with its prefix length (guest_ip): never a zone, which Proxmox's ip6= and the
    guest's network configuration do not take."""
    try:
        return "/" in value and "%" not in value and bool(ipaddress.ip_interface(value))
    except ValueError:
        return False


def is_ip(value: str) -> bool:
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        return False
    zone = getattr(address, "scope_id", None)
    return zone is None or ZONE_RE.fullmatch(zone) is not None


positive = check(lambda v: v > 0, "a number greater than 0")
tcp_port = check(lambda v: 1 <= v <= 65535, "1 to 65535")


# ----------------------------------------------------------------------------------------------
# Host paths and the folders the deploy makes (grammars.py says what each accepts, and why).


def _host_path(value: str) -> str:
    problem = host_path_problem(value)
    if problem:
        raise PydanticCustomError("inference_host", "{valid}", {"valid": f"{HOST_PATH_TEXT}; {problem}"})
    problem = world_writable_problem(value)  # a program or tree root runs or reads
    if problem:
        raise PydanticCustomError("inference_host", "{valid}", {"valid": problem})
    return value


def _host_folder(value: str) -> str:
    problem = host_folder_problem(value)
    if problem:
        raise PydanticCustomError("inference_host", "{valid}", {"valid": problem})
    return value


_host_path_rule = AfterValidator(_host_path)
_host_folder_rule = AfterValidator(_host_folder)
_RULE_TEXT[id(_host_path_rule)] = HOST_PATH_TEXT
_RULE_TEXT[id(_host_folder_rule)] = f"{HOST_PATH_TEXT}, a folder of its own (not /, nor a system folder)"
AbsolutePath = Annotated[str, _host_path_rule]
HostFolder = Annotated[str, _host_folder_rule]
UnixName = Annotated[str, check(UNIX_NAME_RE.match, "a lower-case Unix user/group name ([a-z_][a-z0-9_-]*)")]
SecretName = Annotated[str, check(SECRET_NAME_RE.match, "a key of the secrets vault (letters, digits, _)")]


def pci_address(address: str) -> str:
    """The one spelling of a PCI address: with its domain (01:00.0 is 0000:01:00.0, as lspci -D,
    sysfs, /proc/driver/nvidia/gpus and Proxmox's hostpci write it), so that two spellings of
    one GPU are one GPU in every comparison.
    The domain is a number (00000:01:00.0 is 0000:01:00.0: Linux prints it %04x, drivers/pci/
    pci-sysfs.c) and hex digits are compared in lower case (lspci and sysfs print them so)."""
    domain, _, rest = address.lower().rpartition(":")
    domain, _, bus = domain.rpartition(":")
    return f"{int(domain or '0', 16):04x}:{bus}:{rest}"


def _pci_addresses(value: list[str]) -> list[str]:
    if not all(PCI_ADDRESS_RE.match(a) for a in value):
        raise PydanticCustomError(
            "inference_host", "{valid}", {"valid": "PCI addresses like 0000:01:00.0 (hex, domain optional)"}
        )
    addresses = [pci_address(a) for a in value]
    repeated = sorted({a for a in addresses if addresses.count(a) > 1})
    if repeated:
        listed = ", ".join(f"{a} {addresses.count(a)} times" for a in repeated)
        raise PydanticCustomError(
            "inference_host",
            "{valid}",
            {"valid": f"each GPU once (01:00.0 and 0000:01:00.0 are one GPU); listed: {listed}"},
        )
    return addresses


PciAddresses = Annotated[list[str], AfterValidator(_pci_addresses)]
DriverVersion = Annotated[str, check(DRIVER_VERSION_RE.match, "a full driver version like 580.95.05")]


def _url(value: str) -> str:
    problem = url_problem(value)
    if problem:
        raise PydanticCustomError("inference_host", "{valid}", {"valid": f"{URL_TEXT}; {problem}"})
    return value


_url_rule = AfterValidator(_url)
_RULE_TEXT[id(_url_rule)] = URL_TEXT
Url = Annotated[str, _url_rule]
# A package mirror's URL: its credential, if it needs one, comes from the vault (a *_credentials_secret
# setting) and reaches only 0600 files; a user part left in the URL would be written into 0644 files and
# command lines, and apt ignores its auth.conf for a URL that has one (apt-pkg/contrib/netrc.cc, MaybeAddAuth).
MirrorUrl = Annotated[
    str,
    _url_rule,
    check(
        lambda v: "@" not in v.split("//", 1)[-1].split("/", 1)[0],
        "an http(s) URL without a user part or trailing spaces (a credential goes in the vault)",
    ),
]
IpAddress = Annotated[str, check(is_ip, "an IP address to bind (127.0.0.1, 0.0.0.0, ...)")]
# An OpenPGP key's fingerprint as gpg prints it with --with-colons (the `fpr` record's 10th
# field: upper-case hex, no spaces): 40 digits for a v4 key, 64 for a v6 key (RFC 9580, 5.5.4).
# roles/shared/apt_keys.py compares gpg's own output with it, character for character.
KeyFingerprint = Annotated[
    str,
    check(
        re.compile(r"^(?:[0-9A-F]{40}|[0-9A-F]{64})$").match,
        "an OpenPGP fingerprint as gpg --with-colons prints it: 40 upper-case hex digits (64 for a v6 key),"
        " no spaces, e.g. EB693B3035CD5710E231E123A4B469963BF863CC",
    ),
]

# An acknowledgement of plain HTTP beyond loopback (serving_/gateway_plaintext_acknowledged):
# a reason a reader of the inventory understands, not a bare flag (roles/site/rules_tls.py).
PlaintextReason = Annotated[
    str, check(lambda v: len(v.strip()) >= 10, "a reason of at least 10 characters, e.g. 'a private VLAN; TLS next'")
]


# ----------------------------------------------------------------------------------------------
# Unit names, apt package names, sysctl settings (their grammars: grammars.py).


def _unit_name(value: str) -> str:
    problem = unit_name_problem(value)
    if problem:
        raise PydanticCustomError("inference_host", "{valid}", {"valid": f"{UNIT_NAME_TEXT}; {problem}"})
    return value


ServiceUnitName = Annotated[str, AfterValidator(_unit_name)]
_RULE_TEXT[id(get_args(ServiceUnitName)[1])] = UNIT_NAME_TEXT


def _debian_packages(value: list[str]) -> list[str]:
    bad = next(((name, p) for name in value if (p := debian_package_problem(name))), None)
    if bad is not None:
        raise PydanticCustomError(
            "inference_host", "{valid}", {"valid": f"{DEBIAN_PACKAGE_TEXT}; {ascii(bad[0])}: {bad[1]}"}
        )
    return value


DebianPackages = Annotated[list[str], AfterValidator(_debian_packages)]
_RULE_TEXT[id(get_args(DebianPackages)[1])] = DEBIAN_PACKAGE_TEXT


def _sysctl(value: dict[str, str]) -> dict[str, str]:
    problem = next((p for key, item in value.items() if (p := sysctl_problem(key, item))), None)
    if problem:
        raise PydanticCustomError("inference_host", "{valid}", {"valid": f"{SYSCTL_TEXT}; {problem}"})
    return value


SysctlSettings = Annotated[dict[str, str], AfterValidator(_sysctl)]
_RULE_TEXT[id(get_args(SysctlSettings)[1])] = SYSCTL_TEXT


# ----------------------------------------------------------------------------------------------
# Values that land inside a Proxmox property string: `pct create --rootfs/--mpN/--net0`,
# `qm create --scsi0/--net0/--efidisk0/--hostpciN`, ipconfigN (roles/shared/pve.py builds each).
# Proxmox reads them with pve-common 8.3.8 (PVE 8, branch stable-bookworm) src/PVE/JSONSchema.pm
# parse_property_string: it splits on every ',' (no escape, no quoting exists), drops blank parts,
# reads a part with '=' as KEY=VALUE split at its first '=' (the value may hold more '='), and a
# part without one as the format's default key (a mount point's volume, a disk's file, a
# hostpci's host). The config file it is stored in (pve-container src/PVE/LXC/Config.pm
# parse_pct_config, qemu-server parse_vm_config) trims the line's ends. So a value with a ','
# (an extra option: '/tank/models,ro=0'), a default-key value with a '=' (read as a key), a blank
# value or one with spaces at its ends would reach Proxmox as something else: refused here.
PROPERTY_STRING_SOURCE = "pve-common src/PVE/JSONSchema.pm parse_property_string"


def property_value_problem(value: str, default_key: bool = False) -> str | None:
    """Why Proxmox would not read value back unchanged from a property string, or None.
    default_key: the value is written bare (first, without KEY=), so a '=' makes it a key."""
    if "," in value:
        return (
            f"has a ',', where Proxmox splits the option into more options (no escape exists: {PROPERTY_STRING_SOURCE})"
        )
    if default_key and "=" in value:
        return f"has a '=', so Proxmox reads it as KEY=VALUE, not as the value ({PROPERTY_STRING_SOURCE})"
    if not value.strip():
        return f"is blank, which Proxmox drops ({PROPERTY_STRING_SOURCE})"
    if value != value.strip():
        return "has spaces at its start or end, which Proxmox's config file trims"
    return None


def _pve_path_problem(path: str, default_key: bool) -> str | None:
    if not path.startswith("/"):
        return "is not an absolute path"
    # pve-container src/PVE/LXC/Config.pm verify_lxc_mp_string (the format of mp and volume).
    if "/./" in path or "/../" in path or path.endswith(("/.", "/..")):
        return "has a /./ or /../ part, which pct refuses (pve-container verify_lxc_mp_string)"
    return property_value_problem(path, default_key)


def _mount_folder_problem(path: str) -> str | None:
    problem = host_folder_problem(path)
    return f"is not one: expected {problem}" if problem else None


def _mount_points(value: dict[str, str]) -> dict[str, str]:
    seen: dict[str, str] = {}
    for host_path, guest_path in value.items():
        for path, role, default_key in ((host_path, "host path", True), (guest_path, "path in the guest", False)):
            # A bind mount of the node's / or /etc gives the guest the node's files (all of them,
            # as root, in a privileged container); one over the guest's / or /etc hides its own.
            problem = _pve_path_problem(path, default_key) or _mount_folder_problem(path)
            if not problem and role == "path in the guest":
                other = seen.setdefault(normal_path(path), host_path)
                if other != host_path:
                    problem = f"is where {other!r} is mounted too (pct refuses two mount points at one path)"
            if problem:
                raise PydanticCustomError(
                    "inference_host",
                    "{valid}",
                    {
                        "valid": (
                            "{host path: path in the guest}, both absolute, each fit for pct's --mpN"
                            f" (volume=HOST,mp=GUEST): the {role} {path!r} {problem}"
                        )
                    },
                )
    return value


# pve-common src/PVE/JSONSchema.pm parse_id (format pve-storage-id): what `STORAGE:SIZE` and
# `STORAGE:import/FILE` may name; no ',', '=', ':' or space can reach the property string.
PVE_STORAGE_ID_RE = re.compile(r"[a-z][a-z0-9\-_.]*[a-z0-9]", re.IGNORECASE)
PveStorageId = Annotated[
    str,
    check(
        lambda v: PVE_STORAGE_ID_RE.fullmatch(v) is not None,
        "a Proxmox storage ID like local-lvm (a letter, then letters, digits,"
        " '-', '_', '.'; pve-common JSONSchema.pm parse_id)",
    ),
]
PveMountPoints = Annotated[dict[str, str], AfterValidator(_mount_points)]

# A value that follows an option on an engine's, the gateway's or a trainer's command line
# (`--served-model-name VALUE`): argparse (Lib/argparse.py, _parse_optional) takes an argument
# starting with '-' for an option, so `--served-model-name --api-key` is the option --api-key,
# or "expected one argument". Such values are refused rather than written as --opt=VALUE.
OptionValue = Annotated[
    str,
    check(
        lambda v: bool(v) and not v.startswith("-"),
        "a non-empty value that does not start with '-' (argparse reads one as an option)",
    ),
]


class Section(BaseModel):
    """Host-data keys sharing a prefix. Field name = key without the prefix."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)
    PREFIX: ClassVar[str]


def type_text(annotation: Any) -> str:
    """A field's type as the settings reference and the messages write it: int | None, list[str]."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Annotated:
        return type_text(args[0])
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_text(a) for a in args)
    if origin in (list, dict):
        return f"{origin.__name__}[{', '.join(type_text(a) for a in args)}]"
    if annotation is Any:
        return "Any"
    return "None" if annotation is type(None) else annotation.__name__


def expected_type(annotation: Any) -> str:
    words = {"int": "an integer", "str": "a string", "bool": "True or False", "float": "a number", "None": "None"}
    text = " or ".join(words.get(part, part) for part in type_text(annotation).split(" | "))
    rule = rule_text(annotation)
    return f"{text} ({rule})" if rule else text


def rule_text(annotation: Any) -> str | None:
    """The `check` rule's text inside a field's type (Annotated[int, tcp_port] | None: 1 to 65535)."""
    if typing.get_origin(annotation) is Annotated:
        return next((_RULE_TEXT[id(m)] for m in annotation.__metadata__ if id(m) in _RULE_TEXT), None)
    return next((rule for arg in typing.get_args(annotation) if (rule := rule_text(arg))), None)
