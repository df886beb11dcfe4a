"""Every value the deploy writes into a Proxmox property string or onto an engine's command line
is read back with what reads it on the host, or was refused by the site model first (issue 38):

- Proxmox: the pct/qm stand-in's parser (lab/standins/proxmox/pve_schema.py), which follows
  pve-common 8.3.8 src/PVE/JSONSchema.pm parse_property_string (PVE 8, stable-bookworm): split on
  every ',', blank parts dropped, KEY=VALUE at the first '=', a bare part the default key;
- the engine: Python's own argparse with the pinned release's options as captured from its wheel
  (roles/serving/cli/<version>.json; sglang and vllm cannot be imported in the unit tier, the lab's
  engine preflight runs the release's real parser on the same arguments).

A property test puts seeded random hostile values (commas, '=', spaces, leading '-', quotes,
unicode) into the prod, lab, lab_replicas, KVM and two-node inventories; each is either refused in
one line naming our file and the setting, or read back unchanged."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import random
import shlex
from pathlib import Path

import pytest

from roles.kvm_guest import create_command as qm_create
from roles.lxc_guest import create_command as pct_create
from roles.lxc_guest import wanted_mount_points
from roles.serving.command import cli_options, server_arguments
from roles.shared import pve
from roles.site import load_site
from roles.site.errors import display
from roles.site.loading import _pyinfra_inventory
from roles.site.schema import build_host
from tests.unit.conftest import PROJECT_ROOT, InventoryFactory
from tests.unit.test_validation_rules import validate  # noqa: F401 (a fixture)

SPEC = importlib.util.spec_from_file_location(
    "pve_schema", PROJECT_ROOT / "lab" / "standins" / "proxmox" / "pve_schema.py"
)
schema = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(schema)

TP = {"gpu_count": 8, "serving_topology": "tensor_parallel", "nccl_ib_disable": True, "nccl_socket_ifname": "ens1f0"}


# --- the consumers' parsers --------------------------------------------------------------------


def pve_parse(key: str, value: str) -> dict[str, str]:
    """What pct/qm make of `--<key> <value>`: the stand-in's schema check (pve's formats), then
    the parsed keys and values as pve-common's parse_property_string returns them."""
    kind, fields, default, aliases = {
        "rootfs": ("lxc", schema.LXC_ROOTFS, "volume", None),
        "mp": ("lxc", schema.LXC_MP, "volume", None),
        "lxcnet": ("lxc", schema.LXC_NET, None, None),
        "drive": ("qemu", schema.DRIVE, "file", None),
        "qmnet": ("qemu", schema.QM_NET, None, {m: None for m in schema.NIC_MODELS}),
    }[key]
    return schema.parse_property_string(value, fields, default, aliases)


def engine_parser(version: str, engine: str) -> argparse.ArgumentParser:
    """argparse with the options of <engine>==version as captured from its wheel."""
    parser = argparse.ArgumentParser(prog=engine, add_help=False, allow_abbrev=False)
    for flag, option in cli_options(version, engine)["options"].items():
        if option["takes_value"]:
            parser.add_argument(flag, dest=flag)
        else:
            parser.add_argument(flag, dest=flag, action="store_true")
    return parser


_PARSERS: dict[tuple[str, str], argparse.ArgumentParser] = {}


def engine_parse(args: list[str], version: str, engine: str = "sglang") -> dict:
    if (version, engine) not in _PARSERS:
        _PARSERS[version, engine] = engine_parser(version, engine)
    parser = _PARSERS[version, engine]
    with contextlib.redirect_stderr(io.StringIO()):
        return vars(parser.parse_args(args))


# --- the inventories, loaded once --------------------------------------------------------------


class Inventory:
    """One inventory file as pyinfra reads it: each host's raw data, to type again with one value
    changed (roles/site/schema.py build_host: every per-value rule runs there)."""

    def __init__(self, label: str, path: Path):
        self.label, self.path, self.where = label, path, display(path)
        self.site = load_site(path)
        self.data = {host.name: host.data.dict() for host in _pyinfra_inventory(path)}

    def retyped(self, name: str, key: str, value) -> tuple[object, list[str]]:
        problems: list[str] = []
        host = self.site.hosts[name]
        return build_host(name, host.groups, {**self.data[name], key: value}, self.where, problems), problems


@pytest.fixture(scope="module")
def inventories(tmp_path_factory) -> dict[str, Inventory]:
    two = InventoryFactory(tmp_path_factory.mktemp("two-node"))
    path = two.groups(
        gpu_nodes=[("node-a", {**TP, "ssh_hostname": "10.0.0.11"}), ("node-b", {**TP, "ssh_hostname": "10.0.0.12"})]
    )
    found = {
        label: Inventory(label, PROJECT_ROOT / "inventory" / f"{label}.py") for label in ("prod", "lab", "lab_replicas")
    }
    found["two-node"] = Inventory("two-node", path)
    return found


