"""Whether the DCGM exporter serves its profiling rows (`DCGM_FI_PROF_*`), and if not, why.

The deploy's counters file enables five profiling rows (roles/monitoring); the exporter drops them
all, silently to Prometheus, when its start-up query of DCGM's profiling metric groups fails
(NVIDIA/dcgm-exporter 4.5.3-4.8.2 `pkg/cmd/app.go` `queryDCPMetrics`: it logs "Not collecting DCP
metrics"). The causes this line tells apart (sources in docs/upstream.md, "NVIDIA driver: PIDs in a
PID namespace, profiling counters", and docs/monitoring.md):

- the driver refuses the counters: `RestrictProfilingToAdminUsers` (default 1 in
  open-gpu-kernel-modules 580.95.05 `nv-reg.h`) lets only CAP_SYS_ADMIN (or CAP_PERFMON) in the
  initial user namespace use them, and root in an unprivileged LXC guest has neither. The option is
  the node's (the guest shares its module): the operator sets it there;
- DCGM's profiling module is not installed (libdcgmmoduleprofiling.so.4, package
  datacenter-gpu-manager-4-proprietary): DCGM needs it for GPUs without GPM; for GPUs with GPM
  (compute capability 9.0 and later) its core answers the metric groups itself
  (NVIDIA/DCGM v4.5.3 `modules/core/DcgmModuleCore.cpp` `ProcessProfGetMetricGroups`);
- otherwise the exporter's own log line is the reason given.

Not applicable where the site deploys no DCGM exporter on the host.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ROW = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"  # the graphics/compute engine's activity: every profiling GPU has it
PROFILING_MODULE = "/usr/lib/x86_64-linux-gnu/libdcgmmoduleprofiling.so.4"
DCP_LOG = "Not collecting DCP metrics"
NODE_FIX = (
    "on the Proxmox node: `echo 'options nvidia NVreg_RestrictProfilingToAdminUsers=0' > "
    "/etc/modprobe.d/nvidia-profiling.conf`, then `update-initramfs -u` and a reboot of the node (or a "
    "reload of the nvidia module with every GPU user stopped); docs/monitoring.md, 'Profiling rows in an LXC guest'"
)


@dataclass(frozen=True)
class Facts:
    """What the host says about the row's prerequisites (None: could not be read)."""

    metrics: str | None  # the exporter's /metrics text
    container: str  # systemd-detect-virt --container
    unprivileged: bool | None  # this host's root is not the initial user namespace's (uid_map)
    restricted: int | None  # /proc/driver/nvidia/params RmProfilingAdminOnly (NVreg_RestrictProfilingToAdminUsers)
    module_installed: bool | None
    gpm: bool | None  # the GPUs have GPM (compute capability 9.0 or later)
    exporter_said: str | None  # the exporter's "Not collecting DCP metrics" line, if it logged one


@dataclass(frozen=True)
class Verdict:
    verdict: str  # PASS, FAIL, UNREACHED
    observed: str


def series(metrics: str, row: str = ROW) -> list[str]:
    """The row's sample lines in an exposition text (comments are no series)."""
    return [line for line in metrics.splitlines() if re.match(rf"{re.escape(row)}(\{{|\s)", line)]


def restricted_value(params: str) -> int | None:
    """/proc/driver/nvidia/params names the option by its registry key: "RmProfilingAdminOnly: 1"
    (open-gpu-kernel-modules 580.95.05 nv-procfs.c prints each entry's `name`, which nv-reg.h's
    NV_DEFINE_PARAMS_TABLE_ENTRY_CUSTOM_NAME sets to the key, not the module parameter's name)."""
    found = re.search(r"^(?:RmProfilingAdminOnly|RestrictProfilingToAdminUsers):\s*(\d+)", params, re.M)
    return int(found[1]) if found else None


def unprivileged_from_uid_map(uid_map: str) -> bool | None:
    """/proc/self/uid_map: "0 0 4294967295" in the initial user namespace; an unprivileged LXC
    guest maps its root elsewhere ("0 100000 65536")."""
    rows = [line.split() for line in uid_map.splitlines() if line.strip()]
    if not rows or any(len(row) != 3 for row in rows):
        return None
    return rows != [["0", "0", "4294967295"]]


def judge(facts: Facts, row: str = ROW) -> Verdict:
    if facts.metrics is None:
        return Verdict("UNREACHED", "the exporter's /metrics could not be read")
    found = series(facts.metrics, row)
    if found:
        return Verdict("PASS", f"present: {len(found)} series, e.g. {found[0][:160]}")
    reasons = []
    if facts.container in ("lxc", "lxc-libvirt") and facts.unprivileged and facts.restricted == 1:
        reasons.append(
            "admin restriction: the node's driver restricts profiling (RmProfilingAdminOnly: 1, module option "
            "NVreg_RestrictProfilingToAdminUsers; performance counters only "
            "for CAP_SYS_ADMIN or CAP_PERFMON in the initial user namespace), which root in this unprivileged "
            f"LXC guest lacks; what to do: {NODE_FIX}"
        )
    if facts.module_installed is False and facts.gpm is not True:
        reasons.append(
            f"profiling module not installed ({PROFILING_MODULE}, datacenter-gpu-manager-4-proprietary; DCGM "
            "needs it for GPUs without GPM); what to do: run the deploy, which installs it"
        )
    if not reasons:
        reasons.append(
            "cause not identified here (module "
            + {True: "installed", False: "absent", None: "unknown"}[facts.module_installed]
            + ", GPM "
            + {True: "yes", False: "no", None: "unknown"}[facts.gpm]
            + ", RmProfilingAdminOnly "
            + ("unknown" if facts.restricted is None else str(facts.restricted))
            + "); `journalctl -u nvidia-dcgm-exporter -b` and `dcgmi profile --list` on the host"
        )
    said = f"; the exporter logged: {facts.exporter_said[:200]}" if facts.exporter_said else ""
    return Verdict("FAIL", f"absent: {row} not in the exporter's /metrics; " + "; ".join(reasons) + said)
