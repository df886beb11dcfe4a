"""roles/monitoring: Prometheus, Alertmanager, the exporters and the checks' timer (monitoring_*)."""

from __future__ import annotations

import re
from typing import Annotated, ClassVar

from pydantic import Field

from roles.site.fields import (
    HostFolder,
    IpAddress,
    SecretName,
    Section,
    Url,
    check,
    positive,
    tcp_port,
)

# A Prometheus duration of one unit (promql/parser's model.ParseDuration accepts these units).
PROMETHEUS_DURATION_RE = re.compile(r"^[1-9][0-9]*(s|m|h|d|w|y)$")
# dcgm-exporter 4.5.3-4.8.2 internal/pkg/devicewatcher/const.go: maxKeepAge = 600.0, how long DCGM keeps a
# watched field's samples; the Xid count's window reads back no further than that.
DCGM_KEEP_S = 600
PrometheusDuration = Annotated[
    str, check(PROMETHEUS_DURATION_RE.match, "a Prometheus duration like 30s, 5m, 15d (one number and one unit)")
]
EMAIL_RE = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
# Alertmanager's receivers the inventory can route a severity to (one receiver of each kind).
RECEIVER_KINDS = ("email", "webhook", "slack", "pagerduty")
RECEIVERS_TEXT = "a list of distinct names from: " + ", ".join(RECEIVER_KINDS)


def _receiver_names(names: list[str]) -> bool:
    return set(names) <= set(RECEIVER_KINDS) and len(set(names)) == len(names)


# Hosts whose URLs carry their token in the path: Slack's incoming webhooks (hooks.slack.com/services/T/B/TOKEN),
# PagerDuty's events and heartbeat URLs, and common dead man's switch services.
TOKEN_URL_HOSTS = (
    "hooks.slack.com",
    "events.pagerduty.com",
    "events.eu.pagerduty.com",
    "hc-ping.com",
    "nosnch.in",
    "cronitor.link",
    "discord.com",
    "discordapp.com",
    "webhook.office.com",
    "api.opsgenie.com",
)
_UUID_RE = re.compile(r"^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}$")


def _looks_random(part: str) -> bool:
    """A UUID, or a run of 16 or more letters, digits, '-', '_' mixing letters and digits: what
    services mint as tokens (a readable path such as /alerts/inference-host is neither)."""
    return bool(_UUID_RE.match(part)) or (
        len(part) >= 16
        and re.fullmatch(r"[A-Za-z0-9_-]+", part) is not None
        and any(c.isdigit() for c in part)
        and any(c.isalpha() for c in part)
    )


def url_credential(url: str) -> str | None:
    """What in a URL looks like a credential, in words that never repeat it, or None."""
    from urllib.parse import parse_qsl, urlsplit

    parts = urlsplit(url)
    if parts.username is not None or parts.password is not None:
        return "a user name or password before its host"
    host = (parts.hostname or "").lower()
    for known in TOKEN_URL_HOSTS:
        if host == known or host.endswith("." + known):
            return f"the host {known}, whose URLs carry their token"
    if any(_looks_random(segment) for segment in parts.path.split("/")):
        return "a path segment shaped like a token (a UUID, or 16 or more mixed letters and digits)"
    if parts.query:
        if any(
            _looks_random(v) or re.search(r"token|key|secret|pass|sig|auth|code", k, re.I)
            for k, v in parse_qsl(parts.query, keep_blank_values=True)
        ):
            return "a query parameter that looks like a credential"
    return None


