"""The checks' timer on a gpu node and the packaged services' arguments: paths and template
arguments from the site model, shared by the role and its tests."""

from __future__ import annotations

import json

from roles.monitoring import checks_env, config
from roles.shared import systemd_syntax as sd
from roles.shared.layout import CHECKS_TEXTFILE, CHECKS_USER, ETC_DIR, OPT_DIR, TEXTFILE_DIR
from roles.site import HostSettings, Site, exporter_bind

CHECKS_ROOT = f"{OPT_DIR}/checks"
CHECKS_ETC = f"{ETC_DIR}/checks"
EXPECT_FILE = f"{CHECKS_ETC}/expect.json"
# The client key the periodic checks send, their own copy (0600 theirs; roles/monitoring/checks_timer.py).
CHECKS_KEY_FILE = f"{CHECKS_ETC}/api-key.json"
CHECKS_UNIT = "inference-host-checks"
CHECK_SUITES = "gpu,service,server"
OUT_FILE = CHECKS_TEXTFILE
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
    """No secret: the client key is in the checks' own 0600 file, named here (api_key_file)."""
    expected = checks_env.expectations(host, site)
    if host.serving.api_key_secret:
        expected["api_key_file"] = CHECKS_KEY_FILE  # an --expect key of its own (checks/expectations.py)
    return json.dumps(expected, indent=2, sort_keys=True) + "\n"


def checks_unit_kwargs(host: HostSettings, bundle: str, python: str) -> dict:
    """Encoded for systemd (roles/shared/systemd_syntax.py): the template takes nothing else."""
    m = host.monitoring
    return dict(
        description=sd.text(f"inference-host health checks as metrics ({CHECK_SUITES})", "Description="),
        after=sd.word_list(
            ["network-online.target", f"{host.serving.unit_name}.service"], "After= (serving_unit_name)"
        ),
        service_user=sd.text(CHECKS_USER, "User="),
        textfile_dir=sd.path(TEXTFILE_DIR, "ReadWritePaths="),
        bundle_dir=sd.path(bundle, "WorkingDirectory="),
        exec_start=sd.argv(
            [
                python,
                "-m",
                "checks.textfile",
                "--expect-file",
                EXPECT_FILE,
                "--suites",
                CHECK_SUITES,
                "--out",
                OUT_FILE,
            ],
            "ExecStart= (health checks)",
        ),
        cpu_quota_percent=sd.number(m.check_cpu_quota_percent, "CPUQuota= (monitoring_check_cpu_quota_percent)"),
        timeout_s=sd.number(m.check_timeout_s, "TimeoutStartSec= (monitoring_check_timeout_s)"),
    )


