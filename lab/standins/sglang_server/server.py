"""STAND-IN for `python -m sglang.launch_server` (lab only: there is no GPU here).

Mirrors the interface the deploy and the health checks rely on, from SGLang's own sources:
- the command line: the pinned release's real options (captured from its wheel into
  roles/serving/cli/<version>.json, copied beside this file as cli/); an unknown flag or a
  bad choice exits 2 as argparse does; `--config FILE` merges options from a YAML (here JSON)
  file as sglang's ConfigArgumentMerger does;
- python/sglang/srt/entrypoints/http_server.py: /health and /health_generate (0.5.9
  health_generate: 503 until loaded and from SIGTERM on, else a one-token generation, or on a
  busy scheduler the next batch, and 200 once output came back, polled every second, 503 after
  SGLANG_HEALTH_CHECK_TIMEOUT s), /v1/models, /model_info, /get_model_info, /generate,
  /v1/chat/completions, /metrics (only with --enable-metrics), /v1/loads (v1_loads.py as the
  installed release writes it: live on 0.5.9/0.5.10, a published snapshot on 0.5.23);
- --model-path must hold a model: config.json is read and the *.safetensors files read through
  before the server answers (SGLang fails its start without them);
- the start-up log: the `server_args=...` line of the installed release, built from that
  release's own (patched) source (startup_log.py says how);
- python/sglang/srt/utils/auth.py (0.5.9, decide_request_auth) with the auth levels of 0.5.9's
  http_server.py (standin_auth.py: the routes marked @auth_level(AuthLevel.ADMIN_OPTIONAL)):
  /health* and /metrics* take no key; an admin route takes --admin-api-key when it is set (and
  then not --api-key), else --api-key, else anyone; every other path takes --api-key when it is
  set, or a tenant's key (the project's tenant-keys patch); a refusal is 401. Of the admin routes the stand-in plays
  /flush_cache, /pause_generation and /continue_generation (200); the others, once allowed,
  answer 501 (nothing of theirs exists here).

The version it reports is the sglang distribution installed in the interpreter running it
(the real wheel the deploy put into the environment). Generated text is deterministic and
varied (no repeated token loop), so a server check that looks at text can pass or fail.

- speculative decoding (--speculative-algorithm EAGLE/EAGLE3): the drafter directory must hold a
  config.json (the real server loads it with transformers' AutoConfig and fails to start
  otherwise); the scheduler's bookkeeping of srt/observability/scheduler_metrics_mixin.py
  (0.5.10; srt/managers in 0.5.9): accepted tokens per verify forward ("accept len"), accept
  rate = accept length / draft tokens, logged per decode as "accept len: X, accept rate: Y",
  exported as the gauges sglang:spec_accept_length and sglang:spec_accept_rate, and the
  cumulative average as internal_states[0].avg_spec_accept_length of /server_info
  (srt/managers/scheduler.py get_internal_state), which bench_serving prints as "Accept length".

- streaming (`"stream": true` on /v1/chat/completions): server-sent events as 0.5.9's
  srt/entrypoints/openai/serving_chat.py `_generate_chat_stream` writes them, one
  `data: <ChatCompletionStreamResponse JSON>` event per token (protocol.py's fields, None
  values included as pydantic's model_dump_json writes them): a first chunk with
  `delta: {"role": "assistant", "content": ""}`, one content delta per token, a chunk with an
  empty delta and `finish_reason` "length" (max_tokens reached), a usage chunk with empty
  choices when `stream_options.include_usage`, then `data: [DONE]`;
- /metrics (with --enable-metrics): the names, types, labels and histogram buckets of the pinned
  0.5.9 wheel's python/sglang/srt/metrics/collector.py. The scheduler's gauges
  (SchedulerMetricsCollector; labels model_name, engine_type "unified", tp_rank, pp_rank,
  moe_ep_rank as srt/managers/scheduler_metrics_mixin.py sets them): sglang:num_running_reqs (the
  requests being answered right now, which a rolling switch waits on), num_queue_reqs,
  gen_throughput, token_usage, num_used_tokens, cache_hit_rate, spec_accept_length,
  spec_accept_rate. The tokenizer's (TokenizerMetricsCollector; label model_name,
  srt/managers/tokenizer_manager.py): the counters sglang:prompt_tokens_total,
  generation_tokens_total, num_requests_total and the histograms time_to_first_token_seconds,
  inter_token_latency_seconds, e2e_request_latency_seconds with the collector's default buckets.
  The values are the stand-in's own timings (no GPU, no KV cache: token_usage and
  cache_hit_rate stay 0).
- the scheduler's queue and when its gauges change (class Scheduler; as harsh as SGLang's, so
  the rolling drain is tested against what it will read on the target): at most
  --max-running-requests requests run, the rest wait in the queue; each admitted request is
  first in prefill for a time that scales with its prompt, then decodes; sglang:num_running_reqs
  and sglang:num_queue_reqs are set only when SGLang 0.5.9 sets them (at prefill, from the
  running batch before the new batch joins; every --decode-log-interval decode steps; at idle
  only 30 s after the last time), so they lag and can read 0 while a request is in prefill.
  SIGTERM stops the server at once and cuts open streams: harsher than 0.5.9, which drains its
  requests first (tokenizer_manager.py sigterm_watchdog), so a restart the drain did not wait
  for shows as a cut stream.

Lab-only knobs (environment, set through serving_extra_env):
  INFERENCE_HOST_STANDIN_TOKENS_PER_SECOND  decode speed of each streamed request (default 100;
                                         0: no pause between tokens; answers that do not
                                         stream come at once)
  INFERENCE_HOST_STANDIN_PREFILL_TOKENS_PER_SECOND  prompt words prefilled per second (default
                                         2000; 0: no prefill time)
  INFERENCE_HOST_STANDIN_ACCEPT_LENGTH   accept length with speculative decoding (default 2.6,
                                         at most num_steps + 1)
  INFERENCE_HOST_STANDIN_LOAD_SECONDS    seconds before /health_generate answers 200 (default 2)
  INFERENCE_HOST_STANDIN_NEVER_HEALTHY   comma list of sglang versions that never get ready
  INFERENCE_HOST_STANDIN_STUBBORN_CHILD  1: spawn a child that ignores SIGTERM (orphan test)
  INFERENCE_HOST_STANDIN_HUNG            1: hung from the start (no prefill or decode step progresses)
  INFERENCE_HOST_STANDIN_HUNG_FILE       hung while this file exists (default
                                         /run/inference-host-standin.hung; tests/lab/test_replicas.py)
Never installed by a production path: only lab/ copies it into the rehearsal container.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import standin_answers as answers  # noqa: E402 - the routes' JSON bodies
from standin_auth import ADMIN_ROUTES, auth_allowed, tenant_api_keys  # noqa: E402 - SGLang's auth.py, as patched
from standin_metrics import Metrics  # noqa: E402 - /metrics, collector.py's names
from standin_tls import make_server  # noqa: E402 - TLS (0.5.10+) as uvicorn serves it: its docstring
from startup_log import log_kv_allocation, log_server_args  # noqa: E402 - beside this file on the host, not a package

WORDS = [
    "the",
    "quick",
    "model",
    "answers",
    "every",
    "prompt",
    "with",
    "care",
    "while",
    "tensors",
    "flow",
    "across",
    "eight",
    "cards",
    "and",
    "the",
    "scheduler",
    "keeps",
    "batches",
    "full",
    "so",
    "tokens",
    "stream",
    "steadily",
    "to",
    "each",
    "client",
    "without",
    "stalls",
    "or",
    "repeated",
    "phrases",
]


def installed_version() -> str:
    return metadata.version("sglang")


def build_parser(version: str) -> argparse.ArgumentParser:
    table = json.loads((HERE / "cli" / f"{version}.json").read_text())
    parser = argparse.ArgumentParser(prog="sglang.launch_server (stand-in)")
    for flag, option in table["options"].items():
        if flag in ("-h", "--help"):
            continue
        if option["takes_value"]:
            choices = [str(c) for c in option["choices"]] if option["choices"] else None
            parser.add_argument(flag, choices=choices)
        else:
            parser.add_argument(flag, action="store_true")
    return parser


def merge_config(argv: list[str]) -> list[str]:
    """`--config FILE`: its options go after the command line's, as in sglang."""
    if "--config" not in argv:
        return argv
    index = argv.index("--config")
    config = json.loads(Path(argv[index + 1]).read_text())
    extra = []
    for key, value in config.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            extra.append(flag)
        elif value is not False:
            extra += [flag, str(value)]
    return argv[:index] + argv[index + 2 :] + extra


