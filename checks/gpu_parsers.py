"""Pure parsers of the GPU tools: the text of nvidia-smi, /proc/driver/nvidia, dmesg (Xid),
nvidia-smi topo and dcgmi turned into typed values. No I/O here, no pyinfra (checks runs where
there is none): the health checks (checks) use these functions, and tests/unit holds each to real
captured output (tests/unit/data/gpu/). The engine's service on its host (systemctl, ss, the
launch script) is parsed in checks/service_parsers.py, its answers (JSON, Prometheus text, the
benchmark's output) in checks/answer_parsers.py.

The driver's evidence (kernel module version and flavor, userspace versions, NVML's
"Driver/library version mismatch", the modinfo license) is parsed in one place,
roles/shared/driver_state.py, which the driver role uses too; it is re-exported here so
that the checks read every parser from this one module.

Values a tool reports as missing ("[N/A]", "[Not Supported]") become None, never 0: a check
must be able to tell "no evidence" from "evidence of zero".
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from roles.shared.driver_state import (  # noqa: F401  (re-exported for checks)
    SMI_GPU_LOST_RC,
    KernelModule,
    parse_gpu_lost,
    parse_kernel_log_driver_version,
    parse_modinfo_license,
    parse_nvml_mismatch,
    parse_proc_driver_version,
    parse_smi_version,
    parse_userspace_versions,
)

ANSI_ESCAPE_RE = re.compile(r"\x1b\[[0-9;]*m")
MISSING_VALUES = {"[N/A]", "N/A", "[Not Supported]", "Not Supported", "[Unknown Error]", ""}

# ----------------------------------------------------------------------------------------------
# nvidia-smi --query-gpu / --query-remapped-rows / --query-compute-apps (CSV)

# The fields the GPU suite asks for, in this order (nvidia-smi --help-query-gpu names them).
GPU_QUERY_FIELDS = (
    "index",
    "pci.bus_id",
    "name",
    "uuid",
    "compute_cap",
    "memory.total",
    "driver_version",
    "persistence_mode",
    "pstate",
    "pcie.link.gen.current",
    "pcie.link.gen.max",
    "pcie.link.gen.gpumax",
    "pcie.link.width.current",
    "pcie.link.width.max",
)


def _cell(value: str) -> str | None:
    value = value.strip()
    return None if value in MISSING_VALUES else value


def _int(value: str | None) -> int | None:
    if value is None:
        return None
    match = re.match(r"^-?\d+", value)
    return int(match.group(0)) if match else None


def _yes(value: str | None) -> bool | None:
    if value is None:
        return None
    return value.strip().lower() in ("yes", "enabled", "on", "true", "1")


def parse_csv(text: str, fields: tuple[str, ...] | None = None) -> list[dict[str, str | None]]:
    """Rows of nvidia-smi `--format=csv` output, with or without header and units.

    With a header the keys are the header names without their unit ("memory.total [MiB]" ->
    "memory.total"); without one, `fields` names the columns.
    """
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return []
    first = [c.strip() for c in lines[0].split(",")]
    if fields is None:
        fields = tuple(re.sub(r"\s*\[.*\]$", "", name) for name in first)
        lines = lines[1:]
    elif tuple(re.sub(r"\s*\[.*\]$", "", name) for name in first) == tuple(fields):
        lines = lines[1:]
    rows = []
    for line in lines:
        cells = [c for c in line.split(",")]
        if len(cells) != len(fields):
            raise ValueError(
                f"nvidia-smi CSV row has {len(cells)} columns, expected {len(fields)} ({', '.join(fields)}): {line!r}"
            )
        rows.append({name: _cell(cell) for name, cell in zip(fields, cells, strict=True)})
    return rows


@dataclass(frozen=True)
class GpuInfo:
    index: int
    bus_id: str
    name: str
    uuid: str | None
    compute_cap: str | None
    memory_mib: int | None
    driver_version: str | None
    persistence_mode: bool | None
    pstate: str | None
    pcie_gen_current: int | None
    pcie_gen_max: int | None
    pcie_gen_gpu_max: int | None
    pcie_width_current: int | None
    pcie_width_max: int | None

    @property
    def bus(self) -> str:
        """Bus id in the kernel's short form (0000:01:00.0), as dmesg and /proc name it."""
        return normalize_bus_id(self.bus_id)