class MonitoringSettings(Section):
    """roles/monitoring: Prometheus and Alertmanager on the monitors group; node_exporter, DCGM's
    exporter and the checks' timer on every gpu node. Alert thresholds that the health checks
    also judge come from health_* (one source); these are the ones only the monitor has."""

    PREFIX: ClassVar[str] = "monitoring_"

    listen_address: IpAddress = Field(
        "127.0.0.1",
        description="Address Prometheus' and Alertmanager's web endpoints listen on (basic auth in front of both).",
    )
    prometheus_port: Annotated[int, tcp_port] = Field(9090, description="Prometheus' web port.")
    alertmanager_port: Annotated[int, tcp_port] = Field(9093, description="Alertmanager's web port.")
    alert_relay_port: Annotated[int, tcp_port] = Field(
        9097,
        description=(
            "Loopback port of the alert relay on a monitor: Alertmanager posts there the alerts of a"
            " webhook or heartbeat receiver whose URL is a vault secret, and the relay forwards them"
            " (docs/monitoring.md, 'Webhook URLs stay out of the journal')."
        ),
    )
    exporter_address: IpAddress | None = Field(
        None,
        description=(
            "Address the exporters on each gpu node bind (node_exporter, DCGM's exporter):"
            " where the monitors reach them. None: 127.0.0.1 on a host that is its site's only monitor,"
            " else 0.0.0.0 (with firewall_enabled only the monitors are let in)."
        ),
    )
    node_exporter_port: Annotated[int, tcp_port] = Field(9100, description="node_exporter's port on each gpu node.")
    dcgm_exporter_port: Annotated[int, tcp_port] = Field(9400, description="DCGM exporter's port on each gpu node.")
    dcgm_exporter: bool = Field(
        True,
        description=(
            "Install NVIDIA's DCGM exporter on the gpu nodes; False (a site without NVIDIA's repository): the GPU"
            " alerts rely on the checks' own metrics only."
        ),
    )
    xid_window_s: Annotated[
        int, check(lambda v: 1 <= v <= DCGM_KEEP_S, f"1 to {DCGM_KEEP_S} seconds (DCGM keeps {DCGM_KEEP_S} s)")
    ] = Field(
        300,
        description=(
            "DCGM's exporter counts each GPU's Xids over this window (its -x, default 5 minutes): GpuXidError fires on"
            " a new Xid and resolves this long after the last one. At least the monitors' scrape interval (a shorter"
            " window can rise and fall between two scrapes) and at most 600 s (the exporter's DCGM watches keep 600 s"
            " of samples)."
        ),
    )
    data_dir: HostFolder = Field("/var/lib/prometheus/metrics2", description="Prometheus' TSDB folder.")
    retention_time: PrometheusDuration = Field(
        "30d",
        description=(
            "Prometheus keeps samples this long (whichever of time and size is reached first drops the oldest blocks)."
        ),
    )
    retention_size_gib: Annotated[int, positive] = Field(
        50, description="Prometheus keeps at most this many GiB of samples."
    )
    scrape_interval: PrometheusDuration = Field("15s", description="How often Prometheus scrapes every target.")
    web_user: Annotated[
        str, check(re.compile(r"^[A-Za-z0-9_.-]{1,64}$").match, "a user name of letters, digits, '_', '.', '-'")
    ] = Field("inference-host", description="The basic-auth user of both web endpoints.")
    web_password_secret: SecretName | None = Field(
        None,
        description=(
            "Vault key of the web password (the deploy writes only its bcrypt hash, 0640 root:prometheus); None: no web"
            " authentication, allowed only on a loopback listen_address."
        ),
    )
    webhook_url: Url | None = Field(
        None,
        description=(
            "Alertmanager sends alerts to this webhook (webhook_config): a URL that carries no credential (an internal"
            " receiver). One with a token, a password or a secret path (Slack, PagerDuty, a heartbeat service) is"
            " refused: put it in the vault and name it with monitoring_webhook_url_secret."
        ),
    )
    webhook_url_secret: SecretName | None = Field(
        None,
        description=(
            "Vault key of a webhook URL that carries a token (webhook_config); written only into a 0600 file on the"
            " monitor."
        ),
    )
    slack_api_url_secret: SecretName | None = Field(
        None,
        description=(
            "Vault key of a Slack incoming-webhook URL (its path is its token): Alertmanager's slack_configs reads it"
            " from a 0600 file (api_url_file)."
        ),
    )
    slack_channel: (
        Annotated[str, check(re.compile(r"^[#@]?[A-Za-z0-9._-]{1,80}$").match, "a Slack channel like #alerts")] | None
    ) = Field(None, description="Slack channel of the alerts; None: the incoming webhook's own channel.")
    pagerduty_routing_key_secret: SecretName | None = Field(
        None,
        description=(
            "Vault key of a PagerDuty Events API v2 integration key: Alertmanager's pagerduty_configs reads it from a"
            " 0600 file (routing_key_file)."
        ),
    )
    heartbeat_url_secret: SecretName | None = Field(
        None,
        description=(
            "Vault key of a dead man's switch URL (Healthchecks.io, Dead Man's Snitch, Cronitor, ...): the"
            " always-firing Watchdog alert is posted there every monitoring_heartbeat_interval, and that service"
            " pages when the posts stop (docs/monitoring.md)."
        ),
    )
    heartbeat_interval: PrometheusDuration = Field(
        "1m",
        description=(
            "How often the Watchdog reaches the heartbeat URL: its route's repeat_interval. The route's"
            " group_interval, the tick at which Alertmanager checks whether that much has passed, is half of it,"
            " at most 10 s (at least 1 s), so each beat comes within 10 s of the interval. The outside service's"
            " grace period should be a few of these."
        ),
    )
    critical_receivers: Annotated[list[str], check(_receiver_names, RECEIVERS_TEXT)] | None = Field(
        None,
        description=(
            "Receivers of critical alerts, from email, webhook, slack, pagerduty; None: every one configured."
        ),
    )
    warning_receivers: Annotated[list[str], check(_receiver_names, RECEIVERS_TEXT)] | None = Field(
        None,
        description=(
            "Receivers of warnings, from email, webhook, slack, pagerduty; None: every one configured but pagerduty"
            " (a warning wakes nobody), or pagerduty when it is the only one."
        ),
    )
    critical_repeat_interval: PrometheusDuration = Field(
        "1h", description="A critical alert still firing is sent again this often (its route's repeat_interval)."
    )
    warning_repeat_interval: PrometheusDuration = Field(
        "4h", description="A warning still firing is sent again this often (its route's repeat_interval)."
    )
    email_to: Annotated[str, check(EMAIL_RE.match, "an e-mail address")] | None = Field(
        None, description="Alertmanager sends alerts to this e-mail address."
    )
    email_from: Annotated[str, check(EMAIL_RE.match, "an e-mail address")] | None = Field(
        None, description="The sender address of alert e-mails."
    )
    email_smarthost: (
        Annotated[
            str,
            check(
                lambda v: (
                    (m := re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?:(\d{1,5})", v)) is not None
                    and 1 <= int(m.group(2)) <= 65535
                ),
                "host:port of the SMTP relay (a DNS name or IPv4 address, a port from 1 to 65535)",
            ),
        ]
        | None
    ) = Field(None, description="host:port of the SMTP relay for alert e-mails.")
    email_auth_username: str | None = Field(None, description="SMTP user for alert e-mails.")
    email_auth_password_secret: SecretName | None = Field(None, description="Vault key of the SMTP password.")
    check_interval: PrometheusDuration = Field(
        "5m",
        description=(
            "How often the checks' timer on each gpu node runs the fast suites (gpu without the bandwidth probes,"
            " service, server)."
        ),
    )
    check_cpu_quota_percent: Annotated[int, check(lambda v: 1 <= v <= 100, "a percentage of one CPU from 1 to 100")] = (
        Field(25, description="CPU budget of the checks' unit (CPUQuota=, percent of one CPU).")
    )
    check_timeout_s: Annotated[int, check(lambda v: 10 <= v <= 3600, "10 to 3600 seconds")] = Field(
        120, description="Time budget of the checks' unit (TimeoutStartSec=); shorter than check_interval."
    )
    check_failing_for: PrometheusDuration = Field(
        "10m", description="A check must fail this long before it alerts (a restart during a deploy is not a page)."
    )
    alert_group_wait: PrometheusDuration = Field(
        "30s",
        description=(
            "Alertmanager waits this long after a group's first alert before it sends (group_wait), so that alerts"
            " firing together arrive as one message."
        ),
    )
    alert_group_interval: PrometheusDuration = Field(
        "5m",
        description=(
            "Alertmanager waits this long before it sends a group again with alerts that joined it after its first"
            " message (group_interval): a second failing check of a host whose group already fired arrives this much"
            " later at most."
        ),
    )
    down_for: PrometheusDuration = Field(
        "2m",
        description=(
            "A host, engine or gateway whose /metrics fails this long alerts (InferenceHostDown, EngineDown,"
            " GatewayDown)."
        ),
    )
    restart_window: PrometheusDuration = Field(
        "30m",
        description=(
            "EngineRestartLooping counts the serving unit's restarts over this window (more than"
            " health_max_unit_restarts alert); the alert clears this long after the last restart."
        ),
    )
    max_ttft_p95_s: Annotated[float, positive] = Field(
        5.0, description=("Alert when the p95 time to first token of real traffic exceeds this (seconds).")
    )
    max_itl_p95_s: Annotated[float, positive] = Field(
        0.25, description=("Alert when the p95 inter-token latency of real traffic exceeds this (seconds).")
    )
    min_free_disk_percent: Annotated[int, check(lambda v: 1 <= v <= 50, "1 to 50 percent")] = Field(
        10, description="Alert when the weights' or Prometheus' disk has less free space than this."
    )

    @property
    def check_interval_seconds(self) -> int:
        return duration_seconds(self.check_interval)

    @property
    def scrape_interval_seconds(self) -> int:
        return duration_seconds(self.scrape_interval)

    def configured_receivers(self) -> list[str]:
        """The receiver kinds this monitor has the settings of, in RECEIVER_KINDS' order."""
        have = {
            "email": self.email_to is not None,
            "webhook": self.webhook_url is not None or self.webhook_url_secret is not None,
            "slack": self.slack_api_url_secret is not None,
            "pagerduty": self.pagerduty_routing_key_secret is not None,
        }
        return [kind for kind in RECEIVER_KINDS if have[kind]]

    def receivers_for(self, severity: str) -> list[str]:
        """The receiver kinds a severity is routed to (the setting, or its default)."""
        chosen = self.critical_receivers if severity == "critical" else self.warning_receivers
        if chosen is not None:
            return list(chosen)
        configured = self.configured_receivers()
        if severity == "critical":
            return configured
        # A warning wakes nobody, unless PagerDuty is the only receiver (then it has severity warning there).
        return [k for k in configured if k != "pagerduty"] or configured


def duration_seconds(duration: str) -> int:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
    return int(duration[:-1]) * units[duration[-1]]