def generate_text(prompt: str, max_tokens: int) -> list[str]:
    seed = int(hashlib.sha256(prompt.encode()).hexdigest(), 16)
    return [
        WORDS[(seed >> (i % 200)) % len(WORDS) if i % 3 else (seed + i * 7) % len(WORDS)] for i in range(max_tokens)
    ]


# srt/managers/scheduler_runtime_checker_mixin.py (the idle metrics, "every 30 seconds during idle").
IDLE_LOG_SECONDS = 30
# 0.5.23 srt/arg_groups/fields/observability.py load_snapshot_publish_interval (decode steps).
LOAD_SNAPSHOT_PUBLISH_INTERVAL = 15
# 0.5.9 srt/entrypoints/http_server.py HEALTH_CHECK_TIMEOUT (env SGLANG_HEALTH_CHECK_TIMEOUT).
HEALTH_CHECK_TIMEOUT = int(os.environ.get("SGLANG_HEALTH_CHECK_TIMEOUT", "20"))
HUNG_FILE = os.environ.get("INFERENCE_HOST_STANDIN_HUNG_FILE", "/run/inference-host-standin.hung")


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split(".")[:3] if part.isdigit())


def v1_loads(
    version: str,
    running: int,
    waiting: int,
    used: int,
    max_total: int,
    max_running: int,
    waiting_tokens: int = 0,
    accelerators: int = 1,
) -> dict:
    """GET /v1/loads?include=core's JSON for one data-parallel rank, as the release writes it:
    0.5.9/0.5.10 srt/entrypoints/v1_loads.py (dataclasses.asdict without None values and the
    timestamp, num_total_reqs added, an "aggregate"; dp_rank None without data parallelism, so
    left out); 0.5.23 the same file over load_snapshot.py LoadSnapshot.to_dict (every core field,
    the timestamp included; no aggregate; the accelerator's name, None without a GPU, and count,
    `accelerators`: tp_size * pp_size per rank, v1_loads.py _num_accelerators_per_dp_rank), with
    load_inquirer.py's num_total_tokens: the KV tokens in use plus the waiting prompts' tokens
    (`waiting_tokens`). Other sections (`include` beyond core) are not served."""
    core = {
        "num_running_reqs": running,
        "num_waiting_reqs": waiting,
        "num_used_tokens": used,
        "max_total_num_tokens": max_total,
        "token_usage": round(used / max_total, 4) if max_total else 0.0,
        "gen_throughput": 0.0,
        "cache_hit_rate": 0.0,
        "utilization": 0.0,
        "max_running_requests": max_running,
    }
    now = datetime.now(UTC).isoformat()
    if _release(version) < (0, 5, 23):
        load: dict[str, object] = {**core, "num_total_reqs": running + waiting}
        return {
            "timestamp": now,
            "version": version,
            "dp_rank_count": 1,
            "loads": [load],
            "aggregate": {
                "total_running_reqs": running,
                "total_waiting_reqs": waiting,
                "total_reqs": running + waiting,
                "avg_token_usage": core["token_usage"],
                "avg_throughput": 0.0,
                "avg_utilization": 0.0,
            },
        }
    load = {
        "timestamp": time.time(),
        "dp_rank": 0,
        **core,
        "num_waiting_uncached_tokens": 0,
        "num_total_tokens": used + waiting_tokens,
        "num_active_tokens": used + waiting_tokens,
        "num_prealloc_ready_tokens": 0,
        "total_prefill_uncached_tokens": 0,
        "total_prefill_busy_us": 0,
        "decode_moments": None,
    }
    return {
        "timestamp": now,
        "version": version,
        "accelerator": None,
        "num_accelerators": accelerators,
        "loads": [load],
    }