def normalize_bus_id(bus_id: str) -> str:
    """00000000:01:00.0 (nvidia-smi) and 0000:01:00 (Xid lines) -> 0000:01:00.0, lower case."""
    bus_id = bus_id.strip().lower()
    parts = bus_id.split(":")
    if len(parts) == 3:
        domain, bus, rest = parts
        domain = domain[-4:].rjust(4, "0")
    elif len(parts) == 2:
        domain, (bus, rest) = "0000", parts
    else:
        return bus_id
    if "." not in rest:
        rest += ".0"
    return f"{domain}:{bus}:{rest}"


def parse_gpu_query(text: str, fields: tuple[str, ...] = GPU_QUERY_FIELDS) -> list[GpuInfo]:
    """Returns one GpuInfo per line of `nvidia-smi --query-gpu=<fields> --format=csv,...`."""
    gpus = []
    for row in parse_csv(text, fields):
        get = row.get
        gpus.append(
            GpuInfo(
                index=int(get("index") or 0),
                bus_id=get("pci.bus_id") or "",
                name=get("name") or "",
                uuid=get("uuid"),
                compute_cap=get("compute_cap"),
                memory_mib=_int(get("memory.total")),
                driver_version=get("driver_version"),
                persistence_mode=_yes(get("persistence_mode")),
                pstate=get("pstate"),
                pcie_gen_current=_int(get("pcie.link.gen.current")),
                pcie_gen_max=_int(get("pcie.link.gen.max")),
                pcie_gen_gpu_max=_int(get("pcie.link.gen.gpumax")),
                pcie_width_current=_int(get("pcie.link.width.current")),
                pcie_width_max=_int(get("pcie.link.width.max")),
            )
        )
    return gpus


@dataclass(frozen=True)
class RemappedRows:
    bus_id: str
    correctable: int | None
    uncorrectable: int | None
    pending: bool | None
    failure: bool | None


REMAPPED_FIELDS = (
    "gpu_bus_id",
    "remapped_rows.correctable",
    "remapped_rows.uncorrectable",
    "remapped_rows.pending",
    "remapped_rows.failure",
)


def parse_remapped_rows(text: str) -> list[RemappedRows]:
    """Returns the row-remapping state per GPU (`nvidia-smi --query-remapped-rows=...`)."""
    return [
        RemappedRows(
            bus_id=row["gpu_bus_id"] or "",
            correctable=_int(row["remapped_rows.correctable"]),
            uncorrectable=_int(row["remapped_rows.uncorrectable"]),
            pending=_yes(row["remapped_rows.pending"]),
            failure=_yes(row["remapped_rows.failure"]),
        )
        for row in parse_csv(text, REMAPPED_FIELDS)
    ]


@dataclass(frozen=True)
class RetiredPages:
    index: int
    pending: bool | None
    single_bit: int | None
    double_bit: int | None

    @property
    def supported(self) -> bool:
        """False on GPUs that remap rows instead of retiring pages (A100 and later)."""
        return not (self.pending is None and self.single_bit is None and self.double_bit is None)


RETIRED_FIELDS = (
    "index",
    "retired_pages.pending",
    "retired_pages.single_bit_ecc.count",
    "retired_pages.double_bit.count",
)


def parse_retired_pages(text: str) -> list[RetiredPages]:
    """Returns the page-retirement state per GPU; [N/A] (not supported) becomes None."""
    return [
        RetiredPages(
            index=int(row["index"] or 0),
            pending=_yes(row["retired_pages.pending"]),
            single_bit=_int(row["retired_pages.single_bit_ecc.count"]),
            double_bit=_int(row["retired_pages.double_bit.count"]),
        )
        for row in parse_csv(text, RETIRED_FIELDS)
    ]


