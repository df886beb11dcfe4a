"""Replicas behind the REAL SGLang model gateway (smg from PyPI), with no container: two
stand-in servers (tests/standins/sglang_server, started with the command line roles/serving
renders) on 127.0.0.2 and 127.0.0.3, the gateway started as roles/gateway's unit starts it
(its smg-launch wrapper, its rendered arguments, the key from its 0600 file), the
rolling switch as roles/serving runs it (sglang-rolling), and the verdict of
tests/infra/gateway.py. What this does not rehearse: systemd and pyinfra around them (see the
README's "What is verified where").

Needs PyPI (uv installs the committed lock of smg==<gateway_version> once into .lab/) and jq and
curl on this machine.
Adds about 40 s (3 rolling upgrades of 2 replicas, each replica taking ~2 s to load).
"""

from __future__ import annotations

import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import jinja2
import pytest

from roles.gateway import command as gateway_command
from roles.gateway import env_path as gateway_env_path
from roles.gateway import lock_text as gateway_lock_text
from roles.serving import command as serving_command
from roles.serving import secret_args_content
from roles.shared.replicas import gateway_url, replicas, worker_url
from roles.site import PROJECT_ROOT, load_site
from roles.site import vault as secrets
from tests.infra import gateway as gateway_health

KEY = "lab-gateway-key-5e1f"
PASSWORD = b"gateway-lab-password"
STANDIN = PROJECT_ROOT / "tests" / "standins" / "sglang_server"
LAB_DIR = PROJECT_ROOT / ".lab"
PORT, GATEWAY_PORT, METRICS_PORT = 30000, 38080, 39080
MODEL = "kimi-k2.5"


def _render(template: str, **kwargs) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(PROJECT_ROOT), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True)
    return env.get_template(template).render(**kwargs)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gateway") / "inventory"
    folder.mkdir()
    shutil.copy(PROJECT_ROOT / "inventory" / "stack.yml", folder / "stack.yml")
    shutil.copytree(PROJECT_ROOT / "inventory" / "locks", folder / "locks")  # each stack's lock
    secrets.set_secret(folder / "secrets.vault.yml", "sglang_api_key", KEY, PASSWORD)
    model = folder.parent / "model"  # the stand-in reads config.json at start, as SGLang does
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "stand-in"}')
    common = {"stack_file": "stack.yml", "secrets_file": "secrets.vault.yml", "gpu_count": 8,
              "serving_model_path": str(model),
              "serving_api_key_secret": "sglang_api_key", "serving_port": PORT,
              "serving_served_model_name": MODEL}
    (folder / "site.py").write_text(
        f"gpu_nodes = [('replica-a', {{**{common!r}, 'serving_host': '127.0.0.2'}}),\n"
        f"             ('replica-b', {{**{common!r}, 'serving_host': '127.0.0.3'}})]\n"
        f"gateways = [('gw', {{'stack_file': 'stack.yml', 'secrets_file': 'secrets.vault.yml',"
        f" 'gateway_host': '127.0.0.1', 'gateway_port': {GATEWAY_PORT},"
        f" 'gateway_prometheus_port': {METRICS_PORT}, 'gateway_health_check_interval': 1}})]\n")
    return load_site(folder / "site.py")


@pytest.fixture(scope="module")
def python(site) -> str:
    """A venv with the real smg of gateway_version installed exactly from its committed lock, as
    roles/gateway installs it (and sglang's metadata for the stand-in)."""
    gateway = site.group("gateways")[0]
    env = LAB_DIR / Path(gateway_env_path(site, gateway)).name
    if not (env / "bin" / "smg").exists():
        LAB_DIR.mkdir(exist_ok=True)
        lock = LAB_DIR / f"{env.name}.txt"
        lock.write_text(gateway_lock_text(site, gateway))
        subprocess.run(["uv", "venv", "-q", "--python", sys.executable, str(env)], check=True)
        subprocess.run(["uv", "pip", "sync", "-q", "--require-hashes", "--python", str(env / "bin" / "python"),
                        str(lock)], check=True)
        subprocess.run(["uv", "pip", "install", "-q", "--no-deps", "--python", str(env / "bin" / "python"),
                        f"sglang=={site.stack.active.sglang}"], check=True)
    return str(env / "bin" / "python")


