"""STAND-IN nvidia-smi of the lab's NVIDIA apt repository (package nvidia-smi): no GPU and no
kernel module exist in the lab.

Without a driver (every lab host, unless the lab says otherwise) it prints what the real one
prints when it cannot reach the driver, exit status 9.

With a driver: where the lab planted a GPU list at /run/nvidia-smi-standin/proc-driver-nvidia
(lab.up does, on inventory/lab_replicas.py's gpu nodes and inventory/lab.py's guest: the same
re-addressed /proc/driver/nvidia/gpus/<address>/information files its DCGM exporter stand-in reads), it
answers as the real nvidia-smi does on a host with the driver, from the real captures of
1 x H200 under driver 580.159.04 (tests/unit/data/gpu/h200-1gpu, h200-1gpu-health), one GPU per
planted information file:
- identity from the planted file: index (PCI bus order), bus id, model name, UUID, minor number;
- the numbers the checks hold a model to, for the model named there: compute capability and
  memory (the RTX PRO 6000 Blackwell Server Edition: 12.0, as CUDA's compute capability list
  gives it, and 97887 MiB, the total nvidia-smi reports for that board with driver 610.43.02 in
  public output; the H200: as captured);
- everything else exactly as captured (ECC, remapped rows, clocks' event reasons, temperature
  and its margin, power limits, BAR1, MIG, PCIe link), with the installed package's version in
  place of 580.159.04;
- the output formats as captured: `--format=csv[,noheader][,nounits]` rows of ", "-separated
  cells, a header of the field names with the unit in brackets ("memory.total [MiB]"), values
  with their unit unless nounits ("143771 MiB"); `-q`, `--version` and the plain table.

The processes holding a GPU (`--query-compute-apps`, `-q`'s Processes, the plain table's
Processes): the driver lists a process while it holds a CUDA context; no process in the lab
can. A lab test makes one "hold" a GPU by writing /run/nvidia-smi-standin/compute-apps/<pid>
("<gpu index> <used MiB>[ <node pid>]"); it is listed while that process lives, as a context
ends with its process, and its memory counts in `memory.used` (the captured -q: Used 0 MiB when
none), with the few MiB more per context the driver shows there (context_overhead_mib). Which PID
is listed depends on where the driver runs and on its version, and the lab says where with
/run/nvidia-smi-standin/pid-namespace:
- absent: the host's own PIDs, as on bare metal or in a KVM guest whose kernel runs the driver;
- "container": as NVML answers inside an LXC guest (its own PID namespace, the driver in the
  node's kernel), by the package's driver version (checks/gpu_processes.py translates_pids):
  - 535.113.01 and later (every 545+, the pinned 580.95.05): the driver names each process by its
    PID in the caller's PID namespace and leaves out what it cannot name there
    (open-gpu-kernel-modules 580.95.05 kernel-open/nvidia/os-interface.c os_find_ns_pid,
    src/nvidia/src/kernel/gpu/gpu_rmapi.c gpuGetProcWithObject_IMPL; captured on an H100 with
    the open module 580.159.04 from `unshare --pid` and `unshare --user --pid`,
    tests/unit/data/nvidia-smi-pidns): a planted process is listed under its own PID and name; a
    holder outside the guest, planted as /run/nvidia-smi-standin/outside/<name> ("<gpu index>
    <used MiB>[ <node pid>]"), is never listed and its memory counts in memory.used;
  - older: the driver knows no PID namespace (NVIDIA/nvidia-docker#1483, "you will always get the
    host pids, not the container pids"; canonical/lxd#9755): the node's PID, the file's third field,
    with no process name (the guest's /proc has no such process); a process planted without one is
    not listed at all, as nvidia-smi shows an empty process list when it cannot name the node's
    PIDs (NVIDIA/nvidia-docker#1460); an outside holder is listed under its node PID; memory counts
    in memory.used either way (lxd#9755: the memory usage is right).
A file /run/nvidia-smi-standin/hang makes every call block for ever, as the real one does on a
wedged driver (a GPU off the bus, Xid 79). Fields as NVML reports a process (nvmlDeviceGetComputeRunningProcesses:
nvmlProcessInfo_t pid, usedGpuMemory; docs.nvidia.com/deploy/nvml-api) under nvidia-smi's names
(`nvidia-smi --help-query-compute-apps`: pid, process_name, used_gpu_memory or used_memory,
gpu_bus_id, gpu_uuid, gpu_name); the header prints used_memory as "used_gpu_memory [MiB]"; with
no process and noheader nothing at all is printed (captured: h200-1gpu/compute-apps.csv).

Anything else (topo, nvlink, a field the captures do not hold) is refused with exit 2, saying
it is the stand-in. It never ships in a production path: only the lab's repository holds it.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[3]
CAPTURES = PROJECT_ROOT / "tests" / "unit" / "data" / "gpu"
CAPTURED_DRIVER = "580.159.04"
STATE = "/run/nvidia-smi-standin"  # the lab's switch and process list, emptied at every boot
PROGRAM_PATH = "/usr/lib/nvidia-smi-standin/nvidia_smi.py"

# /usr/bin/nvidia-smi: the text the real one prints without a driver, unless the lab planted GPUs.
NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
    " Make sure that the latest NVIDIA driver is installed and running."
)
WRAPPER = f"""#!/bin/sh
# STAND-IN nvidia-smi (inference-host lab, lab/standins/nvidia_apt_repo/nvidia_smi.py): no GPU
# and no kernel module exist here. Prints what the real nvidia-smi prints when it cannot reach
# the driver, with its exit status; where the lab planted GPUs ({STATE}/proc-driver-nvidia)
# it answers from real captures instead.
# {STATE}/hang: a wedged driver (a GPU off the bus, the driver stuck in the kernel): the real
# nvidia-smi then blocks in an NVML call and never returns; so does this one.
if [ -e "${{NVIDIA_SMI_STANDIN_STATE:-{STATE}}}/hang" ]; then
    exec sleep infinity
