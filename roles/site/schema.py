"""Host data typed: HostSettings (one host, one attribute per settings section) and Site (all).

Host data keys are flat and prefixed by the section they belong to (``serving_port``,
``nccl_p2p_level``); a key that belongs to no section is an error, so a typo never passes
silently. The sections are roles/site/sections/<section>.py, assembled by its ``SECTIONS``;
this module only dispatches on that list: a key goes to the section with the longest matching
prefix, each section's pydantic errors become one-line messages.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import re
import unicodedata
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import ValidationError

from roles.site.credentials import VAULT_SETTING, credential_kind
from roles.site.errors import closest, escaped, is_invisible, shown, shown_key
from roles.site.fields import PROJECT_ROOT, Section, expected_type, is_ip, type_text
from roles.site.old_keys import RENAMED_KEYS, old_key_problem
from roles.site.sections import SECTIONS, attribute_of
from roles.site.sections.serving import SpeculativeSettings
from roles.site.stack import Stack

if TYPE_CHECKING:
    from roles.site import sections

__all__ = [
    "KNOWN_GROUPS",
    "PROJECT_ROOT",
    "RENAMED_KEYS",
    "SECTIONS",
    "SITE_KEYS",
    "HostSettings",
    "Site",
    "address_of",
    "build_host",
    "control_character_problem",
    "host_name_problem",
    "secret_problem",
    "section_keys",
    "type_text",
]

KNOWN_GROUPS = ("proxmox_hosts", "lxc_guests", "kvm_guests", "gpu_nodes", "builders", "gateways", "monitors")

# Keys that are not role settings: where the stack and secrets live.
SITE_KEYS = {
    "stack_file": "path of the stack file, relative to the inventory (default: stack.yml)",
    "stack": "id of the stack this inventory serves with, one of the stack file's `stacks`"
    " (default: the stack file's `active`)",
    "secrets_file": "path of the ansible-vault file, relative to the inventory",
}

# ----------------------------------------------------------------------------------------------
# Hosts and the whole site.


def _with_sections(cls: type) -> type:
    """The frozen dataclass of one host: `name`, `groups`, then one field per section of
    SECTIONS (host.serving is the ServingSettings, defaults when the host sets none of its
    keys), then `invalid_keys`. The fields come from that one list, so a new section is a
    new attribute without an edit here."""
    own = dict(cls.__annotations__)
    cls.__annotations__ = {
        "name": own.pop("name"),
        "groups": own.pop("groups"),
        **{attribute_of(section): section for section in SECTIONS},
        **own,
    }
    for section in SECTIONS:
        setattr(cls, attribute_of(section), dataclasses.field(default_factory=section))
    return dataclass(frozen=True)(cls)


@_with_sections
class HostSettings:
    """One host's settings. Besides the fields below, one attribute per section of SECTIONS
    (roles/site/sections/): host.base, host.gpu, host.serving, host.ssh (pyinfra's connector
    data: ssh_hostname, ssh_port, ssh_user, ssh_key), ..."""

    name: str
    groups: tuple[str, ...]
    # Keys already reported as invalid: cross-host rules skip them (one message per mistake).
    invalid_keys: frozenset[str] = frozenset()

    if TYPE_CHECKING:  # the fields _with_sections adds, one per section, for the type checker
        base: sections.base.BaseSettings
        gpu: sections.gpu.GpuSettings
        nccl: sections.nccl.NcclSettings
        serving: sections.serving.ServingSettings
        build: sections.build.BuildSettings
        guest: sections.guest.GuestSettings
        proxmox: sections.proxmox.ProxmoxSettings
        health: sections.health.HealthSettings
        engine: sections.engine.EngineSettings
        sglang: sections.sglang.SglangSettings
        vllm: sections.vllm.VllmSettings
        nvidia_driver: sections.nvidia_driver.NvidiaDriverSettings
        cuda: sections.cuda.CudaSettings
        docker: sections.docker.DockerSettings
        gateway: sections.gateway.GatewaySettings
        eagle3_training: sections.eagle3_training.Eagle3TrainingSettings
        weights: sections.weights.WeightsSettings
        monitoring: sections.monitoring.MonitoringSettings
        firewall: sections.firewall.FirewallSettings
        ssh: sections.ssh.SshSettings

        def __init__(self, name: str, groups: tuple[str, ...], **fields: object) -> None: ...

    @property
    def ssh_hostname(self) -> str | None:
        """The address the host is reached at (pyinfra's ssh_hostname), when not its name."""
        return self.ssh.hostname

    def valid(self, *keys: str) -> bool:
        return not (set(keys) & self.invalid_keys)

    def in_group(self, group: str) -> bool:
        return group in self.groups

    @property
    def driver_mode(self) -> Literal["full", "userspace"]:
        """An LXC guest uses its node's kernel module: it gets the userspace driver only."""
        return "userspace" if self.in_group("lxc_guests") else "full"

    @property
    def speculative(self) -> SpeculativeSettings | None:
        spec = self.serving.speculative
        return SpeculativeSettings(**spec) if spec else None


@dataclass(frozen=True)
class Site:
    inventory_file: str
    stack: Stack
    hosts: dict[str, HostSettings]
    secrets_file: str | None
    secret_names: frozenset[str]

    def group(self, name: str) -> list[HostSettings]:
        return [h for h in self.hosts.values() if h.in_group(name)]

    def summary(self) -> str:
        lines = [
            f"{self.inventory_file}: valid",
            f"  stack {self.stack.active.id} ({self.stack.active.label}, "
            f"torch {self.stack.active.torch}, CUDA {self.stack.active.cuda}, "
            f"driver {self.stack.driver_version}, uv {self.stack.uv}) from {self.stack.file}",
        ]
        for host in self.hosts.values():
            detail = ", ".join(host.groups) or "no role group"
            if host.in_group("gpu_nodes"):
                detail += (
                    f"; {host.gpu.count} x {host.gpu.arch} GPU, serving {host.serving.served_model_name}"
                    f" on {host.serving.host}:{host.serving.port}"
                )
            if host.guest.vmid is not None:
                gpus = ", ".join(host.guest.gpu_addresses) or "none"
                detail += f"; vmid {host.guest.vmid} on {host.guest.node}, GPUs {gpus}"
            lines.append(f"  {host.name}: {detail}")
        # The acknowledged plain-HTTP listeners stay in view (docs/security.md#tls): a warning
        # the operator accepted, with the reason given, not one silenced.
        lines += [f"  {host.name}: WARNING: {line}" for host in self.hosts.values() for line in plaintext_lines(host)]
        lines.append(f"  secrets: {self.secrets_file or 'none'} ({len(self.secret_names)} keys)")
        return "\n".join(lines)

    def summary_data(self) -> dict:
        """What summary() says, for a program (`--json`): names and numbers, never a secret's value."""
        active = self.stack.active
        hosts = {}
        for host in self.hosts.values():
            item: dict[str, object] = {"groups": list(host.groups)}
            if host.in_group("gpu_nodes"):
                item |= {
                    "gpu_count": host.gpu.count,
                    "gpu_arch": host.gpu.arch,
                    "served_model_name": host.serving.served_model_name,
                    "endpoint": f"{host.serving.host}:{host.serving.port}",
                }
            if host.guest.vmid is not None:
                item |= {
                    "vmid": host.guest.vmid,
                    "node": host.guest.node,
                    "gpu_addresses": list(host.guest.gpu_addresses),
                }
            hosts[host.name] = item
        return {
            "inventory": self.inventory_file,
            "valid": True,
            "stack": {
                "id": active.id,
                "label": active.label,
                "torch": active.torch,
                "cuda": active.cuda,
                "driver": self.stack.driver_version,
                "uv": self.stack.uv,
                "file": str(self.stack.file),
            },
            "hosts": hosts,
            "secrets_file": self.secrets_file,
            "secret_names": sorted(self.secret_names),
        }


def is_loopback(address: str) -> bool:
    """127.0.0.0/8 and ::1; a wildcard (0.0.0.0, ::) listens on every address, not loopback."""
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def plaintext_lines(host: HostSettings) -> list[str]:
    """The host's listeners serving plain HTTP beyond loopback with the inventory's acknowledgement
    (roles/site/rules_tls.py refuses one without it), each with the reason it gave."""
    listeners = []
    if host.in_group("gpu_nodes") and not is_loopback(host.serving.host) and host.serving.plaintext_reason:
        listeners.append(("engine", "serving", host.serving.host, host.serving.plaintext_reason))
    if host.in_group("gateways") and not is_loopback(host.gateway.host) and host.gateway.plaintext_reason:
        listeners.append(("gateway", "gateway", host.gateway.host, host.gateway.plaintext_reason))
    return [
        f"the {what} serves plain HTTP on {address} (the API key crosses the network in clear);"
        f" {prefix}_plaintext_acknowledged: {reason}"
        for what, prefix, address, reason in listeners
    ]


def address_of(host: HostSettings) -> str:
    """Where other hosts reach this one: pyinfra's ssh_hostname, else the inventory name
    (without a connector prefix like @docker/)."""
    return host.ssh_hostname or host.name.split("@", 1)[-1].split("/")[-1]


# ----------------------------------------------------------------------------------------------
# Typing one host's data: pydantic checks each section; its errors become our one-line messages.


# C0 controls, DEL and C1 controls: a newline in a value that lands in a systemd unit, an env
# file or a command line starts a new directive or variable there (ExecStartPre=... injected
# through serving_served_model_name), a NUL ends a C string early. No setting needs one.
CONTROL_CHARACTER_RE = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def control_character_problem(value: Any, path: str = "") -> str | None:
    """Why a value (strings inside lists and dicts included, keys too) cannot be written
    anywhere, or None. Besides control characters: invisible ones (errors.is_invisible: U+200B,
    U+202E and the other format characters, spaces other than U+0020), which pass into
    --model-path or Description= looking like nothing, or reorder what a reader sees."""
    if isinstance(value, str):
        found = CONTROL_CHARACTER_RE.search(value)
        if found:
            return (
                f"has the control character {found.group()!r} at position {found.start()}{path};"
                " expected text without newlines, tabs, NUL or other control characters"
            )
        invisible = next(((i, c) for i, c in enumerate(value) if is_invisible(c)), None)
        if invisible:
            position, character = invisible
            return (
                f"has the invisible character {escaped(character)} ({unicodedata.name(character, 'unnamed')})"
                f" at position {position}{path}; expected text without invisible, format or look-alike space"
                " characters"
            )
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            problem = control_character_problem(key, f" of the key {shown(key)}") or control_character_problem(
                item, f" of [{shown(key)}]"
            )
            if problem:
                return problem
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            problem = control_character_problem(item, f" of item {index}")
            if problem:
                return problem
    return None


def number_problem(value: Any) -> str | None:
    """Why a number cannot be written anywhere, or None: Python's integers have no bound, but
    every reader of ours does (systemd and Proxmox parse 64-bit integers, JSON readers doubles),
    so 10**30 became an error on the host, or a wrapped value; a float must be finite."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and not -(2**63) <= value < 2**63:
        return (
            f"is beyond a 64-bit integer ({len(str(abs(value)))} digits); expected a number the host's tools can read"
        )
    if isinstance(value, float) and not math.isfinite(value):
        return "is not a finite number; expected a finite number"
    if isinstance(value, dict):
        return next((p for item in value.values() if (p := number_problem(item))), None)
    if isinstance(value, (list, tuple)):
        return next((p for item in value if (p := number_problem(item))), None)
    return None


# The shape of a value before any rule walks it: the rules below recurse, and a list that holds
# itself or a mapping nested thousands deep (built by a loop in a Python inventory) ended them in
# a RecursionError traceback. No setting nests deeper than a few levels or needs a string longer
# than PATH_MAX (4096: the longest path a host takes; a command-line word's own limit,
# MAX_ARG_STRLEN, is 131072) or more than MAX_ITEMS entries.
MAX_DEPTH, MAX_CHARACTERS, MAX_ITEMS = 16, 4096, 4096


def shape_problem(value: Any) -> str | None:
    """Why a value is too deep, refers to itself, or is too long for any setting, or None."""
    stack: list[tuple[Any, int, frozenset[int]]] = [(value, 0, frozenset())]
    while stack:
        item, depth, parents = stack.pop()
        if isinstance(item, str) and len(item) > MAX_CHARACTERS:
            what = "is longer than" if depth == 0 else f"holds a text of {len(item)} characters, longer than"
            return f"{what} any host takes; expected at most {MAX_CHARACTERS} characters (PATH_MAX)"
        if not isinstance(item, (dict, list, tuple, set, frozenset)):
            continue
        if id(item) in parents:
            return "holds itself (a list or mapping inside itself); expected plain values"
        if depth >= MAX_DEPTH:
            return f"is nested more than {MAX_DEPTH} levels deep; expected plain values"
        if len(item) > MAX_ITEMS:
            return f"has {len(item)} entries; expected at most {MAX_ITEMS}"
        children = [*item.keys(), *item.values()] if isinstance(item, dict) else list(item)
        stack.extend((child, depth + 1, parents | {id(item)}) for child in children)
    return None


# Keys of a mapping setting named like a secret: environment variable names (upper case, as
# serving_extra_env's are), so that a file path under a lower-case key (a daemon's "tls_key")
# is not taken for one.
SECRET_KEY_RE = re.compile(r"^([A-Z0-9_]*_)?(TOKEN|KEY|APIKEY|SECRET|PASSWORD|PASSWD)$")


# Package mirrors' URLs, whose credential is a vault key of its own holding login:password (the URL
# stays in the inventory, where a reviewer sees which mirror the hosts trust; roles/shared/mirror_auth.py
# writes the credential into 0600 files only).
MIRROR_CREDENTIALS = {
    "cuda_repo_url": "cuda_repo_credentials_secret",
    "base_pypi_index_url": "base_pypi_index_credentials_secret",
}
# URLs the roles write into 0644 files, command lines or environment variables, for which no vault
# key exists: a credential in them is refused with a line that says so, not pointed at a *_secret
# setting nothing reads.
NO_VAULT_KEY = frozenset(
    {
        "base_python_install_mirror",
        "docker_repo_url",
        "docker_nvidia_toolkit_repo_url",
        "docker_nvidia_toolkit_key_url",
        "weights_endpoint",
    }
)
# Plain settings whose credential-carrying form has a vault key of its own (roles/monitoring).
OWN_VAULT_KEY = {
    "monitoring_webhook_url": "monitoring_webhook_url_secret",
    "monitoring_email_smarthost": "monitoring_email_auth_password_secret",
}


def secret_problem(value: Any, path: str = "") -> tuple[str, str] | None:
    """(why a plain setting holds what looks like a secret, the *_secret setting for it), or None;
    never the secret itself. A plain
    setting is written in clear into the preview, the unit, the launcher, a systemd-run command
    line and the deploy's diffs; a secret belongs in the vault, named by a *_secret setting."""
    if isinstance(value, str):
        kind = credential_kind(value)
        if kind:
            root = path.split("[", 1)[0]
            setting = (
                MIRROR_CREDENTIALS.get(root) or OWN_VAULT_KEY.get(root) or VAULT_SETTING.get(kind, "a *_secret setting")
            )
            return f"{path} holds what looks like a credential ({kind})", setting
        return None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, (list, tuple)) else ()
    for key, item in items:
        where = f"{path}[{shown(key)}]"
        kind = credential_kind(key) if isinstance(key, str) else None
        if kind:  # a mapping's key is written too (a mount point's host path, a sysctl key)
            return f"{path} has a key that looks like a credential ({kind})", VAULT_SETTING.get(
                kind, "a *_secret setting"
            )
        if isinstance(key, str) and SECRET_KEY_RE.match(key) and isinstance(item, str) and item:
            setting = (
                "serving_hf_token_secret"
                if key.upper().startswith(("HF_", "HUGGING"))
                else "serving_api_key_secret"
                if "API" in key.upper()
                else "a *_secret setting"
            )
            return f"{where} is named like a secret (*_TOKEN, *_KEY, *_SECRET, *_PASSWORD)", setting
        nested = secret_problem(item, where)
        if nested:
            return nested
    return None


