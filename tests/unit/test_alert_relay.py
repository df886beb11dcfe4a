"""The alert relay (roles/monitoring/files/alert_relay.py), as it runs on a monitor: loads the
config the role writes, forwards Alertmanager's webhook to the receiver's URL, answers with the
status Alertmanager's retry rules expect, bounds every wait, and logs the receiver's name and the
outcome, never the URL, its host or the receiver's answer. Its unit passes systemd-analyze verify."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pyinfra_cli  # noqa: F401  (gevent patches threading when this is imported: before the relays' threads)
import pytest
import yaml

from roles.monitoring import config, units
from roles.shared import templates
from roles.site import load_site
from tests.unit.conftest import PROJECT_ROOT, gpu_node

SPEC = importlib.util.spec_from_file_location("alert_relay", PROJECT_ROOT / config.RELAY_SOURCE)
relay_program = importlib.util.module_from_spec(SPEC)
sys.modules["alert_relay"] = relay_program
SPEC.loader.exec_module(relay_program)

TOKEN = "Tq9Wz3Kp5Rm8Vn2Lab0NotReal"


class _Receiver(BaseHTTPRequestHandler):
    """A receiver whose answer each test sets: status, body (it echoes the path), or a hang."""

    status = 200
    hang = 0.0
    received: list = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.received.append((self.path, body, dict(self.headers)))
        time.sleep(self.hang)
        answer = f"seen {self.path}".encode()
        self.send_response(self.status)
        if self.status in (301, 302):
            self.send_header("Location", f"http://127.0.0.1:1/moved/{TOKEN}")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass


@pytest.fixture
def receiver():
    _Receiver.status, _Receiver.hang, _Receiver.received = 200, 0.0, []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def relay():
    """Start the relay on given receivers; yields (start, log lines)."""
    lines: list[str] = []
    servers = []

    def start(receivers: dict[str, str], timeout: float = 2.0, token: str | None = None) -> str:
        server = relay_program.serve(receivers, "127.0.0.1", 0, timeout, lines.append, token=token)
        servers.append(server)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start, lines
    for server in servers:
        server.shutdown()


def _post(url: str, body: bytes = b'{"alerts": []}', timeout: float = 15, token: str | None = None) -> tuple[int, str]:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    request = urllib.request.Request(url, body, headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_a_delivery_is_forwarded_as_alertmanager_sent_it(receiver, relay):
    start, lines = relay
    base = start({"heartbeat": f"{receiver}/ping/{TOKEN}?create=0"})
    body = json.dumps({"version": "4", "alerts": [{"labels": {"alertname": "Watchdog"}}]}).encode()
    assert _post(f"{base}/heartbeat", body) == (200, "relay: receiver heartbeat: HTTP 200\n")
    ((path, got, headers),) = _Receiver.received
    assert (path, got, headers["Content-Type"]) == (f"/ping/{TOKEN}?create=0", body, "application/json")
    assert lines == []  # a success after no failure is not logged


@pytest.mark.parametrize(
    ("status", "expected", "retried"),
    [(503, 503, "retries"), (500, 500, "retries"), (404, 404, "does not retry"), (302, 502, "retries")],
)
def test_a_refusal_is_answered_with_its_status_and_logged_without_the_url(receiver, relay, status, expected, retried):
    """Alertmanager retries a 5xx and not a 4xx (notify/util.go Retrier.Check, v0.25.0): the relay
    passes the receiver's status on; a redirect is not followed (502). Neither the relay's answer
    (which Alertmanager logs) nor its own line holds the path, the token or the receiver's body."""
    _Receiver.status = status
    start, lines = relay
    base = start({"webhook": f"{receiver}/hook/{TOKEN}"})
    code, text = _post(f"{base}/webhook")
    assert code == expected
    what = f"HTTP {status}" + (" (a redirect, not followed)" if status == 302 else "")
    assert text == f"relay: receiver webhook: {what}\n"
    assert lines == [f"receiver webhook: delivery failed: {what} (Alertmanager {retried})"]
    assert len(_Receiver.received) == 1  # the redirect was not followed
    _Receiver.status = 200
    assert _post(f"{base}/webhook")[0] == 200
    assert lines[-1] == "receiver webhook: delivered again (HTTP 200)"
    assert TOKEN not in text + "".join(lines) and "hook" not in "".join(lines).replace("webhook", "")


