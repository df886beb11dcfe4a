"""The server suite's HTTP path and judges: a local HTTP server answering with SGLang's
response shapes (tests/unit/data/sglang/), reached through testinfra's local backend exactly as
the suite reaches a host, with the API key read from an env file on the 'host'."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import testinfra

from checks import server_checks
from checks.expectations import Expectations

DATA = Path(__file__).parent / "data" / "sglang"
KEY = "lab-key-9f8e7d6c5b4a"


class FakeSglang(BaseHTTPRequestHandler):
    """Answers like SGLang's http_server.py: /health and /metrics without the key, the rest with."""

    degenerate = False

    def _send(self, status: int, body: str, kind="application/json"):
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _authorized(self) -> bool:
        return self.headers.get("Authorization") == f"Bearer {KEY}"

    def do_GET(self):
        if self.path == "/health":
            return self._send(200, "")
        if self.path == "/metrics":
            return self._send(200, (DATA / "metrics.txt").read_text(), "text/plain")
        if not self._authorized():
            return self._send(401, (DATA / "unauthorized.json").read_text())
        if self.path == "/v1/models":
            return self._send(200, (DATA / "v1-models.json").read_text())
        self._send(404, '{"detail":"Not Found"}')

    def do_POST(self):
        if not self._authorized():
            return self._send(401, (DATA / "unauthorized.json").read_text())
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert body["temperature"] == 0
        name = "chat-completion-degenerate.json" if FakeSglang.degenerate else "chat-completion.json"
        self._send(200, (DATA / name).read_text())

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def fake_server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), FakeSglang)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd.server_address[1]
    httpd.shutdown()


@pytest.fixture()
def env_file(tmp_path):
    """roles/serving's --config file: {"api-key": ...}, JSON being YAML."""
    path = tmp_path / "inference-engine-secret-args.yaml"
    path.write_text(json.dumps({"api-key": KEY}) + "\n")
    return path


@pytest.fixture()
def expect(fake_server, env_file):
    return Expectations.from_overrides(
        [
            f"serving_port={fake_server}",
            "serving_api_key_secret=engine_api_key",
            "serving_served_model_name=kimi-k2.5",
            "health_server_timeout_s=5",
            f"api_key_file={env_file}",
        ]
    )


@pytest.fixture()
def host():
    return testinfra.get_host("local://")


def test_health_within_bound(host, expect):
    answer = server_checks.request(host, expect, "/health", with_key=False)
    assert answer.status == 200
    assert server_checks.judge_health(answer, expect.server_timeout_s) is None
    slow = server_checks.HttpAnswer(200, 30.0, "")
    assert "within 5 s" in server_checks.judge_health(slow, expect.server_timeout_s)


def test_models_with_the_key_from_the_env_file(host, expect, env_file):
    answer = server_checks.request(host, expect, "/v1/models")
    assert answer.status == 200, answer
    assert server_checks.judge_models(answer, "kimi-k2.5") is None
    problem = server_checks.judge_models(answer, "deepseek-v3")
    assert "expected served model name 'deepseek-v3'" in problem and "['kimi-k2.5']" in problem


def test_key_is_not_on_any_command_line(host, expect, env_file, monkeypatch):
    commands = []
    original = host.run
    monkeypatch.setattr(host, "run", lambda command, *a: commands.append(command) or original(command, *a))
    server_checks.request(host, expect, "/v1/models")
    assert commands and all(KEY not in command for command in commands)


def test_without_key_is_refused(host, expect):
    answer = server_checks.request(host, expect, "/v1/models", with_key=False)
    assert answer.status == 401 and answer.json() == {"error": "Unauthorized"}
    assert server_checks.judge_refused_without_key(answer) is None
    open_server = server_checks.HttpAnswer(200, 0.01, (DATA / "v1-models.json").read_text())
    assert "expected HTTP 401" in server_checks.judge_refused_without_key(open_server)


def test_chat_completion_judged_on_text(host, expect, env_file):
    body = {
        "model": "kimi-k2.5",
        "temperature": 0,
        "max_tokens": 48,
        "messages": [{"role": "user", "content": server_checks.CHAT_PROMPT}],
    }
    FakeSglang.degenerate = False
    problem, text = server_checks.judge_chat(server_checks.request(host, expect, "/v1/chat/completions", body))
    assert problem is None and "spring" in text
    FakeSglang.degenerate = True
    try:
        problem, _ = server_checks.judge_chat(server_checks.request(host, expect, "/v1/chat/completions", body))
    finally:
        FakeSglang.degenerate = False
    assert "degenerate output: 'the' repeated 44 times in a row" in problem


def test_metrics(host, expect):
    problem, count = server_checks.judge_metrics(server_checks.request(host, expect, "/metrics", with_key=False))
    assert problem is None and count == 4


def test_no_server_is_no_answer(host, expect, fake_server):
    closed = Expectations.from_overrides(["serving_port=9", "health_server_timeout_s=2"])
    answer = server_checks.request(host, closed, "/health", with_key=False)
    assert answer.status == 0
    assert "no answer" in server_checks.judge_health(answer, 2)


@pytest.mark.parametrize(
    "text, reason",
    [
        ("The four seasons of the year are spring, summer, autumn, and winter.", None),
        ("", "the text is empty"),
        ("!!!!!!!!!!!!", "'!' repeated 12 times in a row"),
        ("a b " * 30, "only 2 distinct tokens out of 60"),
    ],
)
def test_degenerate_reason(text, reason):
    from checks.answer_parsers import degenerate_reason

    assert degenerate_reason(text) == reason