def _shown_shallow(value: Any) -> str:
    """shown() of a value that may hold itself or be nested deeper than repr() goes: its type
    and size only, when repr() cannot be trusted to end."""
    if isinstance(value, str):
        return shown(value)
    if isinstance(value, (dict, list, tuple, set, frozenset)):
        return f"<a {type(value).__name__} of {len(value)} entries>"
    return shown(value)


def host_name_problem(name: str) -> str | None:
    """Why an inventory name cannot be a host's name, or None. A plain name is what ssh resolves and
    what the replicas' URLs, the gateway's worker list and the preview's folders are written
    with: an ASCII DNS name (RFC 1123: labels of letters, digits and '-', neither first nor last,
    1 to 63 characters; 253 in all) or an IP address. A look-alike letter (Cyrillic 'е' for 'e')
    resolves to another name or none. A connector's name (@docker/..., @local) is ASCII too."""
    odd = next(((i, c) for i, c in enumerate(name) if not c.isascii()), None)
    if odd:
        position, character = odd
        return (
            f"{ascii(character)[1:-1]} (U+{ord(character):04X} {unicodedata.name(character, 'unnamed')}) at position"
            f" {position} is not ASCII"
        )
    if name.startswith("@"):
        return (
            None
            if re.fullmatch(r"@[A-Za-z0-9._:/@+-]+", name)
            else "a connector name with a character other than letters, digits and . _ : / @ + -"
        )
    if is_ip(name):
        return None
    labels = name.rstrip(".").split(".")
    if len(name) > 253:
        return f"{len(name)} characters (at most 253)"
    bad = next((label for label in labels if not DNS_LABEL_RE.fullmatch(label)), None)
    if bad is not None:
        return f"the label {bad!r} is not 1 to 63 letters, digits and '-' (not first or last)"
    return None