@dataclass(frozen=True)
class ComputeApp:
    pid: int
    process_name: str
    used_memory_mib: int | None
    gpu_bus_id: str | None = None


COMPUTE_APP_FIELDS = ("pid", "process_name", "used_memory", "gpu_bus_id")


def parse_compute_apps(text: str, fields: tuple[str, ...] = COMPUTE_APP_FIELDS) -> list[ComputeApp]:
    """Returns the processes holding a CUDA context (`--query-compute-apps=...`); none: []."""
    if "No running processes found" in text:
        return []
    return [
        ComputeApp(
            pid=int(row["pid"] or 0),
            process_name=row.get("process_name") or "",
            used_memory_mib=_int(row.get("used_memory")),
            gpu_bus_id=row.get("gpu_bus_id"),
        )
        for row in parse_csv(text, fields)
    ]


# ----------------------------------------------------------------------------------------------
# Kernel log: Xid errors


@dataclass(frozen=True)
class XidEvent:
    bus: str
    code: int
    message: str
    line: str


XID_RE = re.compile(r"NVRM: Xid \(PCI:(?P<bus>[0-9a-fA-F:.]+)\): (?P<code>\d+),?\s*(?P<message>.*)$")


def parse_xid_events(dmesg_text: str) -> list[XidEvent]:
    """Returns every `NVRM: Xid (PCI:...): N, ...` line of a kernel log, oldest first."""
    events = []
    for line in dmesg_text.splitlines():
        match = XID_RE.search(line)
        if match:
            events.append(
                XidEvent(
                    bus=normalize_bus_id(match.group("bus")),
                    code=int(match.group("code")),
                    message=match.group("message").strip(),
                    line=line.strip(),
                )
            )
    return events


# ----------------------------------------------------------------------------------------------
# nvidia-smi topo -m


@dataclass(frozen=True)
class Topology:
    gpus: list[str]
    links: dict[tuple[str, str], str]  # (GPU0, GPU1) -> NV18 / SYS / PIX / ...
    cpu_affinity: dict[str, str | None]
    numa_affinity: dict[str, str | None]

    def link_kinds(self) -> set[str]:
        return set(self.links.values())


def parse_topology(text: str) -> Topology:
    """Returns the GPU-to-GPU link matrix and each GPU's CPU/NUMA affinity of `nvidia-smi topo -m`."""
    text = ANSI_ESCAPE_RE.sub("", text)
    lines = [line for line in text.splitlines() if line.strip()]
    header_index = next(i for i, line in enumerate(lines) if "CPU Affinity" in line)
    header = [c.strip() for c in lines[header_index].split("\t") if c.strip()]
    columns = [c for c in header if not c.startswith(("CPU Affinity", "NUMA Affinity", "GPU NUMA"))]
    gpu_columns = [c for c in columns if c.startswith("GPU")]
    gpus, links, cpu, numa = [], {}, {}, {}
    for line in lines[header_index + 1 :]:
        if line.startswith("Legend"):
            break
        cells = [c.strip() for c in line.split("\t")]
        cells = [c for c in cells if c != ""]
        if not cells or not cells[0].startswith("GPU"):
            continue
        name = cells[0]
        gpus.append(name)
        for column, value in zip(columns, cells[1:], strict=False):
            if column in gpu_columns and column != name:
                links[(name, column)] = value
        rest = cells[1 + len(columns) :]
        cpu[name] = _cell(rest[0]) if len(rest) > 0 else None
        numa[name] = _cell(rest[1]) if len(rest) > 1 else None
    return Topology(gpus=gpus, links=links, cpu_affinity=cpu, numa_affinity=numa)


# ----------------------------------------------------------------------------------------------
# The small programs the GPU suite runs with the engine's python print one JSON line each.


def parse_json_line(text: str, marker: str) -> dict:
    """Returns the JSON object printed after `marker` (the last such line wins)."""
    found = None
    for line in text.splitlines():
        if line.startswith(marker):
            found = json.loads(line[len(marker) :])
    if found is None:
        raise ValueError(f"no line starting with {marker!r} in the program's output")
    return found