# --- where each setting lands, and what must be read back ------------------------------------


def lxc_read_back(guest) -> list[tuple[str, dict, dict]]:
    """(option, what pct reads, what the inventory said) for each property string of pct create."""
    args = shlex.split(pct_create(guest, []))
    options = dict(zip(args[4::2], args[5::2], strict=True))
    settings = guest.guest
    found = [
        ("--rootfs", pve_parse("rootfs", options["--rootfs"]), {"volume": f"{settings.storage}:{settings.disk_gib}"}),
        ("--net0", pve_parse("lxcnet", options["--net0"])["bridge"], settings.bridge),
    ]
    ro = {pve.mount_identity(v) for v in wanted_mount_points(guest) if ",ro=1" in v}
    for index, (host_path, guest_path) in enumerate(settings.mount_points.items()):
        wanted = {"volume": host_path, "mp": guest_path}
        if f"{host_path}->{guest_path}" in ro:
            wanted["ro"] = "1"
        found.append((f"--mp{index}", pve_parse("mp", options[f"--mp{index}"]), wanted))
    for key in ("--rootfs", "--net0", *(f"--mp{i}" for i in range(len(settings.mount_points)))):
        schema.LXC_SCHEMA[key[2:]](options[key])  # pct's own schema accepts it too
    return found


def kvm_read_back(guest) -> list[tuple[str, dict, dict]]:
    args = shlex.split(qm_create(guest))
    options = dict(zip(args[3::2], args[4::2], strict=True))
    settings = guest.guest
    image = settings.cloud_image
    disk = {"file": f"{settings.storage}:{0 if image else settings.disk_gib}", "iothread": "1"}
    if image:
        disk["import-from"] = image
    found = [
        ("--scsi0", pve_parse("drive", options["--scsi0"]), disk),
        ("--net0", pve_parse("qmnet", options["--net0"]), {"model": "virtio", "bridge": settings.bridge}),
        (
            "--efidisk0",
            pve_parse("drive", options["--efidisk0"]),
            {"file": f"{settings.storage}:1", "efitype": "4m", "pre-enrolled-keys": "0"},
        ),
    ]
    if image:
        found.append(("--ide2", pve_parse("drive", options["--ide2"]), {"file": f"{settings.storage}:cloudinit"}))
    for key in ("--scsi0", "--net0", "--efidisk0"):
        schema.QM_SCHEMA[key[2:]](options[key])
    return found


VLLM_STACK = "vllm-0.16.0-cu128"


def engine_read_back(host, site) -> list[tuple[str, object, object]]:
    """The SGLang arguments of the inventory's stack, and vLLM's of the stack file's vLLM stack."""
    sglang = engine_parse(server_arguments(host, site.hosts, site.stack.active), site.stack.active.sglang)
    vllm_stack = site.stack.stacks[VLLM_STACK]
    vllm = engine_parse(server_arguments(host, site.hosts, vllm_stack), vllm_stack.vllm, "vllm")
    serving = host.serving
    return [
        ("--served-model-name", sglang["--served-model-name"], serving.served_model_name),
        ("--model-path", sglang["--model-path"], serving.model_path),
        ("vllm --served-model-name", vllm["--served-model-name"], serving.served_model_name),
        ("vllm --model", vllm["--model"], serving.model_path),
    ]


# (inventory, host group, setting, how the generated value becomes the setting, read-back)
SLOTS = [
    ("prod", "lxc_guests", "guest_mount_points", lambda v: {v: "/models"}, "lxc"),
    ("prod", "lxc_guests", "guest_mount_points", lambda v: {"/tank/models": v}, "lxc"),
    ("prod", "lxc_guests", "guest_storage", lambda v: v, "lxc"),
    ("prod", "lxc_guests", "guest_bridge", lambda v: v, "lxc"),
    # An image comes from the node's image storage only (grammars.IMAGE_TREES): a path there.
    ("prod", "kvm_guests", "guest_cloud_image", lambda v: "/var/lib/vz/import" + v if v.startswith("/") else v, "kvm"),
    ("prod", "kvm_guests", "guest_storage", lambda v: v, "kvm"),
    ("prod", "kvm_guests", "guest_bridge", lambda v: v, "kvm"),
    ("prod", "gpu_nodes", "serving_served_model_name", lambda v: v, "engine"),
    ("prod", "gpu_nodes", "serving_model_path", lambda v: v, "engine"),
    ("lab", "lxc_guests", "guest_mount_points", lambda v: {v: "/models"}, "lxc"),
    ("lab", "lxc_guests", "guest_storage", lambda v: v, "lxc"),
    ("lab", "gpu_nodes", "serving_served_model_name", lambda v: v, "engine"),
    ("lab_replicas", "gpu_nodes", "serving_served_model_name", lambda v: v, "engine"),
    ("lab_replicas", "gpu_nodes", "serving_model_path", lambda v: v, "engine"),
    ("two-node", "gpu_nodes", "serving_served_model_name", lambda v: v, "engine"),
    ("two-node", "gpu_nodes", "serving_model_path", lambda v: v, "engine"),
]

