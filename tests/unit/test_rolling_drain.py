"""roles/serving/templates/inference-engine-rolling.j2 run for real (sh, curl, jq) against a fake gateway
and a fake replica on this machine: the replica is taken out of the gateway, restarted only
once smg and its own live load (SGLang's /v1/loads, vLLM's /load) read nothing in flight,
whatever path the requests came by (or the drain timeout has passed), and added
back once the gateway has dropped the drained entry and the replica has answered a generation
of its own (one that answers none is not added back); the last healthy worker at a gateway is
not taken out, and a step that does not finish leaves its restart to the next deploy."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import ssl
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.unit.conftest import PROJECT_ROOT

# The lab's SGLang stand-in: its /v1/loads JSON is each release's (lab/standins/sglang_server).
_spec = importlib.util.spec_from_file_location(
    "sglang_standin", PROJECT_ROOT / "lab" / "standins" / "sglang_server" / "server.py"
)
STANDIN = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(STANDIN)

SCRIPT = PROJECT_ROOT / "roles" / "serving" / "templates" / "inference-engine-rolling.j2"
# The replica's client key, its admin key and the gateways' control-plane key (one role each).
CLIENT = "client-key-0123456789abcdef0123456789"
ADMIN_KEY = "admin-key-0123456789abcdef0123456789"
CONTROL = "control-0123456789abcdef0123456789ab"
# CI installs both (.ci/run) and must not skip (INFERENCE_HOST_REQUIRE_LAB=1 there).
pytestmark = pytest.mark.skipif(
    not (shutil.which("curl") and shutil.which("jq")) and os.environ.get("INFERENCE_HOST_REQUIRE_LAB") != "1",
    reason="needs curl and jq",
)


class Fake:
    """A gateway with smg 1.13.0's /workers routes (a worker's status "ready" and its "load", what
    smg has in flight to it, as the real one lists them; DELETE: Draining, still listed with its
    load, dropped after `settle` seconds) and a replica (`engine`: "sglang-0.5.9", "sglang-0.5.23"
    or "vllm") whose requests end at `busy_until`. The replica answers its live load as the
    release does (SGLang GET /v1/loads, the stand-in's own JSON builder; vLLM GET /load with
    --enable-server-load-tracking) and its Prometheus gauges. `seen` says where the requests
    show until they end:
    - "running": everywhere;
    - "dispatched": smg's load only (sent by the gateway, not arrived yet);
    - "prefill": smg's load and, on SGLang, the KV tokens in use only (a long prompt in chunked
      prefill: in neither the running batch nor the queue; the gauges read 0); vLLM's /load;
    - "queued": the engine's waiting count and gauge only (sent by another client);
    - "straight": a long prompt sent straight to the replica, not through the gateway: smg 0,
      the gauges 0 all along (set at prefill from the batch before it joined, next 40 decode
      steps on; vLLM: still in its API server, being tokenized), SGLang's KV tokens in use
      (and, after 1.5 s, the running batch), vLLM's /load;
    - "tokenizing": as "straight", but nothing at all for its first second (on its way to the
      scheduler), then the KV tokens in use.
    `lost`: vLLM 0.16.0's /load counter lowered for good by that many disconnects counted twice
    (entrypoints/utils.py: listen_for_disconnect decrements it, lines 42-54, and so does the
    response's background task, decrement_server_load, lines 102-151, when the handler ends in
    the same turn as the disconnect; each route stacks with_cancellation over load_aware_call,
    openai/chat_completion/api_router.py lines 44-45; read in the vllm-0.16.0 sdist): /load reads
    what is in flight minus `lost`. `broken`: the live load cannot be read: "error" (its route
    answers 500), "unparsable" (200 with no count), "unpublished" (SGLang 0.5.23 with no snapshot:
    an empty "loads"), "no-gauges" (vLLM's /metrics without its request gauges); `broken_after`:
    only from that moment (monotonic) on."""

    def __init__(
        self,
        settle: float,
        busy_until: float,
        engine: str,
        generates: bool = True,
        seen: str = "running",
        tls: ssl.SSLContext | None = None,
    ):
        self.settle, self.busy_until, self.engine, self.generates = settle, busy_until, engine, generates
        self.seen, self.began = seen, time.monotonic()
        self.lost, self.broken, self.broken_after = 0, "", 0.0
        self.workers: dict[str, dict] = {}
        self.events: list[tuple[float, str]] = []
        # The gateway's /workers take the control-plane key only (smg with --control-plane-api-keys;
        # old_gateway: one deployed before it, which took the client key); the replica the client key.
        self.old_gateway = False
        self.refused: list[str] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        if tls is not None:  # both the gateway and the replica serve HTTPS (gateway_tls_*, serving_tls_*)
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.server.server_address[1]}"
        self.worker = f"{self.url}/replica"
        self.workers["w1"] = {"id": "w1", "url": self.worker, "is_healthy": True, "status": "ready"}
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def busy(self) -> bool:
        return time.monotonic() < self.busy_until

    def load(self) -> int:  # smg's count
        return 2 if self.busy() and self.seen in ("running", "prefill", "dispatched") else 0

    def live(self) -> tuple[int, int, int]:
        """(running, waiting, KV tokens in use) as the engine's live signal reads them."""
        if not self.busy():
            return 0, 0, 0
        since = time.monotonic() - self.began
        return {
            "running": (2, 0, 1200),
            "dispatched": (0, 0, 0),
            "prefill": (0, 0, 600),
            "queued": (0, 2, 0),
            "straight": (1 if since >= 1.5 else 0, 0, 6000),
            "tokenizing": (0, 0, 6000 if since >= 1 else 0),
        }[self.seen]

    def gauges(self) -> tuple[int, int]:  # Prometheus: running, waiting
        if not self.busy():
            return 0, 0
        return {"running": (2, 0), "queued": (0, 2)}.get(self.seen, (0, 0))

    def server_load(self) -> int:  # vLLM's GET /load: the HTTP lifetime of what reached it, less `lost`
        running, waiting, used = self.live()
        return running + waiting + (1 if used and not running else 0) - self.lost

    def broken_now(self) -> str:
        return self.broken if time.monotonic() >= self.broken_after else ""

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _refused(self) -> bool:
                """401 unless the request carries the key of the route's role."""
                gateway = self.path.startswith("/workers")
                wanted = (CLIENT if fake.old_gateway else CONTROL) if gateway else CLIENT
                if self.path == "/restart" or self.headers.get("Authorization") == f"Bearer {wanted}":
                    return False
                fake.refused.append(f"{self.command} {self.path}")
                self._send(401, {"error": "Unauthorized"})
                return True

            def _send(self, code, body, kind="application/json"):
                data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self._refused():
                    return
                sglang = fake.engine.startswith("sglang")
                if self.path == "/restart":  # COMMAND: the switch that restarts the replica
                    fake.events.append((time.monotonic(), "RESTART"))
                    return self._send(200, {})
                if self.path == "/workers":
                    listed = [
                        {**w, "load": fake.load() if w["url"] == fake.worker else 0} for w in fake.workers.values()
                    ]
                    return self._send(200, {"workers": listed})
                broken = fake.broken_now()
                live_route = self.path in ("/replica/v1/loads?include=core", "/replica/load")
                if live_route and broken == "error":
                    fake.events.append((time.monotonic(), "live error"))
                    return self._send(500, {"error": "Internal Server Error"})
                if live_route and broken == "unparsable":
                    return self._send(200, "<html>proxy error</html>", "text/html")
                if self.path == "/replica/v1/loads?include=core" and broken == "unpublished" and sglang:
                    return self._send(200, {"timestamp": "2026-01-01T00:00:00+00:00", "version": "0.5.23", "loads": []})
                if self.path == "/replica/v1/loads?include=core" and sglang:
                    running, waiting, used = fake.live()
                    fake.events.append((time.monotonic(), f"live {running + waiting} {used}"))
                    version = fake.engine.removeprefix("sglang-")
                    return self._send(200, STANDIN.v1_loads(version, running, waiting, used, 500000, 48))
                if self.path == "/replica/load" and not sglang:
                    fake.events.append((time.monotonic(), f"live {fake.server_load()} 0"))
                    return self._send(200, {"server_load": fake.server_load()})
                if self.path == "/replica/metrics" and broken == "no-gauges":
                    return self._send(200, "# HELP python_info Python platform information\n", "text/plain")
                if self.path == "/replica/metrics":
                    running, waiting = fake.gauges()
                    fake.events.append((time.monotonic(), f"metrics {running + waiting}"))
                    labels = '{model_name="kimi-k2.5"}' if sglang else '{engine="0",model_name="kimi-k2.5"}'
                    names = (
                        ("sglang:num_running_reqs", "sglang:num_queue_reqs")
                        if sglang
                        else ("vllm:num_requests_running", "vllm:num_requests_waiting")
                    )
                    text = "".join(
                        f"# TYPE {name} gauge\n{name}{labels} {value if sglang else float(value)}\n"
                        for name, value in zip(names, (running, waiting), strict=True)
                    )
                    return self._send(200, text, "text/plain")
                return self._send(404, {"detail": "Not Found"})

            def do_DELETE(self):
                if self._refused():
                    return
                worker_id = self.path.rsplit("/", 1)[1]
                fake.workers[worker_id]["status"] = "draining"
                fake.events.append((time.monotonic(), "DELETE"))
                threading.Timer(fake.settle, lambda: fake.workers.pop(worker_id, None)).start()
                return self._send(202, {"status": "accepted"})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self._refused():
                    return
                if self.path == "/replica/v1/chat/completions":  # the replica's own API
                    fake.events.append((time.monotonic(), f"GENERATE {body['model']} {self.headers['Authorization']}"))
                    if not fake.generates:
                        return self._send(500, {"error": {"message": "EngineCore died"}})
                    return self._send(200, {"choices": [{"index": 0, "message": {"content": "ok"}}]})
                fake.events.append((time.monotonic(), f"POST {body.get('api_key') == CLIENT}"))
                fake.workers["w2"] = {"id": "w2", "url": body["url"], "is_healthy": True, "status": "ready"}
                return self._send(202, {"status": "accepted"})

        return Handler


def _roll(
    tmp_path,
    fake: Fake,
    drain_timeout: int,
    replicas: int = 2,
    script: Path = SCRIPT,
    env: dict | None = None,
    options: tuple[str, ...] = (),
    gateway: str | None = None,
    worker: str | None = None,
    restart: tuple[str, ...] = ("curl", "-fsS"),
) -> tuple[subprocess.CompletedProcess, float | None]:
    key, control = tmp_path / "secret-args.yaml", tmp_path / "control-plane-api-key"
    key.write_text(json.dumps({"api-key": CLIENT, "admin-api-key": ADMIN_KEY}))
    control.write_text(CONTROL + "\n")
    run = subprocess.run(
        [
            "sh",
            str(script),
            *options,
            str(key),
            str(control),
            worker or fake.worker,
            str(drain_timeout),
            "kimi-k2.5",
            str(replicas),
            str(_pending(tmp_path)),
            gateway or fake.url,
            "--",
            *restart,
            f"{fake.url}/restart",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    fake.server.shutdown()
    return run, next((t for t, e in fake.events if e == "RESTART"), None)


def _pending(tmp_path):
    """Where the script leaves a restart for the next deploy (roles/serving.restart_pending_file)."""
    return tmp_path / "state" / "inference-engine.restart-pending"


def _other_replica(fake: Fake, healthy: bool = True, status: str = "ready") -> None:
    fake.workers["w0"] = {"id": "w0", "url": "http://10.0.0.9:30000", "is_healthy": healthy, "status": status}


@pytest.mark.parametrize("engine", ["sglang-0.5.9", "sglang-0.5.23", "vllm"])
def test_restart_waits_for_the_running_requests_then_the_replica_comes_back(tmp_path, engine):
    fake = Fake(settle=4, busy_until=time.monotonic() + 2.5, engine=engine)
    _other_replica(fake)  # serves while this one restarts
    run, restarted = _roll(tmp_path, fake, drain_timeout=30)
    assert run.returncode == 0, run.stdout + run.stderr
    deleted = next(t for t, e in fake.events if e == "DELETE")
    idle = next(t for t, e in fake.events if e == "live 0 0")
    assert any(e.startswith("live 2 ") for _, e in fake.events)  # it was busy when taken out
    # restarted only once idle (the first idle read after the requests ended), two reads 2 s apart
    assert deleted < idle <= restarted and idle >= fake.busy_until and restarted - idle >= 2.0
    posted = next(t for t, e in fake.events if e == "POST True")  # with the client key smg sends it
    assert posted - deleted >= 4  # after smg dropped the drained entry
    # ...and after the replica answered a generation of the served model, with the key.
    generated = [t for t, e in fake.events if e == f"GENERATE kimi-k2.5 Bearer {CLIENT}"]
    assert len(generated) == 1 and restarted < generated[0] < posted, fake.events
    assert (
        "has nothing in flight (gateways and engine, 2 s apart) after" in run.stdout and "is healthy at" in run.stdout
    )
    assert "answered a generation after" in run.stdout
    assert fake.refused == []  # /workers with the control-plane key, the replica with the client key


@pytest.mark.parametrize("old_gateway", [False, True])
def test_the_gateway_is_asked_with_the_control_plane_key_never_a_key_on_a_command_line(tmp_path, old_gateway):
    """/workers take the control-plane key (a gateway deployed before it had one: the client
    key, which it took then); no key is ever on curl's or jq's command line (read from
    /proc/<pid>/cmdline of every process the script starts, through recording wrappers)."""
    fake = Fake(settle=1, busy_until=0, engine="sglang-0.5.9")
    fake.old_gateway = old_gateway
    _other_replica(fake)
    bin_dir, log = tmp_path / "bin", tmp_path / "argv.log"
    bin_dir.mkdir()
    for tool in ("curl", "jq", "sed", "cat", "head", "awk"):
        real = shutil.which(tool)
        if real:
            wrapper = bin_dir / tool
            wrapper.write_text(f'#!/bin/sh\nprintf "%s\\n" "{tool} $*" >> "{log}"\nexec {real} "$@"\n')
            wrapper.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    run, restarted = _roll(tmp_path, fake, drain_timeout=30, env=env)
    assert run.returncode == 0 and restarted is not None, run.stdout + run.stderr
    assert any(e == "DELETE" for _, e in fake.events) and any(e == "POST True" for _, e in fake.events)
    argv = log.read_text()
    assert "curl" in argv and "jq" in argv
    for key in (CLIENT, CONTROL, ADMIN_KEY):
        assert key not in argv
    if old_gateway:  # each call was tried with the control-plane key first, refused
        assert fake.refused and all(
            r.startswith(("GET /workers", "DELETE /workers", "POST /workers")) for r in fake.refused
        )
    else:
        assert fake.refused == []


def test_a_replica_that_serves_no_generation_is_not_added_back(tmp_path):
    fake = Fake(settle=1, busy_until=0, engine="vllm", generates=False)
    _other_replica(fake)
    run, restarted = _roll(tmp_path, fake, drain_timeout=30)
    assert run.returncode == 5, run.stdout + run.stderr
    assert [e for _, e in fake.events if e.startswith(("DELETE", "RESTART", "GENERATE", "POST"))] == [
        "DELETE",
        "RESTART",
        f"GENERATE kimi-k2.5 Bearer {CLIENT}",
    ]  # out of the gateway, and left out
    assert f"{fake.worker} serves no generation after its restart: not adding it back to {fake.url}" in run.stderr
    assert _pending(tmp_path).exists()  # the next deploy restarts it again


@pytest.mark.parametrize("other", ["absent", "unhealthy", "draining"])
def test_the_last_healthy_worker_at_a_gateway_is_not_taken_out(tmp_path, other):
    """The other replica's step failed (exit 5 left it out of the gateway), or it is down or
    being drained: restarting this one would leave the gateway no worker (smg refuses each
    request: "No available workers for model"), so nothing is touched, the script fails (6)
    and the restart is left for the next deploy."""
    fake = Fake(settle=1, busy_until=0, engine="vllm")
    if other != "absent":
        _other_replica(fake, healthy=other != "unhealthy", status=other if other == "draining" else "ready")
    run, restarted = _roll(tmp_path, fake, drain_timeout=30)
    assert run.returncode == 6, run.stdout + run.stderr
    assert restarted is None and not any(e.startswith(("DELETE", "metrics", "POST")) for _, e in fake.events)
    assert f"{fake.worker} is the only healthy worker at {fake.url} (of 2 replicas): not taking it out" in run.stderr
    assert _pending(tmp_path).exists()


def test_a_finished_step_clears_a_pending_restart(tmp_path):
    _pending(tmp_path).parent.mkdir(parents=True)
    _pending(tmp_path).touch()  # left by an earlier step that did not finish
    fake = Fake(settle=1, busy_until=0, engine="sglang-0.5.9")
    _other_replica(fake)
    run, restarted = _roll(tmp_path, fake, drain_timeout=30)
    assert run.returncode == 0 and restarted is not None, run.stdout + run.stderr
    assert not _pending(tmp_path).exists()


def test_a_single_replica_is_restarted_although_it_is_the_only_worker(tmp_path):
    """One replica behind the gateway: no other can serve meanwhile, so the guard does not apply."""
    fake = Fake(settle=1, busy_until=0, engine="sglang-0.5.9")
    run, restarted = _roll(tmp_path, fake, drain_timeout=30, replicas=1)
    assert run.returncode == 0 and restarted is not None, run.stdout + run.stderr


def test_the_drain_timeout_bounds_the_wait(tmp_path):
    fake = Fake(settle=5, busy_until=time.monotonic() + 600, engine="sglang-0.5.9")
    _other_replica(fake)
    run, restarted = _roll(tmp_path, fake, drain_timeout=2)
    deleted = next(t for t, e in fake.events if e == "DELETE")
    assert run.returncode == 0 and 2 <= restarted - deleted < 6
    assert (
        "still has 2 request(s) in flight at the gateways and 2 at the engine (1200 KV cache tokens in use)"
        " after 2 s (serving_drain_timeout_s); restarting anyway" in run.stderr
    )


def _closed_port() -> str:
    """A local address nothing listens on (connection refused)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


@pytest.mark.parametrize("engine", ["sglang-0.5.9", "sglang-0.5.23", "vllm"])
def test_a_replica_no_gateway_lists_is_restarted_only_once_its_own_load_is_idle(tmp_path, engine):
    """Not listed at the gateway (only the other replica is): nothing to take out, but a request
    sent straight to it is waited for all the same, on its own live load, then two idle reads."""
    fake = Fake(settle=1, busy_until=time.monotonic() + 3, engine=engine, seen="straight")
    fake.workers.clear()
    _other_replica(fake)
    run, restarted = _roll(tmp_path, fake, drain_timeout=30)
    assert run.returncode == 0 and restarted is not None, run.stdout + run.stderr
    assert not any(e == "DELETE" for _, e in fake.events)
    assert any(e.startswith("live ") and e != "live 0 0" for _, e in fake.events)  # it was busy
    assert restarted >= fake.busy_until + 2, (restarted - fake.busy_until, run.stdout)
    assert f"{fake.worker} has nothing in flight (gateways and engine, 2 s apart)" in run.stdout


@pytest.mark.parametrize("engine", ["sglang-0.5.23", "vllm"])
def test_with_the_gateway_down_the_replica_own_load_is_waited_for(tmp_path, engine):
    fake = Fake(settle=1, busy_until=time.monotonic() + 3, engine=engine, seen="straight")
    down = _closed_port()
    run, restarted = _roll(tmp_path, fake, drain_timeout=30, gateway=down)
    assert run.returncode == 0 and restarted is not None, run.stdout + run.stderr
    assert f"gateway {down} does not answer GET /workers: not draining {fake.worker} there" in run.stdout
    assert restarted >= fake.busy_until + 2, (restarted - fake.busy_until, run.stdout)


def test_a_negative_vllm_load_falls_back_to_its_running_and_waiting_gauges(tmp_path):
    """Three disconnects counted twice: /load reads 2 - 3 = -1 while two requests run. The drain
    reads the gauges instead (2, then 0) and restarts once they are idle, not after its timeout."""
    fake = Fake(settle=1, busy_until=time.monotonic() + 3, engine="vllm", seen="running")
    fake.lost = 3
    _other_replica(fake)
    run, restarted = _roll(tmp_path, fake, drain_timeout=30)
    assert run.returncode == 0 and restarted is not None, run.stdout + run.stderr
    assert fake.busy_until + 2 <= restarted < fake.busy_until + 8, (restarted - fake.busy_until, run.stdout)
    assert (
        f"{fake.worker}: vLLM's /load reads -1 (its disconnect listener decrements too):"
        " its running and waiting gauges instead" in run.stdout
    )
    assert "restarting anyway" not in run.stderr


@pytest.mark.parametrize(
    ("engine", "broken", "why"),
    [
        ("sglang-0.5.9", "error", "GET /v1/loads: (22) The requested URL returned error: 500; GET /load: (22)"),
        ("sglang-0.5.23", "unpublished", "GET /v1/loads answered no loads; GET /load: (22)"),
        ("vllm", "unparsable", "GET /load answered no server_load count"),
        ("vllm", "no-gauges", "GET /metrics: no vllm:num_requests_running or _waiting gauge"),
    ],
)
def test_a_load_that_cannot_be_read_is_a_refusal_to_restart(tmp_path, engine, broken, why):
    """No wait and no cut: one line naming the replica and why, nothing touched (not taken out of
    the gateway, not restarted), exit 7 and the restart left to the next deploy."""
    fake = Fake(settle=1, busy_until=0, engine=engine)
    fake.broken = broken
    _other_replica(fake)
    started = time.monotonic()
    run, restarted = _roll(tmp_path, fake, drain_timeout=30)
    assert run.returncode == 7, run.stdout + run.stderr
    assert time.monotonic() - started < 10  # at once, not a drain timeout
    assert restarted is None and not any(e in ("DELETE", "RESTART") for _, e in fake.events)
    [line] = run.stderr.splitlines()
    assert line.startswith(f"{fake.worker}: its live load cannot be read ({why}") and line.endswith(
        "not restarting it; --force restarts it anyway (or stop the engine, then deploy again: nothing listens,"
        " nothing is in flight)"
    ), line
    assert _pending(tmp_path).exists()


def test_a_load_that_stops_answering_while_draining_is_a_refusal_too(tmp_path):
    """Read at first, then errors for 10 s (MISSING_S) while the replica is out of the gateway:
    refused, left out (as exit 5 leaves it), the restart pending; not cut at the drain timeout."""
    fake = Fake(settle=1, busy_until=time.monotonic() + 60, engine="sglang-0.5.9")
    fake.broken, fake.broken_after = "error", time.monotonic() + 3
    _other_replica(fake)
    run, restarted = _roll(tmp_path, fake, drain_timeout=60)
    assert run.returncode == 7 and restarted is None, run.stdout + run.stderr
    assert any(e == "DELETE" for _, e in fake.events) and not any(e.startswith("POST") for _, e in fake.events)
    assert f"{fake.worker}: its live load cannot be read (GET /v1/loads: (22)" in run.stderr
    assert "for 10 s): not restarting it; --force restarts it anyway (or stop the engine" in run.stderr
    assert f"nothing is in flight) (left out of {fake.url} until then" in run.stderr
    assert _pending(tmp_path).exists()


def test_force_restarts_a_replica_whose_load_cannot_be_read(tmp_path):
    """--force: the unread load is said and not waited for; smg's own count still is."""
    fake = Fake(settle=5.5, busy_until=time.monotonic() + 3, engine="sglang-0.5.9", seen="dispatched")
    fake.broken = "error"
    _other_replica(fake)
    run, restarted = _roll(tmp_path, fake, drain_timeout=30, options=("--force",))
    assert run.returncode == 0 and restarted is not None, run.stdout + run.stderr
    assert f"{fake.worker}: its live load cannot be read (GET /v1/loads: (22)" in run.stdout
    assert "; --force: not waiting for it" in run.stdout
    assert restarted >= fake.busy_until + 2  # smg's load (2 dispatched) was waited for
    assert not _pending(tmp_path).exists()


def test_a_replica_nothing_listens_on_has_nothing_in_flight(tmp_path):
    """Stopped, or its first start (the gateway not up yet either): connection refused, so
    nothing can be in flight there: no refusal, restarted after the two idle reads."""
    fake = Fake(settle=1, busy_until=0, engine="sglang-0.5.9")
    stopped = _closed_port()
    run, restarted = _roll(tmp_path, fake, drain_timeout=30, worker=stopped, gateway=_closed_port())
    assert run.returncode == 0 and restarted is not None, run.stdout + run.stderr
    assert f"{stopped}: nothing listens at {stopped} (stopped or not started): nothing in flight" in run.stdout
    assert f"{stopped} has nothing in flight (gateways and engine, 2 s apart) after 2 s" in run.stdout


def test_the_drain_before_cut_a_stream_sent_straight_to_an_unlisted_replica(tmp_path):
    """What reading the replica's own load at every restart closes, shown on the script as it
    was (planted: the drain only after a gateway drained it): an unlisted replica under a long
    prompt sent straight to it was restarted at once."""
    planted = tmp_path / "listed-only-inference-engine-rolling"
    text = SCRIPT.read_text()
    line = "drain  # listed or not, gateway up or not: the replica's own load (what came straight to it) too\n"
    assert text.count(line) == 1
    planted.write_text(text.replace(line, '[ "$drained" = 1 ] && drain\n'))
    fake = Fake(settle=1, busy_until=time.monotonic() + 8, engine="sglang-0.5.9", seen="straight")
    fake.workers.clear()
    _other_replica(fake)
    run, restarted = _roll(tmp_path, fake, drain_timeout=30, script=planted)
    assert run.returncode == 0 and restarted is not None, run.stdout + run.stderr
    assert restarted < fake.busy_until  # cut


# The engine's side of the drain before it read the live load (planted to show what the new
# one adds): SGLang's and vLLM's Prometheus gauges of running and waiting requests.
GAUGES_ENGINE_LOAD = """engine_load() {  # the replica's running + waiting requests, "?" when unread
    api GET "$worker/metrics" 2>/dev/null | awk '
        /^(sglang:num_running_reqs|sglang:num_queue_reqs|vllm:num_requests_running|vllm:num_requests_waiting)[{ ]/ {
            sum += $NF; found = 1 }
        END { if (found) printf "%d 0\\n", sum; else print "? ?" }'
}
"""


def _planted_gauges_drain(tmp_path) -> Path:
    """The drain as it was before it read the engine's live load (planted once): smg's load and
    the engine's Prometheus gauges, two reads 2 s apart."""
    text = SCRIPT.read_text()
    begin, end = text.index("engine_load() {"), text.index("now_ms() {")
    planted = tmp_path / "gauges-inference-engine-rolling"
    planted.write_text(text[:begin] + GAUGES_ENGINE_LOAD + text[end:])
    return planted


@pytest.mark.parametrize(
    ("engine", "seen"),
    [
        ("sglang-0.5.9", "prefill"),
        ("sglang-0.5.9", "dispatched"),
        ("sglang-0.5.9", "queued"),
        ("vllm", "queued"),
        ("sglang-0.5.9", "tokenizing"),
        ("sglang-0.5.9", "straight"),
        ("sglang-0.5.23", "straight"),
        ("vllm", "straight"),
    ],
)
def test_a_request_in_prefill_queued_or_sent_straight_to_the_replica_is_waited_for(tmp_path, engine, seen):
    """Whatever path a request came by and wherever it is (in chunked prefill, dispatched by smg
    and not arrived, queued, on its way to the scheduler, sent straight to the replica), the
    replica is restarted only once it has ended, and two idle reads 2 s apart after."""
    fake = Fake(settle=5.5, busy_until=time.monotonic() + 3, engine=engine, seen=seen)
    _other_replica(fake)
    run, restarted = _roll(tmp_path, fake, drain_timeout=30)
    assert run.returncode == 0 and restarted is not None, run.stdout + run.stderr
    assert restarted >= fake.busy_until + 2, (restarted - fake.busy_until, run.stdout)


@pytest.mark.parametrize("engine", ["sglang-0.5.9", "vllm"])
def test_the_gauges_drain_cut_a_prompt_sent_straight_to_the_replica(tmp_path, engine):
    """The blind spot the live load closes, shown on the drain before it (planted): a long prompt
    sent straight to the replica is in no gauge while it is tokenized and prefilled, nor in smg's
    load, so that drain restarted the replica under it."""
    fake = Fake(settle=5.5, busy_until=time.monotonic() + 8, engine=engine, seen="straight")
    _other_replica(fake)
    run, restarted = _roll(tmp_path, fake, drain_timeout=30, script=_planted_gauges_drain(tmp_path))
    assert run.returncode == 0 and restarted is not None, run.stdout + run.stderr
    assert restarted < fake.busy_until  # cut: restarted while the request still ran


def test_a_replica_and_gateway_in_tls_are_verified_with_their_cas(tmp_path):
    """With --worker-ca and --gateway-ca (roles/serving rolling_tls_options) every request goes to
    https:// verified with that CA (curl's cacert, from its config on stdin); without them the
    gateway is not trusted and nothing reaches it."""
    from lab.tls_ca import make_tls_material

    material = make_tls_material(["127.0.0.1"])
    ca, cert, key = tmp_path / "ca.pem", tmp_path / "cert.pem", tmp_path / "key.pem"
    for path, text in ((ca, material.ca_pem), (cert, material.cert_pem), (key, material.key_pem)):
        path.write_text(text)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    restart = ("curl", "-fsS", "--cacert", str(ca))
    fake = Fake(settle=1, busy_until=0, engine="sglang-0.5.23", tls=context)
    _other_replica(fake)
    options = ("--worker-ca", str(ca), "--gateway-ca", str(ca))
    run, restarted = _roll(tmp_path, fake, drain_timeout=30, options=options, restart=restart)
    assert run.returncode == 0 and restarted is not None, run.stdout + run.stderr
    assert fake.url.startswith("https://") and fake.refused == []
    assert [e for _, e in fake.events if e in ("DELETE", "POST True")] == ["DELETE", "POST True"]
    unverified = Fake(settle=1, busy_until=0, engine="sglang-0.5.23", tls=context)
    _other_replica(unverified)
    (tmp_path / "no-ca").mkdir()
    run, _ = _roll(tmp_path / "no-ca", unverified, drain_timeout=30, restart=restart)
    assert not [e for _, e in unverified.events if e.startswith(("DELETE", "POST", "live", "GENERATE"))], run.stdout
    assert run.returncode != 0, run.stdout + run.stderr  # and it says why