class Scheduler:
    """When SGLang's scheduler runs a request and when its gauges say so (sglang 0.5.9).

    - A queue: srt/managers/scheduler.py get_new_batch_prefill admits waiting requests only while
      the running batch is below max_running_requests (--max-running-requests); the rest stay
      in waiting_queue, counted by sglang:num_queue_reqs. Here: a request waits for a slot.
    - Prefill, then decode: an admitted request is first prefilled (its whole prompt, in chunks
      of --chunked-prefill-size when longer: the chunked request is not in the running batch
      until its last chunk); here for prompt words / PREFILL_TOKENS_PER_SECOND seconds, then it
      joins the running (decoding) batch.
    - The gauges: srt/managers/scheduler_metrics_mixin.py log_prefill_stats sets
      num_running_reqs from len(running_batch.reqs) BEFORE the new prefill batch joins it and
      num_queue_reqs from the waiting queue after the batch was taken out of it: a request in
      prefill with an empty running batch reads 0 and 0. log_decode_stats sets them every
      decode_log_interval decode steps (server_args.py: 40; scheduler.py:
      `self.forward_ct_decode % self.server_args.decode_log_interval == 0`); between those they
      keep their last value. At idle, scheduler_runtime_checker_mixin.py
      _maybe_log_idle_metrics sets them again only once 30 s have passed since the last time:
      after the last request they read its last decode value for up to 30 s.
    Here one decode step is one token time (1 / tokens per second) while anything decodes.

    GET /v1/loads reads the scheduler's own queues, not the gauges: running = the running batch,
    waiting = the waiting queue, num_used_tokens = KV cache tokens held (0.5.9/0.5.10
    scheduler_metrics_mixin.py get_loads, answered between two forward passes). A request in
    prefill (chunked or just prefilled, not yet merged into the running batch) is in neither
    count but holds its KV tokens; here: its prompt words from admission to its end. 0.5.23
    (scheduler_components/load_inquirer.py; scheduler.py publish_load_snapshot) answers from a
    snapshot published after each prefill chunk, every --load-snapshot-publish-interval (15)
    decode steps and when the scheduler goes idle: `snapshots` says which of the two this is.

    Hung (State.hung: INFERENCE_HOST_STANDIN_HUNG=1, or the file INFERENCE_HOST_STANDIN_HUNG_FILE
    exists): no prefill and no decode step progresses, as on a GPU stuck in a kernel or a
    deadlocked all-reduce; requests are taken and never answered until it clears."""

    def __init__(
        self,
        max_running: int,
        decode_log_interval: int,
        tokens_per_second: float,
        prefill_tokens_per_second: float,
        chunked_prefill_size: int = 8192,
        snapshots: bool = False,
        hung=lambda: False,
    ):
        self.max_running, self.interval = max_running, decode_log_interval
        self.step_seconds = 1 / tokens_per_second if tokens_per_second > 0 else 0.01
        self.prefill_rate = prefill_tokens_per_second
        self.chunk = max(1, chunked_prefill_size)
        self.snapshots, self.hung = snapshots, hung
        self.cond = threading.Condition()
        self.waiting = 0  # in the queue
        self.waiting_tokens = 0  # their prompts' tokens (0.5.23 num_total_tokens)
        self.admitted = 0  # in prefill or decoding: the slots max_running counts
        self.decoding = 0  # in the running batch
        self.used_tokens = 0  # KV cache tokens held by admitted requests
        self.forward_ct_decode = 0
        self.num_running_reqs = 0  # the gauges as last set
        self.num_queue_reqs = 0
        self.last_log = time.monotonic()
        self.snapshot = (0, 0, 0, 0)  # 0.5.23: what /v1/loads reads (running, waiting, used, waiting tokens)
        self.health_signals = 0  # health checks answered by the next batch (return_health_check_ct)
        self.signalled = 0.0  # wall clock of the last such answer
        threading.Thread(target=self._loop, daemon=True).start()

    def _log(self, running: int) -> None:
        self.num_running_reqs, self.num_queue_reqs, self.last_log = running, self.waiting, time.monotonic()

    def _publish(self, running: int | None = None) -> None:
        running = self.decoding if running is None else running
        self.snapshot = (running, self.waiting, self.used_tokens, self.waiting_tokens)

    def loads(self) -> tuple[int, int, int, int]:
        """(running, waiting, KV tokens in use, waiting prompts' tokens) as GET /v1/loads reads
        them. 0.5.9/0.5.10 ask the scheduler itself (tokenizer_communicator_mixin.py
        _Communicator, no timeout), answered between two forward passes: a hung scheduler never
        answers. 0.5.23 reads the last published snapshot (shared memory): it answers."""
        if not self.snapshots:
            self.gate()
        with self.cond:
            live = (self.decoding, self.waiting, self.used_tokens, self.waiting_tokens)
            return self.snapshot if self.snapshots else live

    def _loop(self) -> None:
        while True:
            time.sleep(self.step_seconds)
            with self.cond:
                if self.decoding and not self.hung():
                    self._batch_done()
                    self.forward_ct_decode += 1
                    if self.forward_ct_decode % self.interval == 0:
                        self._log(self.decoding)
                    if self.forward_ct_decode % LOAD_SNAPSHOT_PUBLISH_INTERVAL == 0:
                        self._publish()
                elif not self.admitted and not self.waiting and time.monotonic() > self.last_log + IDLE_LOG_SECONDS:
                    self._log(0)

    def _batch_done(self) -> None:
        """scheduler.py maybe_send_health_check_signal: after each batch's result, one health
        check that was not queued is answered (a HealthCheckOutput to the tokenizer manager)."""
        if self.health_signals:
            self.health_signals -= 1
            self.signalled = time.time()

    def health_check(self) -> bool:
        """scheduler.py process_input_requests (0.5.9): a health-check generation that arrives
        while a request is in chunked prefill or the running batch is not empty is not queued;
        the next batch's result answers it. True: it was taken that way; False: run it."""
        with self.cond:
            if self.admitted:
                self.health_signals += 1
                return True
            return False

    def gate(self, deadline: float | None = None) -> bool:
        """Wait while hung; False if `deadline` (monotonic) passes first."""
        while self.hung():
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(0.1)
        return True

    def admit(self, prompt_words: int) -> None:
        """Wait for a slot, then prefill chunk by chunk (the gauges set as log_prefill_stats
        sets them, the 0.5.23 snapshot published after each chunk)."""
        with self.cond:
            self.waiting += 1
            self.waiting_tokens += max(1, prompt_words)
            while self.admitted >= self.max_running:
                self.cond.wait()
            self.waiting -= 1
            self.waiting_tokens -= max(1, prompt_words)
            self.admitted += 1
            self.used_tokens += max(1, prompt_words)
            self._log(self.decoding)  # the running batch before this request joins it
        left = prompt_words
        while True:
            self.gate()
            step = min(left, self.chunk)
            if self.prefill_rate > 0:
                time.sleep(step / self.prefill_rate)
            left -= step
            with self.cond:
                self._publish()  # process_batch_result of the extend batch: before it joins
                self._batch_done()
            if left <= 0:
                break
        with self.cond:
            self.decoding += 1

    def finish(self, prompt_words: int) -> None:
        with self.cond:
            self.decoding -= 1
            self.admitted -= 1
            self.used_tokens -= max(1, prompt_words)
            if not self.admitted and not self.waiting:
                self._publish(0)  # the fully-idle publish, forced
            self.cond.notify()


