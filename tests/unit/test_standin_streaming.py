"""The lab's SGLang stand-in streams as sglang 0.5.9's serving_chat.py does (one SSE event per
token, the finish-reason chunk, [DONE]) at its configured speed, and its scheduler gauges are as
harsh as SGLang's (what the rolling switch's drain reads): a queue past --max-running-requests,
a prefill that lasts with the prompt, sglang:num_running_reqs and sglang:num_queue_reqs set at
prefill from the batch before the request joins, every --decode-log-interval decode steps, and
at idle only after 30 s; GET /v1/loads as each release answers it (live on 0.5.9, a published
snapshot on 0.5.23), and /health as a one-token generation that fails on a hung server."""

from __future__ import annotations

import argparse
import importlib.util
import json
import threading
import time
import urllib.error
import urllib.request
from http.server import ThreadingHTTPServer

import pytest

from tests.unit.conftest import PROJECT_ROOT


def _server(
    monkeypatch,
    rate: str,
    max_running: int | None = None,
    interval: int | None = None,
    prefill_rate: str = "2000",
    idle_seconds: float | None = None,
    version: str = "0.5.9",
    chunk: int | None = None,
    health_timeout: int | None = None,
    **options,
):
    monkeypatch.setenv("INFERENCE_HOST_STANDIN_TOKENS_PER_SECOND", rate)
    monkeypatch.setenv("INFERENCE_HOST_STANDIN_PREFILL_TOKENS_PER_SECOND", prefill_rate)
    spec = importlib.util.spec_from_file_location(
        "standin_server", PROJECT_ROOT / "lab" / "standins" / "sglang_server" / "server.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if idle_seconds is not None:
        module.IDLE_LOG_SECONDS = idle_seconds
    if health_timeout is not None:
        module.HEALTH_CHECK_TIMEOUT = health_timeout
    args = argparse.Namespace(
        served_model_name="kimi-k2.5",
        model_path="/models/tiny",
        api_key=None,
        enable_metrics=True,
        speculative_algorithm=None,
        speculative_num_steps=None,
        speculative_num_draft_tokens=None,
        max_running_requests=max_running,
        decode_log_interval=interval,
        chunked_prefill_size=chunk,
        **options,
    )
    state = module.State(args, version)
    state.started -= 60  # loaded
    server = ThreadingHTTPServer(("127.0.0.1", 0), module.make_handler(state))
    server.state, server.module = state, module
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def _gauge(url: str, name: str) -> int:
    text = urllib.request.urlopen(f"{url}/metrics", timeout=5).read().decode()
    return int(next(line for line in text.splitlines() if line.startswith(f"sglang:{name}{{")).split()[-1])


def _running(url: str) -> int:
    return _gauge(url, "num_running_reqs")


def _gauges(url: str) -> tuple[int, int]:
    return _gauge(url, "num_running_reqs"), _gauge(url, "num_queue_reqs")


def _stream(url: str, tokens: int, prompt: str = "hi") -> dict:
    """Stream one chat completion in a thread; the returned dict fills in as it goes."""
    out = {"first": None, "tokens": 0, "done": False}
    body = json.dumps(
        {"model": "kimi-k2.5", "max_tokens": tokens, "stream": True, "messages": [{"role": "user", "content": prompt}]}
    ).encode()

    def run():
        request = urllib.request.Request(f"{url}/v1/chat/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as answer:
            for raw in answer:
                line = raw.decode().strip()
                if line == "data: [DONE]":
                    out["done"] = True
                elif line.startswith("data: ") and any(
                    c["delta"].get("content") for c in json.loads(line[6:])["choices"]
                ):
                    out["first"] = out["first"] or time.monotonic()
                    out["tokens"] += 1

    out["thread"] = threading.Thread(target=run)
    out["thread"].start()
    return out


def test_stream_is_sglangs_chunks_token_by_token_and_not_yet_counted_before_decode_step_40(monkeypatch):
    server, url = _server(monkeypatch, "40")
    body = json.dumps(
        {
            "model": "kimi-k2.5",
            "max_tokens": 40,
            "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "hi"}],
        }
    ).encode()
    request = urllib.request.Request(f"{url}/v1/chat/completions", body, {"Content-Type": "application/json"})
    started, seen, events = time.monotonic(), [], []
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.headers["Content-Type"] == "text/event-stream"
        for raw in answer:
            line = raw.decode().strip()
            if line.startswith("data: "):
                events.append(line[6:])
                if len(events) in (10, 35):
                    seen.append(_running(url))
    elapsed = time.monotonic() - started
    server.shutdown()
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"} and len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {
        "role": "assistant",
        "content": "",
        "reasoning_content": None,
        "tool_calls": None,
    }
    tokens = [c["choices"][0]["delta"]["content"] for c in chunks[1:-2]]
    assert len(tokens) == 40 and all(t for t in tokens)
    assert (
        chunks[-2]["choices"][0]["finish_reason"] == "length" and chunks[-2]["choices"][0]["delta"]["content"] is None
    )
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 40
    assert 0.9 <= elapsed < 3  # 40 tokens at 40 tokens/s
    # Set at prefill from the batch before this request joined (0), next at decode step 40: a
    # request of 40 tokens reads 0 all along (what the drain must not take for idle).
    assert seen == [0, 0]


def test_running_requests_read_zero_when_idle(monkeypatch):
    server, url = _server(monkeypatch, "0")
    assert _running(url) == 0
    server.shutdown()


def test_gauges_lag_as_sglangs_do(monkeypatch):
    """0 in prefill (the batch before it joined), set again only every decode_log_interval steps,
    and after the request the last decode value until the idle refresh."""
    server, url = _server(monkeypatch, "40", interval=20, prefill_rate="100", idle_seconds=2)
    stream = _stream(url, 60, prompt=" ".join(["word"] * 100))  # 1 s of prefill
    time.sleep(0.5)
    assert stream["first"] is None and _gauges(url) == (0, 0)  # in prefill: reads 0
    while stream["tokens"] < 30:
        time.sleep(0.05)
    assert _gauges(url) == (1, 0)  # decode step 20 set it
    stream["thread"].join()
    assert stream["done"] and stream["tokens"] == 60
    assert _gauges(url) == (1, 0)  # stale after the request ended...
    time.sleep(2.5)
    assert _gauges(url) == (0, 0)  # ...until the idle refresh
    server.shutdown()


def test_requests_past_max_running_wait_in_the_queue(monkeypatch):
    server, url = _server(monkeypatch, "40", max_running=1, interval=10)
    first = _stream(url, 40)
    time.sleep(0.2)
    second = _stream(url, 10)
    time.sleep(0.6)  # decode step 10 and after of the first
    assert second["first"] is None and _gauges(url) == (1, 1)  # queued, counted in the queue gauge
    first["thread"].join()
    second["thread"].join()
    assert first["done"] and second["done"] and second["first"] >= first["first"] + 0.9  # only after the first ended
    server.shutdown()


def _loads(url: str) -> dict:
    return json.loads(urllib.request.urlopen(f"{url}/v1/loads?include=core", timeout=5).read())


def _load_counts(answer: dict) -> tuple[int, int, int]:
    (load,) = answer["loads"]
    return load["num_running_reqs"], load["num_waiting_reqs"], load["num_used_tokens"]


def test_v1_loads_holds_a_long_prompt_in_prefill_that_the_gauges_miss(monkeypatch):
    """0.5.9 scheduler_metrics_mixin.py get_loads: the running batch and the waiting queue, read
    when asked, and the KV tokens in use; a request in chunked prefill is in neither count but
    holds its prompt's tokens, while the Prometheus gauges read 0 (the drain's old blind spot)."""
    server, url = _server(monkeypatch, "40", prefill_rate="100", interval=40, chunk=50)
    stream = _stream(url, 20, prompt=" ".join(["word"] * 150))  # 1.5 s of prefill, 3 chunks
    time.sleep(0.5)
    answer = _loads(url)
    assert _gauges(url) == (0, 0) and _load_counts(answer) == (0, 0, 150)
    # The release's own JSON: 0.5.9 entrypoints/v1_loads.py (num_total_reqs, an aggregate).
    assert answer["version"] == "0.5.9" and answer["dp_rank_count"] == 1
    assert answer["loads"][0]["num_total_reqs"] == 0 and answer["aggregate"]["total_reqs"] == 0
    assert "timestamp" not in answer["loads"][0]
    while stream["tokens"] < 5:
        time.sleep(0.05)
    assert _load_counts(_loads(url)) == (1, 0, 150) and _gauges(url) == (0, 0)  # live; the gauge lags
    stream["thread"].join()
    assert _load_counts(_loads(url)) == (0, 0, 0)
    server.shutdown()


def test_v1_loads_on_0_5_23_reads_the_published_snapshot(monkeypatch):
    """0.5.23 answers from a snapshot the scheduler publishes after each prefill chunk, every 15
    decode steps and when it goes idle (load_inquirer.py, scheduler.py publish_load_snapshot)."""
    server, url = _server(monkeypatch, "20", prefill_rate="100", chunk=50, version="0.5.23")
    assert _load_counts(_loads(url)) == (0, 0, 0)
    stream = _stream(url, 40, prompt=" ".join(["word"] * 150))
    time.sleep(0.25)
    assert _load_counts(_loads(url)) == (0, 0, 0)  # the first chunk is not done: nothing published yet
    time.sleep(0.5)
    answer = _loads(url)
    assert _load_counts(answer) == (0, 0, 150)  # published after the first chunk
    assert "aggregate" not in answer and answer["loads"][0]["dp_rank"] == 0 and "timestamp" in answer["loads"][0]
    while stream["tokens"] < 5:
        time.sleep(0.05)
    assert _load_counts(_loads(url)) == (0, 0, 150)  # decode steps 1-14: the last chunk's snapshot
    while stream["tokens"] < 20:
        time.sleep(0.05)
    assert _load_counts(_loads(url)) == (1, 0, 150)  # step 15 published it
    stream["thread"].join()
    assert _load_counts(_loads(url)) == (0, 0, 0)  # the idle publish
    server.shutdown()


def test_v1_loads_on_0_5_23_counts_waiting_prompts_and_the_ranks_accelerators(monkeypatch):
    """0.5.23 load_inquirer.py get_loads: num_total_tokens is the KV tokens in use plus the
    waiting requests' prompts; v1_loads.py num_accelerators is tp_size * pp_size per DP rank."""
    server, url = _server(
        monkeypatch, "20", max_running=1, prefill_rate="100", chunk=50, version="0.5.23", tp_size="2", pp_size="1"
    )
    first = _stream(url, 5, prompt=" ".join(["word"] * 100))  # two chunks, 0.5 s each
    time.sleep(0.1)
    second = _stream(url, 5, prompt=" ".join(["word"] * 30))  # waits for the only slot
    time.sleep(0.6)  # the first chunk's publish, the second request waiting
    answer = _loads(url)
    (load,) = answer["loads"]
    assert _load_counts(answer) == (0, 1, 100) and load["num_total_tokens"] == 130, load
    assert answer["num_accelerators"] == 2
    first["thread"].join()
    second["thread"].join()
    server.shutdown()


@pytest.mark.parametrize("version", ["0.5.9", "0.5.23"])
def test_v1_loads_of_a_hung_scheduler(monkeypatch, tmp_path, version):
    """0.5.9 asks the scheduler (tokenizer_communicator_mixin.py _Communicator, no timeout;
    answered between two forward passes): a scheduler stuck in a forward never answers.
    0.5.23 reads the last published snapshot from shared memory: it answers."""
    hung = tmp_path / "hung"
    monkeypatch.setenv("INFERENCE_HOST_STANDIN_HUNG_FILE", str(hung))
    server, url = _server(monkeypatch, "40", version=version)
    hung.touch()
    if version == "0.5.9":
        with pytest.raises(OSError):  # urllib's timeout
            urllib.request.urlopen(f"{url}/v1/loads?include=core", timeout=1.5).read()
    else:
        assert _load_counts(_loads(url)) == (0, 0, 0)
    hung.unlink()
    assert _load_counts(_loads(url)) == (0, 0, 0)
    server.shutdown()


def _health(url: str, path: str = "/health") -> tuple[int, float]:
    began = time.monotonic()
    try:
        code = urllib.request.urlopen(f"{url}{path}", timeout=30).status
    except urllib.error.HTTPError as error:
        code = error.code
    return code, time.monotonic() - began


def test_health_runs_a_generation_and_a_hung_server_answers_503(monkeypatch, tmp_path):
    """0.5.9 http_server.py health_generate: a one-token generation, 200 once output came back
    (polled every second: at least 1 s), 503 after SGLANG_HEALTH_CHECK_TIMEOUT s without any,
    and 503 at once during shutdown. Hung (the file switch): nothing progresses."""
    hung = tmp_path / "hung"
    monkeypatch.setenv("INFERENCE_HOST_STANDIN_HUNG_FILE", str(hung))
    server, url = _server(monkeypatch, "40", health_timeout=3)
    for path in ("/health", "/health_generate"):
        code, took = _health(url, path)
        assert code == 200 and 1 <= took < 2, (path, code, took)
    hung.touch()
    stream = _stream(url, 10)
    code, took = _health(url)
    assert code == 503 and 3 <= took < 4.5 and stream["first"] is None  # no token came out
    hung.unlink()
    stream["thread"].join()
    assert stream["done"] and stream["tokens"] == 10  # it goes on once the hang clears
    assert _health(url)[0] == 200
    server.state.shutting_down = True  # what SIGTERM sets
    code, took = _health(url)
    assert code == 503 and took < 0.5
    server.shutdown()


def test_a_health_check_on_a_busy_server_is_answered_by_the_next_batch_not_queued(monkeypatch):
    """0.5.9 scheduler.py process_input_requests: a health-check generation arriving while the
    running batch is not empty (or a request is in chunked prefill) is not queued; the next
    batch's result answers it (maybe_send_health_check_signal). So health checks never pile up
    in the queue behind long requests, where smg 1.13.0, which polls /v1/loads, would read them
    as waiting requests."""
    server, url = _server(monkeypatch, "20", max_running=1)
    stream = _stream(url, 60)  # 3 s, the only slot
    while stream["first"] is None:
        time.sleep(0.05)
    codes = [_health(url)[0] for _ in range(2)]
    assert codes == [200, 200] and _load_counts(_loads(url))[:2] == (1, 0)  # running 1, nothing queued
    stream["thread"].join()
    server.shutdown()