# Hostile characters: property-string and option syntax, spaces, quotes, shell and systemd
# characters, a look-alike letter and other unicode (the invisible ones are refused by an
# earlier rule, tests/unit/test_validation_rules.py).
ALPHABET = list("abcXYZ019-_./:") + [",", "=", " ", " ", "-", "--", "'", '"', "\\", "%", "$", "é", "е", "中", ";", "@"]


def hostile_values(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    values = []
    for _ in range(count):
        text = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 10)))
        start = rng.random()
        if start < 0.15:  # a plain name, so that strict settings (a storage ID) accept some too
            text = rng.choice("abcxyz") + "".join(rng.choice("abcxyz019-_.") for _ in range(rng.randint(0, 8))) + "z"
        elif start < 0.5:
            text = "/" + text  # most settings here are paths: get past "absolute"
        elif start < 0.6:
            text = "-" + text
        values.append(text)
    return values


def read_back(kind: str, inventory: Inventory, host) -> list[tuple[str, object, object]]:
    if kind == "lxc":
        return lxc_read_back(host)
    if kind == "kvm":
        return kvm_read_back(host)
    return engine_read_back(host, inventory.site)


def test_every_hostile_value_is_refused_in_one_line_or_read_back_unchanged(inventories):
    values = hostile_values(38, 2400)
    assert len(set(values)) > 2000
    outcome = {index: {"refused": 0, "read back": 0} for index in range(len(SLOTS))}
    for number, value in enumerate(values):
        index = number % len(SLOTS)
        label, group, key, setting, kind = SLOTS[index]
        inventory = inventories[label]
        name = inventory.site.group(group)[0].name
        host, problems = inventory.retyped(name, key, setting(value))
        if problems:
            assert len(problems) == 1, problems
            assert problems[0].startswith(f"{inventory.where}: host {name}: {key} = "), problems[0]
            outcome[index]["refused"] += 1
            continue
        for option, parsed, wanted in read_back(kind, inventory, host):
            assert parsed == wanted, f"{label} {key} = {setting(value)!r}: {option} read back as {parsed!r}"
        outcome[index]["read back"] += 1
    # Every setting saw both: values it refused and values that reached the host unchanged.
    assert all(seen["refused"] and seen["read back"] for seen in outcome.values()), outcome


# --- named examples (each failed before: accepted, and read back as something else) -------------


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"guest_mount_points": {"/tank/models,ro=0": "/models"}},
            "guest_mount_points = {'/tank/models,ro=0': '/models'} is invalid; expected {host path: path in the guest},"
            " both absolute, each fit for pct's --mpN (volume=HOST,mp=GUEST): the host path '/tank/models,ro=0'"
            " has a ',', where Proxmox splits the option into more options (no escape exists:"
            " pve-common src/PVE/JSONSchema.pm parse_property_string)",
        ),
        (
            {"guest_mount_points": {"/tank/a=b": "/models"}},
            "the host path '/tank/a=b' has a '=', so Proxmox reads it as KEY=VALUE, not as the value",
        ),
        (
            {"guest_mount_points": {"/tank/models": "/models "}},
            "the path in the guest '/models ' has spaces at its start or end, which Proxmox's config file trims",
        ),
        ({"guest_mount_points": {"/tank/../etc": "/models"}}, "has a /./ or /../ part, which pct refuses"),
        (
            {"guest_storage": "local-lvm,size=1"},
            "guest_storage = 'local-lvm,size=1' is invalid; expected a Proxmox storage ID like local-lvm",
        ),
        (
            {"guest_cloud_image": "/var/lib/vz/x.img,iothread=0"},
            "guest_cloud_image = '/var/lib/vz/x.img,iothread=0' is invalid",
        ),
        (
            {"eagle3_training_specforge_repo": "--upload-pack=touch /tmp/x"},
            "eagle3_training_specforge_repo = '--upload-pack=touch /tmp/x' is invalid; expected a git repository URL",
        ),
        (
            {"serving_served_model_name": "--api-key"},
            "serving_served_model_name = '--api-key' is invalid; expected a non-empty value that does not start"
            " with '-' (argparse reads one as an option)",
        ),
    ],
)
def test_named_examples_are_refused_in_one_line_naming_our_file(inventory, validate, data, message):  # noqa: F811
    from tests.unit.test_refusals import NODE

    guest = ("ct", {"guest_vmid": 201, "guest_node": NODE[0], "gpu_count": 0, **data})
    group = "kvm_guests" if "guest_cloud_image" in data else "lxc_guests"
    groups = {"proxmox_hosts": [NODE], group: [guest]}
    if "serving_served_model_name" in data or "eagle3_training_specforge_repo" in data:
        groups = {"gpu_nodes": [("gpu1", {"gpu_count": 8, **data})]}
    path = inventory.groups(**groups)
    line = validate(path)
    assert line.startswith(f"{path}: host ") and message in line, line