fi
if [ -d "${{NVIDIA_SMI_STANDIN_STATE:-{STATE}}}/proc-driver-nvidia/gpus" ]; then
    exec /usr/bin/python3 "${{NVIDIA_SMI_STANDIN_PROGRAM:-{PROGRAM_PATH}}}" "$@"
fi
echo "{NO_DRIVER}"
exit 9
"""

# What a model's board reports where it differs from the captured H200 in what the checks judge.
MODELS = {"NVIDIA RTX PRO 6000 Blackwell Server Edition": {"compute_cap": "12.0", "memory_mib": 97887}}


def captures() -> dict[str, str]:
    one, health = CAPTURES / "h200-1gpu", CAPTURES / "h200-1gpu-health"
    return {
        "query_gpu": (one / "query-gpu.csv").read_text(),  # header with units, values with units
        "query_health": (health / "query-gpu-health.csv").read_text(),  # GPU_QUERY_FIELDS, nounits
        "query_retired": (one / "query-retired.csv").read_text(),
        "query_remapped": (one / "query-remapped.csv").read_text(),
        "version": (one / "smi-version.txt").read_text(),
        "table": (one / "nvidia-smi.txt").read_text(),
        "q": (one / "nvidia-smi-q.txt").read_text(),
    }


PROGRAM = r'''#!/usr/bin/python3
"""STAND-IN nvidia-smi with a driver (inference-host lab, lab/standins/nvidia_apt_repo/nvidia_smi.py)."""
import glob, os, re, sys, time

CAPTURED_DRIVER, VERSION = %(captured)r, %(version)r
STATE = os.environ.get("NVIDIA_SMI_STANDIN_STATE", %(state)r)  # the unit tests point it elsewhere
CAPTURES = %(captures)r
MODELS = %(models)r
HEALTH_FIELDS = ("index", "pci.bus_id", "name", "uuid", "compute_cap", "memory.total", "driver_version",
                 "persistence_mode", "pstate", "pcie.link.gen.current", "pcie.link.gen.max",
                 "pcie.link.gen.gpumax", "pcie.link.width.current", "pcie.link.width.max")
APP_FIELDS = {"pid": "pid", "process_name": "process_name", "used_memory": "used_gpu_memory [MiB]",
              "used_gpu_memory": "used_gpu_memory [MiB]", "gpu_bus_id": "gpu_bus_id", "gpu_uuid": "gpu_uuid",
              "gpu_name": "gpu_name"}


def text(name):
    return CAPTURES[name].replace(CAPTURED_DRIVER, VERSION).replace("580.159", VERSION.rsplit(".", 1)[0])


def refuse(what):
    print("nvidia-smi (stand-in): %%s is not answered in the lab (no capture of it)" %% what, file=sys.stderr)
    sys.exit(2)


def rows(name):
    return [[c.strip() for c in line.split(",")] for line in text(name).splitlines() if line.strip()]


def captured_fields():
    """{field: (header name, value without unit, value with unit)} of the captured GPU."""
    header, values = rows("query_gpu")
    fields = {}
    for name, value in zip(header, values):
        field = re.sub(r"\s*\[.*\]$", "", name)
        fields[field] = (name, value.split(" ")[0] if name != field else value, value)
    for field, value in zip(HEALTH_FIELDS, rows("query_health")[0]):
        fields.setdefault(field, (field, value, value))
    header, values = rows("query_retired")
    for name, value in zip(header, values):
        fields.setdefault(name, (name, value, value))
    return fields


def gpus():
    """The planted GPU list, in PCI bus order (nvidia-smi's index order)."""
    found = []
    for path in glob.glob(STATE + "/proc-driver-nvidia/gpus/*/information"):
        info = open(path).read()
        get = lambda key: (re.search(key + r":\s*(.+)", info) or [None, ""])[1].strip()  # noqa: E731
        domain, bus, rest = path.split("/")[-2].split(":")
        found.append({"bus_id": "%%08X:%%s:%%s" %% (int(domain, 16), bus.upper(), rest.upper()),
                      "name": get("Model"), "uuid": get("GPU UUID"), "minor": get("Device Minor")})
    found.sort(key=lambda g: g["bus_id"])
    for index, gpu in enumerate(found):
        gpu["index"] = str(index)
    return found


def gpu_values(gpu):
    """{field: (header, bare, with unit)} of one planted GPU: its identity, its model's numbers,
    the captured rest."""
    out, model = {}, MODELS.get(gpu["name"], {})
    own = {"index": gpu["index"], "pci.bus_id": gpu["bus_id"], "name": gpu["name"], "uuid": gpu["uuid"],
           "compute_cap": model.get("compute_cap")}
    for field, (header, bare, with_unit) in captured_fields().items():
        mine = own.get(field)
        out[field] = (header, mine, mine) if mine else (header, bare, with_unit)
    if "memory_mib" in model:
        memory = str(model["memory_mib"])
        out["memory.total"] = (out["memory.total"][0], memory, memory + " MiB")
    on_gpu = [int(app["used"]) for app in apps() if app["gpu"]["index"] == gpu["index"]]
    used = str(sum(on_gpu) + context_overhead_mib(len(on_gpu)))
    out["memory.used"] = ("memory.used [MiB]", used, used + " MiB")
    return out


def context_overhead_mib(contexts):
    """What memory.used holds beyond the processes' own figures: 9 MiB with one CUDA context on the
    GPU, 15 MiB with two, none without (captured: tests/unit/data/nvidia-smi-pidns, H100, 580.159.04);
    6 MiB more for each further context is an extrapolation of those two points."""
    return 0 if contexts == 0 else 9 + 6 * (contexts - 1)


def apps():
    """Processes the lab made hold a GPU, while they live, and holders outside this host's PID
    namespace (memory counted; listed only where the driver would name them)."""
    listed, by_index = [], {g["index"]: g for g in gpus()}
    for path in sorted(glob.glob(STATE + "/compute-apps/*")):
        pid = os.path.basename(path)
        try:
            fields = open(path).read().split()
            index, used = fields[:2]
            argv0 = open("/proc/%%s/cmdline" %% pid, "rb").read().split(b"\0")[0].decode()
        except (OSError, ValueError):
            continue  # the process ended: its context with it
        gpu = by_index.get(index)
        if gpu is None:
            continue
        if in_container() and not translates_pids(VERSION):
            # an old driver: the node's PID, unnamed here; none planted: not listed (memory counted)
            node_pid = fields[2] if len(fields) > 2 else None
            listed.append({"pid": node_pid, "process_name": "[Not Found]", "used": used, "gpu": gpu})
        else:  # this namespace's own PID and name (a translating driver names them in a guest too)
            listed.append({"pid": pid, "process_name": argv0, "used": used, "gpu": gpu})
    for path in sorted(glob.glob(STATE + "/outside/*")) if in_container() else ():
        try:
            fields = open(path).read().split()
            index, used = fields[:2]
        except (OSError, ValueError):
            continue
        gpu = by_index.get(index)
        if gpu is None:
            continue
        # outside this namespace: a translating driver leaves it out; an old one gives the node's PID
        node_pid = None if translates_pids(VERSION) or len(fields) < 3 else fields[2]
        listed.append({"pid": node_pid, "process_name": "[Not Found]", "used": used, "gpu": gpu})
    return listed


def in_container():
    try:
        return open(STATE + "/pid-namespace").read().strip() == "container"
    except OSError:
        return False


%(translates_pids)s

def shown_apps():
    """The processes nvidia-smi lists: those it can name by a PID."""
    return [app for app in apps() if app["pid"] is not None]


def csv(format_option, header, lines):
    options = format_option.split(",")
    if options[0] != "csv":
        refuse("--format=" + format_option)
    out = [] if "noheader" in options else [", ".join(header)]
    for cells in lines:
        out.append(", ".join(bare if "nounits" in options else with_unit for bare, with_unit in cells))
    if out:
        print("\n".join(out))


def query_gpu(fields, format_option):
    values = [gpu_values(g) for g in gpus()]
    known = values[0] if values else {}
    for field in fields:
        if field not in known:
            refuse('field "%%s"' %% field)
    csv(format_option, [known[f][0] for f in fields], [[(v[f][1], v[f][2]) for f in fields] for v in values])


def query_remapped(fields, format_option):
    header, values = rows("query_remapped")
    captured = dict(zip(header, values))
    for field in fields:
        if field not in captured:
            refuse('field "%%s"' %% field)
    lines = [[(g["bus_id"], g["bus_id"]) if f == "gpu_bus_id" else (captured[f], captured[f]) for f in fields]
             for g in gpus()]
    csv(format_option, fields, lines)


def query_apps(fields, format_option):
    for field in fields:
        if field not in APP_FIELDS:
            refuse('field "%%s"' %% field)
    lines = []
    for app in shown_apps():
        cell = {"pid": app["pid"], "process_name": app["process_name"], "gpu_bus_id": app["gpu"]["bus_id"],
                "gpu_uuid": app["gpu"]["uuid"], "gpu_name": app["gpu"]["name"]}
        lines.append([(app["used"], app["used"] + " MiB") if f in ("used_memory", "used_gpu_memory")
                      else (cell[f], cell[f]) for f in fields])
    csv(format_option, [APP_FIELDS[f] for f in fields], lines)


def now():
    return time.ctime()  # as captured: "Sun Nov 29 17:27:59 2026"


def query_q():
    """`nvidia-smi -q`: the captured report, one GPU section per GPU."""
    lines = text("q").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("GPU "))
    head = [re.sub(r"(Timestamp\s+: ).*", lambda m: m.group(1) + now(), line) for line in lines[:start]]
    head = [re.sub(r"(Attached GPUs\s+: ).*", lambda m: m.group(1) + str(len(gpus())), line) for line in head]
    section, out = "\n".join(lines[start:]), head
    width = len(re.search(r"\n(    Product Name\s+: )", section).group(1)) - 4
    for gpu in gpus():
        v = gpu_values(gpu)
        body = section.replace(lines[start], "GPU " + gpu["bus_id"])
        for key, value in (("Product Name", gpu["name"]), ("GPU UUID", gpu["uuid"]), ("Minor Number", gpu["minor"]),
                           ("Bus Id", gpu["bus_id"]), ("Bus", "0x" + gpu["bus_id"].split(":")[1].lower())):
            body = re.sub(
                r"(\n\s+%%s\s+: ).*" %% re.escape(key), lambda m, value=value: m.group(1) + value, body, count=1
            )
        body = re.sub(r"(FB Memory Usage\n\s+Total\s+: )\d+", lambda m: m.group(1) + v["memory.total"][1], body)
        used = v["memory.used"][1]
        body = re.sub(r"(FB Memory Usage\n(?:.*\n){2}\s+Used\s+: )\d+", lambda m: m.group(1) + used, body)
        held = [a for a in shown_apps() if a["gpu"]["index"] == gpu["index"]]
        if held:
            process = ["    Processes"]
            for app in held:
                for key, value in (("GPU instance ID", "N/A"), ("Compute instance ID", "N/A"),
                                   ("Process ID", app["pid"]), ("Type", "C"), ("Name", app["process_name"]),
                                   ("Used GPU Memory", app["used"] + " MiB")):
                    process.append(("        " + key).ljust(width + 4) + ": " + value)
            body = re.sub(r"\n    Processes\s+: None", lambda m: "\n" + "\n".join(process), body)
        out += body.splitlines()
    print("\n".join(out))


