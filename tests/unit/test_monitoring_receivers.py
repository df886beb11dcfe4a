"""Alerts that outlive the machine (roles/monitoring/config.py alertmanager_config): the Watchdog
routed only to the heartbeat URL, each severity to its receivers with its repeat interval, every
token-carrying URL or key from the vault into a 0600 file and nowhere else; read back with the
real amtool (Debian 12's 0.25.0) and, for the heartbeat's timing and the secret files, the real
Alertmanager of the same package sending to local listeners.
"""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pyinfra_cli  # noqa: F401  (gevent patches threading when this is imported: before the listeners' threads)
import pytest
import yaml

from roles.monitoring import config
from roles.site import SiteError, load_site
from tests.unit.conftest import gpu_node
from tests.unit.test_monitoring_rules import _tool, run

# Shaped like the real ones (none is real): Slack's incoming webhook path, a Healthchecks.io ping
# UUID, a PagerDuty Events API v2 integration key (32 characters).
SLACK = "https://hooks.slack.com/services/T0LAB0001/B0LAB0002/Zq3x9LabNotARealToken01"
HEARTBEAT = "https://hc-ping.com/5c6a1f0e-2b1d-4f7e-9a42-0d7c1b3e9f11"
WEBHOOK = "https://alerts.example.org/hook/a8Kq2Zr7Xw1Lm4Np9Tt0"
ROUTING_KEY = "R0a1b2c3d4e5f60718293a4b5c6d7e8f9"
SMTP = "smtp-pass-Lab42"
SECRETS = {"slack": SLACK, "heartbeat": HEARTBEAT, "hook": WEBHOOK, "pd": ROUTING_KEY, "smtp": SMTP}
RECEIVERS = {
    "monitoring_email_to": "oncall@example.org",
    "monitoring_email_from": "alertmanager@example.org",
    "monitoring_email_smarthost": "smtp.example.org:587",
    "monitoring_email_auth_username": "alertmanager",
    "monitoring_email_auth_password_secret": "smtp",
    "monitoring_webhook_url_secret": "hook",
    "monitoring_slack_api_url_secret": "slack",
    "monitoring_pagerduty_routing_key_secret": "pd",
    "monitoring_heartbeat_url_secret": "heartbeat",
}


def _site(inventory, values=None, **monitor):
    vault = inventory.vault(**(SECRETS if values is None else values))
    return load_site(
        inventory.groups(
            gpu_nodes=[gpu_node(secrets_file=vault)], monitors=[("gpu1", {"secrets_file": vault, **monitor})]
        )
    )


def _problems(inventory, **monitor) -> list[str]:
    with pytest.raises(SiteError) as caught:
        _site(inventory, **monitor)
    return caught.value.problems


def _rendered(site) -> dict:
    return yaml.safe_load(config.alertmanager_config(site.hosts["gpu1"]))


def test_the_watchdog_goes_to_the_heartbeat_only_and_each_severity_to_its_receivers(inventory):
    site = _site(
        inventory,
        **RECEIVERS,
        monitoring_heartbeat_interval="2m",
        monitoring_critical_repeat_interval="30m",
        monitoring_warning_repeat_interval="6h",
    )
    am = _rendered(site)
    watchdog, critical, warning = am["route"]["routes"]
    assert watchdog == {
        "receiver": "heartbeat",
        "matchers": ['alertname="Watchdog"'],
        "group_by": ["alertname"],
        "group_wait": "0s",
        "group_interval": "10s",  # ticks of at most 10 s: a beat every 2 min, at most 10 s late
        "repeat_interval": "2m",
    }
    assert critical["matchers"] == ['severity="critical"'] and critical["repeat_interval"] == "30m"
    assert warning["matchers"] == ['severity="warning"'] and am["route"]["repeat_interval"] == "6h"
    receivers = {r["name"]: r for r in am["receivers"]}
    # The vault's webhook URLs go through the relay on the loopback: Alertmanager never holds them.
    # Each with the relay's token, from a file (the relay answers 401 without it).
    token = {"authorization": {"type": "Bearer", "credentials_file": config.RELAY_TOKEN_FILE}}
    assert receivers["heartbeat"]["webhook_configs"] == [
        {"url": "http://127.0.0.1:9097/heartbeat", "send_resolved": False, "http_config": token}
    ]
    assert receivers["critical"]["webhook_configs"] == [
        {"url": "http://127.0.0.1:9097/webhook", "send_resolved": True, "http_config": token}
    ]
    assert config.relay_receivers(site.hosts["gpu1"]) == {"webhook": "hook", "heartbeat": "heartbeat"}
    assert set(receivers["heartbeat"]) == {"name", "webhook_configs"}  # nobody else gets the Watchdog
    kinds = {"email_configs", "webhook_configs", "slack_configs", "pagerduty_configs"}
    assert set(receivers["critical"]) - {"name"} == kinds
    assert set(receivers["warning"]) - {"name"} == kinds - {"pagerduty_configs"}  # a warning wakes nobody
    assert receivers["critical"]["slack_configs"][0]["api_url_file"] == config.SLACK_URL_FILE
    assert receivers["critical"]["pagerduty_configs"] == [
        {"routing_key_file": config.PAGERDUTY_KEY_FILE, "severity": "critical", "send_resolved": True}
    ]
    assert receivers["critical"]["email_configs"][0]["auth_password_file"] == config.SMTP_PASSWORD_FILE
    # The Watchdog itself: kube-prometheus' rule, severity none, never inhibited.
    (rule,) = [a for a in config.alerts(site, site.hosts["gpu1"]) if a.name == "Watchdog"]
    assert (rule.expr, rule.severity, rule.for_) == ("vector(1)", "none", "0m")