# ----------------------------------------------------------------------------------------------
# nvidia-smi -q: the full per-GPU report (ECC, recovery action, clock events, temperature,
# power limits, BAR1, PCIe replays, MIG). Its layout, as driver 580.159.04 prints it
# (tests/unit/data/gpu/h200-1gpu-checks/nvidia-smi-q.txt): a "GPU <bus id>" line per GPU, then
# "Key : value" lines whose 4-space indentation nests sections ("ECC Errors" > "Volatile" >
# "DRAM Uncorrectable"). Key names changed across drivers (e.g. "Clocks Throttle Reasons"
# became "Clocks Event Reasons" in 535); the accessors below try both.


def parse_smi_q(text: str) -> dict[str, dict]:
    """Returns {bus id (0000:00:06.0): nested {section: {key: value}}} of `nvidia-smi -q`."""
    gpus: dict[str, dict] = {}
    stack: list[tuple[int, dict]] = []
    for raw in text.splitlines():
        if not raw.strip():
            continue
        indent = len(raw) - len(raw.lstrip(" "))
        line = raw.strip()
        if indent == 0:
            match = re.match(r"^GPU ([0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+\.[0-9A-Fa-f])$", line)
            if match:
                current: dict = {}
                gpus[normalize_bus_id(match.group(1))] = current
                stack = [(0, current)]
            else:
                stack = []
            continue
        if not stack:
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if not stack:
            continue
        parent = stack[-1][1]
        key, sep, value = line.partition(":")
        key = key.strip()
        if sep and value.strip():
            parent[key] = value.strip()
        else:  # a section heading: what follows, indented deeper, belongs to it
            section: dict = {}
            parent[key] = section
            stack.append((indent, section))
    return gpus


def _path(tree: dict, *keys: str):
    """tree[k1][k2]...; a key may be "A|B" (alternative names across drivers). None if absent."""
    node: Any = tree
    for key in keys:
        if not isinstance(node, dict):
            return None
        node = next((node[k] for k in key.split("|") if k in node), None)
        if node is None:
            return None
    return node


def _number(value) -> float | None:
    if not isinstance(value, str) or _cell(value) is None:
        return None
    match = re.match(r"^-?\d+(\.\d+)?", value.strip())
    return float(match.group(0)) if match else None


CLOCK_EVENTS_BAD = {
    # `nvidia-smi -q` name -> why it matters (nvidia-smi(1), "Clocks Event Reasons")
    "HW Slowdown": "hardware slowdown (power brake or thermal): the GPU runs at reduced clocks",
    "HW Thermal Slowdown": "the GPU is too hot: check airflow and fans",
    "HW Power Brake Slowdown": "an external power brake (the PSU or chassis asserts it): check power supply",
    "SW Thermal Slowdown": "the driver slows the GPU because it is near its thermal limit",
}


@dataclass(frozen=True)
class GpuHealth:
    """What `nvidia-smi -q` says about one GPU's health (None: not reported on this GPU)."""

    bus: str
    name: str | None
    ecc_current: bool | None
    ecc_pending: bool | None
    ecc_errors: dict[str, dict[str, int | None]]  # Volatile/Aggregate -> {counter: count}
    recovery_action: str | None
    clock_events: dict[str, bool]  # "HW Slowdown" -> active
    temperature_c: float | None
    tlimit_margin_c: float | None  # "GPU T.Limit Temp": degrees left before slowdown
    power_limit_w: float | None  # current (enforced) limit
    power_default_limit_w: float | None
    power_requested_limit_w: float | None
    power_max_limit_w: float | None
    bar1_total_mib: int | None
    fb_total_mib: int | None
    replays: int | None
    replay_rollovers: int | None
    mig_current: str | None
    mig_pending: str | None

    def uncorrectable(self, scope: str) -> dict[str, int]:
        """Counters of `scope` (Volatile, Aggregate) that count uncorrectable errors, nonzero only."""
        counters = self.ecc_errors.get(scope, {})
        return {k: v for k, v in counters.items() if "Uncorrectable" in k and v}