def test_network_failures_are_named_not_quoted(relay):
    """Connection refused and an unresolvable name: categories, never the exception's text (which
    holds the host: urllib's `<urlopen error ...>`, http.client's InvalidURL the whole URL)."""
    start, lines = relay
    closed = _free_port()
    base = start({"heartbeat": f"http://127.0.0.1:{closed}/{TOKEN}", "webhook": f"http://{TOKEN.lower()}.invalid/x"})
    assert _post(f"{base}/heartbeat") == (502, "relay: receiver heartbeat: connection refused\n")
    assert _post(f"{base}/webhook") == (502, "relay: receiver webhook: name resolution failed\n")
    assert lines == [
        "receiver heartbeat: delivery failed: connection refused (Alertmanager retries)",
        "receiver webhook: delivery failed: name resolution failed (Alertmanager retries)",
    ]
    assert str(closed) not in "".join(lines)


def test_a_receiver_that_never_answers_is_a_named_timeout_within_the_bound(receiver, relay):
    """A receiver that accepts and never answers: 504 within the per-operation timeout (1 s here),
    well before twice it, the bound of a whole delivery."""
    _Receiver.hang = 5
    start, lines = relay
    base = start({"heartbeat": f"{receiver}/ping/{TOKEN}"}, timeout=1.0)
    began = time.monotonic()
    code, text = _post(f"{base}/heartbeat")
    took = time.monotonic() - began
    assert (code, text) == (504, "relay: receiver heartbeat: no answer within 1 s\n")
    assert took < 2.5, took
    assert lines == ["receiver heartbeat: delivery failed: no answer within 1 s (Alertmanager retries)"]


