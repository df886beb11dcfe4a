"""Pure parsers: the text of nvidia-smi, /proc/driver/nvidia, dmesg, ss, systemctl and SGLang
turned into typed values. No I/O here, no pyinfra (tests/infra runs where there is none):
the health checks (tests/infra) use these functions, and tests/unit holds each to real
captured output (tests/unit/data/gpu/).

The driver's evidence (kernel module version and flavor, userspace versions, NVML's
"Driver/library version mismatch", the modinfo license) is parsed in one place,
roles/shared/driver_state.py, which the driver role uses too; it is re-exported here so
that the checks read every parser from this one module.

Values a tool reports as missing ("[N/A]", "[Not Supported]") become None, never 0: a check
must be able to tell "no evidence" from "evidence of zero".
"""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass, field

from roles.shared.driver_state import (  # noqa: F401  (re-exported for tests/infra)
    KernelModule,
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
    "index", "pci.bus_id", "name", "uuid", "compute_cap", "memory.total", "driver_version",
    "persistence_mode", "pstate", "pcie.link.gen.current", "pcie.link.gen.max",
    "pcie.link.gen.gpumax", "pcie.link.width.current", "pcie.link.width.max",
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
            raise ValueError(f"nvidia-smi CSV row has {len(cells)} columns, expected "
                             f"{len(fields)} ({', '.join(fields)}): {line!r}")
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
        gpus.append(GpuInfo(
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
        ))
    return gpus


@dataclass(frozen=True)
class RemappedRows:
    bus_id: str
    correctable: int | None
    uncorrectable: int | None
    pending: bool | None
    failure: bool | None


REMAPPED_FIELDS = ("gpu_bus_id", "remapped_rows.correctable", "remapped_rows.uncorrectable",
                   "remapped_rows.pending", "remapped_rows.failure")


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


RETIRED_FIELDS = ("index", "retired_pages.pending", "retired_pages.single_bit_ecc.count",
                  "retired_pages.double_bit.count")


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
            events.append(XidEvent(
                bus=normalize_bus_id(match.group("bus")),
                code=int(match.group("code")),
                message=match.group("message").strip(),
                line=line.strip(),
            ))
    return events


# ----------------------------------------------------------------------------------------------
# /proc/driver/nvidia/gpus/<bdf>/information


def parse_proc_gpu_information(text: str) -> dict[str, dict[str, str]]:
    """Returns {bus location: {field: value}} from the concatenated `information` files
    (each introduced by `== /proc/driver/nvidia/gpus/<bdf>` or read one at a time)."""
    gpus: dict[str, dict[str, str]] = {}
    current: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("== "):
            current = {}
            gpus[line.rsplit("/", 1)[-1].strip()] = current
            continue
        key, sep, value = line.partition(":")
        if not sep:
            continue
        current[key.strip()] = value.strip()
        if key.strip() == "Bus Location" and current not in gpus.values():
            gpus[value.strip()] = current
    return {bus: info for bus, info in gpus.items() if info}


# ----------------------------------------------------------------------------------------------
# nvidia-smi topo -m


@dataclass(frozen=True)
class Topology:
    gpus: list[str]
    links: dict[tuple[str, str], str]           # (GPU0, GPU1) -> NV18 / SYS / PIX / ...
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
    for line in lines[header_index + 1:]:
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
        rest = cells[1 + len(columns):]
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
            found = json.loads(line[len(marker):])
    if found is None:
        raise ValueError(f"no line starting with {marker!r} in the program's output")
    return found


# ----------------------------------------------------------------------------------------------
# Service: systemctl show, ss


def parse_systemctl_show(text: str) -> dict[str, str]:
    """Returns `systemctl show UNIT -p A -p B` as {"A": ..., "B": ...}."""
    values = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip()
    return values


@dataclass(frozen=True)
class ListeningSocket:
    address: str
    port: int
    process: str | None = None


def parse_ss_listening(text: str) -> list[ListeningSocket]:
    """Returns the TCP listening sockets of `ss -Hltnp` (or `ss -ltnp` with its header)."""
    sockets = []
    for line in text.splitlines():
        cells = line.split()
        if len(cells) < 4 or cells[0] == "State":
            continue
        # State Recv-Q Send-Q Local Peer [Process]; `-H` drops the header only.
        local = cells[3]
        address, _, port = local.rpartition(":")
        if not port.isdigit():
            continue
        address = address.strip("[]")
        address = address.split("%", 1)[0]  # 127.0.0.1%lo
        process = " ".join(cells[5:]) or None
        sockets.append(ListeningSocket(address=address, port=int(port), process=process))
    return sockets


# ----------------------------------------------------------------------------------------------
# Server: OpenAI-compatible responses and Prometheus text


def model_ids(models_json: dict) -> list[str]:
    """Returns the ids listed by /v1/models ({"object": "list", "data": [{"id": ...}]})."""
    return [entry.get("id", "") for entry in models_json.get("data", [])]


def completion_text(chat_json: dict) -> str:
    """Returns the assistant text of a /v1/chat/completions response."""
    choices = chat_json.get("choices") or []
    if not choices:
        raise ValueError("the completion has no choices")
    message = choices[0].get("message") or {}
    return message.get("content") or ""


def degenerate_reason(text: str, max_run: int = 8, min_distinct_ratio: float = 0.2) -> str | None:
    """Returns why generated text looks degenerate (a token repeated in a long run, or very few
    distinct tokens), or None when it looks like language. Tokens are whitespace words, and
    characters for text without spaces, so "!!!!!!!!" is caught too."""
    stripped = text.strip()
    if not stripped:
        return "the text is empty"
    tokens = stripped.split()
    if len(tokens) < 3:
        tokens = list(stripped)
    run, longest, longest_token = 1, 1, tokens[0]
    for previous, token in itertools.pairwise(tokens):
        run = run + 1 if token == previous else 1
        if run > longest:
            longest, longest_token = run, token
    if longest >= max_run:
        return f"{longest_token!r} repeated {longest} times in a row"
    if len(tokens) >= 20 and len(set(tokens)) / len(tokens) < min_distinct_ratio:
        return f"only {len(set(tokens))} distinct tokens out of {len(tokens)}"
    return None


PROMETHEUS_LINE_RE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?P<labels>\{[^}]*\})?\s+(?P<value>\S+)")