def _ecc_counters(section) -> dict[str, int | None]:
    if not isinstance(section, dict):
        return {}
    # Flat counters only ("SRAM Correctable", "DRAM Uncorrectable", older drivers' "Total");
    # "SRAM Threshold Exceeded" is Yes/No, not a count.
    return {k: _int(v) for k, v in section.items() if isinstance(v, str) and _int(v) is not None}


def gpu_health(bus: str, tree: dict) -> GpuHealth:
    events = _path(tree, "Clocks Event Reasons|Clocks Throttle Reasons") or {}
    flat_events: dict[str, bool] = {}

    def walk(section: dict) -> None:
        for key, value in section.items():
            if isinstance(value, dict):
                walk(value)
            elif _cell(value) is not None:
                flat_events[key] = value.strip() == "Active"
            # HW Slowdown holds its two causes as a nested section in 580.x; walk() flattens it

    walk(events)
    power = _path(tree, "GPU Power Readings|Power Readings") or {}
    return GpuHealth(
        bus=bus,
        name=_path(tree, "Product Name"),
        ecc_current=_yes(_cell(_path(tree, "ECC Mode", "Current") or "")),
        ecc_pending=_yes(_cell(_path(tree, "ECC Mode", "Pending") or "")),
        ecc_errors={scope: _ecc_counters(_path(tree, "ECC Errors", scope)) for scope in ("Volatile", "Aggregate")},
        recovery_action=_cell(_path(tree, "GPU Recovery Action") or ""),
        clock_events=flat_events,
        temperature_c=_number(_path(tree, "Temperature", "GPU Current Temp")),
        tlimit_margin_c=_number(_path(tree, "Temperature", "GPU T.Limit Temp")),
        power_limit_w=_number(power.get("Current Power Limit") or power.get("Enforced Power Limit")),
        power_default_limit_w=_number(power.get("Default Power Limit")),
        power_requested_limit_w=_number(power.get("Requested Power Limit")),
        power_max_limit_w=_number(power.get("Max Power Limit")),
        bar1_total_mib=_int(_cell(_path(tree, "BAR1 Memory Usage", "Total") or "")),
        fb_total_mib=_int(_cell(_path(tree, "FB Memory Usage", "Total") or "")),
        replays=_int(_cell(_path(tree, "PCI", "Replays Since Reset") or "")),
        replay_rollovers=_int(_cell(_path(tree, "PCI", "Replay Number Rollovers") or "")),
        mig_current=_cell(_path(tree, "MIG Mode", "Current") or ""),
        mig_pending=_cell(_path(tree, "MIG Mode", "Pending") or ""),
    )


def parse_gpu_health(text: str) -> dict[str, GpuHealth]:
    """Returns {bus id: GpuHealth} of `nvidia-smi -q`."""
    return {bus: gpu_health(bus, tree) for bus, tree in parse_smi_q(text).items()}


# ----------------------------------------------------------------------------------------------
# nvidia-smi nvlink -s / -e. Format (nvidia-smi(1); driver 5xx):
#   GPU 0: NVIDIA H200 (UUID: GPU-...)
#            Link 0: 26.562 GB/s            (-s; "<inactive>" for a link that is down)
#            Link 0: Replay Errors: 0       (-e; one line per counter and link)
# A GPU without NVLink prints nothing at all (seen on one H200 with its links unused, driver
# 580.159.04: tests/unit/data/gpu/h200-1gpu-checks/nvlink-s.txt is empty).


@dataclass(frozen=True)
class NvlinkState:
    gpu: int
    links: dict[int, float | None]  # link -> GB/s; None: inactive
    errors: dict[int, dict[str, int]] = field(default_factory=dict)

    @property
    def inactive(self) -> list[int]:
        return [link for link, speed in self.links.items() if speed is None]

    def nonzero_errors(self) -> dict[int, dict[str, int]]:
        return {
            link: {k: v for k, v in counters.items() if v}
            for link, counters in self.errors.items()
            if any(counters.values())
        }


_NVLINK_GPU_RE = re.compile(r"^GPU (\d+): ")
_NVLINK_LINK_RE = re.compile(r"^\s*Link (\d+): (.*)$")