class State:
    def __init__(self, args, version: str):
        self.args = args
        self.version = version
        self.started = time.monotonic()
        self.requests = 0
        self.generated_tokens = 0
        never = os.environ.get("INFERENCE_HOST_STANDIN_NEVER_HEALTHY", "")
        self.never_healthy = version in [v.strip() for v in never.split(",") if v.strip()]
        self.load_seconds = float(os.environ.get("INFERENCE_HOST_STANDIN_LOAD_SECONDS", "2"))
        self.speculative = args.speculative_algorithm is not None
        steps = int(args.speculative_num_steps or 3)
        self.draft_tokens = int(args.speculative_num_draft_tokens or steps + 1)
        self.accept_length = min(float(os.environ.get("INFERENCE_HOST_STANDIN_ACCEPT_LENGTH", "2.6")), steps + 1.0)
        self.spec_forward_ct = 0  # since start (avg_spec_accept_length)
        self.spec_accepted = 0
        self.last_accept_length = 0.0  # the gauge: most recent decode
        self.last_accept_rate = 0.0
        self.running = 0
        self.lock = threading.Lock()
        self.tokens_per_second = float(os.environ.get("INFERENCE_HOST_STANDIN_TOKENS_PER_SECOND", "100"))
        self.metrics = Metrics()
        # SGLang's default comes from the KV cache's size; without a GPU: 256 unless given.
        self.last_output = 0.0  # wall clock of the last token out (tokenizer_manager.last_receive_tstamp)
        self.shutting_down = False  # SIGTERM seen (tokenizer_manager.gracefully_exit)
        self.max_total_tokens = 500_000  # the KV pool's size; no GPU here to size it from
        self.scheduler = Scheduler(
            int(getattr(args, "max_running_requests", None) or 256),
            int(getattr(args, "decode_log_interval", None) or 40),
            self.tokens_per_second,
            float(os.environ.get("INFERENCE_HOST_STANDIN_PREFILL_TOKENS_PER_SECOND", "2000")),
            int(getattr(args, "chunked_prefill_size", None) or 8192),
            snapshots=_release(version) >= (0, 5, 23),
            hung=self.hung,
        )

    @staticmethod
    def hung() -> bool:
        return os.environ.get("INFERENCE_HOST_STANDIN_HUNG") == "1" or os.path.exists(HUNG_FILE)

    def pace(self, index: int, began: float) -> None:
        """Hold token `index` until the request's decode speed lets it out (forever while hung)."""
        if self.hung():
            self.scheduler.gate()
        elif self.tokens_per_second > 0:
            wait = began + (index + 1) / self.tokens_per_second - time.monotonic()
            if wait > 0:
                time.sleep(wait)
        self.last_output = time.time()

    def health_generation(self, deadline: float) -> None:
        """The one-token generation /health runs (input_ids [0], max_new_tokens 1): answered by
        the next batch when the scheduler is busy (Scheduler.health_check), else prefilled and
        decoded like any request, its token out after one decode step unless hung."""
        if self.scheduler.health_check():
            return
        self.scheduler.admit(1)
        try:
            if self.scheduler.gate(deadline):
                time.sleep(self.scheduler.step_seconds)
                self.last_output = time.time()
        finally:
            self.scheduler.finish(1)

    def loads(self) -> dict:
        running, waiting, used, waiting_tokens = self.scheduler.loads()
        args = self.args
        accelerators = int(getattr(args, "tp_size", None) or 1) * int(getattr(args, "pp_size", None) or 1)
        if getattr(args, "enable_dp_attention", False):
            accelerators //= int(getattr(args, "dp_size", None) or 1)
        return v1_loads(
            self.version,
            running,
            waiting,
            used,
            self.max_total_tokens,
            self.scheduler.max_running,
            waiting_tokens,
            accelerators,
        )

    def decoded(self, tokens: int) -> None:
        """Book a decode of `tokens` tokens as the scheduler does with a drafter."""
        self.generated_tokens += tokens
        if not self.speculative or tokens == 0:
            return
        forwards = max(1, round(tokens / self.accept_length))
        self.spec_forward_ct += forwards
        self.spec_accepted += tokens
        self.last_accept_length = tokens / forwards
        self.last_accept_rate = self.last_accept_length / self.draft_tokens
        sys.stderr.write(
            f"[stand-in] Decode batch, #running-req: 1, accept len: {self.last_accept_length:.2f},"
            f" accept rate: {self.last_accept_rate:.2f}, gen throughput (token/s): 0.00\n"
        )

    def ready(self) -> bool:
        return not self.never_healthy and time.monotonic() - self.started >= self.load_seconds


