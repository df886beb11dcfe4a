"""The lab's dead man's switch stand-in (lab/standins/heartbeat) answers as Healthchecks.io v4.3's
ping endpoint does (hc/api/views.py ping, hc/api/urls.py) and records what it accepts; the real
Alertmanager (Debian 12's 0.25.0) reaches it with the role's heartbeat configuration."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from lab.standins import heartbeat
from tests.unit.conftest import PROJECT_ROOT

CHECK = heartbeat.check_uuid("unit")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def standin(tmp_path):
    port, log = _free_port(), tmp_path / "pings.jsonl"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "lab.standins.heartbeat.server",
            "--port",
            str(port),
            "--check",
            CHECK,
            "--log",
            str(log),
        ],
        cwd=PROJECT_ROOT,
    )
    base = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            urllib.request.urlopen(base + "/ready", timeout=1)
            break
        except OSError:
            time.sleep(0.05)
    yield base, heartbeat.Pings(log)
    process.terminate()
    process.wait(5)


def _call(url: str, body: bytes | None = None, method: str = "POST") -> tuple[int, str, dict]:
    request = urllib.request.Request(url, data=body, method=method)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read().decode(), dict(response.headers)
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(), dict(error.headers)


def test_a_ping_of_a_known_check_is_ok_and_recorded(standin):
    base, pings = standin
    status, text, headers = _call(f"{base}/ping/{CHECK}", b'{"alerts": []}')
    assert (status, text) == (200, "OK")
    assert headers["Ping-Body-Limit"] == "10000" and headers["Access-Control-Allow-Origin"] == "*"
    (ping,) = pings.all()
    assert (ping["check"], ping["method"], ping["action"], ping["body"]) == (CHECK, "POST", "success", '{"alerts": []}')


def test_unknown_checks_bad_exit_statuses_and_long_bodies_as_healthchecks(standin):
    base, pings = standin
    other = "00000000-0000-4000-8000-000000000000"
    assert _call(f"{base}/ping/{other}")[:2] == (404, "not found")
    assert _call(f"{base}/ping/{CHECK}/256")[:2] == (400, "invalid url format")
    assert _call(f"{base}/ping/{CHECK}/3")[:2] == (200, "OK")
    assert _call(f"{base}/ping/{CHECK}/fail", method="GET")[:2] == (200, "OK")
    assert _call(f"{base}/ping/{CHECK}", b"x" * 12000)[:2] == (200, "OK")
    actions = [(p["action"], len(p["body"])) for p in pings.all()]
    assert actions == [("fail", 0), ("fail", 0), ("success", 10000)]  # PING_BODY_LIMIT


def test_the_lab_url_is_the_prefixs_port_and_check():
    url = heartbeat.ping_url("ih-lab")
    assert url.endswith(f":{heartbeat.port_for('ih-lab')}/ping/{heartbeat.check_uuid('ih-lab')}")
    assert 50000 <= heartbeat.port_for("ih-lab") < 55000
    assert heartbeat.check_uuid("ih-lab") == heartbeat.check_uuid("ih-lab") != heartbeat.check_uuid("ih-x")


def test_alertmanagers_watchdog_reaches_it(standin, tmp_path, inventory):
    """The role's heartbeat route with Debian 12's Alertmanager 0.25.0, run for real through the
    role's alert relay: the stand-in records Watchdog posts from Alertmanager (its User-Agent)."""
    from roles.monitoring import config
    from roles.site import load_site
    from tests.unit.conftest import gpu_node
    from tests.unit.test_monitoring_receivers import _free_port as free
    from tests.unit.test_monitoring_receivers import _local, _relay
    from tests.unit.test_monitoring_rules import _tool

    binary = _tool("prometheus-alertmanager")
    base, pings = standin
    vault = inventory.vault(hb=f"{base}/ping/{CHECK}")
    site = load_site(
        inventory.groups(
            gpu_nodes=[gpu_node(secrets_file=vault)],
            monitors=[
                (
                    "gpu1",
                    {
                        "secrets_file": vault,
                        "monitoring_webhook_url": "http://127.0.0.1:9/none",
                        "monitoring_heartbeat_url_secret": "hb",
                        "monitoring_heartbeat_interval": "2s",
                        "monitoring_alert_relay_port": free(),
                    },
                )
            ],
        )
    )
    relay, _ = _relay(site, {"hb": f"{base}/ping/{CHECK}", "_dir": tmp_path})
    (tmp_path / "am.yml").write_text(_local(config.alertmanager_config(site.hosts["gpu1"]), tmp_path))
    port = free()
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={tmp_path / 'am.yml'}",
            f"--storage.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        alert = json.dumps([{"labels": {"alertname": "Watchdog", "severity": "none"}}]).encode()
        for _ in range(100):
            try:
                urllib.request.urlopen(
                    urllib.request.Request(
                        f"http://127.0.0.1:{port}/api/v2/alerts", alert, {"Content-Type": "application/json"}
                    ),
                    timeout=1,
                )
                break
            except OSError:
                time.sleep(0.1)
        deadline = time.monotonic() + 10
        while len(pings.all()) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        process.terminate()
        process.wait(10)
        relay.shutdown()
    got = pings.all()
    assert len(got) >= 2, got
    assert all(p["user_agent"].startswith("Alertmanager/") for p in got)
    assert {a["labels"]["alertname"] for p in got for a in json.loads(p["body"])["alerts"]} == {"Watchdog"}