def parse_nvlink(status_text: str, errors_text: str = "") -> dict[int, NvlinkState]:
    """Returns {GPU index: NvlinkState} of `nvidia-smi nvlink -s` (and `-e` for counters)."""
    links: dict[int, dict[int, float | None]] = {}
    errors: dict[int, dict[int, dict[str, int]]] = {}
    for text, is_errors in ((status_text, False), (errors_text, True)):
        gpu = None
        for line in text.splitlines():
            match = _NVLINK_GPU_RE.match(line)
            if match:
                gpu = int(match.group(1))
                links.setdefault(gpu, {})
                continue
            match = _NVLINK_LINK_RE.match(line)
            if not match or gpu is None:
                continue
            link, rest = int(match.group(1)), match.group(2).strip()
            if is_errors:
                name, _, value = rest.rpartition(":")
                count = _int(value.strip())
                if count is not None:
                    errors.setdefault(gpu, {}).setdefault(link, {})[name.strip()] = count
            else:
                speed = re.match(r"^([\d.]+) GB/s", rest)
                links[gpu][link] = float(speed.group(1)) if speed else None
    return {gpu: NvlinkState(gpu, links.get(gpu, {}), errors.get(gpu, {})) for gpu in sorted(set(links) | set(errors))}


# ----------------------------------------------------------------------------------------------
# Link classes of `nvidia-smi topo -m`, best first. The legend nvidia-smi prints names them:
# NV# (bonded NVLinks), PIX/PXB (PCIe bridges/switch, not through the host bridge), PHB/NODE
# (through a host bridge, within one NUMA node), SYS (across the SMP interconnect: sockets).

LINK_CLASSES = ("nvlink", "pcie-switch", "host-bridge", "cross-socket")


def link_class(code: str) -> str:
    """NV18 -> nvlink, PIX/PXB -> pcie-switch, PHB/NODE -> host-bridge, SYS -> cross-socket."""
    code = code.strip().upper()
    if code.startswith("NV"):
        return "nvlink"
    if code in ("PIX", "PXB"):
        return "pcie-switch"
    if code in ("PHB", "NODE"):
        return "host-bridge"
    if code == "SYS":
        return "cross-socket"
    raise ValueError(f"unknown link {code!r} in `nvidia-smi topo -m` (expected NV#, PIX, PXB, PHB, NODE, SYS)")


def worst_link(topology: Topology) -> str | None:
    """The slowest link class between any two GPUs (the all-reduce ring crosses it); None: one GPU."""
    classes = [link_class(code) for code in topology.links.values()]
    return max(classes, key=LINK_CLASSES.index) if classes else None


# ----------------------------------------------------------------------------------------------
# `dcgmi diag -r N -j`: DCGM 4's JSON (NVIDIA/DCGM 4.6.0 dcgmi/Diag.cpp HelperJsonBuildOutput,
# HelperJsonAddResult, HelperJsonAddTestSummary, HelperDisplayFailureMessage; the key names are
# nvvs/include/NvvsJsonStrings.h's; -j/--json is dcgmi/CommandLineParser.cpp's switch):
#   {"DCGM Diagnostic": {"test_categories": [{"category": "Deployment", "tests": [
#        {"name": "software",
#         "results": [{"entity_group": "GPU", "entity_group_id": 1, "entity_id": 1,
#                      "status": "Fail", "warnings": [{"warning": "...", "error_id": 29,
#                      "error_category": 3, "error_severity": 1}], "info": ["..."]}],
#         "test_summary": {"status": "Fail", "warnings": [...every error of the test...]}}]}]},
#    "entity_groups": [...], "metadata": {"version": "4.6.0", "Driver Version Detected": "..."}}
# A run that cannot start prints {"DCGM Diagnostic": {"version": ..., "runtime_error": "..."}}.
# Unlike the text table, names are not cut at 25 characters nor messages at 45, and every
# warning carries DCGM's error id (dcgmlib/dcgm_errors.h DCGM_FR_*). The JSON shows a warning
# as "Fail" (HelperDisplayDiagResult without DDR_DISPLAY_WARN); a result DCGM did not run is
# left out (HelperJsonAddResult returns false for DCGM_DIAG_RESULT_NOT_RUN).


