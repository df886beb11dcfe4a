"""What the monitors write, derived from the site model (nothing typed twice): Prometheus' scrape
jobs and alert rules, Alertmanager's routing, and the web configuration with basic auth.

Pure functions of the Site: roles/monitoring writes their text on the host, roles/render
previews it, and tests/unit checks it with promtool (check config, check rules, test rules).

Metric names, by source:
- node_exporter: up, node_filesystem_avail_bytes / node_filesystem_size_bytes (fstype, mountpoint);
- NVIDIA's dcgm-exporter: DCGM_FI_DEV_* of etc/default-counters.csv (NVIDIA/dcgm-exporter),
  labels gpu, UUID, pci_bus_id, device, modelName, Hostname;
- SGLang (python/sglang/srt/metrics/collector.py): sglang:time_to_first_token_seconds and
  sglang:inter_token_latency_seconds (histograms), sglang:spec_accept_length (gauge);
- vLLM (vllm/v1/metrics/loggers.py): vllm:time_to_first_token_seconds,
  vllm:inter_token_latency_seconds (histograms);
- the checks' timer on each gpu node (checks/textfile.py): inference_host_check_ok
  {suite, check, gpu} and the evidence inference_host_* gauges.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import yaml

from roles.monitoring import runbook
from roles.monitoring.dashboard import DASHBOARD_FILE, dashboard_text
from roles.shared import layout, xid_catalog
from roles.site import HostSettings, Site, address_of, exporter_bind
from roles.site.sections.monitoring import duration_seconds

LOOPBACK = ("127.0.0.1", "::1")
WILDCARD = ("0.0.0.0", "::")
TEXTFILE_DIR = layout.TEXTFILE_DIR  # Debian's and Ubuntu's packaged default
ALERTMANAGER_DATA_DIR = "/var/lib/prometheus/alertmanager"
PROMETHEUS_CONFIG_DIR = "/etc/prometheus"
RULES_FILE = f"{PROMETHEUS_CONFIG_DIR}/inference-host.rules.yml"
WEB_CONFIG_FILE = f"{PROMETHEUS_CONFIG_DIR}/web.yml"
# Alertmanager reads the password of Prometheus' basic auth from this file (0640 root:prometheus).
PASSWORD_FILE = f"{PROMETHEUS_CONFIG_DIR}/inference-host-web.password"
SMTP_PASSWORD_FILE = f"{PROMETHEUS_CONFIG_DIR}/inference-host-smtp.password"
# The receivers' secrets Alertmanager reads itself, each in a 0600 file of the prometheus user,
# read and trimmed of white space when it sends (alertmanager v0.25.0 config/notifiers.go:
# slack_configs api_url_file, pagerduty_configs routing_key_file; notify/slack/slack.go,
# notify/pagerduty/pagerduty.go). Their error paths print no secret at v0.25.0: Slack's wraps the
# *url.Error in notify.RedactURL (notify/util.go), PagerDuty's URL (events.pagerduty.com/v2/enqueue)
# holds none (the routing key is in the body).
SLACK_URL_FILE = f"{PROMETHEUS_CONFIG_DIR}/inference-host-slack.url"
PAGERDUTY_KEY_FILE = f"{PROMETHEUS_CONFIG_DIR}/inference-host-pagerduty.key"
# Files of an earlier layout (webhook URLs read by Alertmanager 0.26's url_file): removed.
RETIRED_FILES = (
    f"{PROMETHEUS_CONFIG_DIR}/inference-host-webhook.url",
    f"{PROMETHEUS_CONFIG_DIR}/inference-host-heartbeat.url",
)
# The webhook receivers whose URL is a vault secret go through the alert relay (files/alert_relay.py):
# Alertmanager v0.25.0 prints a webhook's whole URL when a delivery fails (notify/webhook/webhook.go
# returns notify.PostJSON's *url.Error unredacted; v0.26.0 redacts that error but still logs the
# receiver's response body). Alertmanager posts to the relay on the loopback; only the relay, as its
# own user, reads the URLs.
RELAY_UNIT = "inference-host-alert-relay"
RELAY_USER = "inference-host-alert-relay"
RELAY_DIR = f"{layout.OPT_DIR}/alert-relay"
RELAY_SCRIPT = f"{RELAY_DIR}/alert_relay.py"
RELAY_SOURCE = "roles/monitoring/files/alert_relay.py"
RELAY_CONFIG = f"{layout.ETC_DIR}/alert-relay.json"
RELAY_HOST = "127.0.0.1"
RELAY_TIMEOUT_S = 10  # per network operation; a delivery at most twice that
# Only Alertmanager may post to the relay (any local process reaches the loopback): it sends this
# host's relay token, read from a 0600 file of its own user (alertmanager v0.25.0 takes a
# receiver's http_config `authorization: {credentials_file: ...}`, prometheus/common's
# config.HTTPClientConfig, read at every request); the relay refuses a request without it (401).
RELAY_TOKEN_FILE = f"{PROMETHEUS_CONFIG_DIR}/inference-host-alert-relay.token"
# "What is firing now" without a browser: `amtool alert query` on the monitor (as root). amtool
# ships in the distribution's prometheus-alertmanager and reads its flags' defaults from a YAML
# file (alertmanager v0.25.0 cli/root.go: alertmanager.url, http.config.file). Debian's build
# moves that file from upstream's /etc/amtool/config.yml to /etc/prometheus/amtool.yml
# (`amtool --help` of Debian 12's 0.25.0-1+b4: "default config locations:
# $HOME/.config/prometheus/amtool.yml or /etc/prometheus/amtool.yml"). The HTTP client file
# (Prometheus' http_config) names the password file: the password is on no command line and in
# neither file.
AMTOOL_CONFIG = f"{PROMETHEUS_CONFIG_DIR}/amtool.yml"
AMTOOL_HTTP_CONFIG = f"{PROMETHEUS_CONFIG_DIR}/amtool-http.yml"


def _dump(data) -> str:
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False, width=1000)


def monitored(site: Site) -> list[HostSettings]:
    """Hosts with node_exporter: every gpu node and every monitor (its own disk)."""
    return [h for h in site.hosts.values() if h.in_group("gpu_nodes") or h.in_group("monitors")]


def _hostport(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def target(monitor: HostSettings, host: HostSettings, bind: str, port: int) -> str:
    """host:port where the monitor reaches a service bound to `bind` on `host`."""
    if host.name == monitor.name and (bind in LOOPBACK or bind in WILDCARD):
        return f"127.0.0.1:{port}"
    return _hostport(address_of(host) if bind in WILDCARD else bind, port)


def unreachable(monitor: HostSettings, host: HostSettings, bind: str) -> bool:
    return bind in LOOPBACK and host.name != monitor.name


def engine_of(site: Site) -> str:
    return site.stack.active.engine


def scrape_jobs(site: Site, monitor: HostSettings) -> list[dict]:
    """One job per kind of target, each target labelled host=<inventory name>."""
    nodes = site.group("gpu_nodes")

    def static(pairs: list[tuple[HostSettings, str]]) -> list[dict]:
        return [{"targets": [address], "labels": {"host": host.name}} for host, address in pairs]

    jobs = [
        (
            "node",
            [
                (h, target(monitor, h, exporter_bind(h, site.hosts), h.monitoring.node_exporter_port))
                for h in monitored(site)
            ],
        ),
        (
            "dcgm",
            [
                (h, target(monitor, h, exporter_bind(h, site.hosts), h.monitoring.dcgm_exporter_port))
                for h in nodes
                if h.monitoring.dcgm_exporter
            ],
        ),
        # vLLM always serves /metrics; SGLang only with --enable-metrics (serving_enable_metrics).
        (
            "engine",
            [
                (h, target(monitor, h, h.serving.host, h.serving.port))
                for h in nodes
                if engine_of(site) == "vllm" or h.serving.enable_metrics
            ],
        ),
        # smg's --prometheus-host/--prometheus-port (roles/gateway/command.py).
        (
            "gateway",
            [
                (h, target(monitor, h, h.gateway.prometheus_host, h.gateway.prometheus_port))
                for h in site.group("gateways")
            ],
        ),
    ]
    return [{"job_name": name, "static_configs": static(pairs)} for name, pairs in jobs if pairs]


def prometheus_config(site: Site, monitor: HostSettings) -> str:
    m = monitor.monitoring
    # Alertmanager listens where Prometheus does (monitoring_listen_address), on this host.
    local = "127.0.0.1" if m.listen_address in WILDCARD else m.listen_address
    alerting: dict = {"static_configs": [{"targets": [_hostport(local, m.alertmanager_port)]}]}
    if m.web_password_secret:
        alerting["basic_auth"] = {"username": m.web_user, "password_file": PASSWORD_FILE}
    config = {
        "global": {
            "scrape_interval": m.scrape_interval,
            "evaluation_interval": m.scrape_interval,
            "external_labels": {"monitor": monitor.name},
        },
        "rule_files": [RULES_FILE],
        "alerting": {"alertmanagers": [alerting]},
        "scrape_configs": scrape_jobs(site, monitor),
    }
    return "# Written by inference-host (roles/monitoring) from the inventory; edit the inventory.\n" + _dump(config)


def web_config(monitor: HostSettings, password_hash: str | None) -> str:
    """Prometheus' and Alertmanager's --web.config.file (exporter-toolkit's format): bcrypt."""
    head = "# Written by inference-host (roles/monitoring): basic auth of the web endpoints.\n"
    if password_hash is None:
        return head + "{}\n"
    return head + _dump({"basic_auth_users": {monitor.monitoring.web_user: password_hash}})


def alertmanager_url(monitor: HostSettings) -> str:
    """Where Alertmanager answers on the monitor itself (Prometheus and amtool use it)."""
    m = monitor.monitoring
    local = "127.0.0.1" if m.listen_address in WILDCARD else m.listen_address
    return f"http://{_hostport(local, m.alertmanager_port)}"


def amtool_configs(monitor: HostSettings) -> dict[str, str]:
    """amtool's config file and its HTTP client file (basic auth with the password file)."""
    m = monitor.monitoring
    head = "# Written by inference-host (roles/monitoring): `amtool alert query` asks this host's Alertmanager.\n"
    auth = {"basic_auth": {"username": m.web_user, "password_file": PASSWORD_FILE}} if m.web_password_secret else {}
    return {
        AMTOOL_CONFIG: head
        + _dump({"alertmanager.url": alertmanager_url(monitor), "http.config.file": AMTOOL_HTTP_CONFIG}),
        AMTOOL_HTTP_CONFIG: head + (_dump(auth) if auth else "{}\n"),
    }


def secret_files(monitor: HostSettings) -> dict[str, str | None]:
    """0600 file Alertmanager reads -> the vault key whose value it holds (None: not set, removed)."""
    m = monitor.monitoring
    return {SLACK_URL_FILE: m.slack_api_url_secret, PAGERDUTY_KEY_FILE: m.pagerduty_routing_key_secret}


def relay_receivers(monitor: HostSettings) -> dict[str, str]:
    """Relay receiver name -> the vault key of its URL (empty: no relay on this monitor)."""
    m = monitor.monitoring
    pairs = (
        ("webhook", m.webhook_url_secret if m.webhook_url is None else None),
        ("heartbeat", m.heartbeat_url_secret),
    )
    return {name: key for name, key in pairs if key}


def relay_url(monitor: HostSettings, name: str) -> str:
    """Where Alertmanager posts a relayed receiver's alerts: the loopback, no secret in it."""
    return f"http://{_hostport(RELAY_HOST, monitor.monitoring.alert_relay_port)}/{name}"


def relay_token(monitor: HostSettings, values: Mapping[str, str]) -> str:
    """This monitor's relay token: an HMAC-SHA256 of its name keyed with the relay's vault URLs
    (values: vault key -> URL). The same on every deploy (nothing to store, a second deploy
    changes nothing), another on another monitor, and unknown to whoever lacks the URLs the
    relay already holds; it changes with them."""
    material = json.dumps(sorted(values[key] for key in relay_receivers(monitor).values())).encode()
    return hmac.new(material, f"inference-host alert relay {monitor.name}".encode(), hashlib.sha256).hexdigest()


def relay_config(monitor: HostSettings, values: Mapping[str, str]) -> str:
    """The relay's 0600 config (JSON, through json.dumps): receiver name -> its vault URL, and
    the token Alertmanager must send."""
    receivers = {name: values[key] for name, key in relay_receivers(monitor).items()}
    token = relay_token(monitor, values)
    return json.dumps({"receivers": receivers, "token": token}, indent=2, sort_keys=True) + "\n"


def _relayed(monitor: HostSettings, name: str, send_resolved: bool) -> dict:
    """A webhook_configs entry to the relay, with the relay's token from its file."""
    return {
        "url": relay_url(monitor, name),
        "send_resolved": send_resolved,
        "http_config": {"authorization": {"type": "Bearer", "credentials_file": RELAY_TOKEN_FILE}},
    }


def _receiver(name: str, kinds: list[str], monitor: HostSettings) -> dict:
    m = monitor.monitoring
    receiver: dict = {"name": name}
    if "email" in kinds:
        email = {"to": m.email_to, "from": m.email_from, "smarthost": m.email_smarthost, "send_resolved": True}
        if m.email_auth_username:
            email["auth_username"] = m.email_auth_username
        if m.email_auth_password_secret:
            email["auth_password_file"] = SMTP_PASSWORD_FILE
        receiver["email_configs"] = [email]
    if "webhook" in kinds:
        if m.webhook_url is not None:
            receiver["webhook_configs"] = [{"url": m.webhook_url, "send_resolved": True}]
        else:
            receiver["webhook_configs"] = [_relayed(monitor, "webhook", True)]
    if "slack" in kinds:
        slack = {"api_url_file": SLACK_URL_FILE, "send_resolved": True}
        if m.slack_channel:
            slack["channel"] = m.slack_channel
        receiver["slack_configs"] = [slack]
    if "pagerduty" in kinds:
        # PagerDuty's event severity (Events API v2: critical, error, warning, info); Alertmanager sends
        # "error" for every alert unless told (v0.25.0 notify/pagerduty/pagerduty.go), so its urgency
        # rules could not tell a warning from a critical alert.
        receiver["pagerduty_configs"] = [
            {"routing_key_file": PAGERDUTY_KEY_FILE, "severity": name, "send_resolved": True}
        ]
    return receiver


def heartbeat_tick(interval: str) -> str:
    """The heartbeat route's group_interval: Alertmanager re-sends a group that did not change only
    when, at a tick, repeat_interval has passed since the last send was logged (v0.25.0
    notify/notify.go DedupStage.needsUpdate; nflog logs the send's end), so a tick equal to the
    interval would skip every other beat. Ticks of half the interval, at most 10 s, keep the beat
    within 10 s of the interval."""
    return f"{max(1, min(10, duration_seconds(interval) // 2))}s"


def alertmanager_config(monitor: HostSettings) -> str:
    """Alertmanager's routing: Watchdog to the heartbeat, then each severity to its receivers.
    No secret in it: a vault webhook URL is the relay's, a Slack URL or PagerDuty key a file's."""
    m = monitor.monitoring
    heartbeat: dict = {"name": "heartbeat"}
    if m.heartbeat_url_secret:
        heartbeat["webhook_configs"] = [_relayed(monitor, "heartbeat", False)]
    config = {
        "route": {
            # Anything no route below takes (a severity the rules do not use) goes with the warnings.
            "receiver": "warning",
            "group_by": ["alertname", "host"],
            "group_wait": m.alert_group_wait,
            "group_interval": m.alert_group_interval,
            "repeat_interval": m.warning_repeat_interval,
            "routes": [
                # Never to a person: with no heartbeat URL, to a receiver that sends nothing.
                {
                    "receiver": "heartbeat",
                    "matchers": [f'alertname="{WATCHDOG}"'],
                    "group_by": ["alertname"],
                    "group_wait": "0s",
                    "group_interval": heartbeat_tick(m.heartbeat_interval),
                    "repeat_interval": m.heartbeat_interval,
                },
                {
                    "receiver": "critical",
                    "matchers": ['severity="critical"'],
                    "repeat_interval": m.critical_repeat_interval,
                },
                {"receiver": "warning", "matchers": ['severity="warning"']},
            ],
        },
        "receivers": [
            heartbeat,
            _receiver("critical", m.receivers_for("critical"), monitor),
            _receiver("warning", m.receivers_for("warning"), monitor),
        ],
        # A host that is down makes its engine and checks silent or failing: one page, not five.
        "inhibit_rules": [
            {
                "source_matchers": ['alertname="InferenceHostDown"'],
                "target_matchers": ['severity=~"warning|critical"', 'alertname!="InferenceHostDown"'],
                "equal": ["host"],
            }
        ],
    }
    return "# Written by inference-host (roles/monitoring) from the inventory; edit the inventory.\n" + _dump(config)


# ----------------------------------------------------------------------------------------------
# Alert rules


@dataclass(frozen=True)
class Alert:
    name: str
    expr: str
    for_: str
    severity: str
    summary: str
    description: str

    def rule(self) -> dict:
        rule: dict[str, object] = {"alert": self.name, "expr": self.expr}
        if self.for_ != "0m":
            rule["for"] = self.for_
        rule["labels"] = {"severity": self.severity}
        rule["annotations"] = {"summary": self.summary, "description": self.description}
        return rule


def _literal(text: str) -> str:
    """text as an RE2 literal inside a PromQL double-quoted string: metacharacters get a
    backslash, which the string itself needs doubled (PromQL knows no escape like \\-)."""
    return "".join("\\\\" + c if c in ".^$*+?()[]{}|\\" else c for c in text)


def _host_regex(hosts: list[HostSettings]) -> str:
    return "|".join(_literal(h.name) for h in hosts)


def by_value(hosts: list[HostSettings], value: Callable[[HostSettings], object]) -> list[tuple[object, str]]:
    """(threshold, host regex) pairs: one rule per distinct threshold of the hosts' settings."""
    groups: dict[object, list[HostSettings]] = defaultdict(list)
    for host in hosts:
        v = value(host)
        if v is not None:
            groups[v].append(host)
    return [(v, _host_regex(members)) for v, members in groups.items()]


def _any(clauses) -> str:
    """One expression for one alert (promtool refuses two rules of one name and labels)."""
    clauses = list(clauses)
    return clauses[0] if len(clauses) == 1 else " or ".join(f"({c})" for c in clauses)


def _thresholds(hosts: list[HostSettings], value: Callable[[HostSettings], object]) -> str:
    return ", ".join(f"{h.name} {value(h)}" for h in hosts)


def _mountpoints_of(paths: list[str]) -> str:
    """Every mount point that may hold one of the paths: each path and its parents (the real
    one is the longest that is mounted; the others are filling too if they alert)."""
    points = set()
    for path in paths:
        parts = path.rstrip("/").split("/")
        points |= {"/".join(parts[:i]) or "/" for i in range(1, len(parts) + 1)}
    return "|".join(sorted(_literal(p) for p in points))


# A NEW Xid, not the last one: DCGM_FI_DEV_XID_ERRORS is the value of the last Xid (etc/default-counters.csv)
# and stays there until the exporter or the driver restarts (NVIDIA/dcgm-exporter issue #500, NVIDIA/DCGM
# issue #277). DCGM_EXP_XID_ERRORS_COUNT (internal/pkg/collector/xid_collector.go and expcollector.go at
# 4.5.3-4.8.2) counts the Xids of the last -x ms per GPU, one series per code (labels xid,
# window_size_in_ms), and one series at 0 without an xid label when there was none: it rises on every
# Xid, a second one of the same code included, and falls back to 0 on its own.
XID_COUNT = "DCGM_EXP_XID_ERRORS_COUNT"
# kube-prometheus' always-firing alert (its general.rules: expr vector(1), severity none): routed
# only to the heartbeat receiver, whose outside service pages when the beats stop.
WATCHDOG = "Watchdog"
# Graded by NVIDIA's Xid catalog, "Resolution Bucket (Immediate Action)" (roles/shared/xid_catalog.yml,
# the rows quoted with their source): only the buckets that need a person page (critical), as does
# a code the catalog file does not hold; RESTART_APP (the program on the GPU) and XID_154 (it restates
# another Xid) are warnings; IGNORE codes raise no alert.
XID_WARNING = xid_catalog.codes("warning")
XID_IGNORED = xid_catalog.codes("none")


def _codes(codes: tuple[int, ...]) -> str:
    return "^(" + "|".join(str(c) for c in codes) + ")$"


def _xid_advice() -> str:
    """The alert's advice as one Go template: a branch per catalog bucket, by the xid label."""
    by_bucket: dict[str, list[int]] = defaultdict(list)
    for code, row in xid_catalog.catalog()["rows"].items():
        if row.severity != "none":
            by_bucket[row.immediate].append(code)
    branches = [
        f'{{{{ {"if" if i == 0 else "else if"} match "{_codes(tuple(codes))}" $labels.xid }}}}'
        f"NVIDIA's Xid catalog says {bucket}: {xid_catalog.row(codes[0]).next_step}."  # type: ignore[union-attr]
        for i, (bucket, codes) in enumerate(sorted(by_bucket.items()))
    ]
    return "".join(branches) + "{{ else }}" + xid_catalog.UNKNOWN[1] + ".{{ end }}"


XID_ADVICE = _xid_advice()


def _alert(name: str, expr: str, for_: str, severity: str, **fields: object) -> Alert:
    """The rule with its summary and description from the runbook (runbook.py), fields filled in."""
    return Alert(name, expr, for_, severity, *runbook.text(name, **fields))


def alerts(site: Site, monitor: HostSettings) -> list[Alert]:
    nodes = site.group("gpu_nodes")
    engine = engine_of(site)
    m = monitor.monitoring
    check_interval = max((h.monitoring.check_interval_seconds for h in nodes), default=300)
    out = [
        _alert(WATCHDOG, "vector(1)", "0m", "none", monitor=monitor.name),
        _alert("InferenceHostDown", 'up{job="node"} == 0', m.down_for, "critical"),
        _alert("EngineDown", 'up{job="engine"} == 0', m.down_for, "critical", engine=engine),
        _alert("GatewayDown", 'up{job="gateway"} == 0', m.down_for, "critical"),
        _alert(
            "ChecksNotRunning",
            f"time() - inference_host_checks_last_run_timestamp_seconds > 3 * {check_interval}",
            "0m",
            "warning",
        ),
        _alert("HealthCheckFailing", "inference_host_check_ok == 0", m.check_failing_for, "warning"),
        _alert(
            "GpuXidError",
            f'{XID_COUNT}{{xid!~"{_codes(XID_WARNING + XID_IGNORED)}"}} > 0',
            "0m",
            "critical",
            xid_advice=XID_ADVICE,
        ),
        _alert(
            "GpuXidError", f'{XID_COUNT}{{xid=~"{_codes(XID_WARNING)}"}} > 0', "0m", "warning", xid_advice=XID_ADVICE
        ),
        _alert(
            "GpuUncorrectableEcc",
            "inference_host_gpu_ecc_uncorrectable_errors > 0 or DCGM_FI_DEV_ROW_REMAP_FAILURE > 0",
            "0m",
            "critical",
        ),
        _alert("GpuThrottling", "inference_host_gpu_clock_events_active > 0", "5m", "warning"),
    ]
    margins = by_value(nodes, lambda h: h.health.min_temp_margin_c)
    if margins:
        out.append(
            _alert(
                "GpuTemperatureMargin",
                _any(
                    f'inference_host_gpu_temperature_margin_celsius{{host=~"{hosts}"}} < {margin}'
                    for margin, hosts in margins
                ),
                "5m",
                "warning",
                thresholds=_thresholds(nodes, lambda h: h.health.min_temp_margin_c),
            )
        )
    counts = by_value(nodes, lambda h: h.gpu.count)
    if counts:
        clauses = []
        for count, hosts in counts:
            clauses.append(f'inference_host_gpus_visible{{host=~"{hosts}"}} < {count}')
            dcgm = [h for h in nodes if h.monitoring.dcgm_exporter and h.gpu.count == count]
            if dcgm:
                clauses.append(f'count by (host) (DCGM_FI_DEV_GPU_TEMP{{host=~"{_host_regex(dcgm)}"}}) < {count}')
        out.append(
            _alert("GpuMissing", _any(clauses), "2m", "critical", thresholds=_thresholds(nodes, lambda h: h.gpu.count))
        )
    restart_window = m.restart_window
    limits = by_value(nodes, lambda h: h.health.max_unit_restarts)
    if limits:
        out.append(
            _alert(
                "EngineRestartLooping",
                # Now against the window's lowest: systemd's NRestarts drops to 0 when the unit is
                # started by hand (the mend), which a max-minus-min would count as restarts.
                _any(
                    f'inference_host_unit_restarts{{host=~"{hosts}"}} - '
                    f'min_over_time(inference_host_unit_restarts{{host=~"{hosts}"}}[{restart_window}]) > {limit}'
                    for limit, hosts in limits
                ),
                "0m",
                "critical",
                window=restart_window,
                thresholds=_thresholds(nodes, lambda h: h.health.max_unit_restarts),
            )
        )
    spec = [h for h in nodes if h.speculative is not None]
    floors = by_value(spec, lambda h: h.health.min_accept_length)
    if floors:
        clauses = []
        for floor, hosts in floors:
            clauses.append(f'inference_host_accept_length{{host=~"{hosts}"}} < {floor}')
            if engine == "sglang":
                clauses.append(f'sglang:spec_accept_length{{host=~"{hosts}"}} < {floor}')
        out.append(
            _alert(
                "SpeculativeAcceptLengthLow",
                _any(clauses),
                "15m",
                "warning",
                thresholds=_thresholds(spec, lambda h: h.health.min_accept_length),
            )
        )
    metrics_nodes = [h for h in nodes if engine == "vllm" or h.serving.enable_metrics]
    if metrics_nodes:
        regex = _host_regex(metrics_nodes)
        for alert, metric, words, limit, key in (
            (
                "TimeToFirstTokenHigh",
                "time_to_first_token_seconds",
                "time to first token",
                m.max_ttft_p95_s,
                "monitoring_max_ttft_p95_s",
            ),
            (
                "InterTokenLatencyHigh",
                "inter_token_latency_seconds",
                "inter-token latency",
                m.max_itl_p95_s,
                "monitoring_max_itl_p95_s",
            ),
        ):
            out.append(
                _alert(
                    alert,
                    f"histogram_quantile(0.95, sum by (host, le) (rate({engine}:{metric}_bucket"
                    f'{{host=~"{regex}"}}[10m]))) > {limit}',
                    "10m",
                    "warning",
                    words=words,
                    limit=limit,
                    key=key,
                    engine=engine,
                )
            )
    out.append(
        _alert(
            "WeightsManifestMismatch",
            'inference_host_check_ok{check="weights manifest matches the pin"} == 0',
            "0m",
            "critical",
        )
    )
    watch = _disk_watch(site)
    if watch:
        out.append(
            _alert(
                "DiskFilling",
                _any(
                    f'100 * node_filesystem_avail_bytes{{host=~"{hosts}",mountpoint=~"{paths}"}} / '
                    f'node_filesystem_size_bytes{{host=~"{hosts}",mountpoint=~"{paths}"}} < {free}'
                    for free, hosts, paths, _, _ in watch
                ),
                "15m",
                "warning",
                where="; ".join(f"{name}: {what}" for _, _, _, name, what in watch),
            )
        )
    return out


def _disk_watch(site: Site) -> list[tuple[int, str, str, str, str]]:
    """(free % floor, host regex, mount point regex, host, what lives there) per host: the weights
    directories of each gpu node, the TSDB of each monitor."""
    from roles.site import weight_sets_of

    out = []
    for host in monitored(site):
        paths, what = [], []
        if host.in_group("gpu_nodes"):
            dirs = [ws.guest_dir for ws in weight_sets_of(host, site.hosts)] or [host.serving.model_path]
            paths += dirs + [host.base.install_root]
            what.append("the weights (" + ", ".join(dirs) + ") and engine environments")
        if host.in_group("monitors"):
            paths.append(host.monitoring.data_dir)
            what.append(f"Prometheus' data ({host.monitoring.data_dir})")
        out.append(
            (
                host.monitoring.min_free_disk_percent,
                _literal(host.name),
                _mountpoints_of(paths),
                host.name,
                " and ".join(what),
            )
        )
    return out


def rules_config(site: Site, monitor: HostSettings) -> str:
    rules = [a.rule() for a in alerts(site, monitor)]
    head = (
        "# Written by inference-host (roles/monitoring) from the site model: the thresholds are the\n"
        "# health_* and monitoring_* settings of the inventory. Edit the inventory, not this file.\n"
    )
    return head + _dump({"groups": [{"name": "inference-host", "rules": rules}]})


def alert_names(site: Site, monitor: HostSettings) -> list[str]:
    return sorted({a.name for a in alerts(site, monitor)})


ALERTMANAGER_FILE = f"{PROMETHEUS_CONFIG_DIR}/alertmanager.yml"


def files(site: Site, monitor: HostSettings, password_hash: str | None) -> dict[str, str]:
    """Path on the monitor -> text, for the role and the preview (the Grafana dashboard and
    amtool's files too: read by no service, they are for operators)."""
    return {
        f"{PROMETHEUS_CONFIG_DIR}/prometheus.yml": prometheus_config(site, monitor),
        RULES_FILE: rules_config(site, monitor),
        ALERTMANAGER_FILE: alertmanager_config(monitor),
        WEB_CONFIG_FILE: web_config(monitor, password_hash),
        DASHBOARD_FILE: dashboard_text(engine_of(site)),
        **amtool_configs(monitor),
    }