def table():
    """Plain `nvidia-smi`: the captured table, one GPU row per GPU, then the processes."""
    lines = text("table").splitlines()
    lines[0] = now() + lines[0][len(now()):]
    gpu_at = next(i for i, line in enumerate(lines) if re.match(r"^\|\s+0\s+NVIDIA", line))
    out = lines[:gpu_at]
    rule = lines[gpu_at + 3]
    for gpu in gpus():
        first, second, third = lines[gpu_at:gpu_at + 3]
        name_cell = first[1:first.index("|", 1)]
        cell = "   %%s  %%s" %% (gpu["index"], gpu["name"])
        on = name_cell.rstrip()[-3:]
        room = len(name_cell) - len(on) - 2
        cell = (cell if len(cell) <= room else cell[:room - 3] + "...").ljust(room) + on + "  "
        first = "|" + cell + first[first.index("|", 1):].replace("00000000:00:06.0", gpu["bus_id"])
        memory = gpu_values(gpu)["memory.total"][1]
        second = re.sub(r" *\d+MiB / +\d+MiB", lambda m: ("0MiB / %%sMiB" %% memory).rjust(len(m.group(0))), second)
        out += [first, second, third, rule]
    tail = lines[gpu_at + 4:]
    held = shown_apps()
    if held:
        at = next(i for i, line in enumerate(tail) if "No running processes found" in line)
        width = len(tail[at])
        rows_ = ["|  %%3s   N/A  N/A  %%12s      C   %%-36s %%8sMiB |" %% (a["gpu"]["index"], a["pid"],
                 a["process_name"][-36:], a["used"]) for a in held]
        tail = tail[:at] + [r[:-1][:width - 1].ljust(width - 1) + "|" for r in rows_] + tail[at + 1:]
    print("\n".join(out + tail))