@dataclass
class DcgmError:
    """One entry of a result's "warnings" (dcgmDiagError_v1)."""

    entity: str  # GPU1; "" for one that belongs to no entity
    error_id: int  # DCGM_FR_* of dcgmlib/dcgm_errors.h (29: persistence mode disabled)
    category: int  # DCGM_FR_EC_*
    severity: int  # DCGM_ERROR_* (1 monitor, 2 isolate, 6 drain and reset ...)
    message: str


@dataclass
class DcgmTest:
    section: str
    name: str
    result: str
    entities: dict[str, str] = field(default_factory=dict)  # GPU0 -> Pass
    details: list[str] = field(default_factory=list)
    errors: list[DcgmError] = field(default_factory=list)


class DcgmRuntimeError(ValueError):
    """dcgmi could not run the diagnostic (its "runtime_error")."""


def _dcgm_entity(result: dict) -> str:
    if "entity_id" not in result:
        return ""
    return f"{result.get('entity_group', 'GPU')}{result['entity_id']}"


def _dcgm_errors(result: dict, entity: str) -> list[DcgmError]:
    return [
        DcgmError(
            entity,
            int(w.get("error_id", 0)),
            int(w.get("error_category", 0)),
            int(w.get("error_severity", 0)),
            str(w.get("warning", "")),
        )
        for w in result.get("warnings") or []
    ]


def _dcgm_test(section: str, entry: dict) -> DcgmTest:
    results = entry.get("results") or []
    summary = entry.get("test_summary") or {}
    test = DcgmTest(section, str(entry.get("name", "")), str(summary.get("status", "Not Run")))
    for result in results:
        entity = _dcgm_entity(result)
        test.entities[entity] = str(result.get("status", ""))
        test.errors += _dcgm_errors(result, entity)
        test.details += [f"Info: {entity}: {info}" for info in result.get("info") or []]
    # The summary repeats every error of the test; keep only those no entity reported.
    seen = {(e.error_id, e.message) for e in test.errors}
    test.errors += [e for e in _dcgm_errors(summary, "") if (e.error_id, e.message) not in seen]
    test.details = [
        f"Warning: {e.entity or 'all'}: {e.message} (DCGM error id {e.error_id})" for e in test.errors
    ] + test.details
    return test


def parse_dcgmi_diag_json(text: str) -> list[DcgmTest]:
    """Returns the tests of `dcgmi diag -r N -j` in display order. Raises DcgmRuntimeError with
    DCGM's message when the run could not start, ValueError when the output is not DCGM's JSON."""
    start = text.find("{")
    try:
        output = json.loads(text[start:]) if start >= 0 else None
    except json.JSONDecodeError as error:
        raise ValueError(f"`dcgmi diag -j` printed no JSON ({error}): {text.strip()[:300]!r}") from None
    if isinstance(output, dict) and output.get("iterations"):  # --iterations N: the last run's
        output = output["iterations"][-1]
    if not isinstance(output, dict) or not isinstance(output.get("DCGM Diagnostic"), dict):
        raise ValueError(f'`dcgmi diag -j` printed no "DCGM Diagnostic" object: {text.strip()[:300]!r}')
    diagnostic = output["DCGM Diagnostic"]
    if diagnostic.get("runtime_error"):
        raise DcgmRuntimeError(diagnostic["runtime_error"].strip())
    return [
        _dcgm_test(str(category.get("category", "")), entry)
        for category in diagnostic.get("test_categories") or []
        for entry in category.get("tests") or []
    ]


def dcgm_version(text: str) -> str | None:
    """The DCGM version `dcgmi diag -j` reports in its metadata."""
    try:
        output = json.loads(text[text.find("{") :])
    except (json.JSONDecodeError, ValueError):
        return None
    return ((output or {}).get("metadata") or {}).get("version")