class Replica:
    def __init__(self, node, site, python: str, folder: Path):
        self.node, self.url = node, worker_url(node)
        self.folder = folder / node.name
        self.folder.mkdir(parents=True, exist_ok=True)
        shutil.copy(STANDIN / "server.py", self.folder / "server.py")
        shutil.copy(STANDIN / "startup_log.py", self.folder / "startup_log.py")
        shutil.copytree(PROJECT_ROOT / "roles" / "serving" / "cli", self.folder / "cli", dirs_exist_ok=True)
        secret_args = self.folder / "secret-args.yaml"
        secret_args.write_text(secret_args_content(KEY))
        secret_args.chmod(0o600)
        self.argv = [python, str(self.folder / "server.py"),
                     *serving_command.server_arguments(node, site.hosts, site.stack.active, str(secret_args))]
        self.process = None

    def start(self) -> None:
        env = {**os.environ, "INFERENCE_HOST_STANDIN_LOAD_SECONDS": "1"}
        self.process = subprocess.Popen(self.argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(10)

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.url}/health_generate", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        raise AssertionError(f"{self.url} never became ready")


def _chat(key: str | None = KEY, timeout: float = 10) -> int:
    body = b'{"model": "%s", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}' % MODEL.encode()
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    request = urllib.request.Request(f"http://127.0.0.1:{GATEWAY_PORT}/v1/chat/completions", body, headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status
    except urllib.error.HTTPError as error:
        return error.code
    except (urllib.error.URLError, OSError):
        return 0


def _local_run(command: str):
    return subprocess.run(command, shell=True, capture_output=True, text=True, executable="/bin/bash")


def _verdict(site, key_file: Path) -> gateway_health.Verdict:
    expected = [worker_url(n) for n in replicas(site.hosts)]
    # The module reads the key from the gateway host's /etc/smg/api-key; here, from the lab's copy.
    run = lambda command: _local_run(command.replace(gateway_health.API_KEY_FILE, str(key_file)))  # noqa: E731
    return gateway_health.check(run, GATEWAY_PORT, MODEL, expected)


@pytest.fixture(scope="module")
def cluster(site, python, tmp_path_factory):
    if not (shutil.which("jq") and shutil.which("curl")):
        pytest.skip("jq and curl are needed (the rolling script and the health check use them)")
    folder = tmp_path_factory.mktemp("cluster")
    nodes = [Replica(node, site, python, folder) for node in replicas(site.hosts)]
    for replica in nodes:
        replica.start()
    for replica in nodes:
        replica.wait_ready()
    gateway = site.group("gateways")[0]
    launcher = folder / "smg-launch"
    launcher.write_text(_render("roles/gateway/templates/smg-launch.j2", version=gateway.gateway.version,
                                key_required=True))
    credentials = folder / "credentials"
    credentials.mkdir()
    (credentials / "api-key").write_text(KEY + "\n")
    (credentials / "api-key").chmod(0o600)
    log = open(folder / "smg.log", "w")
    process = subprocess.Popen([python, str(launcher), *gateway_command.gateway_arguments(gateway, site.hosts)],
                               env={**os.environ, "INFERENCE_HOST_GATEWAY_KEY_FILE": str(credentials / "api-key")},
                               stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while _verdict(site, credentials / "api-key").status != "HEALTHY":
        assert process.poll() is None, (folder / "smg.log").read_text()[-3000:]
        assert time.monotonic() < deadline, "the gateway never reported both replicas ready"
        time.sleep(0.5)
    yield {"nodes": nodes, "gateway": process, "key_file": credentials / "api-key", "folder": folder,
           "gateway_url": gateway_url(gateway)}
    process.send_signal(signal.SIGTERM)
    process.wait(10)
    for replica in nodes:
        replica.stop()


def test_requests_succeed_through_the_gateway_with_the_key_only(cluster):
    assert [_chat() for _ in range(6)] == [200] * 6
    assert _chat(key=None) == 401 and _chat(key="wrong") == 401
    cmdline = Path(f"/proc/{cluster['gateway'].pid}/cmdline").read_bytes()
    assert KEY.encode() not in cmdline  # the key came from its file, not an argument
    with urllib.request.urlopen(f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=5) as answer:
        assert b"smg_http_requests_total" in answer.read()


def test_a_replica_down_is_degraded_and_the_endpoint_serves(site, cluster):
    down = cluster["nodes"][1]
    down.stop()
    try:
        assert [_chat() for _ in range(10)] == [200] * 10
        deadline = time.monotonic() + 20
        while (verdict := _verdict(site, cluster["key_file"])).status == "HEALTHY":
            assert time.monotonic() < deadline, "the gateway never noticed the stopped replica"
            time.sleep(0.5)
        assert verdict.status == "DEGRADED", verdict.detail
        assert verdict.down == (down.url,) and down.url in verdict.detail
    finally:
        down.start()
        down.wait_ready()
    deadline = time.monotonic() + 30
    while (verdict := _verdict(site, cluster["key_file"])).status != "HEALTHY":
        assert time.monotonic() < deadline, verdict.detail
        time.sleep(0.5)


def _rolling_upgrade(cluster, site) -> tuple[float, int, list[str]]:
    """Restart every replica through sglang-rolling while a client keeps asking: (longest gap
    between two successful answers in s, failed requests, the script's output)."""
    script = cluster["folder"] / "sglang-rolling"
    script.write_text(_render("roles/serving/templates/sglang-rolling.j2"))
    secret_args = cluster["folder"] / "gateway-key.json"
    secret_args.write_text(secret_args_content(KEY))
    stop, successes, failures = threading.Event(), [], []

    def client():
        while not stop.is_set():
            status = _chat(timeout=10)
            (successes if status == 200 else failures).append((time.monotonic(), status))

    thread = threading.Thread(target=client)
    thread.start()
    outputs = []
    try:
        for replica in cluster["nodes"]:
            # The switch, as far as the gateway can tell: stop, start, ready (a new release).
            restart = (f"kill -TERM {replica.process.pid}; while kill -0 {replica.process.pid} 2>/dev/null;"
                       " do sleep 0.1; done; touch restarted")
            marker = cluster["folder"] / "restarted"
            marker.unlink(missing_ok=True)
            runner = subprocess.Popen(["sh", str(script), str(secret_args), replica.url, cluster["gateway_url"],
                                       "--", "sh", "-c", restart + f" && while [ ! -e {marker}.ready ]; do sleep 0.1; done"],
                                      cwd=cluster["folder"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            deadline = time.monotonic() + 60
            while not marker.exists():
                assert runner.poll() is None and time.monotonic() < deadline, runner.stdout.read()
                time.sleep(0.05)
            replica.start()
            replica.wait_ready()
            Path(f"{marker}.ready").touch()
            out, _ = runner.communicate(timeout=180)
            Path(f"{marker}.ready").unlink()
            assert runner.returncode == 0, out
            outputs.append(out)
    finally:
        stop.set()
        thread.join()
    times = sorted(t for t, _ in successes)
    gap = max((b - a for a, b in zip(times, times[1:], strict=False)), default=float("inf"))
    return gap, len(failures), outputs


def test_rolling_upgrade_never_drops_the_endpoint(site, cluster, capsys):
    gaps = []
    for _ in range(3):
        gap, failed, outputs = _rolling_upgrade(cluster, site)
        assert failed == 0, f"{failed} request(s) failed during the rolling upgrade"
        for replica, out in zip(cluster["nodes"], outputs, strict=True):
            assert f"draining {replica.url}" in out and f"{replica.url} is healthy" in out, out
        gaps.append(gap)
    with capsys.disabled():
        print(f"\nrolling upgrade of 2 replicas: longest gap between answers {', '.join(f'{g:.3f}' for g in gaps)} s;"
              f" median {statistics.median(gaps):.3f} s")
    assert _verdict(site, cluster["key_file"]).status == "HEALTHY"
