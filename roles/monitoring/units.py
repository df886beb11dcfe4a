"""The checks' timer on a gpu node and the packaged services' arguments: paths and template
arguments from the site model, shared by the role and the preview (roles/render.py)."""

from __future__ import annotations

import json

from roles.monitoring import checks_env, config
from roles.shared.layout import ETC_DIR, OPT_DIR
from roles.site import HostSettings, Site

CHECKS_ROOT = f"{OPT_DIR}/checks"
CHECKS_ETC = f"{ETC_DIR}/checks"
EXPECT_FILE = f"{CHECKS_ETC}/expect.json"
CHECKS_UNIT = "inference-host-checks"
CHECK_SUITES = "gpu,service,server"
OUT_FILE = f"{config.TEXTFILE_DIR}/inference_host_checks.prom"
SYSTEMD_DIR = "/etc/systemd/system"
DCGM_EXPORTER_UNIT = "nvidia-dcgm-exporter"  # NVIDIA/dcgm-exporter packaging/config-files/systemd
# Our counters file beside the package's (its own is a conffile we leave alone): upstream's defaults
# plus the windowed Xid count the GpuXidError alert reads (templates/inference-host-counters.csv.j2).
DCGM_COUNTERS = "/etc/dcgm-exporter/inference-host-counters.csv"
DCGM_COUNTERS_TEMPLATE = "roles/monitoring/templates/inference-host-counters.csv.j2"


def bundle_dir(digest: str) -> str:
    return f"{CHECKS_ROOT}/bundle-{digest}"


def env_dir(requirements_text: str) -> str:
    import hashlib

    return f"{CHECKS_ROOT}/env-{hashlib.sha256(requirements_text.encode()).hexdigest()[:12]}"


def expect_text(host: HostSettings, site: Site) -> str:
    """No secret: the API key stays in roles/serving's 0600 file, which the checks read there."""
    return json.dumps(checks_env.expectations(host, site), indent=2, sort_keys=True) + "\n"


def checks_unit_kwargs(host: HostSettings, bundle: str, python: str) -> dict:
    m = host.monitoring
    return dict(suites=CHECK_SUITES, serving_unit=host.serving.unit_name, bundle_dir=bundle, python=python,
                expect_file=EXPECT_FILE, out_file=OUT_FILE, cpu_quota_percent=m.check_cpu_quota_percent,
                timeout_s=m.check_timeout_s)


def listen(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def gpu_templates(host: HostSettings, bundle: str, python: str) -> list[tuple[str, str, dict]]:
    """(path, template, kwargs) on a gpu node: the timer and its service."""
    return [
        (f"{SYSTEMD_DIR}/{CHECKS_UNIT}.service", "roles/monitoring/templates/inference-host-checks.service.j2",
         checks_unit_kwargs(host, bundle, python)),
        (f"{SYSTEMD_DIR}/{CHECKS_UNIT}.timer", "roles/monitoring/templates/inference-host-checks.timer.j2",
         dict(interval_s=host.monitoring.check_interval_seconds)),
    ]


def node_exporter_template(host: HostSettings) -> tuple[str, str, dict]:
    m = host.monitoring
    return ("/etc/default/prometheus-node-exporter", "roles/monitoring/templates/prometheus-node-exporter.default.j2",
            dict(listen=listen(m.exporter_address, m.node_exporter_port), textfile_dir=config.TEXTFILE_DIR))


def dcgm_dropin(host: HostSettings) -> tuple[str, str]:
    """The packaged unit's ExecStart with our counters file, the settings' address (dcgm-exporter -a,
    default :9400) and the Xid window (-x, --xid-count-window-size in ms, default 300000;
    NVIDIA/dcgm-exporter pkg/cmd/app.go at 4.5.3-4.8.2)."""
    m = host.monitoring
    text = ("# Written by inference-host (roles/monitoring): the exporter's address and Xid window from the inventory.\n"
            "[Service]\nExecStart=\n"
            f"ExecStart=/usr/bin/dcgm-exporter -f {DCGM_COUNTERS} -a {listen(m.exporter_address, m.dcgm_exporter_port)}"
            f" -x {m.xid_window_s * 1000}\n")
    return f"{SYSTEMD_DIR}/{DCGM_EXPORTER_UNIT}.service.d/90-inference-host.conf", text


def monitor_templates(host: HostSettings) -> list[tuple[str, str, dict]]:
    m = host.monitoring
    return [
        ("/etc/default/prometheus", "roles/monitoring/templates/prometheus.default.j2",
         dict(config_file=f"{config.PROMETHEUS_CONFIG_DIR}/prometheus.yml", listen=listen(m.listen_address, m.prometheus_port),
              web_config=config.WEB_CONFIG_FILE, data_dir=m.data_dir, retention_time=m.retention_time,
              retention_size_gib=m.retention_size_gib)),
        ("/etc/default/prometheus-alertmanager", "roles/monitoring/templates/prometheus-alertmanager.default.j2",
         dict(config_file=f"{config.PROMETHEUS_CONFIG_DIR}/alertmanager.yml",
              listen=listen(m.listen_address, m.alertmanager_port), web_config=config.WEB_CONFIG_FILE,
              data_dir=config.ALERTMANAGER_DATA_DIR)),
    ]
