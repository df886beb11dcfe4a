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
PrometheusDuration = Annotated[
    str, check(PROMETHEUS_DURATION_RE.match, "a Prometheus duration like 30s, 5m, 15d (one number and one unit)")
]
EMAIL_RE = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")


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
    exporter_address: IpAddress = Field(
        "0.0.0.0",
        description=(
            "Address the exporters on each gpu node bind (node_exporter, DCGM's exporter):"
            " where the monitors reach them."
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
    xid_window_s: Annotated[int, check(lambda v: 10 <= v <= 86400, "10 to 86400 seconds")] = Field(
        300,
        description=(
            "DCGM's exporter counts each GPU's Xids over this window (its -x, default 5 minutes): GpuXidError fires on"
            " a new Xid and resolves this long after the last one."
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
    webhook_url: Url | None = Field(None, description="Alertmanager sends alerts to this webhook (webhook_config).")
    email_to: Annotated[str, check(EMAIL_RE.match, "an e-mail address")] | None = Field(
        None, description="Alertmanager sends alerts to this e-mail address."
    )
    email_from: Annotated[str, check(EMAIL_RE.match, "an e-mail address")] | None = Field(
        None, description="The sender address of alert e-mails."
    )
    email_smarthost: (
        Annotated[str, check(re.compile(r"^[^\s:]+:\d{1,5}$").match, "host:port of the SMTP relay")] | None
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
        units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
        return int(self.check_interval[:-1]) * units[self.check_interval[-1]]
