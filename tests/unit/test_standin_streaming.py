"""The lab's SGLang stand-in streams as sglang 0.5.9's serving_chat.py does (one SSE event per
token, the finish-reason chunk, [DONE]) at its configured speed, and counts the request in
sglang:num_running_reqs while it runs: what the rolling switch's drain waits on."""

from __future__ import annotations

import argparse
import importlib.util
import json
import threading
import time
import urllib.request
from http.server import ThreadingHTTPServer

from tests.unit.conftest import PROJECT_ROOT


def _server(monkeypatch, rate: str):
    monkeypatch.setenv("INFERENCE_HOST_STANDIN_TOKENS_PER_SECOND", rate)
    spec = importlib.util.spec_from_file_location(
        "standin_server", PROJECT_ROOT / "lab" / "standins" / "sglang_server" / "server.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    args = argparse.Namespace(served_model_name="kimi-k2.5", model_path="/models/tiny", api_key=None,
                              enable_metrics=True, speculative_algorithm=None, speculative_num_steps=None,
                              speculative_num_draft_tokens=None)
    state = module.State(args, "0.5.9")
    state.started -= 60  # loaded
    server = ThreadingHTTPServer(("127.0.0.1", 0), module.make_handler(state))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def _running(url: str) -> int:
    text = urllib.request.urlopen(f"{url}/metrics", timeout=5).read().decode()
    return int(next(line for line in text.splitlines() if line.startswith("sglang:num_running_reqs")).split()[-1])


def test_stream_is_sglangs_chunks_token_by_token_and_counted_while_running(monkeypatch):
    server, url = _server(monkeypatch, "40")
    body = json.dumps({"model": "kimi-k2.5", "max_tokens": 40, "stream": True,
                       "stream_options": {"include_usage": True},
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    request = urllib.request.Request(f"{url}/v1/chat/completions", body, {"Content-Type": "application/json"})
    started, seen, events = time.monotonic(), [], []
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.headers["Content-Type"] == "text/event-stream"
        for raw in answer:
            line = raw.decode().strip()
            if line.startswith("data: "):
                events.append(line[6:])
                if len(events) == 10:
                    seen.append(_running(url))
    elapsed = time.monotonic() - started
    server.shutdown()
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"} and len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": "", "reasoning_content": None,
                                                "tool_calls": None}
    tokens = [c["choices"][0]["delta"]["content"] for c in chunks[1:-2]]
    assert len(tokens) == 40 and all(t for t in tokens)
    assert chunks[-2]["choices"][0]["finish_reason"] == "length" and chunks[-2]["choices"][0]["delta"]["content"] is None
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 40
    assert 0.9 <= elapsed < 3  # 40 tokens at 40 tokens/s
    assert seen == [1]


def test_running_requests_read_zero_when_idle(monkeypatch):
    server, url = _server(monkeypatch, "0")
    assert _running(url) == 0
    server.shutdown()