DNS_LABEL_RE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


def _pyinfra_keys() -> set[str]:
    """Keys pyinfra itself understands: connector data and global operation arguments."""
    try:
        from pyinfra.api.arguments import all_global_arguments
        from pyinfra.api.connectors import get_all_connectors
    except ImportError:  # checks --expect on a machine without pyinfra: no such keys there
        return set()

    keys = {name for name, _ in all_global_arguments()}
    for connector in get_all_connectors().values():
        keys |= set(getattr(connector, "data_meta", {}) or {})
    return keys


# pyinfra's operation arguments (pyinfra 3.10 pyinfra/api/arguments.py, AllArguments) are read
# from host data too: pop_global_arguments takes host.data.<key> as the default of every
# operation on that host, so one key in the inventory changes every command the deploy runs,
# as root, past every rule here (`_env = {"LD_PRELOAD": ...}` wraps each one, `_shell_executable`
# names the shell, `_ignore_errors` hides every failure). The project sets the ones it needs per
# operation in the roles (`_env`, `_timeout`, `_if`) and none from host data, so each is refused,
# its value never printed (`_sudo_password` is a password). Escalation (`_sudo*`, `_su_*`, `_doas*`,
# `_dzdo*`): the deploy connects as root (ssh_user) and escalates nowhere, so no vault key takes
# a sudo password either.
ESCALATION_ARGUMENTS: tuple[str, ...] = (
    "_sudo",
    "_use_sudo_login",
    "_preserve_sudo_env",
    "_su_",
    "_use_su_login",
    "_preserve_su_env",
)
ESCALATION_ARGUMENTS += ("_doas", "_dzdo")
# Connector data that is a password in clear: the deploy logs in with a key (ssh_key, or the
# agent), and no vault key feeds pyinfra's connector.
PASSWORD_DATA = ("ssh_password", "ssh_key_password")