def listen(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def gpu_templates(host: HostSettings, bundle: str, python: str) -> list[tuple[str, str, dict]]:
    """(path, template, kwargs) on a gpu node: the timer and its service."""
    return [
        (
            f"{SYSTEMD_DIR}/{CHECKS_UNIT}.service",
            "roles/monitoring/templates/inference-host-checks.service.j2",
            checks_unit_kwargs(host, bundle, python),
        ),
        (
            f"{SYSTEMD_DIR}/{CHECKS_UNIT}.timer",
            "roles/monitoring/templates/inference-host-checks.timer.j2",
            dict(interval_s=sd.number(host.monitoring.check_interval_seconds, "OnUnitActiveSec=")),
        ),
    ]


def node_exporter_template(host: HostSettings, site: Site) -> tuple[str, str, dict]:
    m = host.monitoring
    address = listen(exporter_bind(host, site.hosts), m.node_exporter_port)
    return (
        "/etc/default/prometheus-node-exporter",
        "roles/monitoring/templates/prometheus-node-exporter.default.j2",
        dict(
            listen=address,
            args=sd.env_words(
                [f"--web.listen-address={address}", f"--collector.textfile.directory={config.TEXTFILE_DIR}"],
                "ARGS of prometheus-node-exporter",
            ),
        ),
    )


def dcgm_dropin(host: HostSettings, site: Site) -> tuple[str, str]:
    """The packaged unit's ExecStart with our counters file, the settings' address (dcgm-exporter -a,
    default :9400) and the Xid window (-x, --xid-count-window-size in ms, default 300000;
    NVIDIA/dcgm-exporter pkg/cmd/app.go at 4.5.3-4.8.2)."""
    m = host.monitoring
    command = sd.argv(
        [
            "/usr/bin/dcgm-exporter",
            "-f",
            DCGM_COUNTERS,
            "-a",
            listen(exporter_bind(host, site.hosts), m.dcgm_exporter_port),
            "-x",
            str(m.xid_window_s * 1000),
        ],
        "ExecStart= of the DCGM exporter",
    )
    text = (
        "# Written by inference-host (roles/monitoring): the exporter's address and Xid window from the inventory.\n"
        f"[Service]\nExecStart=\nExecStart={command}\n"
    )
    return f"{SYSTEMD_DIR}/{DCGM_EXPORTER_UNIT}.service.d/90-inference-host.conf", text


def monitor_templates(host: HostSettings) -> list[tuple[str, str, dict]]:
    m = host.monitoring
    prometheus, alertmanager = (
        listen(m.listen_address, m.prometheus_port),
        listen(m.listen_address, m.alertmanager_port),
    )
    # `listen` names the operation; `args` is what the file holds (Debian's units run `$ARGS`).
    return [
        (
            "/etc/default/prometheus",
            "roles/monitoring/templates/prometheus.default.j2",
            dict(
                listen=prometheus,
                args=sd.env_words(
                    [
                        f"--config.file={config.PROMETHEUS_CONFIG_DIR}/prometheus.yml",
                        f"--web.listen-address={prometheus}",
                        f"--web.config.file={config.WEB_CONFIG_FILE}",
                        f"--storage.tsdb.path={m.data_dir}",
                        f"--storage.tsdb.retention.time={m.retention_time}",
                        f"--storage.tsdb.retention.size={m.retention_size_gib}GB",
                    ],
                    "ARGS of prometheus",
                ),
            ),
        ),
        (
            "/etc/default/prometheus-alertmanager",
            "roles/monitoring/templates/prometheus-alertmanager.default.j2",
            # One Alertmanager: no cluster gossip port (an empty address turns it off).
            dict(
                listen=alertmanager,
                args=sd.env_words(
                    [
                        f"--config.file={config.PROMETHEUS_CONFIG_DIR}/alertmanager.yml",
                        f"--web.listen-address={alertmanager}",
                        f"--web.config.file={config.WEB_CONFIG_FILE}",
                        f"--storage.path={config.ALERTMANAGER_DATA_DIR}",
                        "--cluster.listen-address=",
                    ],
                    "ARGS of prometheus-alertmanager",
                ),
            ),
        ),
    ]


def relay_template(host: HostSettings) -> tuple[str, str, dict]:
    """The alert relay's unit: python3 -I (no site directory, no environment), the script, its
    config, the loopback port and the per-operation timeout; every value encoded for systemd."""
    return (
        f"{SYSTEMD_DIR}/{config.RELAY_UNIT}.service",
        "roles/monitoring/templates/inference-host-alert-relay.service.j2",
        dict(
            description=sd.text("inference-host alert relay (webhooks with a vault URL)", "Description="),
            service_user=sd.text(config.RELAY_USER, "User="),
            exec_start=sd.argv(
                [
                    "/usr/bin/python3",
                    "-I",
                    "-B",
                    config.RELAY_SCRIPT,
                    "--config",
                    config.RELAY_CONFIG,
                    "--host",
                    config.RELAY_HOST,
                    "--port",
                    str(host.monitoring.alert_relay_port),
                    "--timeout",
                    str(config.RELAY_TIMEOUT_S),
                ],
                "ExecStart= (alert relay)",
            ),
        ),
    )
