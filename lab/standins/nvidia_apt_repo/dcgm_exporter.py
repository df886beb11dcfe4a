"""STAND-IN for NVIDIA's DCGM exporter package (datacenter-gpu-manager-exporter) in the lab's
NVIDIA apt repository: no GPU, no NVML and no DCGM host engine exist in the lab.

What is mirrored, from NVIDIA/dcgm-exporter (github.com/NVIDIA/dcgm-exporter):
- the package name and its unit, packaging/config-files/systemd/nvidia-dcgm-exporter.service
  (installed at /lib/systemd/system/, ExecStart=/usr/bin/dcgm-exporter -f
  /etc/dcgm-exporter/default-counters.csv, after nvidia-dcgm.service; packaging/README.md);
- the counters file's format and the default field names, etc/default-counters.csv (commit
  00d6d344ea4a39112b211b9ff5af3d97e0bb51c2): "DCGM FIELD, Prometheus metric type, help message",
  '#' comments; the names listed below are the ones that file enables (the help texts here are
  our own words);
- the command line the role uses: -f FILE (counters), -a ADDRESS (listen, default ":9400");
- /metrics in the text format with one series per GPU and field, labelled as the README's
  sample shows: gpu, UUID, pci_bus_id, device, modelName, Hostname, DCGM_FI_DRIVER_VERSION.

- Xids, as harsh as the real ones (NVIDIA/dcgm-exporter at tag 4.5.3-4.8.2, the 4.8.2 release):
  DCGM_FI_DEV_XID_ERRORS is "Value of the last XID error encountered" (etc/default-counters.csv)
  and never goes back to 0 while the exporter runs, even when the fault is long gone (dcgm-exporter
  issue #500, NVIDIA/DCGM issue #277): the stand-in keeps each GPU's last Xid in its own memory,
  which only a restart of the program clears. DCGM_EXP_XID_ERRORS_COUNT, when the counters file
  enables it, is served as internal/pkg/collector/expcollector.go and xid_collector.go do: per GPU,
  one series per Xid code seen in the last -x/--xid-count-window-size ms (default 300000, env
  DCGM_EXPORTER_XID_COUNT_WINDOW_SIZE; pkg/cmd/app.go) with labels xid and window_size_in_ms and
  the count as value; with no Xid in the window one series valued 0 without an xid label. The
  help text and type are the counters file's row, as the real exporter takes them;
- rows of type "label" (DCGM_FI_DRIVER_VERSION) are labels, not series.
- profiling rows (DCGM_FI_PROF_*) only with DCGM's profiling module installed: at start the real
  exporter asks DCGM for its profiling metric groups (pkg/cmd/app.go queryDCPMetrics); without
  the module (libdcgmmoduleprofiling.so.4, in datacenter-gpu-manager-4-proprietary, not in -core)
  that fails, it logs "Not collecting DCP metrics: ..." and drops every field of the DCP range
  (internal/pkg/counters/counter_config.go fieldIsSupported), silently to Prometheus, with one
  "Skipping line <record index> ('<name>'): metric not enabled" warning per row. NVIDIA/
  dcgm-exporter PR #456 added -proprietary to its own images for this reason. The stand-in looks
  for the module's file once, at start, as the real one asks once.

What is not: the values. The GPUs are those the driver stand-in lists
(/proc/driver/nvidia/gpus/<address>/information, or the lab kernel stand-in's copy under
/run/pve-standin; on inventory/lab_replicas.py's gpu nodes, which no stand-in node made, the
copy lab.up plants under /run/dcgm-exporter-standin/proc-driver-nvidia), with nominal readings; a
lab test plants a fault by writing /run/dcgm-exporter-standin/<gpu index>.json
({"DCGM_FI_DEV_ROW_REMAP_FAILURE": 1}), which stands in for what DCGM would have read from the
driver, and an Xid by appending "<unix time> <code>" to /run/dcgm-exporter-standin/<gpu index>.xid
(what the driver's NVRM line would have told DCGM). With no GPU it exits 1, as the real exporter
does when NVML cannot initialize.
"""

from __future__ import annotations

# With epoch 1, as NVIDIA's DCGM packages have (NVIDIA/DCGM v4.5.3 CMakeLists.txt, CPACK_DEBIAN_PACKAGE_EPOCH 1):
# NVIDIA's own index for the exporter could not be read, and the epoch is the harsher assumption (a literal
# `=4.8.2-1` is then "not found"); the deploy resolves the version from the index either way.
EXPORTER_VERSION = "1:4.8.2-1"
DCGM_CORE = "datacenter-gpu-manager-4-core"

