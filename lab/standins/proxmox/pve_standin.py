"""STAND-IN for Proxmox VE 8's `pct`, `qm`, `pvesh` and `proxmox-boot-tool` (lab only).

Proxmox cannot be installed on the lab machines, so the lab's Proxmox node (a Debian 12 systemd
container) gets these instead. They never ship in a production path: lab/__init__.py copies
them into the node container at bring-up.

What is mirrored from the documented source (branch stable-bookworm = PVE 8):
- option and config key sets: pve-container src/PVE/LXC/Config.pm ($confdesc, $features_desc,
  $netconf_desc, $mp_desc, $dev_desc; dev0-255, mp0-255, net0-31, unused0-255) and the
  create_vm/update_vm parameters of src/PVE/API2/LXC.pm; qemu-server src/PVE/QemuServer.pm
  ($confdesc and the per-index keys), src/PVE/QemuServer/PCI.pm ($hostpci_fmt, hostpci0-15),
  src/PVE/QemuServer/Machine.pm (machine type pattern) and src/PVE/API2/Qemu.pm;
- errors: pve-common src/PVE/JSONSchema.pm + Exception.pm ("400 Parameter verification failed."
  then "key: message" lines, then the short usage; Getopt's "Unknown option: x" then "400 unable
  to parse option"), exit status 255 like a perl `die`;
- config files: write_pct_config / write_vm_config (sorted "key: value" lines, then the pending
  section with a `delete:` line: `[pve:pending]` for a container, `[PENDING]` for a VM; later
  `[special:*]` and snapshot sections are kept as they are), allocated volumes printed as
  `STORAGE:vm-ID-disk-N,size=NG`, a generated hwaddr/MAC on network devices, raw values of
  devN/hostpciN kept as given;
- ssh keys: pct create's --ssh-public-keys are checked as pve-common src/PVE/Tools.pm
  validate_ssh_public_keys does (`ssh-keygen -l -f` on each line alone; "SSH public key
  validation error"), so a key with a corrupt body fails in the lab as on the node;
- pending: a running guest gets only hot-pluggable keys applied (pve-container
  vmconfig_hotplug_pending and $LXC_FASTPLUG_OPTIONS; qemu-server's fast-plug options, network
  and disk hotplug); everything else lands in the pending section until the next start.

What is not real: no container or VM runs (start/stop only record a status), no storage is
allocated (volume names are invented in Proxmox's naming scheme; each new volume's data is a
folder under STATE_DIR/storage, and `destroy` frees what Proxmox frees, see destroy_guest), and a
devN path is checked the
way PVE::LXC::Tools::get_device_mode_and_rdev does it (it must exist and be a character or block
device). In the lab those /dev/nvidia* nodes are real character devices made with mknod (Docker
lets a container make device nodes but not open them), so the check is the real one.

Commands inside a container (`pct exec`, `pct push`, and pct create's post-create hook, which
writes root's authorized_keys) act on the lab's real guest: the node container holds the
host's Docker socket at LAB_DOCKER_SOCKET and lab/__init__.py lists which Docker container is
which CT in LAB_BACKING_FILE; the stand-in runs the command there through the Docker Engine API
(POST /containers/<name>/exec; PUT /containers/<name>/archive for a file), as lxc-attach and
the namespace-entering file copy do on a node. A CT without a lab container runs nothing.

Every invocation is appended to $PVE_STANDIN_LOG (default /var/log/pve-standin.log), one line
each: the argv joined with spaces, then " => <exit status>". Tests read it.

The option schemas (what each key accepts) and PVE's exceptions live in pve_schema.py beside
this file; this one keeps the node's state: config files, volumes, status, the command runner.
"""

from __future__ import annotations

import http.client
import io
import json
import os
import random
import re
import shutil
import socket
import stat
import sys
import tarfile
import urllib.parse
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))  # its sibling pve_schema.py, also when loaded by path
from pve_schema import ParamError, PveError, SchemaError

STATE_DIR = Path(os.environ.get("PVE_STANDIN_STATE", "/var/lib/pve-standin"))
LOG_FILE = Path(os.environ.get("PVE_STANDIN_LOG", "/var/log/pve-standin.log"))
PVE_DIR = Path("/etc/pve")
NODE = socket.gethostname().split(".")[0]

# ----------------------------------------------------------------------------------------------
# Command-line parsing, Getopt::Long style, and the error output of PVE's CLIHandler.