def test_receivers_per_severity_are_settings(inventory):
    site = _site(
        inventory,
        **RECEIVERS,
        monitoring_critical_receivers=["pagerduty", "slack"],
        monitoring_warning_receivers=["email"],
    )
    receivers = {r["name"]: r for r in _rendered(site)["receivers"]}
    assert set(receivers["critical"]) == {"name", "pagerduty_configs", "slack_configs"}
    assert set(receivers["warning"]) == {"name", "email_configs"}


def test_no_secret_in_any_file_alertmanager_reads_and_amtool_accepts_the_config(inventory, tmp_path):
    """No secret in any file the role renders for Prometheus and Alertmanager (alertmanager.yml
    included: the vault's webhook URLs are the relay's, Slack's and PagerDuty's are files), and
    Debian 12's amtool 0.25.0 accepts alertmanager.yml as written."""
    site = _site(inventory, **RECEIVERS)
    mon = site.hosts["gpu1"]
    rendered = config.files(site, mon, "$2b$12$" + "a" * 53)
    for path, text in rendered.items():
        leaked = [key for key, value in SECRETS.items() if value in text]
        assert leaked == [], (path, leaked)
    relay = json.loads(config.relay_config(mon, SECRETS))
    token = config.relay_token(mon, SECRETS)
    assert relay == {"receivers": {"heartbeat": HEARTBEAT, "webhook": WEBHOOK}, "token": token}  # only the relay's file
    assert [path for path, text in rendered.items() if token in text] == []  # the token is a file's too
    amtool = _tool("amtool")
    text = rendered[config.ALERTMANAGER_FILE]
    for path in (config.SLACK_URL_FILE, config.PAGERDUTY_KEY_FILE, config.SMTP_PASSWORD_FILE, config.RELAY_TOKEN_FILE):
        text = text.replace(path, str(tmp_path / Path(path).name))
        (tmp_path / Path(path).name).write_text("x\n")
    (tmp_path / "alertmanager.yml").write_text(text)
    checked = run(amtool, "check-config", "alertmanager.yml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert " - 3 receivers" in checked.stdout, checked.stdout


def test_pagerduty_alone_gets_the_warnings_too_with_their_severity(inventory):
    site = _site(inventory, monitoring_pagerduty_routing_key_secret="pd")
    receivers = {r["name"]: r for r in _rendered(site)["receivers"]}
    assert [c["severity"] for c in receivers["warning"]["pagerduty_configs"]] == ["warning"]
    assert [c["severity"] for c in receivers["critical"]["pagerduty_configs"]] == ["critical"]


def test_without_a_heartbeat_url_the_watchdog_goes_nowhere(inventory):
    site = _site(inventory, monitoring_webhook_url="http://127.0.0.1:9099/alerts")
    receivers = {r["name"]: r for r in _rendered(site)["receivers"]}
    assert receivers["heartbeat"] == {"name": "heartbeat"}  # a receiver that sends nothing
    assert receivers["critical"]["webhook_configs"] == [{"url": "http://127.0.0.1:9099/alerts", "send_resolved": True}]


# --- refusals: one line, the credential never repeated --------------------------------------------


@pytest.mark.parametrize(
    ("url", "what", "secret"),
    [
        (SLACK, "hooks.slack.com", "Zq3x9LabNotARealToken01"),
        (HEARTBEAT, "hc-ping.com", "5c6a1f0e-2b1d-4f7e-9a42-0d7c1b3e9f11"),
        ("https://user:Pa55word@alerts.example.org/hook", "a user name or password", "Pa55word"),
        ("https://alerts.example.org/hook/a8Kq2Zr7Xw1Lm4Np9Tt0", "a path segment shaped like a token", "a8Kq2Zr7Xw1"),
        (
            "https://alerts.example.org/hook/5c6a1f0e-2b1d-4f7e-9a42-0d7c1b3e9f11",
            "a path segment shaped like a token",
            "5c6a1f0e",
        ),
        ("https://alerts.example.org/hook?token=abc123", "a query parameter", "abc123"),
    ],
)
def test_a_plain_webhook_url_with_a_credential_is_refused_without_repeating_it(inventory, url, what, secret):
    (problem,) = _problems(inventory, monitoring_webhook_url=url)
    # The site model's credential rule (detect-secrets' shapes) or, for shapes it does not know,
    # the monitoring rule: either way one line that points at the vault key.
    generic = "holds what looks like a credential" in problem
    assert "monitoring_webhook_url holds" in problem and (generic or what in problem), problem
    assert "monitoring_webhook_url_secret" in problem and "inference-host vault set" in problem
    assert secret not in problem and url not in problem, problem


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:9099/alerts", "https://alerts.example.internal/inference-host", "http://10.0.0.9/a?x=1"]
)
def test_a_plain_webhook_url_without_a_credential_is_kept(inventory, url):
    site = _site(inventory, monitoring_webhook_url=url)
    assert site.hosts["gpu1"].monitoring.webhook_url == url