def make_handler(state: State):
    args = state.args

    class Handler(BaseHTTPRequestHandler):
        server_version = "uvicorn"

        def log_message(self, fmt, *a):  # one line per request in the journal
            sys.stderr.write(f"[stand-in] {self.command} {self.path} {a[1] if len(a) > 1 else ''}\n")

        def _send(self, code: int, body, content_type="application/json"):
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _authorized(self) -> bool:
            path = self.path.split("?")[0]
            admin = getattr(args, "admin_api_key", None)
            if auth_allowed(self.command, path, self.headers.get("Authorization"), args.api_key, admin):
                return True
            self._send(401, {"error": "Unauthorized"})
            return False

        def _admin(self, path: str):
            """An admin route, once allowed: the ones the stand-in can play, else 501."""
            if path == "/flush_cache":
                return self._send(200, b"Cache flushed (stand-in).\n", "text/plain")
            if path in ("/pause_generation", "/continue_generation"):
                return self._send(200, {"message": f"{path[1:]} (stand-in)"})
            return self._send(501, {"error": f"{path} is not played by the SGLang stand-in"})

        def do_GET(self):
            if not self._authorized():
                return
            path = self.path.split("?")[0]
            if path in ADMIN_ROUTES:
                return self._admin(path)
            if path in ("/health", "/health_generate"):
                return self._health()
            if path == "/v1/loads":
                return self._send(200, state.loads())
            if path == "/v1/models":
                return self._send(200, answers.models(args, state.started))
            if path in ("/model_info", "/get_model_info"):
                return self._send(200, answers.model_info(args))
            if path == "/metrics" and args.enable_metrics:
                return self._send(200, state.metrics.text(state).encode(), "text/plain; version=0.0.4")
            if path in ("/server_info", "/get_server_info"):
                speculating = state.speculative and state.spec_forward_ct
                accept = state.spec_accepted / state.spec_forward_ct if speculating else None
                return self._send(200, answers.server_info(args, state.version, accept))
            return self._send(404, {"detail": "Not Found"})

        def _health(self):
            """0.5.9 http_server.py health_generate (/health and /health_generate alike, as
            SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION defaults to true): 503 during shutdown and
            while starting; else a one-token generation is started (on a busy scheduler: answered
            by its next batch instead) and the answer is 200 once any output has come back since
            (checked every second: at least 1 s), 503 after HEALTH_CHECK_TIMEOUT s without any."""
            if state.shutting_down:
                sys.stderr.write("[stand-in] Health check request received during shutdown. Returning 503.\n")
                return self._send(503, b"", "text/plain")
            if not state.ready():
                return self._send(503, b"", "text/plain")
            tic = time.time()
            threading.Thread(
                target=state.health_generation, args=(time.monotonic() + HEALTH_CHECK_TIMEOUT,), daemon=True
            ).start()
            while time.time() < tic + HEALTH_CHECK_TIMEOUT:
                time.sleep(1)
                if max(state.last_output, state.scheduler.signalled) > tic:
                    return self._send(200, b"", "text/plain")
            sys.stderr.write(
                "[stand-in] Health check failed. Server couldn't get a response from detokenizer for last"
                f" {HEALTH_CHECK_TIMEOUT} seconds. tic start time: {time.strftime('%H:%M:%S', time.localtime(tic))}."
                f" last_heartbeat time: {time.strftime('%H:%M:%S', time.localtime(state.last_output))}\n"
            )
            return self._send(503, b"", "text/plain")

        def do_POST(self):
            if not self._authorized():
                return
            if self.path.split("?")[0] in ADMIN_ROUTES:
                return self._admin(self.path.split("?")[0])
            if not state.ready():
                return self._send(503, {"error": "server is not ready"})
            length = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except json.JSONDecodeError:
                return self._send(400, {"error": "invalid JSON"})
            path = self.path.split("?")[0]
            with state.lock:
                state.requests += 1
                state.running += 1
            try:
                return self._answer(path, body)
            finally:
                with state.lock:
                    state.running -= 1

        def _stream_chat(self, body: dict, prompt: str, tokens: list[str], arrived: float) -> None:
            """serving_chat.py _generate_chat_stream (0.5.9), one token per event."""
            request_id = hashlib.md5(f"{prompt}{time.time()}".encode()).hexdigest()
            model = body.get("model") or args.served_model_name

            def event(choices, usage=None) -> bytes:
                return answers.chat_chunk(request_id, model, choices, usage)

            choice = answers.chat_choice

            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            began = first = time.monotonic()
            self.wfile.write(event([choice({"role": "assistant", "content": ""})]))
            self.wfile.flush()
            for index, token in enumerate(tokens):
                state.pace(index, began)
                self.wfile.write(event([choice({"content": token if index == 0 else " " + token})]))
                self.wfile.flush()
                first = first if index else time.monotonic()
            state.decoded(len(tokens))
            state.metrics.finished(len(prompt.split()), len(tokens), arrived, first, time.monotonic())
            self.wfile.write(event([choice({}, "length")]))
            if (body.get("stream_options") or {}).get("include_usage"):
                self.wfile.write(event([], answers.stream_usage(len(prompt.split()), len(tokens))))
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()

        def _answer(self, path: str, body: dict):
            if path not in ("/generate", "/v1/chat/completions"):
                return self._send(404, {"detail": "Not Found"})
            prompt = (
                str(body.get("text", ""))
                if path == "/generate"
                else " ".join(str(m.get("content", "")) for m in body.get("messages", []))
            )
            began = time.monotonic()
            words = len(prompt.split())
            state.scheduler.admit(words)  # queued, then prefilled: the first token after
            try:
                return self._generate(path, body, began)
            finally:
                state.scheduler.finish(words)

        def _generate(self, path: str, body: dict, began: float):
            if path == "/generate":
                params = body.get("sampling_params") or {}
                tokens = generate_text(str(body.get("text", "")), int(params.get("max_new_tokens", 16)))
                state.scheduler.gate()  # never answered while hung
                state.last_output = time.time()
                state.decoded(len(tokens))
                now = time.monotonic()
                state.metrics.finished(len(str(body.get("text", "")).split()), len(tokens), began, now, now)
                return self._send(200, answers.generated(body, tokens))
            if path == "/v1/chat/completions":
                prompt = " ".join(str(m.get("content", "")) for m in body.get("messages", []))
                # SGLang 0.5.9 protocol.py to_sampling_params: max_completion_tokens or the
                # deprecated max_tokens (bench_serving's chat backend sends the former).
                tokens = generate_text(prompt, int(body.get("max_completion_tokens") or body.get("max_tokens") or 16))
                if body.get("stream"):
                    return self._stream_chat(body, prompt, tokens, began)
                state.scheduler.gate()  # never answered while hung
                state.last_output = time.time()
                state.decoded(len(tokens))
                now = time.monotonic()
                state.metrics.finished(len(prompt.split()), len(tokens), began, now, now)
                return self._send(200, answers.chat_completion(body, prompt, tokens, args.served_model_name))
            return self._send(404, {"detail": "Not Found"})

    return Handler


