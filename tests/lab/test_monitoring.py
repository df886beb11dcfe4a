"""roles/monitoring's Prometheus side in the lab: the monitors group deployed for real (Debian 12's
prometheus, prometheus-alertmanager and prometheus-node-exporter at their pinned versions, under
systemd), basic auth in front of both web endpoints, Prometheus scraping node_exporter, a planted
failing check firing HealthCheckFailing at a webhook receiver and clearing when mended, and a
second deploy changing nothing. Times are measured and printed (-s shows them).

The gpu side (DCGM exporter stand-in, the checks' timer) is covered by unit and plan tests only.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from roles.site import load_site
from tests.lab.harness import PROJECT_ROOT, require_docker, run_deploy

pytestmark = pytest.mark.lab

INVENTORY = PROJECT_ROOT / "tests" / "lab" / "inventories" / "monitor.py"
TEXTFILE = "/var/lib/prometheus/node-exporter/planted.prom"
RECEIVED = "/var/tmp/alerts.jsonl"
RECEIVER = f"""
import http.server, json
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        with open("{RECEIVED}", "a") as out:
            out.write(json.dumps(json.loads(body)) + "\\n")
        self.send_response(200); self.end_headers()
http.server.HTTPServer(("127.0.0.1", 9099), H).serve_forever()
"""


def _exec(name: str, command: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["docker", "exec", name, "sh", "-c", command], capture_output=True, text=True, timeout=120)
    if check:
        assert done.returncode == 0, done.stdout + done.stderr
    return done


@pytest.fixture(scope="module")
def monitor():
    require_docker()
    import lab

    lab.up(("mon",))
    name = lab.container_name("mon")
    # The test's own tools in the container: curl for the API, python3 for the webhook receiver.
    _exec(name, "command -v curl >/dev/null && command -v python3 >/dev/null || (apt-get update -qq &&"
                " DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends curl python3 >/dev/null)")
    _exec(name, f"rm -f {RECEIVED}; systemctl stop ih-webhook 2>/dev/null; systemctl reset-failed ih-webhook"
                " 2>/dev/null; systemd-run --unit ih-webhook python3 -c " + repr(RECEIVER).replace("\\n", "\n"),
          check=False)
    started = time.monotonic()
    first = run_deploy(INVENTORY, timeout=900)
    first_s = time.monotonic() - started
    assert first.returncode == 0, first.explain()
    started = time.monotonic()
    second = run_deploy(INVENTORY, timeout=900)
    print(f"\nmonitor deploy: first {first_s:.0f} s, second (no change) {time.monotonic() - started:.0f} s")
    assert second.returncode == 0, second.explain()
    yield name, second
    lab.down(("mon",))


def _password() -> str:
    import lab

    vault, _ = lab.throwaway_vault()
    return lab.vault_secret(vault, "monitoring_web_password")


def _api(name: str, path: str, auth: bool = True) -> tuple[str, str]:
    """(HTTP status, body) of Prometheus' API inside the container; the password goes in a
    curl config file on stdin, never on a command line."""
    config = f'user = "inference-host:{_password()}"\n' if auth else ""
    done = subprocess.run(["docker", "exec", "-i", name, "sh", "-c",
                           f"curl -s -K - -o /tmp/body -w '%{{http_code}}' 'http://127.0.0.1:9090{path}'; cat /tmp/body"],
                          input=config, capture_output=True, text=True, timeout=30)
    return done.stdout[:3], done.stdout[3:]


def test_the_pinned_packages_run_under_systemd(monitor):
    name, _ = monitor
    pins = load_site(INVENTORY).stack.monitoring.for_distro("debian12")
    for package, version in pins.items():
        shown = _exec(name, f"dpkg-query -W -f '${{Version}}' {package}").stdout
        assert shown == version, (package, shown)
    for unit in ("prometheus", "prometheus-alertmanager", "prometheus-node-exporter"):
        assert _exec(name, f"systemctl is-active {unit}", check=False).stdout.strip() == "active", unit


def test_basic_auth_guards_prometheus(monitor):
    name, _ = monitor
    assert _api(name, "/api/v1/status/buildinfo", auth=False)[0] == "401"
    status, body = _api(name, "/api/v1/status/buildinfo")
    assert status == "200" and json.loads(body)["data"]["version"].startswith("2.42.0"), body
    assert _exec(name, "stat -c '%a %U' /etc/prometheus/web.yml").stdout.strip() == "600 prometheus"


def test_prometheus_scrapes_node_exporter_and_loads_the_rules(monitor):
    name, _ = monitor
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        targets = json.loads(_api(name, "/api/v1/targets")[1])["data"]["activeTargets"]
        if targets and all(t["health"] == "up" for t in targets):
            break
        time.sleep(2)
    assert [(t["labels"]["job"], t["labels"]["host"], t["health"]) for t in targets] == [
        ("node", name and f"@docker/{name}", "up")], targets
    rules = json.loads(_api(name, "/api/v1/rules")[1])["data"]["groups"][0]["rules"]
    assert {"HealthCheckFailing", "InferenceHostDown", "DiskFilling"} <= {r["name"] for r in rules}


def _firing(name: str) -> list[dict]:
    return [a for a in json.loads(_api(name, "/api/v1/alerts")[1])["data"]["alerts"]
            if a["labels"]["alertname"] == "HealthCheckFailing" and a["state"] == "firing"]


def test_a_failing_check_alerts_the_webhook_and_clears_when_mended(monitor):
    name, _ = monitor
    planted = ('inference_host_check_ok{suite="service",check="unit active"} 0\n'
               'inference_host_check_failure_info{suite="service",check="unit active",'
               'detail="expected inference-engine.service active; found failed; what to do: journalctl -u inference-engine"} 1\n')
    _exec(name, f"printf '%s' '{planted}' > {TEXTFILE}.tmp && mv {TEXTFILE}.tmp {TEXTFILE}")
    started = time.monotonic()
    received = []
    while time.monotonic() - started < 180 and not received:
        lines = _exec(name, f"cat {RECEIVED} 2>/dev/null", check=False).stdout.splitlines()
        received = [json.loads(line) for line in lines if '"HealthCheckFailing"' in line]
        time.sleep(3)
    fired_s = time.monotonic() - started
    assert received, "no HealthCheckFailing reached the webhook within 180 s"
    alert = received[0]["alerts"][0]
    assert alert["status"] == "firing" and alert["labels"]["check"] == "unit active"
    assert "what to do: journalctl -u inference-engine" in alert["annotations"]["description"]
    _exec(name, f"printf '%s' 'inference_host_check_ok{{suite=\"service\",check=\"unit active\"}} 1\n' > {TEXTFILE}.tmp"
                f" && mv {TEXTFILE}.tmp {TEXTFILE}")
    started = time.monotonic()
    while time.monotonic() - started < 120 and _firing(name):
        time.sleep(2)
    cleared_s = time.monotonic() - started
    print(f"\nHealthCheckFailing: at the webhook {fired_s:.0f} s after the plant"
          f" (for: 30s, group_wait 30s), cleared in Prometheus {cleared_s:.0f} s after the mend")
    assert not _firing(name)
    _exec(name, f"rm -f {TEXTFILE}")


def test_a_second_deploy_changes_nothing(monitor):
    _, second = monitor
    assert second.changed == [], second.changed