def parse_options(args: list[str], allowed: dict, booleans: set[str]) -> tuple[dict, list[str]]:
    """--key value / -key value / --key=value; booleans may omit their value."""
    options: dict[str, str] = {}
    positional: list[str] = []
    index = 0
    while index < len(args):
        arg = args[index]
        match = re.fullmatch(r"--?([A-Za-z][\w\-]*)(?:=(.*))?", arg)
        if not match:
            positional.append(arg)
            index += 1
            continue
        key, value = match.group(1), match.group(2)
        if key not in allowed:
            print(f"Unknown option: {key}", file=sys.stderr)
            raise UsageError("unable to parse option")
        if value is None:
            nxt = args[index + 1] if index + 1 < len(args) else None
            if key in booleans and (nxt is None or nxt.startswith("-")):
                value = "1"
            elif nxt is None:
                print(f"Option {key} requires an argument", file=sys.stderr)
                raise UsageError("unable to parse option")
            else:
                value = nxt
                index += 1
        options[key] = value
        index += 1
    return options, positional


class UsageError(Exception):
    pass


class ExitStatus(Exception):
    """A command that ran and ends with its own status (pct exec: the command's)."""

    def __init__(self, status: int):
        self.status = status
        super().__init__(status)


def validate(options: dict, schema: dict) -> dict:
    errors: dict[str, str] = {}
    result: dict[str, str] = {}
    for key, value in options.items():
        check = schema.get(key)
        if check is None:
            errors[key] = "property is not defined in schema and the schema does not allow additional properties"
            continue
        try:
            result[key] = check(value)
        except SchemaError as error:
            errors[key] = str(error).rstrip("\n")
    if errors:
        raise ParamError(errors)
    return result


def run(tool: str, usage: dict[str, str], handler) -> None:
    """Run a CLI command, log it, and print errors and exit codes the way PVE's CLIs do."""
    argv = sys.argv[1:]
    command = argv[0] if argv else ""
    status = 0
    try:
        if command not in usage:
            raise PveError(f"unknown command '{tool} {command}'\nUSAGE: {tool} <COMMAND> [ARGS] [OPTIONS]")
        handler(command, argv[1:])
    except UsageError as error:
        sys.stderr.write(f"400 {error}\n{tool} {usage[command]}\n")
        status = 255
    except ParamError as error:
        lines = "".join(f"{key}: {msg}\n" for key, msg in error.errors.items())
        sys.stderr.write(f"400 Parameter verification failed.\n{lines}{tool} {usage[command]}\n")
        status = 255
    except PveError as error:
        sys.stderr.write(f"{error}\n")
        status = 255
    except ExitStatus as done:
        status = done.status
    finally:
        _log(tool, argv, status)
    sys.exit(status)


def _log(tool: str, argv: list[str], status: int) -> None:
    try:
        with LOG_FILE.open("a") as log:
            log.write(" ".join([tool, *argv]) + f" => {status}\n")
    except OSError:
        pass


# ----------------------------------------------------------------------------------------------
# Config files (write_pct_config / write_vm_config) and guest status.


def conf_path(kind: str, vmid: int) -> Path:
    return PVE_DIR / "nodes" / NODE / kind / f"{vmid}.conf"


def pending_header(kind: str) -> str:
    """pve-container 5.3.5 write_pct_config writes "[pve:pending]"; qemu-server 8.4.10
    write_vm_config writes "[PENDING]" (both src files on branch stable-bookworm)."""
    return "[pve:pending]" if kind == "lxc" else "[PENDING]"


def read_conf(kind: str, vmid: int) -> tuple[dict, dict]:
    current, pending, _ = _read_sections(kind, vmid)
    return current, pending


def _read_sections(kind: str, vmid: int) -> tuple[dict, dict, str]:
    """Main and pending keys, and the later sections ([special:*], snapshots) as written."""
    current: dict[str, str] = {}
    pending: dict[str, str] = {}
    section = current
    lines = conf_path(kind, vmid).read_text().splitlines()
    for index, line in enumerate(lines):
        if not line.strip() or line.startswith("#"):
            continue
        if line.strip().lower() == pending_header(kind).lower():
            section = pending
            continue
        if line.startswith("["):
            return current, pending, "\n".join(lines[index:]) + "\n"
        key, _, value = line.partition(":")
        section[key.strip()] = value.strip()
    return current, pending, ""