# etc/default-counters.csv (commit above): the enabled fields, their types, and nominal
# readings of an idle RTX PRO 6000 (our numbers).
COUNTERS = [
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock (MHz)", 2430),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock (MHz)", 13365),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (C)", 40),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (C)", 38),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (W)", 85.5),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Energy since boot (mJ)", 1000000),
    ("DCGM_FI_DEV_PCIE_TX_THROUGHPUT", "counter", "PCIe bytes sent (KB)", 0),
    ("DCGM_FI_DEV_PCIE_RX_THROUGHPUT", "counter", "PCIe bytes received (KB)", 0),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "PCIe retries", 0),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (%)", 0),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (%)", 0),
    ("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (%)", 0),
    ("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (%)", 0),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered", 0),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer free (MiB)", 97000),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer used (MiB)", 0),
    ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter", "NVLink bandwidth counters, all lanes", 0),
    ("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge", "vGPU license status", 0),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter", "Rows remapped for uncorrectable errors", 0),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter", "Rows remapped for correctable errors", 0),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Row remapping failed", 0),
]


XID_COUNT = "DCGM_EXP_XID_ERRORS_COUNT"  # internal/pkg/counters/const.go


def counters_csv() -> str:
    lines = [
        "# STAND-IN (inference-host lab): dcgm-exporter's counters file format and default fields.",
        "# DCGM FIELD, Prometheus metric type, help message",
    ]
    lines += [f"{name}, {kind}, {help_text}." for name, kind, help_text, _ in COUNTERS]
    # Off by default, as in upstream's file: a counters file of one's own enables it.
    lines += [f"# {XID_COUNT}, counter, reported XIDs during last window"]
    return "\n".join(lines) + "\n"


PROGRAM = '''#!/usr/bin/python3
"""STAND-IN dcgm-exporter (inference-host lab, lab/standins/nvidia_apt_repo/dcgm_exporter.py)."""
import argparse, glob, http.server, json, os, re, socket, sys, time

NOMINAL = %(nominal)r
FAULTS = os.environ.get("DCGM_STANDIN_FAULTS", "/run/dcgm-exporter-standin")
# Where the driver (stand-in) lists its GPUs; the unit tests point it elsewhere.
PROC_DIRS = os.environ.get("DCGM_STANDIN_PROC_DIRS", "/proc/driver/nvidia:/run/pve-standin/proc-driver-nvidia:"
                           "/run/dcgm-exporter-standin/proc-driver-nvidia").split(":")
DRIVER = "%(driver)s"

parser = argparse.ArgumentParser(prog="dcgm-exporter")
parser.add_argument("-f", "--collectors", default="/etc/dcgm-exporter/default-counters.csv")
parser.add_argument("-a", "--address", default=":9400")
# pkg/cmd/app.go (4.5.3-4.8.2): --xid-count-window-size, -x, ms, default 5 minutes.
parser.add_argument("-x", "--xid-count-window-size", type=int,
                    default=int(os.environ.get("DCGM_EXPORTER_XID_COUNT_WINDOW_SIZE", 300000)))
args, _ = parser.parse_known_args()
STARTED = time.time()
PROFILING_MODULE = os.environ.get("DCGM_STANDIN_PROFILING_MODULE", "%(profiling_module)s")
COLLECT_DCP = os.path.exists(PROFILING_MODULE)
if not COLLECT_DCP:
    print("Not collecting DCP metrics: Error getting supported metrics: This request is serviced by a module of"
          " DCGM that is not currently loaded (stand-in: no " + PROFILING_MODULE + ")", file=sys.stderr)
    # internal/pkg/counters/counter_config.go ExtractCounters: each DCP row then warned and
    # dropped, by its index among the file's records (comment and blank lines are none).
    records = [line.split(",")[0].strip() for line in open(args.collectors)]
    for index, name in enumerate(n for n in records if n and not n.startswith("#")):
        if name.startswith("DCGM_FI_PROF_"):
            print("Skipping line %%d ('%%s'): metric not enabled" %% (index, name), file=sys.stderr)
LAST_XID = {}  # gpu -> the last Xid code: DCGM keeps it until the exporter restarts (issue #500)


def counters():
    out = []
    for line in open(args.collectors):
        line = line.strip()
        if line and not line.startswith("#"):
            name, kind, help_text = [part.strip() for part in line.split(",", 2)]
            if kind != "label" and (COLLECT_DCP or not name.startswith("DCGM_FI_PROF_")):
                out.append((name, kind, help_text))
    return out


def gpus():
    found = []
    for folder in PROC_DIRS:
        for path in sorted(glob.glob(folder + "/gpus/*/information")):
            text = open(path).read()
            model = re.search(r"Model:\\s*(.+)", text)
            minor = re.search(r"Device Minor:\\s*(\\d+)", text)
            uuid = re.search(r"GPU UUID:\\s*(\\S+)", text)
            bus = path.split("/")[-2]
            found.append({"gpu": minor.group(1) if minor else str(len(found)), "bus": bus,
                          "model": model.group(1).strip() if model else "NVIDIA GPU",
                          "uuid": uuid.group(1) if uuid else "GPU-standin-" + bus})
        if found:
            break
    return found


def driver_version():
    for path in [folder + "/version" for folder in PROC_DIRS]:
        if os.path.exists(path):
            m = re.search(r"Kernel Module for \\S+\\s+(\\S+)", open(path).read())
            if m:
                return m.group(1)
    return DRIVER


def xid_events(gpu):
    """(time, code) of the Xids planted for this GPU since the program started."""
    path = os.path.join(FAULTS, gpu + ".xid")
    events = []
    if os.path.exists(path):
        for line in open(path):
            parts = line.split()
            if len(parts) == 2 and float(parts[0]) >= STARTED:
                events.append((float(parts[0]), int(parts[1])))
    if events:
        LAST_XID[gpu] = max(events)[1]  # kept after the file is gone, as DCGM keeps it
    return events


def xid_counts(gpu):
    """Code -> count of the window's Xids (expcollector.go: GetValuesSince(now - window))."""
    since, counts = time.time() - args.xid_count_window_size / 1000.0, {}
    for at, code in xid_events(gpu):
        if at >= since:
            counts[code] = counts.get(code, 0) + 1
    return counts


def metrics():
    lines, host, driver = [], socket.gethostname(), driver_version()
    devices = gpus()
    for name, kind, help_text in counters():
        lines += ["# HELP %%s %%s" %% (name, help_text), "# TYPE %%s %%s" %% (name, kind)]
        for d in devices:
            planted = {}
            fault = os.path.join(FAULTS, d["gpu"] + ".json")
            if os.path.exists(fault):
                planted = json.load(open(fault))
            value = planted.get(name, NOMINAL.get(name, 0))
            domain, _, rest = d["bus"].partition(":")
            bus = "%%08X:%%s" %% (int(domain, 16), rest.upper())  # NVML's busId form, 00000000:01:00.0
            labels = ('gpu="%%s",UUID="%%s",pci_bus_id="%%s",device="nvidia%%s",modelName="%%s",Hostname="%%s",'
                      'DCGM_FI_DRIVER_VERSION="%%s"' %% (d["gpu"], d["uuid"], bus, d["gpu"], d["model"], host, driver))
            if name == "DCGM_FI_DEV_XID_ERRORS":
                xid_events(d["gpu"])
                value = LAST_XID.get(d["gpu"], 0)
            if name == "%(xid_count)s":
                window = 'window_size_in_ms="%%d"' %% args.xid_count_window_size
                counts = xid_counts(d["gpu"])
                for code in sorted(counts):
                    lines.append('%%s{%%s,%%s,xid="%%d"} %%d' %% (name, labels, window, code, counts[code]))
                if not counts:
                    lines.append("%%s{%%s,%%s} 0" %% (name, labels, window))
                continue
            lines.append("%%s{%%s} %%s" %% (name, labels, value))
    return "\\n".join(lines) + "\\n"


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path.split("?")[0] != "/metrics":
            self.send_response(404); self.end_headers(); return
        body = metrics().encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


if not gpus():
    print("Failed to initialize NVML: no GPU found (stand-in dcgm-exporter)", file=sys.stderr)
    sys.exit(1)
host, _, port = args.address.rpartition(":")
http.server.ThreadingHTTPServer((host or "0.0.0.0", int(port)), Handler).serve_forever()
'''

