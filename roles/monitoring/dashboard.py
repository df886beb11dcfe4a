"""A Grafana dashboard for the operators who run Grafana: engine throughput, time to first token
and inter-token latency, running and queued requests, GPU power, temperature and memory, and the
health checks, from the same metric names as the alert rules (roles/monitoring/config.py).

Written on each monitor next to Prometheus' files (/etc/prometheus/inference-host.grafana.json)
and by the preview; import it in Grafana (Dashboards > New > Import) and pick the Prometheus data
source. Grafana itself is not installed: the alerts are what the site relies on.

The file is in the form Grafana's "Export for sharing externally" writes (grafana/grafana,
public/app/features/dashboard/components/DashExportModal/DashboardExporter.ts, makeExportable):
`__inputs` holds one data source input (type "datasource", pluginId "prometheus"), every panel,
target and query variable names it as {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}, and
`__requires` lists Grafana, the panel type and the data source. Import shows one data source
picker per `__inputs` entry of type "datasource", listing that plugin's data sources
(public/app/features/manage-dashboards/state/actions.ts, processInputs), and the server puts the
chosen one wherever "${DS_PROMETHEUS}" stands, refusing an import that lacks an input
(pkg/services/dashboardimport/utils/dash_template_evaluator.go). A data source chosen through a
dashboard variable is no input (the exporter leaves such uses alone): the dashboard has no data
source variable.

Metric names, by source (tests/unit/test_monitoring_dashboard.py checks each one against it):
- SGLang 0.5.9 python/sglang/srt/metrics/collector.py (gauges, counters exported with _total,
  histograms with _bucket); vLLM 0.16.0 vllm/v1/metrics/loggers.py;
- NVIDIA dcgm-exporter etc/default-counters.csv: DCGM_FI_DEV_POWER_USAGE, DCGM_FI_DEV_GPU_TEMP,
  DCGM_FI_DEV_FB_USED, DCGM_FI_DEV_FB_FREE;
- the checks' timer (checks/textfile.py): inference_host_check_ok, inference_host_checks_*.
"""

from __future__ import annotations

import json

# Beside Prometheus' own files (roles/monitoring/config.py's PROMETHEUS_CONFIG_DIR, which imports
# this module; a unit test holds the two together).
DASHBOARD_FILE = "/etc/prometheus/inference-host.grafana.json"

# Per engine: (what, metric) of the engine's own /metrics.
ENGINE_METRICS = {
    "sglang": {
        "generated": "sglang:generation_tokens_total",
        "prompt": "sglang:prompt_tokens_total",
        "ttft": "sglang:time_to_first_token_seconds_bucket",
        "itl": "sglang:inter_token_latency_seconds_bucket",
        "running": "sglang:num_running_reqs",
        "queued": "sglang:num_queue_reqs",
    },
    "vllm": {
        "generated": "vllm:generation_tokens_total",
        "prompt": "vllm:prompt_tokens_total",
        "ttft": "vllm:time_to_first_token_seconds_bucket",
        "itl": "vllm:inter_token_latency_seconds_bucket",
        "running": "vllm:num_requests_running",
        "queued": "vllm:num_requests_waiting",
    },
}


# The one input Grafana's Import asks for, named as the exporter names a data source called
# "Prometheus" ('DS_' + its name upper-cased).
DATASOURCE_INPUT = "DS_PROMETHEUS"
DATASOURCE = {"type": "prometheus", "uid": "${" + DATASOURCE_INPUT + "}"}
INPUTS = [
    {
        "name": DATASOURCE_INPUT,
        "label": "Prometheus",
        "description": "The Prometheus of the monitors group",
        "type": "datasource",
        "pluginId": "prometheus",
        "pluginName": "Prometheus",
    }
]
# What the file uses, as the exporter lists it (sorted by id). The Grafana version is the one the
# file is written for (schemaVersion 39, the timeseries panel); it was not imported into a running
# Grafana here (none is installed).
REQUIRES = [
    {"type": "grafana", "id": "grafana", "name": "Grafana", "version": "10.4.0"},
    {"type": "datasource", "id": "prometheus", "name": "Prometheus", "version": "1.0.0"},
    {"type": "panel", "id": "timeseries", "name": "Time series", "version": ""},
]