def operation_argument_problem(key: str) -> str | None:
    """Why a host-data key that is one of pyinfra's operation arguments (or a connector password)
    cannot be in the inventory, or None for any other key."""
    if key in PASSWORD_DATA:
        return (
            f"{key} is a password in clear in the inventory; expected none: the deploy logs in as root with a key"
            " (ssh_key, or ssh-agent), and no vault key takes an SSH password"
        )
    if key not in _operation_arguments():
        return None
    if key.startswith(ESCALATION_ARGUMENTS):
        return (
            f"{key} is pyinfra's privilege escalation for every operation; expected none: the deploy connects as"
            " root (ssh_user) and escalates nowhere, so sudo, su, doas and their passwords are not supported"
        )
    return (
        f"{key} is pyinfra's operation argument, which host data would set for every operation on this host,"
        " as root, past the settings' rules; expected none (the roles set it per operation where needed)"
    )


def _operation_arguments() -> frozenset[str]:
    try:
        from pyinfra.api.arguments import all_global_arguments
    except ImportError:
        return frozenset()
    return frozenset(name for name, _ in all_global_arguments())


def section_keys() -> dict[str, type[Section]]:
    return {cls.PREFIX + name: cls for cls in SECTIONS for name in cls.model_fields}


def _section_of(key: str) -> type[Section] | None:
    matches = [cls for cls in SECTIONS if key.startswith(cls.PREFIX)]
    return max(matches, key=lambda cls: len(cls.PREFIX)) if matches else None