# NVIDIA/dcgm-exporter packaging/config-files/systemd/nvidia-dcgm-exporter.service (tag 4.5.3-4.8.2, as installed).
UNIT = """[Unit]
Description=NVIDIA DCGM-exporter service
Wants=nvidia-dcgm.service
After=nvidia-dcgm.service

[Service]
User=root
PrivateTmp=false

StandardOutput=append:/var/log/dcgm-exporter.log
StandardError=append:/var/log/dcgm-exporter.log

ExecStart=/usr/bin/dcgm-exporter -f /etc/dcgm-exporter/default-counters.csv

Restart=on-abort

[Install]
WantedBy=multi-user.target
"""


def program(driver: str) -> str:
    nominal = {name: value for name, _, _, value in COUNTERS}
    from lab.standins.nvidia_apt_repo.dcgm import PROFILING_MODULE

    return PROGRAM % {
        "nominal": nominal,
        "driver": driver,
        "xid_count": XID_COUNT,
        "profiling_module": PROFILING_MODULE,
    }


def dcgm_exporter_packages(package_cls, driver: str) -> list:
    return [
        package_cls(
            "datacenter-gpu-manager-exporter",
            EXPORTER_VERSION,
            depends=[DCGM_CORE, "python3"],
            files={
                "/usr/bin/dcgm-exporter": (program(driver), 0o755),
                "/etc/dcgm-exporter/default-counters.csv": (counters_csv(), 0o644),
                "/lib/systemd/system/nvidia-dcgm-exporter.service": (UNIT, 0o644),
            },
            conffiles=["/etc/dcgm-exporter/default-counters.csv"],
        )
    ]