@pytest.mark.parametrize(
    ("monitor", "parts"),
    [
        (
            {"monitoring_webhook_url": "http://127.0.0.1:9099/a", "monitoring_webhook_url_secret": "hook"},
            ["both set"],
        ),
        ({"monitoring_heartbeat_url_secret": "heartbeat"}, ["no receiver"]),
        (
            {"monitoring_webhook_url_secret": "hook", "monitoring_critical_receivers": ["pagerduty"]},
            ["monitoring_critical_receivers = ['pagerduty'] names pagerduty", "configured ones: webhook"],
        ),
        (
            {"monitoring_webhook_url_secret": "hook", "monitoring_critical_receivers": []},
            ["sends critical alerts nowhere"],
        ),
        (
            {"monitoring_webhook_url_secret": "hook", "monitoring_warning_receivers": ["sms"]},
            ["monitoring_warning_receivers = ['sms']", "email, webhook, slack, pagerduty"],
        ),
        (
            {"monitoring_slack_api_url_secret": "slack_url"},
            ["monitoring_slack_api_url_secret = 'slack_url' names no secret"],
        ),
        ({"monitoring_webhook_url_secret": "hook", "monitoring_heartbeat_interval": "1 min"}, ["a Prometheus"]),
    ],
)
def test_bad_receiver_settings_are_named_in_one_line(inventory, monitor, parts):
    (problem,) = _problems(inventory, **monitor)
    for part in parts:
        assert part in problem, (part, problem)


@pytest.mark.parametrize(
    ("window", "scrape", "parts"),
    [
        (601, "15s", ["monitoring_xid_window_s = 601", "1 to 600 seconds"]),
        (
            10,
            "15s",
            [
                "monitoring_xid_window_s = 10 is shorter than",
                "gpu1's monitoring_scrape_interval = '15s'",
                "expected 15 to 600 seconds",
            ],
        ),
    ],
)
def test_the_xid_window_lies_between_the_scrape_interval_and_dcgms_keep_age(inventory, window, scrape, parts):
    vault = inventory.vault(**SECRETS)
    path = inventory.groups(
        gpu_nodes=[gpu_node(secrets_file=vault, monitoring_xid_window_s=window)],
        monitors=[("gpu1", {"secrets_file": vault, "monitoring_scrape_interval": scrape, **RECEIVERS})],
    )
    with pytest.raises(SiteError) as caught:
        load_site(path)
    (problem,) = caught.value.problems
    for part in parts:
        assert part in problem, (part, problem)