def _later_blocks(later: str) -> list[tuple[str, list[str]]]:
    """The sections after the pending one: (header, lines) in file order."""
    blocks: list[tuple[str, list[str]]] = []
    for line in later.splitlines():
        if line.startswith("["):
            blocks.append((line.strip(), []))
        elif line.strip() and blocks:
            blocks[-1][1].append(line)
    return blocks


def read_special(kind: str, vmid: int, name: str) -> dict:
    """The keys of a `[special:<name>]` section (qemu-server parse_vm_config)."""
    for header, lines in _later_blocks(_read_sections(kind, vmid)[2]):
        if header.lower() == f"[special:{name}]":
            return {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return {}


def write_special(kind: str, vmid: int, name: str, values: dict) -> None:
    """Replace (or, empty, drop) a special section; write_vm_config puts the special sections,
    sorted, after [PENDING] and before the snapshots, each with its keys sorted."""
    current, pending, later = _read_sections(kind, vmid)
    blocks = [b for b in _later_blocks(later) if b[0].lower() != f"[special:{name}]"]
    if values:
        blocks.append((f"[special:{name}]", [f"{k}: {values[k]}" for k in sorted(values)]))
    specials = sorted((b for b in blocks if b[0].lower().startswith("[special:")), key=lambda b: b[0])
    others = [b for b in blocks if not b[0].lower().startswith("[special:")]
    text = "\n".join("\n".join([header, *lines]) + "\n" for header, lines in specials + others)
    write_conf(kind, vmid, current, pending, later=text)


def write_conf(kind: str, vmid: int, current: dict, pending: dict, later: str | None = None) -> None:
    def block(conf: dict) -> str:
        raw = [(k, v) for k, v in conf.items() if not k.startswith("lxc.")]
        lxc = [(k, v) for k, v in conf.items() if k.startswith("lxc.")]
        return "".join(f"{k}: {v}\n" for k, v in sorted(raw) + lxc)

    path = conf_path(kind, vmid)
    if later is None:
        later = _read_sections(kind, vmid)[2] if path.exists() else ""
    text = block(current)
    if pending:
        text += f"\n{pending_header(kind)}\n" + block(pending)
    if later:  # special sections and snapshots follow the pending one, kept as they are
        text += "\n" + later
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def exists(vmid: int) -> str | None:
    for kind, label in (("lxc", "CT"), ("qemu-server", "VM")):
        if conf_path(kind, vmid).exists():
            return label
    return None


def status_file(kind: str, vmid: int) -> Path:
    return STATE_DIR / kind / f"{vmid}.status"


def get_status(kind: str, vmid: int) -> str:
    path = status_file(kind, vmid)
    return path.read_text().strip() if path.exists() else "stopped"


def set_status(kind: str, vmid: int, value: str) -> None:
    path = status_file(kind, vmid)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(value + "\n")


def require_conf(kind: str, vmid: int) -> None:
    if not conf_path(kind, vmid).exists():
        raise PveError(f"Configuration file 'nodes/{NODE}/{kind}/{vmid}.conf' does not exist")


def vmid_of(value: str | None) -> int:
    if value is None:
        raise ParamError({"vmid": "property is missing and it is not optional"})
    if not re.fullmatch(r"\d+", value) or not 100 <= int(value) <= 999999999:
        raise ParamError({"vmid": "invalid format - value does not look like a valid VM ID"})
    return int(value)


def allocate(storage: str, vmid: int, spec: str, taken: dict, default_size: str) -> str:
    """`local-lvm:500` -> `local-lvm:vm-101-disk-0,size=500G` (first free disk number)."""
    first, _, rest = spec.partition(",")
    store, _, size = first.partition(":")
    if size == "cloudinit":  # qemu-server Cloudinit.pm: one drive per VM, always a cdrom
        return f"{store}:vm-{vmid}-cloudinit,media=cdrom"
    if not re.fullmatch(r"\d+(\.\d+)?", size or ""):
        return spec  # an existing volume or a path: kept as given
    imported = [o for o in rest.split(",") if o.startswith("import-from=")]
    if imported:  # qemu-server API2/Qemu.pm: "<storage>:0,import-from=<source>", a copy of it
        source = imported[0].removeprefix("import-from=")
        if size != "0":
            raise ParamError(
                {"scsi0": "'import-from' requires special syntax - use <storage ID>:0,import-from=<source>"}
            )
        if not os.path.isabs(source) and not source.split(":", 1)[-1].startswith("import/"):
            raise ParamError({"scsi0": f"invalid format - import-from: '{source}' is not a path or import volume"})
        path = source if os.path.isabs(source) else f"/var/lib/vz/{source.split(':', 1)[1]}"
        if not os.path.isfile(path):
            raise PveError(f"failed to stat '{path}'")
        rest = ",".join(o for o in rest.split(",") if not o.startswith("import-from="))
        default_size = f"{os.path.getsize(path) // (1024 * 1024) or 1}M"
    used = " ".join(taken.values())
    disk = 0
    while f"vm-{vmid}-disk-{disk}" in used:
        disk += 1
    options = [o for o in rest.split(",") if o]
    volume = f"{store}:vm-{vmid}-disk-{disk}"
    volume_data(volume).mkdir(parents=True, exist_ok=True)  # the new volume's (empty) data
    size_text = default_size if default_size else f"{size}G"
    return ",".join([volume, *options, f"size={size_text}"])


# ----------------------------------------------------------------------------------------------
# Storage volumes and what `pct destroy` / `qm destroy` free.
#
# No storage is real here, but a volume's data is: each volume the stand-in allocates gets a
# folder STATE_DIR/storage/<storage>/<volname> (standing in for the LV, dataset or image file),
# and a CT's rootfs with a lab container behind it (LAB_BACKING_FILE) is that container. A destroy
# frees what Proxmox frees, so data that a real destroy deletes is deleted in the lab too:
# - pve-container 5.3.5 src/PVE/LXC.pm destroy_lxc_container: every rootfs/mpN/unusedN of the
#   config and of its pending section; delete_mountpoint_volume skips what
#   PVE::LXC::Config->classify_mountpoint calls 'bind' (a path) or 'device' (/dev/...), frees a
#   volume whose owner (PVE::Storage::parse_volname) is the CT, and warns "ignore deletion of
#   '<volid>', CT <vmid> isn't the owner!" for any other; --destroy-unreferenced-disks also frees
#   every volume of that VMID on every storage (vdisk_list), referenced or not.
# - qemu-server 8.4.10 src/PVE/QemuServer.pm destroy_vm: every drive, unusedN and vmstate of the
#   config and its pending section, except cdroms (a cloud-init drive is freed) and paths; only
#   volumes the VM owns, silently; --destroy-unreferenced-disks as above.
STORAGE_DATA = STATE_DIR / "storage"
_OWNED_VOLNAME = re.compile(r"(?:vm|subvol|base|basevol)-(\d+)-")


def volume_data(volid: str) -> Path:
    store, _, volname = volid.partition(":")
    return STORAGE_DATA / store / volname


def volume_owner(volid: str) -> int | None:
    """PVE::Storage::parse_volname's owner: the VMID in the volume's own name (for a linked
    clone `base-100-disk-0/vm-101-disk-0`, the last part's); None for templates, ISOs, backups."""
    volname = volid.partition(":")[2]
    match = _OWNED_VOLNAME.match(volname.rsplit("/", 1)[-1])
    return int(match.group(1)) if match else None


def classify_mountpoint(volume: str) -> str:
    """pve-container 5.3.5 PVE::LXC::Config->classify_mountpoint."""
    if volume.startswith("/"):
        return "device" if volume.startswith("/dev/") else "bind"
    return "volume"


def free_volume(kind: str, vmid: int, volid: str, rootfs: bool = False) -> None:
    """PVE::Storage::vdisk_free: the volume and its data are gone. A CT's volume backed by the
    lab's container (its rootfs) takes that container with it; its Docker volumes (the node's
    models, the uv cache) are not the CT's and stay, as a bind mount's folder stays."""
    data = volume_data(volid)
    if data.exists():
        shutil.rmtree(data)
    if rootfs and kind == "lxc" and str(vmid) in load_json(LAB_BACKING_FILE, {}):
        name = urllib.parse.quote(lab_container(vmid))
        status, answer = _engine("DELETE", f"/containers/{name}?force=1")
        if status not in (204, 404):
            raise PveError(
                f"CT {vmid}: removing its rootfs failed ({status}: {answer.decode(errors='replace').strip()})"
            )


def unreferenced_volumes(vmid: int, referenced: set[str]) -> list[str]:
    """vdisk_list(storage_cfg, undef, vmid): the volumes of this VMID on every storage."""
    found = []
    if STORAGE_DATA.is_dir():
        for store in sorted(p for p in STORAGE_DATA.iterdir() if p.is_dir()):
            for path in sorted(store.rglob("*")):
                volid = f"{store.name}:{path.relative_to(store).as_posix()}"
                if path.is_dir() and volume_owner(volid) == vmid and volid not in referenced:
                    if _OWNED_VOLNAME.match(path.name):
                        found.append(volid)
    return found


def destroy_guest(
    kind: str, vmid: int, volumes: list[tuple[str, str]], purge_unreferenced: bool, warn_foreign: bool
) -> None:
    """Free the guest's own volumes ((key, volid) in config order), then, asked for, the
    unreferenced ones of its VMID; then remove its config and state (destroy_config)."""
    seen: set[str] = set()
    for key, volid in volumes:
        if volid in seen:
            continue
        seen.add(volid)
        if volume_owner(volid) == vmid:
            free_volume(kind, vmid, volid, rootfs=key == "rootfs")
        elif warn_foreign:
            sys.stderr.write(f"ignore deletion of '{volid}', CT {vmid} isn't the owner!\n")
    if purge_unreferenced:
        for volid in unreferenced_volumes(vmid, seen):
            free_volume(kind, vmid, volid)
    conf_path(kind, vmid).unlink()
    status_file(kind, vmid).unlink(missing_ok=True)
    STATE_DIR.joinpath(kind, f"{vmid}.authorized_keys").unlink(missing_ok=True)


def random_mac() -> str:
    # Proxmox's default OUI for generated MACs is BC:24:11 (datacenter.cfg mac_prefix).
    return "BC:24:11:" + ":".join(f"{random.randint(0, 255):02X}" for _ in range(3))


def check_device_node(path: str) -> None:
    """PVE::LXC::Tools::get_device_mode_and_rdev: the path must be a char or block device."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise PveError(f"Device {path} does not exist") from None
    if not (stat.S_ISCHR(mode) or stat.S_ISBLK(mode)):
        raise PveError(f"{path} is not a device")


def apply_update(
    kind: str, vmid: int, params: dict, delete: list[str], hotplug: set[str], readonly=(), on_hotplug=None
) -> None:
    """update_pct_config / update_vm: record changes, apply what a running guest can take.

    on_hotplug(key, old, new) is called for each change applied to a running guest (before the
    config is written), new None for a deletion."""
    current, pending = read_conf(kind, vmid)
    pending_delete = [k for k in pending.pop("delete", "").split(",") if k]
    for key in delete:
        if key in readonly:
            raise PveError(f"unable to delete read-only option: '{key}'")
        if key not in current and key not in pending:
            print(f"cannot delete '{key}' - not set in current configuration!", file=sys.stderr)
            continue
        pending.pop(key, None)
        if key not in pending_delete:
            pending_delete.append(key)
    for key, value in params.items():
        if key in readonly:
            raise PveError(f"unable to modify read-only option: '{key}'")
        pending[key] = value
        if key in pending_delete:
            pending_delete.remove(key)
    running = get_status(kind, vmid) == "running"
    for key in list(pending):
        if not running or key in hotplug:
            if running and on_hotplug:
                on_hotplug(key, current.get(key), pending[key])
            current[key] = pending.pop(key)
    for key in list(pending_delete):
        if not running or key in hotplug:
            if running and on_hotplug:
                on_hotplug(key, current.get(key), None)
            current.pop(key, None)
            pending_delete.remove(key)
    # cleanup_pending: a pending value equal to the current one is no change
    for key in [k for k, v in pending.items() if current.get(k) == v]:
        del pending[key]
    if pending_delete:
        pending["delete"] = ",".join(pending_delete)
    write_conf(kind, vmid, current, pending)


def apply_pending(kind: str, vmid: int) -> None:
    current, pending = read_conf(kind, vmid)
    for key in [k for k in pending.pop("delete", "").split(",") if k]:
        current.pop(key, None)
    current.update(pending)
    write_conf(kind, vmid, current, {})


def effective_config(kind: str, vmid: int, current_only: bool) -> dict:
    current, pending = read_conf(kind, vmid)
    if current_only:
        return current
    merged = {**current, **{k: v for k, v in pending.items() if k != "delete"}}
    for key in [k for k in pending.get("delete", "").split(",") if k]:
        merged.pop(key, None)
    return merged


def print_config(conf: dict) -> None:
    for key in sorted(k for k in conf if not k.startswith("lxc.")):
        print(f"{key}: {conf[key]}")
    for key in (k for k in conf if k.startswith("lxc.")):
        print(f"{key}: {conf[key]}")


def print_pending(kind: str, vmid: int) -> None:
    """PVE::GuestHelpers::format_pending."""
    current, pending = read_conf(kind, vmid)
    deletes = [k for k in pending.pop("delete", "").split(",") if k]
    for key in sorted(set(current) | set(pending)):
        if key in deletes:
            print(f"del {key}: {current.get(key, '')}")
        elif key in pending:
            if key in current:
                print(f"cur {key}: {current[key]}")
            print(f"new {key}: {pending[key]}")
        else:
            print(f"cur {key}: {current[key]}")


def load_json(path: Path, default):
    return json.loads(path.read_text()) if path.exists() else default


# ----------------------------------------------------------------------------------------------
# The lab's containers behind CTs: commands and files inside them, through the Docker Engine API.

LAB_DOCKER_SOCKET = os.environ.get("PVE_STANDIN_DOCKER_SOCKET", "/opt/pve-standin-lab/docker.sock")
LAB_BACKING_FILE = STATE_DIR / "lab-containers.json"


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str):
        super().__init__("localhost", timeout=120)
        self._path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(120)
        self.sock.connect(self._path)


def _engine(
    method: str, path: str, body: bytes | None = None, content_type: str = "application/json"
) -> tuple[int, bytes]:
    connection = _UnixHTTPConnection(LAB_DOCKER_SOCKET)
    try:
        connection.request(method, path, body=body, headers={"Content-Type": content_type})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def lab_container(vmid: int) -> str:
    backing = load_json(LAB_BACKING_FILE, {})
    name = backing.get(str(vmid))
    if not name:
        raise PveError(
            f"CT {vmid}: no lab container stands behind it (stand-in: only the CTs in {LAB_BACKING_FILE} run commands)"
        )
    return name


def container_exec(vmid: int, argv: list[str]) -> tuple[int, bytes, bytes]:
    """Run argv in the CT's lab container: exit status, stdout, stderr (no stdin, no tty)."""
    name = urllib.parse.quote(lab_container(vmid))
    status, data = _engine(
        "POST",
        f"/containers/{name}/exec",
        json.dumps({"AttachStdout": True, "AttachStderr": True, "Cmd": argv}).encode(),
    )
    if status != 201:
        raise PveError(f"container '{vmid}' not running! ({status}: {data.decode(errors='replace').strip()})")
    exec_id = json.loads(data)["Id"]
    status, data = _engine("POST", f"/exec/{exec_id}/start", json.dumps({"Detach": False, "Tty": False}).encode())
    streams = {1: bytearray(), 2: bytearray()}
    while len(data) >= 8:  # the multiplexed stream: [stream, 0, 0, 0, size (4 bytes BE)] + payload
        size = int.from_bytes(data[4:8], "big")
        streams.setdefault(data[0], bytearray()).extend(data[8 : 8 + size])
        data = data[8 + size :]
    _, info = _engine("GET", f"/exec/{exec_id}/json")
    return int(json.loads(info).get("ExitCode") or 0), bytes(streams[1]), bytes(streams[2])


def container_put_file(vmid: int, path: str, data: bytes, mode: int, uid: int, gid: int) -> bool:
    """Write a file in the CT's lab container; False when its folder does not exist."""
    folder, base = os.path.split(os.path.normpath(os.path.join("/", path)))
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        info = tarfile.TarInfo(base)
        info.size, info.mode, info.uid, info.gid = len(data), mode, uid, gid
        archive.addfile(info, io.BytesIO(data))
    name = urllib.parse.quote(lab_container(vmid))
    query = urllib.parse.urlencode({"path": folder})
    status, answer = _engine(
        "PUT", f"/containers/{name}/archive?{query}", buffer.getvalue(), content_type="application/x-tar"
    )
    if status == 404:
        return False
    if status != 200:
        raise PveError(f"CT {vmid}: writing {path} failed ({status}: {answer.decode(errors='replace').strip()})")
    return True


def container_stat(vmid: int, path: str) -> tuple[int, int, int] | None:
    """(uid, gid, mode) of a file in the CT's lab container, or None when it is absent."""
    status, out, _ = container_exec(vmid, ["stat", "-c", "%u %g %a", path])
    if status != 0:
        return None
    uid, gid, mode = out.decode().split()
    return int(uid), int(gid), int(mode, 8)