def test_a_comma_in_a_mount_point_stops_pyinfra_before_any_host(inventory, tmp_path):
    """Through the deploy's own entry (`pyinfra INVENTORY deploy.py`): exit 2, one line, no host."""
    from tests.unit.test_refusals import NODE, one_line

    guest = ("ct", {"guest_vmid": 201, "guest_node": NODE[0], "guest_mount_points": {"/tank/models,ro=0": "/models"}})
    path = inventory.write(
        "from validation import require_valid_inventory\n"
        f"proxmox_hosts = [{NODE!r}]\nlxc_guests = [{guest!r}]\n"
        "require_valid_inventory(__file__, globals())\n"
    )
    pyinfra = str(PROJECT_ROOT / ".venv" / "bin" / "pyinfra")
    line = one_line(tmp_path, pyinfra, "-y", str(path), "deploy.py")
    assert "guest_mount_points = {'/tank/models,ro=0': '/models'} is invalid" in line and "has a ','" in line


# --- planted once: the code before this rule ----------------------------------------------------


def test_a_raw_comma_in_a_mount_point_became_an_extra_option_of_mp0():
    """What pve.lxc_mount_point wrote before (the raw value joined with ','): pve's parser reads
    the host path '/tank/models,ro=0' as the volume /tank/models and an option ro=0, so the
    read-only mount the deploy meant (ro=1) became a duplicate key, or silently writable."""
    before = ",".join(["/tank/models,ro=0", "mp=/models"])  # the old print_property_string
    assert pve_parse("mp", before) == {"volume": "/tank/models", "ro": "0", "mp": "/models"}
    with pytest.raises(ValueError, match="cannot be written into a Proxmox property string"):
        pve.lxc_mount_point("/tank/models,ro=0", "/models")


def test_a_raw_setting_cannot_reach_a_property_string_option():
    """The type, not a convention: pct/qm options that Proxmox parses as property strings take
    only what roles/shared/pve.py wrote (the f-string --rootfs of the code before is refused)."""
    with pytest.raises(TypeError, match="--rootfs takes a property string built by roles/shared/pve.py"):
        pve.option_args("rootfs", "local-lvm:8")
    with pytest.raises(TypeError, match="--mp0"):
        pve.Plan({"mp0": "/tank/models,mp=/models"}).arguments()
    assert pve.option_args("rootfs", pve.lxc_rootfs("local-lvm", 8)) == ["--rootfs", "local-lvm:8"]
    assert pve.option_args("cores", "8") == ["--cores", "8"]


def test_a_leading_dash_became_an_option_of_the_engine(inventories):
    """served_model_name '--api-key' before the rule: argparse reads it as the option --api-key."""
    prod = inventories["prod"]
    host = prod.site.group("gpu_nodes")[0]
    args = server_arguments(host, prod.site.hosts, prod.site.stack.active)
    planted = [
        ("--api-key" if previous == "--served-model-name" else arg)
        for previous, arg in zip([None, *args[:-1]], args, strict=True)
    ]
    with pytest.raises(SystemExit):  # "argument --served-model-name: expected one argument"
        engine_parse(planted, prod.site.stack.active.sglang)


def test_the_standin_reads_property_strings_as_pve_common_does():
    """pve-common 8.3.8 JSONSchema.pm parse_property_string: blank parts dropped, a value kept
    with its '=' and spaces, a part '=x' or 'k=' is a missing key, a bare part the default key."""
    assert pve_parse("mp", "/a,, ,mp=/b=c ") == {"volume": "/a", "mp": "/b=c "}
    for bad in ("/a,mp=", "/a,=x", "/a=b,mp=/c"):
        with pytest.raises(schema.SchemaError):
            pve_parse("mp", bad)