def _build_section(
    cls: type[Section], data: dict, where: str, problems: list[str], unknown: list[str], invalid: set[str]
) -> Section:
    # Lists may come as tuples from Python inventories (as they always could).
    values = {
        key.removeprefix(cls.PREFIX): list(value) if isinstance(value, tuple) else value
        for key, value in data.items()
        if _section_of(key) is cls
    }
    try:
        return cls.model_validate(values)
    except ValidationError as error:
        bad: dict[str, Any] = {}
        for detail in error.errors():
            name = str(detail["loc"][0])
            bad.setdefault(name, detail)
        for name, detail in bad.items():
            key = cls.PREFIX + name
            if detail["type"] == "extra_forbidden":
                unknown.append(key)
                continue
            if detail["type"] == "inference_host":
                valid = detail["ctx"]["valid"]
            else:
                valid = expected_type(cls.model_fields[name].annotation)
            problems.append(f"{where}: {key} = {shown(data[key])} is invalid; expected {valid}")
            invalid.add(key)
        return cls.model_validate({k: v for k, v in values.items() if k not in bad})


def build_host(name: str, groups: tuple[str, ...], data: dict, where: str, problems: list[str]) -> HostSettings:
    """Typed settings of one host from its merged pyinfra data."""
    known = section_keys()
    pyinfra_keys = _pyinfra_keys()
    for key, value in data.items():
        if not isinstance(key, str):
            problems.append(
                f"{where}: host {name}: the key {shown_key(key)} (= {shown(value)}) is not a string but"
                f" a {type(key).__name__}; expected setting names as strings, like 'serving_port'"
            )
    data = {key: value for key, value in data.items() if isinstance(key, str)}
    unknown = [key for key in data if _section_of(key) is None and key not in SITE_KEYS and key not in pyinfra_keys]
    invalid: set[str] = set()
    value_problems: list[str] = []
    name_problem = control_character_problem(name)
    if name_problem:  # the name lands in files too (URLs of replicas, the preview's folders)
        value_problems.append(f"{where}: host {shown(name)}: the host name {name_problem}")
    elif host_name_problem(name):
        value_problems.append(
            f"{where}: host {shown(name)}: the host name is not a DNS name in ASCII:"
            f" {host_name_problem(name)}; expected letters a-z, digits, '-' and dots (RFC 1123)"
            " or an IP address"
        )
    for key in data:
        argument = operation_argument_problem(key)
        if argument:
            value_problems.append(f"{where}: host {name}: {argument}")
            invalid.add(key)
            continue
        if key == "fake_responses" and name.startswith("@fake/"):
            continue  # pyinfra's @fake connector: facts as a tool printed them (tabs and all), no host
        if key in pyinfra_keys and key not in known:  # a connector's data, never written by a role
            problem = shape_problem(data[key]) or control_character_problem(data[key]) or number_problem(data[key])
            if problem:
                value_problems.append(f"{where}: host {name}: {key} = {_shown_shallow(data[key])} {problem}")
                invalid.add(key)
            continue
        shape = shape_problem(data[key])
        if shape:
            value_problems.append(f"{where}: host {name}: {key} = {_shown_shallow(data[key])} {shape}")
            invalid.add(key)
            continue
        secret = secret_problem(data[key], key)
        if secret:
            what, setting = secret
            value_problems.append(
                f"{where}: host {name}: {what}, in a plain setting (written in clear to the preview, unit files and"
                " command lines); "
                + (
                    f"expected {key} without its user part, and the credential as login:password in the vault:"
                    f" inference-host vault set FILE NAME (value on stdin), named by {setting}"
                    if key in MIRROR_CREDENTIALS
                    else f"expected {key} without a credential (no vault key takes one for this URL: use a mirror"
                    " that trusts the host's address)"
                    if key in NO_VAULT_KEY
                    else "expected it in the vault: inference-host vault set FILE NAME (value on stdin), named"
                    f" by {setting}"
                )
            )
            invalid.add(key)
            continue
        problem = control_character_problem(data[key]) or number_problem(data[key])
        if problem:
            value_problems.append(f"{where}: host {name}: {key} = {shown(data[key])} {problem}")
            invalid.add(key)
    unknown = [key for key in unknown if key not in invalid]  # its own message names it
    data = {key: value for key, value in data.items() if key not in invalid}
    sections = {
        attribute_of(cls): _build_section(cls, data, f"{where}: host {name}", value_problems, unknown, invalid)
        for cls in SECTIONS
    }
    for key in sorted(unknown, key=list(data).index):
        if key in pyinfra_keys:
            continue
        old = old_key_problem(key, shown(data[key]))
        if old:
            problems.append(f"{where}: host {name}: {old}")
            continue
        problems.append(
            f"{where}: host {name}: unknown key {shown_key(key)} = {shown(data[key])}"
            f"{closest(key, list(known) + list(SITE_KEYS))} (valid keys are listed in"
            " docs/settings.md)"
        )
    problems.extend(value_problems)
    return HostSettings(name=name, groups=groups, **sections, invalid_keys=frozenset(invalid))