def test_an_xid_window_of_the_scrape_interval_and_of_600_s_are_valid(inventory):
    vault = inventory.vault(**SECRETS)
    for window in (15, 600):
        path = inventory.groups(
            f"site{window}.py",
            gpu_nodes=[gpu_node(secrets_file=vault, monitoring_xid_window_s=window)],
            monitors=[("gpu1", {"secrets_file": vault, **RECEIVERS})],
        )
        assert load_site(path).hosts["gpu1"].monitoring.xid_window_s == window


# --- the real Alertmanager sends the beats, and reads the secret files -----------------------------


class _Recorder(BaseHTTPRequestHandler):
    received: list = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.received.append((time.monotonic(), self.path, json.loads(body or b"{}")))
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"OK")

    def log_message(self, *args):
        pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Refuser(BaseHTTPRequestHandler):
    """A receiver that is down for maintenance and says where it was asked (some do)."""

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = f"maintenance, {self.path} not served\n".encode()
        self.send_response(503)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def _serve(handler) -> tuple[ThreadingHTTPServer, str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def _token_file(directory: Path) -> Path:
    """Where these tests keep Alertmanager's copy of the relay token (config.RELAY_TOKEN_FILE on a host)."""
    return directory / Path(config.RELAY_TOKEN_FILE).name


def _local(text: str, directory: Path) -> str:
    """alertmanager.yml as the role writes it, with the relay token's file in `directory`."""
    return text.replace(config.RELAY_TOKEN_FILE, str(_token_file(directory)))


def _relay(site, values: dict) -> tuple[ThreadingHTTPServer, list[str]]:
    """The role's relay (files/alert_relay.py) on the monitor's relay port, in this process, from
    the config file the role writes, requiring its token as main() does; the token also written,
    as the role writes it, where _local points Alertmanager; its log lines collected."""
    from tests.unit.test_alert_relay import relay_program as alert_relay

    mon = site.hosts["gpu1"]
    directory = Path(values.pop("_dir"))
    path = directory / "alert-relay.json"
    path.write_text(config.relay_config(mon, values))
    _token_file(directory).write_text(config.relay_token(mon, values) + "\n")
    lines: list[str] = []
    receivers, token = alert_relay.load_config(str(path))
    server = alert_relay.serve(receivers, "127.0.0.1", mon.monitoring.alert_relay_port, 3.0, lines.append, token)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, lines


def _run_alertmanager(tmp_path, text: str, alerts: list[dict], seconds: float) -> str:
    """Debian 12's Alertmanager 0.25.0 on alertmanager.yml = text, given the alerts, for `seconds`;
    returns what it logged (stderr: the journal's content under systemd)."""
    binary = _tool("prometheus-alertmanager")
    (tmp_path / "alertmanager.yml").write_text(_local(text, tmp_path))
    port = _free_port()
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={tmp_path / 'alertmanager.yml'}",
            f"--storage.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        api = f"http://127.0.0.1:{port}/api/v2/alerts"
        deadline = time.monotonic() + 20
        while True:
            try:
                request = urllib.request.Request(
                    api, json.dumps(alerts).encode(), {"Content-Type": "application/json"}, method="POST"
                )
                urllib.request.urlopen(request, timeout=2).read()
                break
            except OSError:
                assert time.monotonic() < deadline and process.poll() is None, "Alertmanager did not start"
                time.sleep(0.2)
        time.sleep(seconds)
    finally:
        process.terminate()
        _, err = process.communicate(timeout=10)
    return err.decode(errors="replace")


WATCHDOG_AND_CRITICAL = [
    {"labels": {"alertname": "Watchdog", "severity": "none"}},
    {"labels": {"alertname": "EngineDown", "severity": "critical", "host": "gpu1"}},
]


def test_the_real_alertmanager_beats_at_the_interval_through_the_relay(inventory, tmp_path):
    """Debian 12's Alertmanager 0.25.0 with the role's config (the heartbeat through the relay,
    Slack's URL from api_url_file): the Watchdog reaches the heartbeat's URL every
    monitoring_heartbeat_interval (2 s here, ticks of 1 s), a critical alert reaches Slack's
    listener at the path in the file, and nothing but the Watchdog reaches the heartbeat."""
    server, base = _serve(_Recorder)
    _Recorder.received = []
    values = {"heartbeat": f"{base}/ping/5c6a1f0e", "slack": f"{base}/services/T0/B0/tok", "hook": f"{base}/hook"}
    site = _site(
        inventory,
        values=values,
        monitoring_webhook_url_secret="hook",
        monitoring_slack_api_url_secret="slack",
        monitoring_heartbeat_url_secret="heartbeat",
        monitoring_heartbeat_interval="2s",
        monitoring_alert_group_wait="1s",
        monitoring_critical_receivers=["slack"],
        monitoring_alert_relay_port=_free_port(),
    )
    relay, relay_log = _relay(site, {**values, "_dir": tmp_path})
    text = config.alertmanager_config(site.hosts["gpu1"])
    (tmp_path / "inference-host-slack.url").write_text(values["slack"] + "\n")  # as the role writes it
    posted = time.monotonic()
    try:
        _run_alertmanager(
            tmp_path,
            text.replace(config.SLACK_URL_FILE, str(tmp_path / "inference-host-slack.url")),
            WATCHDOG_AND_CRITICAL,
            9,
        )
    finally:
        relay.shutdown()
        server.shutdown()
    beats = [at - posted for at, path, _ in _Recorder.received if path == "/ping/5c6a1f0e"]
    names = {path: [a["labels"]["alertname"] for a in body.get("alerts", [])] for _, path, body in _Recorder.received}
    assert all(n == ["Watchdog"] for p, n in names.items() if p == "/ping/5c6a1f0e"), names
    assert len(beats) >= 3, beats
    gaps = [b - a for a, b in zip(beats, beats[1:], strict=False)]
    assert all(1.5 <= g <= 3.5 for g in gaps), gaps  # every 2 s, within a 1 s tick
    assert "/services/T0/B0/tok" in names, names  # the Slack URL came from api_url_file, trimmed
    assert "/hook" not in names  # criticals go to Slack only here
    assert relay_log == [], relay_log  # deliveries that succeed are not logged
    print(f"\nheartbeats at {[round(b, 1) for b in beats]} s; gaps {[round(g, 1) for g in gaps]} s")


HEARTBEAT_TOKEN = "9f2c4e71b3a84d0c8e5f6a7b1c2d3e4f"  # shaped like a Healthchecks ping UUID
HOOK_TOKEN = "xoxb0Lab7Tq9Wz3Kp5Rm8Vn2"


@pytest.mark.parametrize("form", ["relay", "direct"], ids=["the relay", "planted: the URL in alertmanager.yml"])
def test_a_failed_delivery_logs_no_url(inventory, tmp_path, form):
    """The leak this relay closes. Debian 12's Alertmanager 0.25.0 fails to deliver: the heartbeat's
    receiver refuses connections, the webhook's answers 503 with its path in the body. Through the
    relay neither token reaches Alertmanager's log nor the relay's, and the relay says which
    receiver failed and how. The planted form (the URLs inline, as the role wrote them for 0.25
    before the relay) shows that this test sees the leak: Alertmanager logs `Post "<url>"`."""
    refuser, base = _serve(_Refuser)
    closed = _free_port()  # nothing listens there
    values = {"heartbeat": f"http://127.0.0.1:{closed}/ping/{HEARTBEAT_TOKEN}", "hook": f"{base}/hook/{HOOK_TOKEN}"}
    site = _site(
        inventory,
        values=values,
        monitoring_webhook_url_secret="hook",
        monitoring_heartbeat_url_secret="heartbeat",
        monitoring_heartbeat_interval="2s",
        monitoring_alert_group_wait="1s",
        monitoring_alert_relay_port=_free_port(),
    )
    mon = site.hosts["gpu1"]
    text = config.alertmanager_config(mon)
    relay, relay_log = _relay(site, {**values, "_dir": tmp_path})
    if form == "direct":
        text = text.replace(config.relay_url(mon, "heartbeat"), values["heartbeat"])
        text = text.replace(config.relay_url(mon, "webhook"), values["hook"])
    try:
        logged = _run_alertmanager(tmp_path, text, WATCHDOG_AND_CRITICAL, 5)
    finally:
        relay.shutdown()
        refuser.shutdown()
    assert "Notify attempt failed" in logged, logged  # the deliveries did fail
    leaked = [t for t in (HEARTBEAT_TOKEN, HOOK_TOKEN) if t in logged + "\n".join(relay_log)]
    failed = [line for line in logged.splitlines() if "Notify attempt failed" in line]
    print("\n" + "\n".join([*failed[:2], *relay_log[:2]]))
    if form == "direct":
        assert leaked == [HEARTBEAT_TOKEN, HOOK_TOKEN], logged  # the detector sees the old leak
        return
    assert leaked == [], logged + "\n".join(relay_log)
    assert "receiver heartbeat: delivery failed: connection refused (Alertmanager retries)" in relay_log, relay_log
    assert "receiver webhook: delivery failed: HTTP 503 (Alertmanager retries)" in relay_log, relay_log
    assert "relay: receiver webhook: HTTP 503" in logged, logged  # Alertmanager's line names the receiver only
    assert "127.0.0.1:" + str(closed) not in logged + "\n".join(relay_log)


@pytest.mark.parametrize(
    "value",
    ["hooks.slack.com/services/T/B/x", "https://a.example/x\nreceivers: []", "https://a.example/x y", "ftp://x/y"],
)
def test_a_vault_url_that_is_not_one_url_stops_the_deploy_without_showing_it(inventory, value):
    """Alertmanager refuses its whole file for one bad URL, and stops every alert: refused at load,
    before a host is contacted (roles/site/loading.py _require_decryptable), value not shown."""
    from roles.site.loading import receiver_url_problems

    site = _site(inventory, **RECEIVERS)
    (problem,) = receiver_url_problems(site, {**SECRETS, "heartbeat": value})
    assert "secret 'heartbeat' (monitoring_heartbeat_url_secret) is not one http(s) URL" in problem
    assert value not in problem and "a.example" not in problem
    assert receiver_url_problems(site, {**SECRETS, "heartbeat": HEARTBEAT + "\n"}) == []  # `echo URL |`


def test_the_relays_config_reads_back_as_itself(inventory, tmp_path):
    """The relay's file is JSON through json.dumps: a URL with JSON's and YAML's own characters, or
    beyond ASCII in its query's escapes, is the same string when the relay loads it."""
    from tests.unit.test_alert_relay import relay_program as alert_relay

    site = _site(inventory, **RECEIVERS)
    hostile = "https://a.example/x?q=1&r=%E2%82%AC#:{}[]',\"*!|>%@`\\"
    (tmp_path / "relay.json").write_text(config.relay_config(site.hosts["gpu1"], {**SECRETS, "heartbeat": hostile}))
    assert alert_relay.load_receivers(str(tmp_path / "relay.json")) == {"heartbeat": hostile, "webhook": WEBHOOK}


@pytest.mark.parametrize(
    "name", ["pve.example.internal", "monitor.example.internal"], ids=["the node", "a second machine"]
)
def test_a_monitor_on_another_host_is_one_line_of_the_shipped_inventory(tmp_path, name):
    """docs/monitoring.md: put another machine's name on prod.py's monitors line; the site loads
    and that monitor scrapes the GPU guest's exporters and engine by the guest's address."""
    import shutil

    from tests.unit.conftest import PROJECT_ROOT

    folder = tmp_path / "inventory"
    shutil.copytree(PROJECT_ROOT / "inventory", folder)
    prod = folder / "prod.py"
    line = '    (\n        "gpu-lxc.example.internal",\n        {  # a separate monitor: its host name here instead'
    text = prod.read_text()
    assert text.count(line) == 1
    prod.write_text(text.replace(line, line.replace("gpu-lxc.example.internal", name)))
    site = load_site(prod)
    (monitor,) = site.group("monitors")
    assert monitor.name == name
    jobs = {j["job_name"]: [c["targets"][0] for c in j["static_configs"]] for j in config.scrape_jobs(site, monitor)}
    assert jobs["engine"] == ["gpu-lxc.example.internal:30000"]
    assert jobs["dcgm"] == ["gpu-lxc.example.internal:9400"]
    assert "gpu-lxc.example.internal:9100" in jobs["node"] and "127.0.0.1:9100" in jobs["node"]


def test_the_heartbeat_settings_description_says_what_the_route_gets():
    """The route's group_interval is half the interval, at most 10 s and at least 1 s
    (config.heartbeat_tick); repeat_interval is the interval. The setting's description (and
    docs/settings.md, generated from it) says so, not that group_interval is the interval."""
    from roles.site.sections.monitoring import MonitoringSettings

    assert [config.heartbeat_tick(i) for i in ("1m", "2m", "12s", "1s")] == ["10s", "10s", "6s", "1s"]
    description = MonitoringSettings.model_fields["heartbeat_interval"].description
    assert "its route's repeat_interval" in description
    assert "group_interval, the tick at which Alertmanager checks whether that much has passed, is half of it" in (
        description
    )
    assert "at most 10 s (at least 1 s)" in description and "group_interval and repeat_interval" not in description
