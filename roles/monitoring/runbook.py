"""What each alert says to the person it pages: its summary and its description (what is wrong,
what to do), by alert name. The rules themselves (expressions, durations, severities) are
roles/monitoring/config.py's alerts(); this table is the prose they carry.

Both texts are Prometheus alert templates (Go's text/template: `{{ $labels.host }}`,
`{{ $value }}`), rendered by Prometheus when the alert fires. `${name}` is ours: a value of the
site model that alerts() fills in before the rule is written (the engine's name, the thresholds
per host), through text(); a name it does not pass is an error, not a blank.
"""

from __future__ import annotations

import re

# The check's failure detail, read back from the checks' own failure_info series by the alert.
DETAIL = (
    '{{ with printf "inference_host_check_failure_info{host=%q,suite=%q,check=%q,gpu=%q}" '
    '$labels.host $labels.suite $labels.check $labels.gpu | query }}{{ . | first | label "detail" }}'
    "{{ else }}see the check's detail in the timer's journal{{ end }}"
)

RUNBOOK: dict[str, tuple[str, str]] = {
    "Watchdog": (
        "The alerting pipeline of ${monitor} is alive (this alert always fires)",
        "Prometheus and Alertmanager on ${monitor} send this every monitoring_heartbeat_interval to the"
        " heartbeat URL (monitoring_heartbeat_url_secret) and to no person. The outside service pages when it"
        " stops: then ${monitor}, its node or its network is down, or Prometheus or Alertmanager there is."
        " What to do on that page: reach ${monitor} (ping, ssh); `systemctl status prometheus"
        " prometheus-alertmanager` there; on the node, `pct status` / `qm status` of the guest.",
    ),
    "InferenceHostDown": (
        "{{ $labels.host }} does not answer (node_exporter down or host unreachable)",
        "Prometheus cannot scrape node_exporter on {{ $labels.host }} ({{ $labels.instance }}). What to do: "
        "check that the host is up (ping, ssh); then `systemctl status prometheus-node-exporter` there.",
    ),
    "EngineDown": (
        "The ${engine} server on {{ $labels.host }} does not answer /metrics",
        "${engine}'s /metrics on {{ $labels.instance }} fails. What to do: on {{ $labels.host }}, "
        "`systemctl status` and `journalctl -u` of the serving unit (serving_unit_name); a deploy "
        "restarts and health-gates it.",
    ),
    "GatewayDown": (
        "The smg gateway on {{ $labels.host }} does not answer /metrics",
        "smg's Prometheus endpoint {{ $labels.instance }} fails. What to do: `systemctl status smg` and "
        "`journalctl -u smg` on {{ $labels.host }}.",
    ),
    "ChecksNotRunning": (
        "The health checks' timer on {{ $labels.host }} has not reported for three intervals",
        "inference-host-checks.timer writes the checks' results every monitoring_check_interval. What to do: "
        "`systemctl list-timers inference-host-checks.timer` and `journalctl -u inference-host-checks` "
        "on {{ $labels.host }} (a run over monitoring_check_timeout_s is killed).",
    ),
    "HealthCheckFailing": (
        "Health check '{{ $labels.check }}' ({{ $labels.suite }}{{ if $labels.gpu }}, GPU{{ $labels.gpu }}"
        "{{ end }}) fails on {{ $labels.host }}",
        DETAIL,
    ),
    "GpuXidError": (
        "GPU{{ $labels.gpu }} on {{ $labels.host }} reported Xid {{ $labels.xid }}",
        "DCGM counted {{ $value }} Xid {{ $labels.xid }} on GPU{{ $labels.gpu }} ({{ $labels.pci_bus_id }}) in its "
        "last {{ $labels.window_size_in_ms }} ms; the alert resolves once that window has passed without one. "
        "What to do: ${xid_advice} `dmesg | grep NVRM` on {{ $labels.host }} shows the driver's own line; "
        "NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html) has the code's "
        "immediate and investigatory action.",
    ),
    "GpuUncorrectableEcc": (
        "GPU{{ $labels.gpu }} on {{ $labels.host }} has uncorrectable memory errors",
        "Uncorrectable ECC errors or a failed row remap ({{ $value }}). What to do: drain the GPU, reset it "
        "(`nvidia-smi -r`) or reboot, then check row remapping (`nvidia-smi -q -d ROW_REMAPPER`); a growing "
        "aggregate count means the GPU needs an RMA.",
    ),
    "GpuThrottling": (
        "GPU{{ $labels.gpu }} on {{ $labels.host }} is slowed down (HW slowdown, thermal or power brake)",
        "{{ $value }} of the bad clock-event reasons are active. What to do: `nvidia-smi -q -d PERFORMANCE` "
        "names them; check cooling, fans, inlet temperature and the power supply.",
    ),
    "GpuTemperatureMargin": (
        "GPU{{ $labels.gpu }} on {{ $labels.host }} is {{ $value }} C from its slowdown temperature",
        "Less than health_min_temp_margin_c (${thresholds}) below "
        "the GPU's slowdown temperature. What to do: check airflow, fans and inlet temperature; a GPU near "
        "its limit slows down under load.",
    ),
    "GpuMissing": (
        "{{ $labels.host }} sees only {{ $value }} GPUs",
        "Fewer GPUs are visible (nvidia-smi / DCGM) than gpu_count (${thresholds})."
        " What to do: `nvidia-smi -L` and `dmesg | grep -i -e NVRM -e 'fallen off the bus'` on the host; a GPU"
        " that fell off the bus needs a reboot of the node (and its guest), then a deploy.",
    ),
    "EngineRestartLooping": (
        "The serving unit on {{ $labels.host }} restarted {{ $value }} times in ${window}",
        "More restarts in ${window} than health_max_unit_restarts "
        "(${thresholds}): the server crashes and systemd restarts"
        " it. What to do: `journalctl -u <serving unit> -b` on the host shows why (out of memory, a kernel"
        " missing for the GPU arch, a NCCL hang).",
    ),
    "SpeculativeAcceptLengthLow": (
        "Speculative decoding on {{ $labels.host }} accepts {{ $value }} tokens per step",
        "The drafter's accept length is under health_min_accept_length "
        "(${thresholds}): the drafter costs more than it saves."
        " What to do: compare serving_speculative's drafter with the served model (a drafter trained for"
        " another revision), or turn speculative decoding off until a matching drafter is deployed.",
    ),
    # The two latency alerts share one text: ${words} names the latency, ${key} its setting.
    "TimeToFirstTokenHigh": (
        "p95 ${words} on {{ $labels.host }} is {{ $value | humanizeDuration }}",
        "Over ${limit} s (${key}) for 10 minutes. What to do: look at the load (running and queued requests "
        "in ${engine}'s /metrics); run `python -m checks.bench` against the host and compare with "
        "reports/bench-history.jsonl; a recent deploy or stack change is the first suspect.",
    ),
    "WeightsManifestMismatch": (
        "The served weights on {{ $labels.host }} do not match the pinned revision",
        "The weights directory's verified manifest is missing or names another commit, or a file's size "
        "changed. What to do: deploy again (roles/weights fetches and verifies the pinned commit).",
    ),
    "DiskFilling": (
        '{{ $labels.mountpoint }} on {{ $labels.host }} has {{ $value | printf "%.0f" }}% free',
        "Under monitoring_min_free_disk_percent free on the disk of ${where}"
        ". What to do: free space there (old engine environments are pruned by the deploy:"
        " engine_keep_environments; Prometheus: lower monitoring_retention_time or monitoring_retention_size_gib)"
        " or grow the disk.",
    ),
}
RUNBOOK["InterTokenLatencyHigh"] = RUNBOOK["TimeToFirstTokenHigh"]

FIELD = re.compile(r"\$\{(\w+)\}")


def text(name: str, **fields: object) -> tuple[str, str]:
    """(summary, description) of the alert `name`, with our ${fields} filled in."""

    def fill(template: str) -> str:
        missing = sorted(set(FIELD.findall(template)) - set(fields))
        if missing:
            raise KeyError(f"runbook text of {name} needs {', '.join(missing)}")
        return FIELD.sub(lambda match: str(fields[match.group(1)]), template)

    summary, description = RUNBOOK[name]
    return fill(summary), fill(description)