def parse_prometheus(text: str) -> dict[str, float]:
    """Returns {metric name with labels: value} of the Prometheus text format (comments skipped)."""
    metrics = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        match = PROMETHEUS_LINE_RE.match(line)
        if match:
            try:
                metrics[match.group("name") + (match.group("labels") or "")] = float(match.group("value"))
            except ValueError:
                continue
    return metrics


# ----------------------------------------------------------------------------------------------
# Benchmark: sglang.bench_serving --output-file (one JSON object per run)


@dataclass(frozen=True)
class BenchResult:
    max_concurrency: int | None
    completed: int | None
    output_throughput: float | None     # output tok/s
    request_throughput: float | None
    mean_ttft_ms: float | None
    median_ttft_ms: float | None
    mean_itl_ms: float | None
    median_itl_ms: float | None
    mean_tpot_ms: float | None
    accept_length: float | None
    extra: dict = field(default_factory=dict, compare=False)


def _float(value) -> float | None:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


def parse_bench_serving_jsonl(text: str) -> list[BenchResult]:
    """Returns one BenchResult per line of bench_serving's --output-file (it appends a line per run)."""
    results = []
    for line in text.splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        results.append(BenchResult(
            max_concurrency=_int(str(row["max_concurrency"])) if row.get("max_concurrency") is not None else None,
            completed=row.get("completed"),
            output_throughput=_float(row.get("output_throughput")),
            request_throughput=_float(row.get("request_throughput")),
            mean_ttft_ms=_float(row.get("mean_ttft_ms")),
            median_ttft_ms=_float(row.get("median_ttft_ms")),
            mean_itl_ms=_float(row.get("mean_itl_ms")),
            median_itl_ms=_float(row.get("median_itl_ms")),
            mean_tpot_ms=_float(row.get("mean_tpot_ms")),
            accept_length=_float(row.get("accept_length")),
            extra={k: row[k] for k in ("backend", "dataset_name", "random_input_len",
                                       "random_output_len", "duration") if k in row},
        ))
    return results