def main(args):
    if not args:
        return table()
    if args == ["--version"]:
        return print(text("version"), end="")
    if args == ["-q"]:
        return query_q()
    options = dict(arg.split("=", 1) for arg in args if arg.startswith("--") and "=" in arg)
    if set(options) - {"--query-gpu", "--query-remapped-rows", "--query-compute-apps", "--format"} or \
            len(options) != len(args) or "--format" not in options:
        refuse("`nvidia-smi %%s`" %% " ".join(args))
    for option, answer in (("--query-gpu", query_gpu), ("--query-remapped-rows", query_remapped),
                           ("--query-compute-apps", query_apps)):
        if option in options:
            return answer([f.strip() for f in options[option].split(",")], options["--format"])
    refuse("`nvidia-smi %%s`" %% " ".join(args))


main(sys.argv[1:])
'''


def translates_pids(driver_version: str | None) -> bool | None:
    """Whether this driver names processes by their PIDs in the caller's PID namespace: the same
    rule as checks/gpu_processes.py's (a unit test holds them equal; the stand-ins import no
    checks): os_find_ns_pid from 535.113.01, 535.43.24 on the 535.43 branch, every 545 and later."""
    found = re.fullmatch(r"(\d+)\.(\d+)(?:\.(\d+))?", (driver_version or "").strip())
    if not found:
        return None
    major, minor, patch = int(found[1]), int(found[2]), int(found[3] or 0)
    if major != 535:
        return major > 535
    return patch >= 24 if minor == 43 else minor >= 113


def program(version: str) -> str:
    return PROGRAM % {
        "captured": CAPTURED_DRIVER,
        "version": version,
        "state": STATE,
        "captures": captures(),
        "models": MODELS,
        "translates_pids": inspect.getsource(translates_pids),
    }