def spawn_stubborn_child() -> None:
    """A 'GPU worker' that ignores SIGTERM, like the orphans seen on the target."""
    code = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True: time.sleep(1)\n"
    subprocess.Popen([sys.executable, "-c", code], start_new_session=True)


def load_weights(model_path: str) -> str:
    """What SGLang does first with --model-path: read config.json (ModelConfig, through
    transformers' AutoConfig) and the weight files (here: read through, no GPU to put them on).
    A missing directory or config fails the start, as it does in SGLang."""
    folder = Path(model_path)
    try:
        json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as error:
        print(f"[stand-in] cannot load the model config from {model_path}: {error}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    weights = sorted(folder.glob("*.safetensors"))
    total = 0
    for path in weights:
        with path.open("rb") as f:
            while chunk := f.read(8 * 1024 * 1024):
                total += len(chunk)
    return f"{len(weights)} weight file(s), {total} bytes, from {model_path}"


def main(argv: list[str]) -> None:
    version = installed_version()
    args = build_parser(version).parse_args(merge_config(argv))
    log_server_args(vars(args))
    if args.speculative_algorithm and not (Path(args.speculative_draft_model_path or "") / "config.json").is_file():
        # transformers' AutoConfig.from_pretrained on a directory without config.json
        print(
            f"OSError: {args.speculative_draft_model_path} does not appear to have a file named config.json.",
            file=sys.stderr,
            flush=True,
        )
        raise SystemExit(1)
    if args.api_key or getattr(args, "admin_api_key", None):
        tenant_api_keys()  # as the patched add_api_key_middleware: an unreadable file stops the start
    loaded = load_weights(args.model_path)
    log_kv_allocation(vars(args))
    state = State(args, version)
    if os.environ.get("INFERENCE_HOST_STANDIN_STUBBORN_CHILD") == "1":
        spawn_stubborn_child()
    server = make_server(args, (args.host or "127.0.0.1", int(args.port or 30000)), make_handler(state))

    def stop(*_):
        state.shutting_down = True  # /health answers 503 from here on
        threading.Thread(target=server.shutdown).start()

    signal.signal(signal.SIGTERM, stop)
    print(
        f"[stand-in] sglang {version} (stand-in) serving {args.served_model_name} on "
        f"{args.host}:{args.port}, tp {args.tp_size}, attention {args.attention_backend}"
        + (" (never healthy for this version)" if state.never_healthy else "")
        + f"; loaded {loaded}",
        flush=True,
    )
    server.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])
