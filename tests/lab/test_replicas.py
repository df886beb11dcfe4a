"""Two replicas behind the REAL SGLang model gateway, deployed by the real deploy
(inventory/lab_replicas.py: two gpu-node containers with the stand-in server, one gateways
container with smg from PyPI): requests succeed through the gateway, a stopped replica leaves
the endpoint serving and the verdict DEGRADED naming it, a rolling upgrade (a new active stack)
never fails a request through the gateway nor cuts a stream running through it, a long prompt in
prefill and queued requests included, nor a long prompt sent straight to a replica as its drain
begins (each replica drained first until smg has nothing in flight to it and its live load,
/v1/loads, reads nothing), a hung replica is routed around and named, and a second deploy
changes nothing.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import testinfra

import lab
from roles.shared.replicas import gateway_url, replicas, worker_url
from roles.site import vault
from tests.lab.harness import (
    PROJECT_ROOT,
    control_plane_key,
    gateway_workers,
    load_lab_site,
    run_deploy,
    straight_at_drain,
    stream_chat,
)

pytestmark = pytest.mark.lab

INVENTORY = PROJECT_ROOT / "inventory" / "lab_replicas.py"


@pytest.fixture(scope="module")
def first_deploy(replicas_first_deploy):
    return replicas_first_deploy  # tests/lab/conftest.py: one deploy for this module and test_monitoring


@pytest.fixture(scope="module")
def site(first_deploy):
    return load_lab_site(INVENTORY)  # the containers' addresses, as pyinfra reads them


@pytest.fixture(scope="module")
def key(site) -> str:
    return vault.decrypt_all(site.secrets_file, ["engine_api_key"])["engine_api_key"]


def _chat(site, key: str | None, timeout: float = 10) -> int:
    url = gateway_url(site.group("gateways")[0])
    body = b'{"model": "kimi-k2.5", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}'
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    try:
        with urllib.request.urlopen(
            urllib.request.Request(f"{url}/v1/chat/completions", body, headers), timeout=timeout
        ) as answer:
            return answer.status
    except urllib.error.HTTPError as error:
        return error.code
    except (urllib.error.URLError, OSError):
        return 0


def _verdict() -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "checks.gateway", str(INVENTORY)],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _wait_verdict(status: str, timeout: float = 30) -> subprocess.CompletedProcess:
    deadline = time.monotonic() + timeout
    while True:
        result = _verdict()
        if f": {status} " in result.stdout or time.monotonic() > deadline:
            return result
        time.sleep(1)


def test_requests_succeed_through_the_gateway(site, key):
    assert [_chat(site, key) for _ in range(6)] == [200] * 6
    assert _chat(site, None) == 401 and _chat(site, "wrong-key") == 401
    gw = testinfra.get_host(f"docker://{lab.container_name('gw')}")
    assert key not in gw.check_output(
        "cat /proc/$(systemctl show -p MainPID --value smg.service)/cmdline | tr '\\0' ' '"
    )
    assert "smg_http_requests_total" in gw.check_output("curl -s http://127.0.0.1:29000/metrics")


def _call(url: str, key: str | None, method: str = "GET", body: dict | None = None) -> int:
    """The HTTP status of one request (0: no answer)."""
    data = json.dumps(body).encode() if body is not None else (b"" if method == "POST" else None)
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data, headers, method=method), timeout=10) as answer:
            return answer.status
    except urllib.error.HTTPError as error:
        return error.code
    except (urllib.error.URLError, OSError):
        return 0


def test_each_key_opens_its_role_only(site, key):
    """docs/security.md#keys-and-their-roles, on the real smg 1.13.0 and the SGLang stand-in (which
    applies 0.5.9's srt/utils/auth.py to 0.5.9's route table): the client key serves the data plane
    and is refused (401/403) on every admin and control-plane route; the admin key opens the
    engine's admin routes, the control-plane key smg's /workers; neither opens the data plane."""
    names = ["engine_admin_api_key", "gateway_control_plane_api_key"]
    admin, control = (vault.decrypt_all(site.secrets_file, names)[n] for n in names)
    gw = gateway_url(site.group("gateways")[0])
    replica = worker_url(replicas(site.hosts)[0])
    chat = {"model": "kimi-k2.5", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    # The gateway: the data plane takes the client key, not the admin or control-plane key.
    assert [_chat(site, k) for k in (key, admin, control)] == [200, 401, 401]
    control_routes = [
        ("GET", "/workers", None),
        ("POST", "/workers", {"url": "http://192.0.2.1:30000"}),  # never registered: refused first
        ("DELETE", "/workers/not-a-worker", None),
        ("POST", "/flush_cache", None),
        ("GET", "/get_loads", None),
    ]
    for k in (key, admin, None):
        refused = {path: _call(f"{gw}{path}", k, method, body) for method, path, body in control_routes}
        assert set(refused.values()) <= {401, 403}, (k == key, refused)
    assert _call(f"{gw}/workers", control) == 200
    assert all(w["url"] != "http://192.0.2.1:30000" for w in _workers(site, key))
    # The replica: the client key serves, and is refused on SGLang's admin routes.
    assert _call(f"{replica}/v1/chat/completions", key, "POST", chat) == 200
    admin_routes = ["/flush_cache", "/pause_generation", "/continue_generation", "/update_weights_from_disk"]
    for k in (key, control, None):
        assert {p: _call(f"{replica}{p}", k, "POST", {}) for p in admin_routes} == dict.fromkeys(admin_routes, 401)
    assert _call(f"{replica}/flush_cache", admin, "POST") == 200
    assert _call(f"{replica}/pause_generation", admin, "POST", {}) == 200
    assert _call(f"{replica}/continue_generation", admin, "POST", {}) == 200
    assert _call(f"{replica}/v1/chat/completions", admin, "POST", chat) == 401  # the admin key is not a client's


def test_second_deploy_changes_nothing(replicas_second_deploy):
    assert replicas_second_deploy.changed == [], replicas_second_deploy.changed


# A TCP connect from inside a container: "open", or the errno's name. The firewall refuses with an
# ICMP administratively-prohibited, which Linux reports to connect() as EHOSTUNREACH; a port with
# no listener answers ECONNREFUSED instead, so the two are told apart.
_CONNECT = (
    "import errno, socket, sys\n"
    "try:\n"
    "    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5).close(); print('open')\n"
    "except OSError as e:\n"
    "    print(errno.errorcode.get(e.errno, repr(e)))\n"
)


def _connect_from(role: str, address: str, port: int) -> str:
    return subprocess.run(
        ["docker", "exec", lab.container_name(role), "python3", "-c", _CONNECT, address, str(port)],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout.strip()


def test_the_firewall_lets_in_only_the_gateway(site):
    """roles/firewall (docs/security.md, 'The network'): a replica's engine port answers the
    gateway and is refused from the other replica, which is no gateway; its exporters answer the
    monitor (the gateway's host) only; SSH answers the control machine (this one) with the lab's
    key, and is refused from the other replica."""
    rep_a, gw = replicas(site.hosts)[0], site.group("gateways")[0]
    address, port = rep_a.ssh_hostname, rep_a.serving.port
    assert address and gw.ssh_hostname
    assert _connect_from("gw", address, port) == "open"
    assert _connect_from("rep-b", address, port) == "EHOSTUNREACH"
    assert _connect_from("gw", address, rep_a.monitoring.node_exporter_port) == "open"
    assert _connect_from("rep-b", address, rep_a.monitoring.node_exporter_port) == "EHOSTUNREACH"
    # The gateway's port answers the replicas (the rolling drain calls its /workers).
    assert _connect_from("rep-b", gw.ssh_hostname, gw.gateway.port) == "open"
    lab.enable_ssh(("rep-a",))
    data = lab.ssh_connection_data("rep-a")
    ssh = [
        "ssh",
        "-i",
        data["ssh_key"],
        "-o",
        f"UserKnownHostsFile={data['ssh_known_hosts_file']}",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        "ConnectTimeout=10",
        f"root@{address}",
        "echo reached",
    ]
    answer = subprocess.run(ssh, capture_output=True, text=True, timeout=60)
    assert answer.stdout.strip() == "reached", answer.stderr
    assert _connect_from("rep-b", address, 22) == "EHOSTUNREACH"


def test_both_replicas_run_the_same_environment_from_the_same_lock(site):
    """The two gpu guests' engine environments, built from one lock, hold the same packages:
    `uv pip freeze` of each environment's own interpreter, run inside each guest."""
    freezes, names = {}, {}
    for role, node in zip(("rep-a", "rep-b"), replicas(site.hosts), strict=True):
        guest = testinfra.get_host(f"docker://{lab.container_name(role)}")
        current = f"{node.base.install_root}/current"
        names[role] = guest.check_output(f"basename $(readlink -f {current})")
        freezes[role] = guest.check_output(f"uv pip freeze --python {current}/bin/python")
    assert names["rep-a"] == names["rep-b"], names  # the same stamp: the same lock, the same inputs
    assert freezes["rep-a"].strip(), "an empty freeze compares nothing"
    assert freezes["rep-a"] == freezes["rep-b"]


def test_the_benchmarks_path_through_the_gateway(site):
    """`python -m checks.bench --through-gateway` as far as the lab can take it: the target
    it picks (the gateway's address, bench_serving running on the gpu node) and the key it reads
    there (the node's 0600 file, into OPENAI_API_KEY) answer a generation from inside the node.
    bench_serving itself needs the full engine environment (numpy, transformers, a tokenizer)
    and a streaming server: not in the lab."""
    from checks import bench, server_checks

    target = bench._target(bench._arguments(["--inventory", str(INVENTORY), "--through-gateway"]))
    assert target["base_url"] == gateway_url(site.group("gateways")[0])
    expect = target["expect"]
    body = json.dumps(
        {"model": expect.served_model_name, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    )
    script = (
        server_checks.api_key_assignment(expect, "OPENAI_API_KEY")
        + 'printf \'header = "Authorization: Bearer %s"\\n\' "$OPENAI_API_KEY" | curl -sS -o /dev/null'
        f" -w '%{{http_code}}' -K - -H 'Content-Type: application/json' -d '{body}'"
        f" {target['base_url']}/v1/chat/completions"
    )
    node = testinfra.get_host(target["url"])
    assert node.check_output(f"bash -c {shlex.quote(script)}") == "200"


def test_stopped_replica_is_degraded_and_the_endpoint_serves(site, key):
    node = replicas(site.hosts)[1]
    guest = testinfra.get_host(f"docker://{lab.container_name('rep-b')}")
    guest.check_output("systemctl stop inference-engine.service")
    try:
        assert [_chat(site, key) for _ in range(10)] == [200] * 10
        result = _wait_verdict("DEGRADED")
        assert result.returncode == 3, result.stdout + result.stderr
        assert f"down: {worker_url(node)}" in result.stdout, result.stdout
    finally:
        guest.check_output("systemctl start inference-engine.service")
    result = _wait_verdict("HEALTHY")
    assert result.returncode == 0, result.stdout + result.stderr


def _command(*argv: str, timeout: float = 60, env: dict | None = None) -> subprocess.CompletedProcess:
    """The installed `inference-host` command, as an operator runs it."""
    return subprocess.run(
        [str(Path(sys.executable).with_name("inference-host")), *argv],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def _served(node, key: str) -> float:
    """The replica's own count of requests it processed (the stand-in's sglang:num_requests_total,
    as SGLang's tokenizer manager counts them)."""
    request = urllib.request.Request(f"{worker_url(node)}/metrics", headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        text = answer.read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith("sglang:num_requests_total"))


def test_status_answers_each_host_within_its_bound(site):
    started = time.monotonic()
    result = _command("status", str(INVENTORY), "--json", timeout=60)
    took = time.monotonic() - started
    print(f"\ninference-host status of the replicas lab (3 hosts): {took:.1f} s")
    assert result.returncode == 0, result.stdout + result.stderr
    answer = json.loads(result.stdout)
    hosts = {h["name"]: h for h in answer["hosts"]}
    for node in replicas(site.hosts):
        host = hosts[node.name]
        assert host["stack"]["active"] == site.stack.active.id, host["stack"]
        assert host["stack"]["lock"].endswith(f"/locks/{host['stack']['environment']}.txt")
        assert host["engine"]["state"] == "active" and host["engine"]["up_seconds"] > 0, host["engine"]
        # The lab's nvidia-smi stand-in answers only what was captured on a real GPU, and no
        # capture has memory.used or temperature.gpu: it refuses, and status says so.
        gpus = host["gpus"]
        assert gpus["count"] == node.gpu.count or "not answered in the lab" in gpus["problem"], gpus
        assert host["health"].get("verdict") or host["health"].get("problem"), host["health"]
        assert answer["replicas"][node.name].startswith("ready at"), answer["replicas"]
    gateway = hosts[site.group("gateways")[0].name]
    assert len(gateway["workers"]) == 2 and gateway["alerts"]["firing"] is not None, gateway
    screen = _command("status", str(INVENTORY), timeout=60)
    assert screen.returncode == 0 and "stack" in screen.stdout and "alerts" in screen.stdout, screen.stdout
    # What status bounds: each host's answer (4 s). The whole command also loads and validates the
    # inventory first (validation.py, 1.6 s of CPU): 7.8-10.8 s in all at a load of 12 on 2 cores.
    assert all(h["seconds"] <= 4 for h in answer["hosts"]), [(h["name"], h["seconds"]) for h in answer["hosts"]]
    assert took < 15, f"status took {took:.1f} s"


def test_drain_takes_a_replica_out_and_undrain_brings_it_back(site, key):
    node = replicas(site.hosts)[1]
    started = time.monotonic()
    result = _command("drain", str(INVENTORY), node.name, timeout=600)
    drained_s = time.monotonic() - started
    try:
        assert result.returncode == 0, result.stdout + result.stderr
        before = _served(node, key)
        assert [_chat(site, key) for _ in range(8)] == [200] * 8  # the other replica serves
        assert _served(node, key) == before, "a drained replica got a new request"
        status = _command("status", str(INVENTORY), "--json", timeout=60)
        answer = json.loads(status.stdout or "{}")
        assert answer, status.stderr
        state = answer["replicas"][node.name]
        assert state.startswith(("draining", "out")), state
        assert {h["name"]: h for h in answer["hosts"]}[node.name]["replica"]["drained_on_purpose"]
    finally:  # the later tests need both replicas in the gateway
        started = time.monotonic()
        result = _command("undrain", str(INVENTORY), node.name, timeout=900)
        undrained_s = time.monotonic() - started
    print(f"\ninference-host drain: {drained_s:.1f} s, undrain: {undrained_s:.1f} s")
    assert result.returncode == 0, result.stdout + result.stderr
    status = json.loads(_command("status", str(INVENTORY), "--json", timeout=60).stdout)
    assert status["replicas"][node.name].startswith("ready at"), status["replicas"]
    assert not {h["name"]: h for h in status["hosts"]}[node.name]["replica"]["drained_on_purpose"]
    assert [_chat(site, key) for _ in range(4)] == [200] * 4


def test_a_hung_replica_is_routed_around_and_named(site, key):
    """A replica whose generations never progress (the stand-in's hung mode: a GPU stuck in a
    kernel, a deadlocked all-reduce) still listens, so only a health check that generates finds
    it: its /health's one-token generation gets no output, smg's probe fails (5 s timeout), smg
    marks it unhealthy and sends new requests to the other replica, and the gateway verdict
    names it; once it clears, smg takes it back."""
    node = replicas(site.hosts)[1]
    guest = testinfra.get_host(f"docker://{lab.container_name('rep-b')}")
    began = time.monotonic()
    guest.check_output("touch /run/inference-host-standin.hung")
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            listed = {w["url"]: w for w in _workers(site, key)}
            if not listed.get(worker_url(node), {}).get("is_healthy", False):
                break
            time.sleep(1)
        marked = time.monotonic() - began
        assert [_chat(site, key) for _ in range(6)] == [200] * 6  # all to the other replica
        result = _verdict()
        assert result.returncode == 3, result.stdout + result.stderr
        assert f"down: {worker_url(node)}" in result.stdout, result.stdout
    finally:
        guest.check_output("rm -f /run/inference-host-standin.hung")
    result = _wait_verdict("HEALTHY", timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    print(f"\nhung replica: unhealthy at smg after {marked:.1f} s; the check took {time.monotonic() - began:.1f} s")


def _inventory_with_active(tmp_path: Path, stack_id: str, site) -> Path:
    folder = tmp_path / stack_id / "inventory"
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(INVENTORY, folder / "lab_replicas.py")
    shutil.copytree(PROJECT_ROOT / "inventory/locks", folder / "locks", dirs_exist_ok=True)
    text = (PROJECT_ROOT / "inventory/stack.yml").read_text()
    (folder / "stack.yml").write_text(text.replace(f"active: {site.stack.active.id}", f"active: {stack_id}"))
    return folder / "lab_replicas.py"


# Rolling deploys in one run: 1 in CI (each is a whole deploy of three hosts); the median of 3
# for docs/testing.md's figure with INFERENCE_HOST_LAB_ROLLING_RUNS=3.
ROLLING_RUNS = int(os.environ.get("INFERENCE_HOST_LAB_ROLLING_RUNS", "1"))


# Long generations streamed through the gateway across each rolling upgrade: seconds each
# (the stand-in decodes 100 tokens/s: lab/standins/sglang_server), the same number the
# inventory's drain timeout is made from; 30 with INFERENCE_HOST_LAB_STREAM_SECONDS=30.
STREAM_SECONDS = int(os.environ.get("INFERENCE_HOST_LAB_STREAM_SECONDS", "8"))
STREAM_TOKENS = 100 * STREAM_SECONDS
STREAMS_AT_ONCE = 3
# One more stream at a time with a long prompt: 6,000 words, 3 s in prefill at the stand-in's
# 2,000 words/s, during which SGLang's gauges read 0 (the running batch before it joined). Four
# streams on two replicas of at most 2 running requests each (inventory/lab_replicas.py): while
# one replica is out, two of them wait in the other's queue.
LONG_PROMPT_WORDS = 6000


def _stream(site, key: str, long_prompt: bool = False) -> dict:
    """One streamed chat completion through the gateway (tests/lab/harness.py stream_chat)."""
    prompt = f"stream {time.monotonic()}" + (" word" * LONG_PROMPT_WORDS if long_prompt else "")
    body = {
        "model": "kimi-k2.5",
        "max_tokens": STREAM_TOKENS,
        "stream": True,
        "messages": [{"role": "user", "content": prompt}],
    }
    result = stream_chat(
        f"{gateway_url(site.group('gateways')[0])}/v1/chat/completions", body, key, timeout=3 * STREAM_SECONDS + 120
    )
    return {**result, "long_prompt": long_prompt}


# A long prompt sent straight to a replica (not through the gateway) the moment smg lists it as
# draining: 6,000 words (3 s in prefill, in no gauge nor in smg's load), then 2 s of tokens. The
# drain must wait for it: only the replica's live load (/v1/loads) holds it.
STRAIGHT_TOKENS = 200


def _workers(site, key: str) -> list[dict]:
    return gateway_workers(gateway_url(site.group("gateways")[0]), control_plane_key(site))


def _straight_body() -> dict:
    prompt = f"straight {time.monotonic()}" + " word" * LONG_PROMPT_WORDS
    return {
        "model": "kimi-k2.5",
        "max_tokens": STRAIGHT_TOKENS,
        "stream": True,
        "messages": [{"role": "user", "content": prompt}],
    }


def _queue_watch(site, stop: threading.Event, seen: dict) -> None:
    """The replicas' sglang:num_queue_reqs, polled (no key needed for /metrics): the most seen."""
    while not stop.is_set():
        for node in replicas(site.hosts):
            try:
                with urllib.request.urlopen(f"{worker_url(node)}/metrics", timeout=2) as answer:
                    for line in answer.read().decode().splitlines():
                        if line.startswith("sglang:num_queue_reqs{"):
                            seen[worker_url(node)] = max(seen.get(worker_url(node), 0), float(line.split()[-1]))
            except (urllib.error.URLError, OSError, ValueError):
                pass  # restarting
        time.sleep(0.3)


def _under_load(site, key, gw, action, what: str) -> tuple[float, float, str]:
    """action() (a rolling deploy) while a client asks through the gateway all along and long
    generations stream through it from before until after: no request fails, every stream ends
    with all its tokens, each replica was drained at the gateway before its restart. Returns the
    longest gap between two answers, between two tokens of a stream, and what was delivered."""
    stop, ok, failed, streams = threading.Event(), [], [], []

    def client():
        while not stop.is_set():  # queued behind the streams at times (2 running at most)
            (ok if _chat(site, key, timeout=3 * STREAM_SECONDS + 30) == 200 else failed).append(time.monotonic())

    def streamer(long_prompt=False):
        while not stop.is_set():  # a stream begun before the deploy ends runs to its end
            streams.append(_stream(site, key, long_prompt))

    queued: dict[str, float] = {}
    straight: dict[str, dict] = {}
    since = gw.check_output("date '+%Y-%m-%d %H:%M:%S'")
    threads = [
        threading.Thread(target=client),
        threading.Thread(target=_queue_watch, args=(site, stop, queued)),
        # A long prompt sent straight to each replica (not through the gateway) as its drain begins.
        threading.Thread(
            target=straight_at_drain,
            args=(gateway_url(site.group("gateways")[0]), key, stop, straight, _straight_body),
            kwargs={"control_key": control_plane_key(site)},
        ),
        threading.Thread(target=streamer, kwargs={"long_prompt": True}),
    ]
    threads += [threading.Thread(target=streamer) for _ in range(STREAMS_AT_ONCE)]
    for thread in threads:
        thread.start()
    time.sleep(1)  # the first streams are under way before the upgrade starts
    try:
        returncode, explain = action()
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert returncode == 0, explain
    assert failed == [], f"{len(failed)} request(s) failed through the gateway during the {what}"
    cut = [
        s
        for s in streams
        if s["error"] or s["errors"] or not s["done"] or s["finish"] != "length" or s["chunks"] != STREAM_TOKENS
    ]
    print(
        f"\n{what}: per stream, tokens delivered/expected (long: a 6,000-word prompt; first token after the request):"
    )
    for s in sorted(streams, key=lambda s: s["began"]):
        first = f"{s['first'] - s['began']:.1f} s" if s["first"] else "none"
        print(
            f"  {'long' if s['long_prompt'] else 'short'} {s['chunks']}/{STREAM_TOKENS}, first token {first},"
            f" {s['finish']}, done {s['done']}{', error ' + s['error'] if s['error'] else ''}"
        )
    print(f"  most requests seen queued (sglang:num_queue_reqs): {queued}")
    for url, s in sorted(straight.items()):
        print(
            f"  straight to {url} as it was drained (6,000-word prompt): {s.get('chunks')}/{STRAIGHT_TOKENS},"
            f" {s.get('finish')}, done {s.get('done')}{', error ' + s['error'] if s.get('error') else ''}"
        )
    # Each replica got a long prompt straight (not through the gateway) as its drain began, and
    # was restarted only once it had ended: every token came.
    assert sorted(straight) == sorted(worker_url(node) for node in replicas(site.hosts)), straight
    assert all(
        s.get("done") and s.get("finish") == "length" and s.get("chunks") == STRAIGHT_TOKENS and not s.get("errors")
        for s in straight.values()
    ), straight
    assert streams and cut == [], f"{len(cut)} of {len(streams)} stream(s) cut or short: {cut[:3]}"
    assert any(s["long_prompt"] for s in streams)
    assert max(queued.values(), default=0) > 0, f"no request was ever queued: {queued}"
    got = sorted(s["chunks"] for s in streams)
    delivered = (
        f"{len(streams)} streams, tokens delivered/expected min {got[0]}/{STREAM_TOKENS}, max {got[-1]}/{STREAM_TOKENS}"
    )
    # smg 1.13.0 logs each DELETE /workers/{id} it drains (workflow/steps/local/drain_workers.rs).
    journal = gw.check_output(f"journalctl -u smg --no-pager --since '{since}'")
    assert journal.count("Draining 1 worker(s)") == len(replicas(site.hosts)), journal[-3000:]
    return max(b - a for a, b in zip(ok, ok[1:], strict=False)), max(s["gap"] for s in streams), delivered


def test_rolling_upgrade_never_drops_the_endpoint(site, key, tmp_path):
    """Rolling switches by the real deploy (to another stack, then back and again when asked
    for more runs), a client asking through the gateway all along and long generations
    streaming through it from before the upgrade until after it: no request fails, every stream
    ends with all its tokens, each replica was drained at the gateway before its restart, and
    the longest gap between two answers and between two tokens of a stream are reported. Then,
    with INFERENCE_HOST_LAB_ROLLBACK=1, `inference-host rollback` under the same load returns the
    lab to the stack it started on (the environment kept on each replica), one replica at a time,
    with nothing dropped."""
    old = site.stack.active.id
    new = next(s for s in site.stack.stacks if s != old)
    upgrade = _inventory_with_active(tmp_path, new, site)
    gw = testinfra.get_host(f"docker://{lab.container_name('gw')}")
    gaps, token_gaps, delivered = [], [], []
    inventories = [(upgrade, INVENTORY)[run % 2] for run in range(ROLLING_RUNS)]
    for number, inventory in enumerate(inventories, 1):

        def deploy(inventory=inventory):
            run = run_deploy(inventory)
            return run.returncode, run.explain()

        gap, token_gap, what = _under_load(site, key, gw, deploy, f"rolling upgrade {number}")
        gaps.append(gap)
        token_gaps.append(token_gap)
        delivered.append(what)
    print(
        f"\nrolling upgrade through the gateway (lab): longest gap between answers"
        f" {', '.join(f'{g:.2f}' for g in gaps)} s; median {statistics.median(gaps):.2f} s;"
        f" {STREAM_SECONDS} s streams: {'; '.join(delivered)}, longest gap between tokens"
        f" {', '.join(f'{g:.2f}' for g in token_gaps)} s; median {statistics.median(token_gaps):.2f} s"
    )
    if inventories[-1] != upgrade or os.environ.get("INFERENCE_HOST_LAB_ROLLBACK") != "1":
        # An even number of runs ended on the old stack: nothing to roll back. The rollback is
        # one more rolling deploy of three hosts (minutes): opt-in, CI's lab budget is spent.
        return

    def rollback():
        result = _command("rollback", str(upgrade), timeout=1800)
        return result.returncode, result.stdout[-4000:] + result.stderr[-4000:]

    started = time.monotonic()
    gap, token_gap, what = _under_load(site, key, gw, rollback, "inference-host rollback")
    print(
        f"\ninference-host rollback {new} -> {old} through the gateway (lab): {time.monotonic() - started:.0f} s;"
        f" longest gap between answers {gap:.2f} s, between tokens {token_gap:.2f} s; {what}"
    )
    assert f"active: {old}" in (upgrade.parent / "stack.yml").read_text()
    status = json.loads(_command("status", str(upgrade), "--json", timeout=60).stdout)
    assert {h["stack"]["active"] for h in status["hosts"] if h["stack"]} == {old}, status


# A stream sent straight to a replica that no gateway lists (taken out by hand, or a gateway
# that lost it): 1,500 tokens, 15 s at the stand-in's 100 tokens/s, within the lab's drain
# timeout (inventory/lab_replicas.py: 34 s by default), so a restart before its end is a cut.
UNLISTED_STREAM_TOKENS = 1500


def _gateway_call(site, method: str, path: str, body: dict | None = None) -> int:
    """smg's control plane with its key (the only key its /workers take)."""
    request = urllib.request.Request(
        f"{gateway_url(site.group('gateways')[0])}{path}",
        json.dumps(body).encode() if body is not None else None,
        {"Authorization": f"Bearer {control_plane_key(site)}", "Content-Type": "application/json"},
        method=method,
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        return answer.status


def test_a_replica_no_gateway_lists_is_restarted_only_after_a_stream_sent_straight_to_it(site, key):
    """The replica is out of the gateway (DELETE /workers/{id}, smg dropped the entry), a long
    stream goes straight to it, and its rolling step runs: the deploy's own command on the
    replica (roles/serving switch_command: inference-engine-rolling around the switch, the
    environment it already serves). Nothing lists it, so only its own live load (/v1/loads)
    holds the stream: the step waits for it, restarts the engine after the stream's end, puts
    the replica back into the gateway, and the stream ends with all its tokens and [DONE]."""
    from roles.serving import switch_command
    from roles.shared import layout

    node = replicas(site.hosts)[0]
    url, unit = worker_url(node), node.serving.unit_name
    guest = testinfra.get_host(f"docker://{lab.container_name('rep-a')}")
    [worker_id] = [w["id"] for w in _workers(site, key) if w["url"] == url]
    assert _gateway_call(site, "DELETE", f"/workers/{worker_id}") == 202
    deadline = time.monotonic() + node.serving.drain_timeout_s + 60  # smg drops it after its settle time
    while any(w["url"] == url for w in _workers(site, key)) and time.monotonic() < deadline:
        time.sleep(1)
    try:
        assert not any(w["url"] == url for w in _workers(site, key)), "smg still lists the replica"
        current = layout.current_link(node.base.install_root)
        target = guest.check_output(f"readlink {shlex.quote(current)}")
        command, _ = switch_command(node, site.hosts, unit, current, target)
        since = int(guest.check_output(f"systemctl show -p ExecMainStartTimestampMonotonic --value {unit}"))
        body = {**_straight_body(), "max_tokens": UNLISTED_STREAM_TOKENS}
        stream: dict = {}
        sender = threading.Thread(
            target=lambda: stream.update(stream_chat(f"{url}/v1/chat/completions", body, key, timeout=300))
        )
        sender.start()
        time.sleep(2)  # under way: in prefill (the 6,000-word prompt, 3 s), then streaming
        began = time.monotonic()
        step = guest.run(command)
        took = time.monotonic() - began
        sender.join()
        ended = stream.get("ended") or time.monotonic()
        restarted = int(guest.check_output(f"systemctl show -p ExecMainStartTimestampMonotonic --value {unit}"))
    finally:  # the later tests need both replicas in the gateway (the step re-adds it itself)
        if not any(w["url"] == url for w in _workers(site, key)):
            _gateway_call(site, "POST", "/workers", {"url": url, "api_key": key})
    print(
        f"\nunlisted replica {url}: its rolling step took {took:.1f} s; the stream straight to it:"
        f" {stream.get('chunks')}/{UNLISTED_STREAM_TOKENS} tokens, {stream.get('finish')}, done {stream.get('done')},"
        f" ended {ended - began:.1f} s into the step; the engine restarted"
        f" {(restarted / 1e6) - ended:.1f} s after the stream's end\n{step.stdout}{step.stderr}"
    )
    assert step.rc == 0, step.stdout + step.stderr
    # Cut by a restart at once (the drain before, planted in the lab: 0/1500 tokens, still in prefill).
    assert not stream.get("error") and not stream.get("errors"), stream
    assert stream.get("done") and stream.get("finish") == "length", stream
    assert stream.get("chunks") == UNLISTED_STREAM_TOKENS, stream
    assert f"{url} has nothing in flight (gateways and engine, 2 s apart)" in step.stdout, step.stdout
    # The engine's process started again (systemd's monotonic clock is this kernel's, as is
    # time.monotonic()), and only after the stream had ended.
    assert restarted > since and restarted / 1e6 >= ended, (since, restarted, ended)
    assert any(w["url"] == url and w["is_healthy"] for w in _workers(site, key)), "not back in the gateway"


def _rotate(value: str) -> subprocess.CompletedProcess:
    """`inference-host rotate` of the API key, the new value on stdin (never on a command line)."""
    return subprocess.run(
        [str(Path(sys.executable).with_name("inference-host")), "rotate", str(INVENTORY), "engine_api_key"],
        input=value + "\n",
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
    )


def _key_windows(records: list[tuple[float, str, int]], which: str) -> dict:
    """One client's answers: how many of each status, the first and last 200 (seconds since the
    rotation began), the failures (non-200) after its first 200 and before its last."""
    mine = [(t, code) for t, w, code in records if w == which]
    ok = [t for t, code in mine if code == 200]
    first, last = (ok[0], ok[-1]) if ok else (None, None)
    between = [code for t, code in mine if first is not None and first <= t <= last and code != 200]
    counts: dict[int, int] = {}
    for _, code in mine:
        counts[code] = counts.get(code, 0) + 1
    return {"answers": counts, "first_ok": first, "last_ok": last, "failed_between": len(between)}


@pytest.mark.skipif(
    os.environ.get("INFERENCE_HOST_LAB_ROTATE") != "1",
    reason="two rotations of the API key, each a rolling deploy of three hosts (minutes): opt-in,"
    " INFERENCE_HOST_LAB_ROTATE=1",
)
def test_rotating_the_api_key_counts_what_clients_see(site, key, cmdline_sampler):
    """`inference-host rotate INVENTORY engine_api_key` while two clients ask through the gateway
    all along, one with the old key and one with the new: the rotation ends with the new key
    accepted and the old one refused (401), and each client's answers are counted: when the old
    key stopped working, when the new one started, the gap between the two (neither key served)
    and any failure on either side of it. Then the key is rotated back (the lab as it was)."""
    import secrets as random_values

    new = random_values.token_urlsafe(32)
    cmdline_sampler.watch("engine_api_key (rotated)", new)
    records: list[tuple[float, str, int]] = []
    stop = threading.Event()
    started = time.monotonic()

    def client(which: str, value: str) -> None:
        while not stop.is_set():
            code = _chat(site, value, timeout=30)
            records.append((time.monotonic() - started, which, code))
            time.sleep(0.2)

    threads = [threading.Thread(target=client, args=(w, v)) for w, v in (("old", key), ("new", new))]
    for thread in threads:
        thread.start()
    try:
        rotated = _rotate(new)
        took = time.monotonic() - started
        time.sleep(3)  # a few answers after the rotation ended
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        back = _rotate(key)  # the lab's own key again, for whatever runs after this test
    old_side, new_side = _key_windows(records, "old"), _key_windows(records, "new")
    gap = (
        new_side["first_ok"] - old_side["last_ok"]
        if new_side["first_ok"] is not None and old_side["last_ok"] is not None
        else None
    )
    print(
        f"\ninference-host rotate engine_api_key through the gateway (lab): {took:.0f} s; old key {old_side};"
        f" new key {new_side}; neither key served for {gap if gap is None else round(gap, 1)} s"
        f" (negative: both keys served at once for that long)"
    )
    assert rotated.returncode == 0, rotated.stdout[-3000:] + rotated.stderr[-3000:]
    assert back.returncode == 0, back.stdout[-3000:] + back.stderr[-3000:]
    assert new_side["first_ok"] is not None, "the new key was never accepted"
    tail = [code for t, w, code in records if w == "old" and t > took]
    assert tail and set(tail) == {401}, f"the old key after the rotation: {tail}"
    assert key not in rotated.stdout + rotated.stderr and new not in rotated.stdout + rotated.stderr


def _inventory_with_tenants(tmp_path: Path, tenants: dict[str, str]) -> Path:
    """The lab's replicas inventory with serving_tenant_api_key_secrets on both replicas."""
    folder = tmp_path / "-".join(sorted(tenants)) / "inventory"
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copytree(PROJECT_ROOT / "inventory/locks", folder / "locks", dirs_exist_ok=True)
    shutil.copy(PROJECT_ROOT / "inventory/stack.yml", folder / "stack.yml")
    text = INVENTORY.read_text()
    line = '    "serving_admin_api_key_secret": "engine_admin_api_key",\n'
    assert text.count(line) == 1
    (folder / "lab_replicas.py").write_text(
        text.replace(line, line + f'    "serving_tenant_api_key_secrets": {tenants!r},\n')
    )
    return folder / "lab_replicas.py"


def test_tenant_keys_serve_the_data_plane_only_and_overlap_a_rotation(site, key, tmp_path, cmdline_sampler):
    """Issue 52: client keys per tenant. Two tenants deployed: each tenant's key gets 200 on the data
    plane through the real smg 1.13.0 (--tenant-api-key, which passes the caller's key on) and
    straight at a replica (the stand-in applies the tenant-keys patch of SGLang's auth.py), 401 on
    smg's /workers and the replica's admin routes; an unknown key 401. One tenant removed: its key is
    refused, the other still served (the overlap a rotation needs). A second deploy changes
    nothing. Then the lab's own inventory again (no tenants) for whatever runs after."""
    import secrets as random_values

    _, password_file = lab.throwaway_vault()
    password = Path(password_file).read_bytes().strip()
    names = {"alpha": "tenant_alpha_api_key", "beta": "tenant_beta_api_key"}
    values = {tenant: random_values.token_urlsafe(32) for tenant in names}
    for tenant, name in names.items():
        vault.set_secret(Path(site.secrets_file), name, values[tenant], password)
        cmdline_sampler.watch(f"{name} (a tenant's key)", values[tenant])
    gw, replica = gateway_url(site.group("gateways")[0]), worker_url(replicas(site.hosts)[0])
    chat = {"model": "kimi-k2.5", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    unknown = random_values.token_urlsafe(32)
    try:
        both = run_deploy(_inventory_with_tenants(tmp_path, names))
        assert both.returncode == 0, both.explain()
        for tenant in names:
            value = values[tenant]
            assert [_chat(site, value) for _ in range(4)] == [200] * 4, tenant  # both replicas, round robin
            assert _call(f"{replica}/v1/chat/completions", value, "POST", chat) == 200, tenant
            assert _call(f"{gw}/workers", value) == 401, tenant
            assert _call(f"{replica}/flush_cache", value, "POST") == 401, tenant
            assert _call(f"{replica}/pause_generation", value, "POST", {}) == 401, tenant
        assert _chat(site, unknown) == 401 and _call(f"{replica}/v1/chat/completions", unknown, "POST", chat) == 401
        assert _chat(site, key) == 200  # the client key as before
        guest = testinfra.get_host(f"docker://{lab.container_name('rep-a')}")
        gateway_host = testinfra.get_host(f"docker://{lab.container_name('gw')}")
        assert gateway_host.file("/etc/smg/tenant-api-keys").mode == 0o600
        assert gateway_host.file("/etc/smg/tenant-api-keys").user == "smg"
        assert all(
            values[t]
            not in gateway_host.check_output(
                "cat /proc/$(systemctl show -p MainPID --value smg.service)/cmdline | tr '\\0' ' '"
            )
            for t in names
        )
        tenant_file = guest.check_output("ls /opt/inference-host/current/serving/*-tenant-api-keys.json")
        assert guest.file(tenant_file).mode == 0o600
        # One tenant removed: its key refused everywhere, the other's still served.
        alpha = run_deploy(_inventory_with_tenants(tmp_path, {"alpha": names["alpha"]}))
        assert alpha.returncode == 0, alpha.explain()
        assert [_chat(site, values["alpha"]) for _ in range(4)] == [200] * 4
        assert [_chat(site, values["beta"]) for _ in range(4)] == [401] * 4
        for url in (worker_url(node) for node in replicas(site.hosts)):
            assert _call(f"{url}/v1/chat/completions", values["alpha"], "POST", chat) == 200, url
            assert _call(f"{url}/v1/chat/completions", values["beta"], "POST", chat) == 401, url
        again = run_deploy(_inventory_with_tenants(tmp_path, {"alpha": names["alpha"]}))
        assert again.returncode == 0, again.explain()
        assert again.changed == [], again.changed
    finally:
        restored = run_deploy(INVENTORY)  # the lab's own inventory: no tenants
    assert restored.returncode == 0, restored.explain()
    assert _chat(site, values["alpha"]) == 401 and _chat(site, key) == 200


def test_no_command_line_held_a_vault_value(site, cmdline_sampler):
    """Issue 53: every process's command line, in the three containers and on the control side,
    sampled from before the first deploy through the second, the rolling upgrade and (opted in)
    the rotation above (tests/lab/cmdline_sampler.py): none held a value of the lab's vault. Then
    the check on a planted fault: a process in a replica whose argv holds the API key is caught."""
    sampler = cmdline_sampler.stop()
    print(
        f"\ncommand lines sampled through the replicas lab's deploys: {sampler.passes} passes,"
        f" {sampler.processes} distinct command lines, {len(sampler.found)} holding a vault value"
    )
    assert sampler.found == [], "\n".join(sampler.found)
    assert sampler.processes > 100, "the sampler saw next to nothing: is /proc the lab's?"
    container = lab.container_name("rep-a")
    planted = subprocess.Popen(
        ["docker", "exec", "-i", container, "sh", "-c", 'read -r v; sh -c "sleep 15; :" planted "$v"'],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert planted.stdin
        planted.stdin.write(sampler.secrets["engine_api_key"] + "\n")
        planted.stdin.close()
        deadline, caught = time.monotonic() + 30, []
        while not caught and time.monotonic() < deadline:
            caught = sampler.sample_once()
            time.sleep(0.2)
    finally:
        planted.kill()  # the planted shell in the replica ends by itself (sleep 15)
    assert any(line.startswith("engine_api_key on the command line of pid ") for line in caught), caught
    assert all(sampler.secrets["engine_api_key"] not in line for line in caught), "a report printed the value"


# -- TLS on the gateway and from the gateway to its workers (docs/security.md#tls) --------------

TLS_ENTRIES = ("engine_tls_cert", "engine_tls_key", "gateway_tls_cert", "gateway_tls_key")


def _set_tls_entries(material) -> None:
    """One certificate for the three hosts' addresses (their address_of: the names asked), stored
    as the engines' and the gateway's, as `vault set` would store them."""
    path, password_file = lab.throwaway_vault()
    password = Path(password_file).read_bytes().strip()
    for name in TLS_ENTRIES:
        vault.set_secret(Path(path), name, material.key_pem if name.endswith("key") else material.cert_pem, password)


def _drop_tls_entries() -> None:
    path, _ = lab.throwaway_vault()
    entries = vault.stored(Path(path))
    vault._write(Path(path), {name: value for name, value in entries.items() if name not in TLS_ENTRIES})


def _stop_engines(site) -> None:
    """A change of the replicas' scheme (http:// <-> https://) is not a rolling step: the drain
    would read the running engine's load at the URL of the other scheme and refuse (exit 7). With
    the engines stopped nothing listens, nothing is in flight (docs/security.md#tls)."""
    for role, node in zip(("rep-a", "rep-b"), replicas(site.hosts), strict=True):  # inventory order
        guest = testinfra.get_host(f"docker://{lab.container_name(role)}")
        guest.check_output(f"systemctl stop {node.serving.unit_name}.service")


def _curl(*options: str) -> tuple[int, str]:
    """curl (OpenSSL) on this machine, the control machine the firewall lets reach the endpoint."""
    done = subprocess.run(
        ["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "-m", "10", *options],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return done.returncode, done.stdout + done.stderr


def test_the_gateway_serves_tls_and_reaches_tls_replicas_verified_with_the_ca(site, key, tmp_path):
    """gateway_tls_* and serving_tls_* (the replicas on the next stack, SGLang 0.5.10: 0.5.9 has no
    TLS option) with one lab CA: the real smg 1.13.0 serves HTTPS with the files the deploy wrote
    (0600, smg's) and calls its workers at https:// verified with --ca-cert-paths; the deploy's
    readiness wait, the gateway check, `inference-host status` and `drain`/`undrain` (the rolling
    script on the replica) ask it with the CA. A real client
    (curl) with the CA gets 200 through it; plain HTTP gets no answer; without the CA curl exits 60;
    a second deploy changes nothing. Then the lab is put back as the other tests know it."""
    from lab.tls_ca import make_tls_material
    from roles.shared.layout import GATEWAY_TLS_FILES, GATEWAY_WORKERS_CA_FILE
    from roles.site import address_of

    gw = site.group("gateways")[0]
    names = [address_of(host) for host in [*replicas(site.hosts), gw]]
    material = make_tls_material(names)
    ca = tmp_path / "lab-ca.pem"
    ca.write_text(material.ca_pem)
    env = {"INFERENCE_HOST_LAB_TLS_CA_FILE": str(ca)}
    new = next(s for s in site.stack.stacks if s != site.stack.active.id)
    assert site.stack.stacks[new].version != "0.5.9", new
    inventory = _inventory_with_active(tmp_path, new, site)
    gateway_host = testinfra.get_host(f"docker://{lab.container_name('gw')}")
    url = f"https://{address_of(gw)}:{gw.gateway.port}/v1/chat/completions"
    chat = ["-H", f"Authorization: Bearer {key}", "-H", "Content-Type: application/json"]
    chat += [
        "--data-binary",
        '{"model": "kimi-k2.5", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}',
    ]
    _set_tls_entries(material)
    started = time.monotonic()
    try:
        _stop_engines(site)
        run = run_deploy(inventory, env=env)
        # The replicas' readiness probes (https, --cacert), smg's readiness wait (https, --cacert:
        # it answers 200 once it reached a replica at https:// verified with --ca-cert-paths).
        assert run.returncode == 0, run.explain()
        deployed = time.monotonic() - started
        for kind in ("cert", "key"):
            file = gateway_host.file(GATEWAY_TLS_FILES[kind])
            assert (file.mode, file.user) == (0o600, "smg"), GATEWAY_TLS_FILES[kind]
        assert gateway_host.file(GATEWAY_TLS_FILES["ca"]).mode == 0o644
        # smg renames its process (smg::router): its arguments are read in the unit it runs.
        cmdline = gateway_host.check_output("systemctl show -p ExecStart --value smg.service")
        cmdline += gateway_host.check_output(
            "cat /proc/$(systemctl show -p MainPID --value smg.service)/cmdline | tr '\\0' ' '"
        )
        assert f"--tls-cert-path {GATEWAY_TLS_FILES['cert']} --tls-key-path {GATEWAY_TLS_FILES['key']}" in cmdline
        assert f"--ca-cert-paths {GATEWAY_WORKERS_CA_FILE}" in cmdline and "https://" in cmdline
        key_body = material.key_pem.splitlines()[1]
        assert key_body not in cmdline and key_body not in gateway_host.check_output("journalctl --no-pager -o cat")
        assert key_body not in run.stdout + run.stderr

        with_ca = [_curl("--cacert", str(ca), *chat, url) for _ in range(4)]  # both replicas, round the policy
        assert with_ca == [(0, "200")] * 4, with_ca
        plain = _curl(*chat, url.replace("https://", "http://"))
        assert plain[0] != 0 and plain[1].startswith("000"), plain  # no HTTP answer at all
        without_ca = _curl(*chat, url)
        assert without_ca[0] == 60, without_ca  # CURLE_PEER_FAILED_VERIFICATION
        verdict = subprocess.run(
            [sys.executable, "-m", "checks.gateway", str(inventory)],
            cwd=PROJECT_ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, **env},
        )
        assert verdict.returncode == 0 and ": HEALTHY " in verdict.stdout, verdict.stdout + verdict.stderr
        states = json.loads(_command("status", str(inventory), "--json", env=env).stdout)["replicas"]
        assert all(state.startswith("ready at") for state in states.values()), states  # https:// URLs listed
        # drain and undrain: inference-engine-rolling on the replica asks the gateway's /workers at
        # https:// (--gateway-ca) and the replica's own routes at https:// (--worker-ca).
        node = replicas(site.hosts)[1]
        drained = _command("drain", str(inventory), node.name, timeout=600, env=env)
        assert drained.returncode == 0, drained.stdout + drained.stderr
        state = json.loads(_command("status", str(inventory), "--json", env=env).stdout)["replicas"][node.name]
        assert state.startswith(("draining", "out")), state
        undrained = _command("undrain", str(inventory), node.name, timeout=900, env=env)
        assert undrained.returncode == 0, undrained.stdout + undrained.stderr
        state = json.loads(_command("status", str(inventory), "--json", env=env).stdout)["replicas"][node.name]
        assert state.startswith("ready at"), state

        unchanged = run_deploy(inventory, env=env)
        assert unchanged.returncode == 0 and unchanged.changed == [], unchanged.changed
    finally:
        _drop_tls_entries()
        _stop_engines(site)
        restored = run_deploy(INVENTORY)  # the lab as the other tests know it: its stack, plain HTTP
    assert restored.returncode == 0, restored.explain()
    for path in [*GATEWAY_TLS_FILES.values(), GATEWAY_WORKERS_CA_FILE]:
        assert not gateway_host.file(path).exists, path
    assert [_chat(site, key) for _ in range(2)] == [200, 200]
    took = time.monotonic() - started
    print(f"\nthe replicas lab in TLS: its deploy {deployed:.0f} s; with the second and the restore {took:.0f} s")