def _panel(number: int, title: str, unit: str, targets: list[tuple[str, str]]) -> dict:
    """A time series panel, two per row of the 24-column grid."""
    return {
        "id": number,
        "type": "timeseries",
        "title": title,
        "datasource": dict(DATASOURCE),
        "gridPos": {"h": 8, "w": 12, "x": 12 * (number % 2), "y": 8 * (number // 2)},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "targets": [
            {"refId": chr(ord("A") + i), "datasource": dict(DATASOURCE), "expr": expr, "legendFormat": legend}
            for i, (expr, legend) in enumerate(targets)
        ],
    }


def _quantile(q: float, bucket: str) -> str:
    return f'histogram_quantile({q}, sum by (host, le) (rate({bucket}{{host=~"$host"}}[5m])))'


def panels(engine: str) -> list[dict]:
    e = ENGINE_METRICS[engine]
    host = '{host=~"$host"}'
    specs = [
        (
            "Engine throughput (tokens/s)",
            "short",
            [
                (f"sum by (host) (rate({e['generated']}{host}[5m]))", "{{host}} generated"),
                (f"sum by (host) (rate({e['prompt']}{host}[5m]))", "{{host}} prompt"),
            ],
        ),
        (
            "Requests running and queued",
            "short",
            [
                (f"sum by (host) ({e['running']}{host})", "{{host}} running"),
                (f"sum by (host) ({e['queued']}{host})", "{{host}} queued"),
            ],
        ),
        (
            "Time to first token",
            "s",
            [(_quantile(0.5, e["ttft"]), "{{host}} p50"), (_quantile(0.95, e["ttft"]), "{{host}} p95")],
        ),
        (
            "Inter-token latency",
            "s",
            [(_quantile(0.5, e["itl"]), "{{host}} p50"), (_quantile(0.95, e["itl"]), "{{host}} p95")],
        ),
        ("GPU power", "watt", [(f"DCGM_FI_DEV_POWER_USAGE{host}", "{{host}} GPU{{gpu}}")]),
        ("GPU temperature", "celsius", [(f"DCGM_FI_DEV_GPU_TEMP{host}", "{{host}} GPU{{gpu}}")]),
        (
            "GPU memory used",
            "percent",
            [
                (
                    f"100 * DCGM_FI_DEV_FB_USED{host} / (DCGM_FI_DEV_FB_USED{host} + DCGM_FI_DEV_FB_FREE{host})",
                    "{{host}} GPU{{gpu}}",
                )
            ],
        ),
        (
            "Health checks failing",
            "short",
            [
                (f"count by (host) (inference_host_check_ok{host} == 0)", "{{host}} failing"),
                (f"inference_host_checks_run_seconds{host}", "{{host}} run (s)"),
                (f"time() - inference_host_checks_last_run_timestamp_seconds{host}", "{{host}} since last run (s)"),
            ],
        ),
    ]
    return [_panel(number, title, unit, targets) for number, (title, unit, targets) in enumerate(specs)]


def dashboard(engine: str) -> dict:
    return {
        "__inputs": INPUTS,
        "__requires": REQUIRES,
        "title": "inference-host",
        "uid": "inference-host",
        "schemaVersion": 39,
        "editable": True,
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "30s",
        "tags": ["inference-host"],
        "templating": {
            "list": [
                {
                    "name": "host",
                    "type": "query",
                    "label": "Host",
                    "includeAll": True,
                    "allValue": ".*",
                    "multi": True,
                    "datasource": dict(DATASOURCE),
                    "query": 'label_values(up{job="node"}, host)',
                    "refresh": 2,
                    "current": {"text": "All", "value": "$__all"},
                },
            ]
        },
        "panels": panels(engine),
    }


def dashboard_text(engine: str) -> str:
    """The dashboard of a site whose gpu nodes serve with `engine` (sglang or vllm)."""
    return json.dumps(dashboard(engine), indent=2) + "\n"