def test_unknown_paths_and_bad_requests_are_refused_without_echo(receiver, relay):
    start, lines = relay
    base = start({"heartbeat": f"{receiver}/ping"})
    assert _post(f"{base}/{TOKEN}") == (404, "relay: no such receiver\n")
    assert _post(f"{base}/heartbeat/../webhook")[0] == 404
    request = urllib.request.Request(f"{base}/heartbeat", method="GET")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=5)
    assert refused.value.code == 405
    with socket.create_connection(("127.0.0.1", int(base.rsplit(":", 1)[1])), timeout=5) as raw:
        raw.sendall(b"POST /heartbeat HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n\r\n")
        assert raw.recv(100).startswith(b"HTTP/1.1 413")
    assert _Receiver.received == [] and lines == []


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "not JSON"),
        ("[1, 2]", 'expected {"receivers"'),
        ('{"receivers": {}}', "at least one receiver"),
        ('{"receivers": {"Bad Name": "https://a.example/' + TOKEN + '"}}', "a receiver name is not"),
        ('{"receivers": {"hook": "ftp://a.example/' + TOKEN + '"}}', "receiver hook: its value is not one http(s) URL"),
        ('{"receivers": {"hook": "https://a.example/' + TOKEN + '\\nX: y"}}', "receiver hook: its value is not"),
        ('{"receivers": {"hook": "https://a.example/' + TOKEN + ' x"}}', "receiver hook: its value is not"),
        ('{"receivers": {"hook": 7}}', "receiver hook: its value is not"),
        ('{"receivers": {"hook": "https://a.example/x"}, "token": "short"}', "expected a token of at least 32"),
        ('{"receivers": {"hook": "https://a.example/x"}, "token": ""}', "expected a token of at least 32"),
    ],
)
def test_a_bad_config_stops_the_relay_in_one_line_without_the_value(tmp_path, text, says):
    path = tmp_path / "relay.json"
    if text.startswith('{"receivers": {"') and "token" not in text:
        text = text[:-1] + ', "token": "' + "t" * 40 + '"}'
    path.write_text(text)
    run = subprocess.run(
        [sys.executable, "-I", str(PROJECT_ROOT / config.RELAY_SOURCE), "--config", str(path), "--port", "1"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert run.returncode == 2, run.stderr
    (line,) = run.stderr.splitlines()
    assert line.startswith(f"alert relay: {path}: ") and says in line, line
    assert TOKEN not in line and "a.example" not in line


def test_the_relay_runs_as_its_unit_says(tmp_path, receiver):
    """The unit's own command line (python3 -I, the script, the config, the port), run from this
    checkout: it serves and forwards."""
    relay_token = "relay-token-of-this-test-0123456789abcdef"
    (tmp_path / "relay.json").write_text(
        json.dumps({"receivers": {"heartbeat": f"{receiver}/p/{TOKEN}"}, "token": relay_token})
    )
    port = _free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-I",
            "-B",
            str(PROJECT_ROOT / config.RELAY_SOURCE),
            "--config",
            str(tmp_path / "relay.json"),
            "--port",
            str(port),
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                refused = _post(f"http://127.0.0.1:{port}/heartbeat", timeout=5)[0]
                status = _post(f"http://127.0.0.1:{port}/heartbeat", timeout=5, token=relay_token)[0]
                break
            except OSError:
                assert time.monotonic() < deadline and process.poll() is None, "the relay did not start"
                time.sleep(0.1)
    finally:
        process.terminate()
        _, err = process.communicate(timeout=10)
    assert (refused, status) == (401, 200)
    assert err.strip().splitlines() == [
        f"alert relay: listening on 127.0.0.1:{port} for heartbeat",
        "refused a request without the relay's token (401; 1 refused since the start)",
    ]


RELAY_TOKEN = "relay-token-" + "0123456789abcdef" * 2


def test_only_a_request_with_the_token_is_relayed_and_each_other_is_counted(receiver, relay):
    """Alertmanager sends the relay's token (its receiver's http_config); another local process
    does not have it: 401, nothing sent on, and a count in the log (never what was sent)."""
    start, lines = relay
    url = start({"heartbeat": f"{receiver}/ping/{TOKEN}"}, token=RELAY_TOKEN)
    forged = b'{"status": "resolved", "alerts": []}'
    assert _post(f"{url}/heartbeat", forged)[0] == 401
    assert _post(f"{url}/heartbeat", forged, token="not-" + RELAY_TOKEN)[0] == 401
    assert _post(f"{url}/heartbeat", forged, token=RELAY_TOKEN[:-1])[0] == 401
    assert _Receiver.received == []  # nothing refused reached the receiver
    assert _post(f"{url}/heartbeat", token=RELAY_TOKEN)[0] == 200
    assert [path for path, _, _ in _Receiver.received] == [f"/ping/{TOKEN}"]
    assert lines == [
        f"refused a request without the relay's token (401; {n} refused since the start)" for n in (1, 2, 3)
    ]
    assert not any(RELAY_TOKEN[:8] in line or "resolved" in line for line in lines)


@pytest.fixture
def monitor(inventory):
    vault = inventory.vault(hook="https://alerts.example.org/hook/" + TOKEN, heartbeat="https://hc-ping.com/x")
    site = load_site(
        inventory.groups(
            gpu_nodes=[gpu_node(secrets_file=vault)],
            monitors=[
                (
                    "gpu1",
                    {
                        "secrets_file": vault,
                        "monitoring_webhook_url_secret": "hook",
                        "monitoring_heartbeat_url_secret": "heartbeat",
                        "monitoring_alert_relay_port": 9197,
                    },
                )
            ],
        )
    )
    return site.hosts["gpu1"]


def test_the_unit_runs_the_relay_hardened_and_passes_systemd_analyze_verify(monitor, tmp_path):
    path, template, kwargs = units.relay_template(monitor)
    text = templates.render(template, **kwargs)
    assert path == "/etc/systemd/system/inference-host-alert-relay.service"
    lines = set(text.splitlines())
    assert {
        "User=inference-host-alert-relay",
        "ExecStart=/usr/bin/python3 -I -B /opt/inference-host/alert-relay/alert_relay.py --config"
        " /etc/inference-host/alert-relay.json --host 127.0.0.1 --port 9197 --timeout 10",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "CapabilityBoundingSet=",
        "Restart=always",
    } <= lines, text
    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze is not installed")
    (tmp_path / "inference-host-alert-relay.service").write_text(text)
    result = subprocess.run(
        ["systemd-analyze", "verify", str(tmp_path / "inference-host-alert-relay.service")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    problems = [row for row in result.stderr.splitlines() if "inference-host-alert-relay" in row]
    assert not problems, result.stderr


def test_alertmanager_sends_the_relay_token_from_its_file(monitor):
    """Each webhook to the relay carries http_config.authorization with the token's file
    (Alertmanager 0.25's credentials_file); the relay's config holds the same token; it is
    stable from deploy to deploy, and another monitor or other URLs give another."""
    alertmanager = yaml.safe_load(config.alertmanager_config(monitor))
    relayed = [
        hook
        for receiver in alertmanager["receivers"]
        for hook in receiver.get("webhook_configs", [])
        if hook["url"].startswith("http://127.0.0.1:9197/")
    ]
    assert len(relayed) >= 2  # the webhook receivers and the heartbeat
    for hook in relayed:
        assert hook["http_config"] == {"authorization": {"type": "Bearer", "credentials_file": config.RELAY_TOKEN_FILE}}
    values = {"hook": "https://alerts.example.org/hook/" + TOKEN, "heartbeat": "https://hc-ping.com/x"}
    token = config.relay_token(monitor, values)
    assert json.loads(config.relay_config(monitor, values))["token"] == token
    assert len(token) == 64 and token == config.relay_token(monitor, dict(values))
    assert config.relay_token(monitor, {**values, "heartbeat": "https://hc-ping.com/y"}) != token
    assert config.relay_token(dataclasses.replace(monitor, name="gpu2"), values) != token
