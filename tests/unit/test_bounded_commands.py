"""checks/bounded.py: every command kind the checks run, made to hang for real (a program that
sleeps, a server that accepts and never answers, a process that escapes `timeout`), ends in a
named failure within its bound; the checks' verdict still comes."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import testinfra.backend
import testinfra.host

from checks import __main__ as checks_main
from checks import bounded, gateway, probes, server_checks
from checks.bounded import CommandOverrun
from tests.unit.conftest import PROJECT_ROOT, as_a_shell_starts_it

# The commands these tests interrupt start with SIGINT as a shell gives it (tests/unit/conftest.py),
# and the worker's own state is reported when it is not Python's default.
pytestmark = pytest.mark.usefixtures("signals_of_this_worker")
_popen = functools.partial(subprocess.Popen, preexec_fn=as_a_shell_starts_it)

ROOT = Path(__file__).resolve().parents[2]


def fresh_host():
    """A testinfra local host of its own (testinfra caches hosts by URL; these are changed)."""
    return bounded.own_host("local://")


@pytest.fixture
def programs(tmp_path, monkeypatch):
    """A folder first on PATH for programs that stand in for the host's tools."""
    folder = tmp_path / "bin"
    folder.mkdir()
    monkeypatch.setenv("PATH", f"{folder}:{os.environ['PATH']}")

    def add(name: str, body: str) -> None:
        path = folder / name
        path.write_text("#!/bin/sh\n" + body + "\n")
        path.chmod(0o755)

    add.folder = folder
    return add


def short(monkeypatch, kind: str, seconds: float) -> None:
    monkeypatch.setitem(bounded.KINDS, kind, dataclasses.replace(bounded.KINDS[kind], bound_s=seconds))


def test_the_program_a_command_starts_names_its_kind():
    assert bounded.program_of("nvidia-smi -q") == "nvidia-smi"
    assert bounded.program_of("/usr/bin/nvidia-smi --query-gpu=name --format=csv") == "nvidia-smi"
    assert bounded.program_of("LANG=C env nvidia-smi topo -m") == "nvidia-smi"
    assert bounded.program_of("systemctl show -p ControlGroup x") == "systemctl"
    assert bounded.program_of("bash -c 'journalctl -u x --no-pager'") == "journalctl"
    assert bounded.program_of("dcgmi diag -r 1 -j") == "dcgmi"
    # `command -v nvidia-smi` is no nvidia-smi call: it still runs once nvidia-smi has wedged
    assert bounded.program_of("command -v nvidia-smi") == "command"
    assert bounded.program_of("cat /proc/1/cgroup") == "command"
    assert bounded.program_of("echo 'unbalanced") == "command"


def test_a_wedged_nvidia_smi_is_one_failure_named_with_its_next_step(programs, monkeypatch):
    programs("nvidia-smi", "exec sleep 1000")
    short(monkeypatch, "nvidia-smi", 1)
    gpu = probes.GpuProbe(fresh_host())
    assert gpu.smi_path  # `command -v` answers
    started = time.monotonic()
    with pytest.raises(CommandOverrun) as first:
        gpu.gpu_query  # noqa: B018 - the property runs the command
    assert time.monotonic() - started < 5
    text = str(first.value)
    assert "`nvidia-smi --query-gpu=" in text and "within 1 s (nvidia-smi)" in text
    assert "Xid" in text and "nvidia-smi -q" in text and "reboot" in text
    # every later nvidia-smi call, and what hangs with the driver, fails at once, naming the first
    for call in (lambda: gpu.smi_q, lambda: gpu.run_program("python3", "cuda_check.py"), lambda: _dcgmi(gpu.host)):
        started = time.monotonic()
        with pytest.raises(CommandOverrun) as later:
            call()
        assert time.monotonic() - started < 1
        assert "not run: `nvidia-smi --query-gpu=" in str(later.value)
        assert "(nvidia-smi, bound 1 s) did not answer earlier in this run" in str(later.value)


def _dcgmi(host):
    return bounded.run(host, "dcgmi diag -r 1 -j", what="dcgmi")


def _end(pid_file: Path) -> None:
    """Ends the escaped process this test started, by its id."""
    os.kill(int(pid_file.read_text()), signal.SIGKILL)


def test_a_process_that_escapes_timeout_is_ended_by_the_local_bound(monkeypatch, tmp_path):
    """A process in D state ignores SIGKILL and `timeout` waits with it; one that leaves the
    process group keeps the output pipe open the same way: the local bound ends the wait."""
    monkeypatch.setattr(bounded, "KILL_AFTER_S", 1)
    monkeypatch.setattr(bounded, "LOCAL_GRACE_S", 1)
    host = fresh_host()
    started = time.monotonic()
    with pytest.raises(CommandOverrun) as overrun:
        bounded.run(host, f"setsid sleep 30 & echo $! > {tmp_path}/pid; wait", bound_s=1)
    assert time.monotonic() - started < 6
    assert "within 1 s (command)" in str(overrun.value)
    _end(tmp_path / "pid")


class SilentServer:
    """Accepts connections and never answers (a stuck engine's HTTP server)."""

    def __init__(self):
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.socket.listen(8)
        self.port = self.socket.getsockname()[1]
        self.held = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                connection, _ = self.socket.accept()
            except OSError:
                return
            self.held.append(connection)

    def close(self):
        self.socket.close()
        for connection in self.held:
            connection.close()


def test_an_engine_that_accepts_and_never_answers_is_a_named_failure():
    server = SilentServer()
    try:
        expect = SimpleNamespace(
            serving_host="127.0.0.1",
            serving_port=server.port,
            server_timeout_s=1,
            api_key_configured=False,
            serving_tls=False,
        )
        started = time.monotonic()
        answer = server_checks.request(fresh_host(), expect, "/health", with_key=False, timeout_s=1)
        assert time.monotonic() - started < 5
    finally:
        server.close()
    assert answer.status == 0 and "timed out" in answer.error.lower()
    problem = server_checks.judge_health(answer, 1)
    assert "expected /health to answer 200 within 1 s" in problem and "no answer" in problem


def test_a_hung_curl_is_ended_by_the_outer_bound(programs, monkeypatch):
    """curl's own -m is the first bound; a curl (or jq, or shell) that still hangs is the
    "engine HTTP" kind's overrun."""
    programs("curl", "exec sleep 1000")
    expect = SimpleNamespace(
        serving_host="127.0.0.1", serving_port=9, server_timeout_s=1, api_key_configured=False, serving_tls=False
    )
    monkeypatch.setattr(server_checks.bounded, "run", _with_margin(bounded.run, 1))
    with pytest.raises(CommandOverrun) as overrun:
        server_checks.request(fresh_host(), expect, "/health", with_key=False, timeout_s=1)
    assert "(engine HTTP)" in str(overrun.value) and "never answered" in str(overrun.value)


def _with_margin(run, seconds):
    def bounded_run(host, command, what=None, bound_s=None):
        return run(host, command, what=what, bound_s=seconds)

    return bounded_run


@pytest.mark.parametrize("tool", ["systemctl", "journalctl"])
def test_a_hung_systemd_tool_is_named(programs, monkeypatch, tool):
    programs(tool, "exec sleep 1000")
    short(monkeypatch, tool, 1)
    with pytest.raises(CommandOverrun) as overrun:
        fresh_host().run(f"{tool} show -p ActiveState x")  # testinfra's own run: bounded too
    assert f"within 1 s ({tool})" in str(overrun.value)


def test_a_gpu_program_killed_by_its_own_timeout_is_no_overrun(programs, monkeypatch):
    programs("fake-python", "exec sleep 1000")
    gpu = probes.GpuProbe(fresh_host())
    started = time.monotonic()
    result = gpu.run_program(str(programs.folder / "fake-python"), "cuda_check.py", timeout_s=1)
    assert result.rc == 137 and time.monotonic() - started < 5  # the check reads its own kill


def test_a_gpu_program_stuck_past_its_kill_is_an_overrun(programs, monkeypatch, tmp_path):
    """A CUDA program in D state ignores even SIGKILL, and `timeout` waits for it: here a
    `timeout` that never returns stands in for that wait, and the local bound ends it."""
    programs("stuck-python", "exec sleep 1000")
    gpu = probes.GpuProbe(fresh_host())
    folder = programs.folder
    programs("timeout", "exec sleep 1000")
    monkeypatch.setattr(probes, "PROGRAM_BOUND_MARGIN_S", 1)
    monkeypatch.setattr(bounded, "KILL_AFTER_S", 1)
    monkeypatch.setattr(bounded, "LOCAL_GRACE_S", 1)
    monkeypatch.setattr(bounded, "GONE_WAIT_S", 1)
    started = time.monotonic()
    with pytest.raises(CommandOverrun) as overrun:
        gpu.run_program(str(folder / "stuck-python"), "cuda_check.py", timeout_s=1)
    assert time.monotonic() - started < 8
    assert "(gpu program)" in str(overrun.value) and "CUDA program did not end" in str(overrun.value)


def test_a_gpu_program_that_leaves_a_process_behind_reads_as_its_own_kill(programs, tmp_path):
    """A process that left the program's group keeps running, but no longer holds the checks'
    wait (the output goes to files, not pipes): the check reads the program's own kill."""
    programs("stuck-python", f"setsid sleep 31 & echo $! > {tmp_path}/pid; wait")
    gpu = probes.GpuProbe(fresh_host())
    started = time.monotonic()
    result = gpu.run_program(str(programs.folder / "stuck-python"), "cuda_check.py", timeout_s=1)
    _end(tmp_path / "pid")
    assert result.rc == 137 and time.monotonic() - started < 5


def test_the_runs_total_deadline_cuts_bounds_and_then_refuses(monkeypatch):
    host = fresh_host()
    bounded.bound(host, deadline_s=1)
    with pytest.raises(CommandOverrun) as cut:
        host.run("sleep 5")
    assert "what was left of the run's --deadline-s" in str(cut.value)
    with pytest.raises(CommandOverrun) as refused:
        host.run("true")
    assert "total bound of 1 s (--deadline-s) is spent" in str(refused.value)
    bounded.release(host)
    assert host.run("true").rc == 0
    assert host.run("sleep 2").rc == 0  # no bound left either


def test_a_bounded_host_is_the_callers_own_not_testinfras_cached_one():
    """A run that ends with its connection failed (or its deadline spent) leaves nothing on the host
    that testinfra.get_host hands the next caller in the same process (a lab test after an
    in-process drain saw every command refused as 'did not answer earlier in this run')."""
    import testinfra

    spent = bounded.own_host("local://", deadline_s=1)
    spent.backend._ih_runner.overran["connection"] = "the connection to local://local (bound 1 s)"
    with pytest.raises(CommandOverrun):
        spent.run("true")
    assert testinfra.get_host("local://").run("true").rc == 0
    assert bounded.own_host("local://").run("true").rc == 0
    cached = bounded.bound(testinfra.get_host("local://"), deadline_s=1)
    cached.backend._ih_runner.overran["connection"] = "planted"
    bounded.release(cached)
    assert testinfra.get_host("local://").run("true").rc == 0


# -- DCGM with the engine stopped around it: hangs and a failed restart ---------------------------


def fake_systemctl(programs, state_file: Path, start_rc: int = 0) -> None:
    """systemctl for one unit: is-active from a file, stop/start change it, show its timeouts."""
    state_file.write_text("active\n")
    programs(
        "systemctl",
        f"""case "$1" in
  is-active) cat {state_file};;
  stop) echo inactive > {state_file};;
  start) if [ {start_rc} = 0 ]; then echo active > {state_file}; else echo failed > {state_file};
         echo "Job for x.service failed because the control process exited with error code." >&2; exit 1; fi;;
  show) echo TimeoutStartUSec=5s; echo TimeoutStopUSec=5s;;
esac""",
    )


def test_a_hung_dcgmi_fails_names_dcgm_and_the_engine_comes_back(programs, monkeypatch, tmp_path):
    fake_systemctl(programs, tmp_path / "state")
    programs("dcgmi", "exec sleep 1000")
    monkeypatch.setitem(bounded.DCGM_DIAG_BOUND_S, 2, 1)
    run = checks_main.dcgm_diag(fresh_host(), 2, "inference-engine")
    assert run.was_active and run.restart_problem is None
    assert "`dcgmi diag -r 2 -j` to finish within 1 s (dcgmi)" in run.problem and "nv-hostengine" in run.problem
    assert (tmp_path / "state").read_text().strip() == "active"


def test_an_engine_that_does_not_start_after_dcgm_is_its_own_failure(programs, tmp_path):
    fake_systemctl(programs, tmp_path / "state", start_rc=1)
    programs("dcgmi", f"cat {json.dumps(str(ROOT / 'tests/unit/data/gpu/dcgm/diag-r1-pass.json'))}")
    run = checks_main.dcgm_diag(fresh_host(), 2, "inference-engine")
    assert run.problem is None and run.tests
    assert "expected inference-engine.service active again after DCGM" in run.restart_problem
    assert "rc 1" in run.restart_problem and "state failed" in run.restart_problem
    assert "journalctl -u inference-engine -b" in run.restart_problem


def test_a_hung_systemctl_before_dcgm_is_named(programs, monkeypatch):
    programs("dcgmi", "true")
    programs("systemctl", "exec sleep 1000")
    short(monkeypatch, "systemctl", 1)
    run = checks_main.dcgm_diag(fresh_host(), 2, "inference-engine")
    assert run.tests is None and "(systemctl)" in run.problem


# -- the verdict comes: `python -m checks` with a wedged nvidia-smi -------------------------------


def test_checks_with_a_wedged_nvidia_smi_end_with_a_verdict_naming_it(programs, tmp_path):
    programs("nvidia-smi", "exec sleep 1000")
    report = tmp_path / "report.json"
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "checks", "--hosts", "local://", "--suites", "gpu", "--no-bandwidth-probes"]
        + ["--report", str(report), "--deadline-s", "6", "--expect", "gpu_count=1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    seconds = time.monotonic() - started
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert "VERDICT: UNHEALTHY" in done.stdout
    checks = json.loads(report.read_text())["checks"]
    failed = [c for c in checks if c["verdict"] == "FAIL"]
    assert any("`nvidia-smi" in c["detail"] and "no answer after" in c["detail"] for c in failed), failed
    assert all("CommandOverrun" not in c["detail"] for c in checks)
    # deadline 6 s + kill grace 15 s + Python's start; the real bound of nvidia-smi is 30 s
    assert seconds < 6 + 15 + 20, seconds


def test_a_hung_python_probe_is_named(monkeypatch):
    short(monkeypatch, "python probe", 1)
    with pytest.raises(CommandOverrun) as overrun:
        bounded.run(fresh_host(), "python3 -c 'import time; time.sleep(100)'", what="python probe")
    assert "within 1 s (python probe)" in str(overrun.value) and "hung filesystem" in str(overrun.value)


def test_the_checks_timer_writes_the_wedge_as_a_failure_metric(programs, tmp_path):
    """checks.textfile, as its unit runs it: a wedged nvidia-smi is a failure_info gauge naming it,
    within --deadline-s, not a run killed by TimeoutStartSec."""
    programs("nvidia-smi", "exec sleep 1000")
    expect, out = tmp_path / "expect.json", tmp_path / "checks.prom"
    expect.write_text(json.dumps({"gpu_count": 1}))
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "checks.textfile", "--expect-file", str(expect), "--suites", "gpu"]
        + ["--out", str(out), "--deadline-s", "5"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert time.monotonic() - started < 5 + 15 + 20
    prom = out.read_text()
    assert re.search(r'check_failure_info\{check="gpu count",detail="expected `nvidia-smi', prom), prom[:3000]
    assert "no answer after" in prom and "inference_host_checks_failed" in prom


GEVENT_ESCAPE = """
from gevent import monkey; monkey.patch_all()  # as pyinfra's CLI does, in the same process as the checks
import os, signal, sys, time
import testinfra.backend, testinfra.host
from checks import bounded
bounded.KILL_AFTER_S = bounded.LOCAL_GRACE_S = 1
backend = testinfra.backend.get_backend("local://")
host = testinfra.host.Host(backend)
backend.set_host(host)
bounded.bound(host)
try:
    bounded.run(host, "setsid sleep 30 & echo $! > " + sys.argv[1] + "; wait", bound_s=1)
except bounded.CommandOverrun as error:
    print("OVERRUN", str(error)[:60])
os.kill(int(open(sys.argv[1]).read()), signal.SIGKILL)
print(host.run("echo AFTER").stdout.strip())
"""


def test_the_local_bound_holds_under_gevent(tmp_path):
    """pyinfra's CLI patches subprocess with gevent; giving up on a process that keeps its pipes
    must not break the next command there either."""
    argv = [sys.executable, "-c", GEVENT_ESCAPE, str(tmp_path / "pid")]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.stdout.splitlines()[-1:] == ["AFTER"], done.stdout + done.stderr
    assert done.stdout.startswith("OVERRUN expected `setsid sleep 30"), done.stdout + done.stderr


@pytest.mark.parametrize("with_file", [True, False])
def test_a_gpu_program_arrives_whole_with_its_words_and_environment(programs, tmp_path, with_file):
    """run_program through a real local shell: the program's source byte for byte, each argument
    one word (a space, a quote, `$(...)` included), and the unit's environment file or else the
    site model's values, nothing of the checker's own environment."""
    programs("fake-python", 'sha256sum "$1"; shift; printf "arg:%s\\n" "$@"; env | sort')
    env_file = tmp_path / "inference engine.env"
    env_file.write_text("NCCL_P2P_LEVEL=SYS\n")
    gpu = probes.GpuProbe(fresh_host())
    words = ["1024", "it's $(touch pwned) `x`", "--flag"]
    result = gpu.run_program(
        str(programs.folder / "fake-python"),
        "membw.py",
        words,
        env_file=str(env_file) if with_file else None,
        fallback_env={"NCCL_P2P_LEVEL": "PIX 'x'"},
        timeout_s=30,
    )
    assert result.rc == 0, result.stderr
    lines = result.stdout.splitlines()
    source = (PROJECT_ROOT / "checks" / "programs" / "membw.py").read_bytes()
    assert lines[0].split()[0] == hashlib.sha256(source).hexdigest()
    assert [line.removeprefix("arg:") for line in lines if line.startswith("arg:")] == words
    assert ("NCCL_P2P_LEVEL=SYS" if with_file else "NCCL_P2P_LEVEL=PIX 'x'") in lines
    assert f"IH_ENV_SOURCE={env_file if with_file else 'site model'}" in lines
    assert not any(line.startswith("PWD=") and "pwned" in line for line in lines)
    assert not (Path.cwd() / "pwned").exists()


def ssh_host(url: str):
    """A testinfra ssh host of its own (not testinfra's cache), bounded."""
    backend = testinfra.backend.get_backend(url)
    host = testinfra.host.Host(backend)
    backend.set_host(host)
    return bounded.bound(host)


def test_a_host_that_accepts_and_never_speaks_ssh_is_one_connection_failure(tmp_path):
    """A port that accepts and never sends ssh's banner (a wedged sshd, a firewall that holds
    connections): one named connection failure after ssh's ConnectTimeout, then every command
    refused at once; not ssh's bare exit 255 from every check, each paying the timeout again."""
    server = SilentServer()
    config = tmp_path / "ssh_config"
    config.write_text(f"Host *\n    BatchMode yes\n    UserKnownHostsFile {tmp_path}/known_hosts\n")
    try:
        host = ssh_host(f"ssh://root@127.0.0.1:{server.port}?ssh_config={config}&timeout=1&controlpersist=0")
        started = time.monotonic()
        with pytest.raises(CommandOverrun) as first:
            bounded.run(host, "nvidia-smi -L")
        assert time.monotonic() - started < 8
        with pytest.raises(CommandOverrun) as second:
            bounded.run(host, "systemctl is-active x")
        assert time.monotonic() - started < 8
    finally:
        server.close()
    line = str(first.value)
    assert "\n" not in line
    assert line.startswith("expected to reach ssh://127.0.0.1 within 30 s (connection) to run `nvidia-smi -L`")
    assert "banner exchange" in line and "what to do: `ssh -v" in line
    assert "driver" not in line  # the connection, not the GPU, is blamed
    assert "found it not run: the connection to ssh://127.0.0.1" in str(second.value)


def test_an_ssh_that_hangs_before_connecting_is_killed_at_the_connection_bound(programs, monkeypatch):
    """ssh's ConnectTimeout does not cover name resolution or authentication: an ssh that never
    gets that far (here a program named ssh that sleeps, as one stuck in a DNS lookup) is killed
    at the connection bound, and the command it carried is not blamed."""
    programs("ssh", "exec sleep 1000")
    short(monkeypatch, "connection", 1)
    host = ssh_host("ssh://root@gpu-node.example.internal")
    started = time.monotonic()
    with pytest.raises(CommandOverrun) as overrun:
        bounded.run(host, "nvidia-smi -L")
    assert time.monotonic() - started < 5
    line = str(overrun.value)
    assert "within 1 s (connection)" in line and "found no session after 1 s, killed" in line
    assert list(host.backend._ih_runner.overran) == ["connection"]  # not the driver's family


def test_endless_output_is_stopped_at_the_cap_not_held_in_memory(programs, monkeypatch):
    """A tool that loops printing (here `yes`, about 0.6 GB a second) filled memory until its
    bound; its output is capped and the overrun says so."""
    programs("nvidia-smi", "exec yes 'GPU 0: NVIDIA H200 (UUID: GPU-0)'")
    monkeypatch.setattr(bounded, "OUTPUT_CAP_BYTES", 1024 * 1024)
    short(monkeypatch, "nvidia-smi", 3)
    started = time.monotonic()
    with pytest.raises(CommandOverrun) as flood:
        bounded.run(fresh_host(), "nvidia-smi -L")
    assert time.monotonic() - started < 2
    line = str(flood.value)
    assert line.startswith("expected `nvidia-smi -L` to print at most 1 MiB; found more after")
    assert "| head -50" in line


def test_a_command_that_reads_stdin_gets_its_end_at_once():
    """A command that waits on stdin (cat, a prompt) reads end-of-file, not a terminal or a pipe
    left open."""
    started = time.monotonic()
    answer = bounded.run(fresh_host(), "cat; read answer; echo read:$?")
    assert time.monotonic() - started < 2
    assert answer.stdout.strip() == "read:1"


def test_a_host_lost_mid_run_is_the_connections_failure_not_the_commands(programs, tmp_path):
    """ssh reached the host, then lost it (its own words on stderr, exit 255): one connection
    failure, and the next command refused at once; a remote command's own exit 255 (no ssh
    words) stays what testinfra makes of it."""
    calls = tmp_path / "calls"
    programs(
        "ssh",
        f"echo x >> {calls}\n"
        f'case $(wc -l < {calls}) in 1) exit 0 ;; 2) echo "Failed to initialize NVML" >&2; exit 255 ;; esac\n'
        "printf 'Timeout, server gpu-node not responding.\\r\\n' >&2; exit 255",
    )
    host = ssh_host("ssh://root@gpu-node")
    with pytest.raises(RuntimeError) as own:  # the command's own 255
        bounded.run(host, "nvidia-smi -L")
    assert not isinstance(own.value, CommandOverrun)
    with pytest.raises(CommandOverrun) as lost:
        bounded.run(host, "nvidia-smi -q")
    line = str(lost.value)
    assert line.startswith("expected `nvidia-smi -q` to answer over the connection to ssh://gpu-node; found")
    assert "connection lost (ssh: Timeout, server gpu-node not responding.)" in line and "`ssh -v" in line
    assert list(host.backend._ih_runner.overran) == ["connection"]
    with pytest.raises(CommandOverrun) as refused:
        bounded.run(host, "systemctl is-active x")
    assert "found it not run: the connection to ssh://gpu-node (lost)" in str(refused.value)
    assert calls.read_text().count("x") == 3


BENCH_WEDGED = """
import dataclasses, sys
from checks import bench, bench_workload, bounded
bench_workload.bench_command = lambda *args: ["sleep", "1000"]
bounded.KILL_AFTER_S = bounded.LOCAL_GRACE_S = 1
bounded.KINDS["benchmark"] = dataclasses.replace(bounded.KINDS["benchmark"], bound_s=1)
sys.exit(bench.main(sys.argv[1:]))
"""


def test_a_benchmark_that_never_ends_is_a_fail_line_not_a_hang(tmp_path):
    """`python -m checks.bench` ran on a host that was not bounded: a benchmark client waiting on
    a wedged engine (sglang's bench_serving allows a request 6 hours) hung it. Here the client is
    a program that sleeps. (Its own process: pyinfra's inventory code patches in gevent.)"""
    history = tmp_path / "history.jsonl"
    argv = ["--inventory", str(ROOT / "inventory" / "lab.py"), "--hosts", "local://", "--history", str(history)]
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", BENCH_WEDGED, *argv, "--concurrency", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert time.monotonic() - started < 30
    assert done.returncode == 1 and not history.exists(), done.stdout + done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("benchmark: FAIL expected `bash -c") and "within 1 s (benchmark)" in line
    assert "the engine stopped answering during the benchmark" in line


def test_a_gateway_that_accepts_and_never_answers_is_asked_once():
    """checks.gateway built its own curl and so waited curl's whole timeout for each request;
    it goes through the engine checks' marking: the first timeout marks the endpoint, the next
    request fails at once naming it, and the gateway sees one connection, not two."""
    server = SilentServer()
    try:
        started = time.monotonic()
        with pytest.raises(CommandOverrun) as overrun:
            gateway.check(
                fresh_host(), f"http://127.0.0.1:{server.port}", "kimi", ["http://10.0.0.2:30000"], timeout_s=1
            )
        took = time.monotonic() - started
        connections = len(server.held)
    finally:
        server.close()
    endpoint = f"http://127.0.0.1:{server.port}"
    assert str(overrun.value).startswith(f"expected /workers to answer on {endpoint}; found it not asked: ")
    assert f"{endpoint} did not answer /v1/chat/completions within 1 s (curl exit 28)" in str(overrun.value)
    assert connections == 1
    assert took < 5, took


class StallingServer(SilentServer):
    """Sends a 200 status line and headers, then one byte of the body every 0.3 s (a stuck
    engine mid-answer, or a slowloris)."""

    def _accept(self):
        while True:
            try:
                connection, _ = self.socket.accept()
            except OSError:
                return
            self.held.append(connection)
            threading.Thread(target=self._stall, args=(connection,), daemon=True).start()

    @staticmethod
    def _stall(connection):
        try:
            connection.recv(65536)
            connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{")
            while True:
                time.sleep(0.3)
                connection.sendall(b" ")
        except OSError:
            return


def test_an_engine_that_stalls_mid_body_is_no_answer_not_a_200():
    """curl's -m ends the transfer (exit 28), but the status line had said 200: that was read as
    an answer (a partial body parsed as JSON, or /health passed on time_total); it is no answer."""
    server = StallingServer()
    try:
        expect = SimpleNamespace(
            serving_host="127.0.0.1",
            serving_port=server.port,
            server_timeout_s=1,
            api_key_configured=False,
            serving_tls=False,
        )
        started = time.monotonic()
        answer = server_checks.request(fresh_host(), expect, "/v1/models", with_key=False, timeout_s=1)
        assert time.monotonic() - started < 5
    finally:
        server.close()
    assert answer.status == 0 and answer.error.startswith("HTTP 200, then curl: (28)")
    assert "expected /health to answer 200 within 1 s; found no answer (HTTP 200, then curl: (28)" in (
        server_checks.judge_health(answer, 1) or ""
    )
    assert "HTTP 0 HTTP 200, then curl: (28)" in server_checks.judge_models(answer, "kimi")


def test_acceptance_of_a_host_that_never_speaks_ssh_is_a_report_not_a_traceback(tmp_path):
    """checks.acceptance against a port that accepts and never speaks ssh ended in ssh's bare
    RuntimeError traceback and no report; now a report that is INCOMPLETE (exit 3: the host
    could not be reached, docs/operations.md), the connection named."""
    server = SilentServer()
    config = tmp_path / "ssh_config"
    config.write_text(f"Host *\n    BatchMode yes\n    UserKnownHostsFile {tmp_path}/known_hosts\n")
    url = f"ssh://root@127.0.0.1:{server.port}?ssh_config={config}&timeout=1&controlpersist=0"
    argv = [sys.executable, "-m", "checks.acceptance", "--hosts", url, "--out", str(tmp_path / "out"), "--no-bench"]
    try:
        started = time.monotonic()
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
        took = time.monotonic() - started
    finally:
        server.close()
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    report = (tmp_path / "out" / "report.md").read_text()
    assert "# Acceptance report: INCOMPLETE" in report, report
    assert done.returncode == 3, done.stderr[-2000:]
    said = done.stdout + done.stderr
    assert "127.0.0.1" in said and f"port {server.port}" in said, said[-2000:]
    assert took < 60


PARAMIKO_SILENT = """
import dataclasses, sys, time
from checks import bounded
from checks.bounded import CommandOverrun
from tests.unit.test_bounded_commands import SilentServer, ssh_host
bounded.KINDS["connection"] = dataclasses.replace(bounded.KINDS["connection"], bound_s=1)
server = SilentServer()
host = ssh_host(f"paramiko://root@127.0.0.1:{server.port}")
started = time.monotonic()
try:
    bounded.run(host, "nvidia-smi -L")
except CommandOverrun as overrun:
    print(f"{time.monotonic() - started:.1f}")
    print(overrun)
sys.stdout.flush()
"""


def test_a_library_backend_that_never_connects_is_given_up_at_the_connection_bound():
    """testinfra's paramiko backend talks from this process, not through a local process that can
    be killed: a port that never speaks ssh held it for paramiko's own 15 s banner timeout (and a
    session lost mid-command for ever); it is given up at the local bound. In a process of its
    own: the abandoned paramiko thread would outlive the test, and a later test that loads a site
    (pyinfra patches threading with gevent on import) failed with "cannot release un-acquired lock"."""
    done = subprocess.run(
        [sys.executable, "-c", PARAMIKO_SILENT], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=60
    )
    lines = done.stdout.splitlines()
    assert len(lines) >= 2, done.stdout + done.stderr[-2000:]
    assert float(lines[0]) < 4
    assert "expected to reach paramiko://127.0.0.1 within 1 s (connection)" in lines[1]
    assert "no session after 1 s" in lines[1]


# -- programs that ignore TERM: nothing of them is left, whatever ends the run -------------------

# A stand-in for a driver call stuck in the kernel: it ignores TERM, and so does its child. Its
# command line carries the test's own folder, so a scan of /proc finds only this test's processes.
STUBBORN = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
if os.fork() == 0:
    time.sleep(1000)  # the child inherits SIG_IGN
print("started", flush=True)
time.sleep(1000)
"""


def stubborn(programs, tmp_path, name: str) -> str:
    """`name` on PATH as the stubborn program; returns the marker its processes' command lines carry."""
    script = tmp_path / "stubborn.py"
    script.write_text(STUBBORN)
    programs(name, f'exec {sys.executable} {script} "$@"')
    return str(script)


def left_with(marker: str) -> list[str]:
    """This machine's live processes (not zombies) whose command line holds marker."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            line = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (proc / "stat").read_text().rsplit(") ", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if marker in line and state != "Z" and proc.name != str(os.getpid()):
            found.append(f"{proc.name} {state} {line.strip()}")
    return found


def end_left(marker: str) -> None:
    """Ends, by id, what a failing test left behind (so one failure does not leak into the next)."""
    for entry in left_with(marker):
        try:
            os.kill(int(entry.split()[0]), signal.SIGKILL)
        except ProcessLookupError:
            pass


def wait_for(marker: str, seconds: float = 90) -> None:
    until = time.monotonic() + seconds
    while not left_with(marker) and time.monotonic() < until:
        time.sleep(0.1)
    assert left_with(marker), f"the stand-in never started ({marker})"


def test_a_program_that_ignores_term_is_killed_with_its_child_and_nothing_is_left(programs, tmp_path, monkeypatch):
    """`timeout -k 5 N sh -c CMD` killed the sh and exited 124 at once; the KILL never came and
    the program (and its child) stayed, reparented to PID 1. Now TERM, then KILL go to the whole
    group, and the line says "killed" only once none of it is left."""
    marker = stubborn(programs, tmp_path, "nvidia-smi")
    short(monkeypatch, "nvidia-smi", 1)
    monkeypatch.setattr(bounded, "KILL_AFTER_S", 1)
    gpu = probes.GpuProbe(fresh_host())
    started = time.monotonic()
    try:
        with pytest.raises(CommandOverrun) as overrun:
            gpu.gpu_query  # noqa: B018 - the property runs the command
        took = time.monotonic() - started
        left = left_with(marker)
    finally:
        end_left(marker)
    assert left == [], left
    line = str(overrun.value)
    assert (
        "found no answer after" in line and "killed (TERM, then KILL to its process group: none of it is left)" in line
    )
    assert took < 1 + 2 * 1 + bounded.GONE_WAIT_S + 2, took
    assert "IH-" not in line


def test_a_command_that_leaves_nothing_behind_keeps_its_own_output():
    """The shell around each command adds its marks to stderr; they are taken out of the result."""
    answer = bounded.run(fresh_host(), "echo out; echo err >&2; exit 3")
    assert (answer.rc, answer.stdout, answer.stderr) == (3, "out\n", "err\n")


@pytest.mark.parametrize("signal_number", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_run_kills_what_it_started_and_writes_its_report(programs, tmp_path, signal_number):
    """Ctrl-C (SIGINT) or systemd's SIGTERM during a hung nvidia-smi: the run ends at once with
    130, kills the program and its child on the host, and writes the report of what had run,
    marked interrupted (before: a traceback or nothing, and the program left running)."""
    marker = stubborn(programs, tmp_path, "nvidia-smi")
    report = tmp_path / "report.json"
    argv = [sys.executable, "-m", "checks", "--hosts", "local://", "--suites", "gpu", "--no-bandwidth-probes"]
    argv += ["--report", str(report), "--expect", "gpu_count=1"]
    process = _popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(marker)
        time.sleep(0.5)
        process.send_signal(signal_number)
        stdout, stderr = process.communicate(timeout=60)
        left = left_with(marker)
    finally:
        process.kill()
        end_left(marker)
    assert left == [], left
    assert process.returncode == 130, stdout[-2000:] + stderr[-2000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    assert "interrupted on local://" in stderr
    payload = json.loads(report.read_text())
    assert payload["interrupted"] is True and payload["verdict"] == "interrupted"
    stopped = [c for c in payload["checks"] if c["check"] == "nvidia smi present"]
    assert stopped and stopped[0]["detail"].startswith("not judged: the run was interrupted"), payload["checks"]
    assert "VERDICT: INTERRUPTED" in stdout


@pytest.mark.parametrize("signal_number", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_acceptance_kills_what_it_started_and_writes_its_report(programs, tmp_path, signal_number):
    """checks.acceptance interrupted while the health checks wait on a hung nvidia-smi: exit 130,
    nothing of the program left, and a report of the lines collected before, marked interrupted,
    with the step that ran as "not judged" (before: one line on stderr and no report)."""
    marker = stubborn(programs, tmp_path, "nvidia-smi")
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "checks.acceptance", "--hosts", "local://", "--suites", "gpu", "--no-dcgm"]
    argv += ["--no-bench", "--out", str(out), "--expect", "gpu_count=1"]
    process = _popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(marker)
        time.sleep(0.5)
        process.send_signal(signal_number)
        stdout, stderr = process.communicate(timeout=60)
        left = left_with(marker)
    finally:
        process.kill()
        end_left(marker)
    assert left == [], left
    assert process.returncode == 130, stdout[-2000:] + stderr[-2000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    assert f"interrupted; the report in {out} holds the lines collected before" in stderr
    payload = json.loads((out / "report.json").read_text())
    assert payload["interrupted"] is True and payload["verdict"] == "INTERRUPTED"
    by_area = {line["area"]: line for line in payload["lines"]}
    assert by_area["node"]["observed"] == "no inventory: no node to read"  # collected before
    stopped = by_area["health checks"]
    assert stopped["observed"].startswith("not judged: the run was interrupted"), payload["lines"]
    assert stopped["verdict"] == "UNREACHED"
    assert "# Acceptance report: INTERRUPTED" in (out / "report.md").read_text()


def never_answering_verdict(port: int, report: Path) -> tuple[float, subprocess.CompletedProcess]:
    """`python -m checks --suites server` against an engine that accepts and never answers."""
    argv = [sys.executable, "-m", "checks", "--hosts", "local://", "--suites", "server", "--report", str(report)]
    argv += ["--expect", "serving_host=127.0.0.1", "--expect", f"serving_port={port}"]
    started = time.monotonic()
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    return time.monotonic() - started, done


def test_an_engine_that_accepts_and_never_answers_gets_a_verdict_within_45_s(tmp_path):
    """Each HTTP check waited its whole curl timeout (185 s for the suite); now the first
    timeout marks the endpoint and every later check fails at once, naming it. The time printed
    is the figure docs/health-and-benchmark.md gives (median of 3 runs)."""
    server = SilentServer()
    marker = f"127.0.0.1:{server.port}"
    try:
        took, done = never_answering_verdict(server.port, tmp_path / "report.json")
        left = left_with(marker)
    finally:
        server.close()
        end_left(marker)
    payload = json.loads((tmp_path / "report.json").read_text())
    print(f"never-answering engine: verdict after {payload['seconds']} s of checks, {took:.1f} s with Python's start")
    assert left == [], left
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert payload["seconds"] < 45, payload["seconds"]  # the checks' own time; Python's start is the machine's
    assert took < 90, took
    checks = {c["check"]: c for c in payload["checks"]}
    assert "found no answer (curl: (28)" in checks["health answers"]["detail"]
    for name in ("models lists served name", "chat completion not degenerate", "metrics exported"):
        if checks[name]["verdict"] == "SKIP":
            continue
        detail = checks[name]["detail"]
        assert checks[name]["verdict"] == "FAIL" and checks[name]["seconds"] < 2, checks[name]
        assert f"found it not asked: http://{marker} did not answer /health within" in detail, detail


def test_a_lost_gpu_fails_the_gpu_count_and_says_reboot_the_node(programs, tmp_path):
    """nvidia-smi's exit 15 with its own words "GPU is lost. Reboot the system to recover this
    GPU" was told to re-run the deploy, and the GPU count was skipped for want of evidence."""
    said = (
        "Unable to determine the device handle for GPU0000:01:00.0: GPU is lost.  Reboot the system to recover this GPU"
    )
    programs("nvidia-smi", f"echo '{said}'; exit 15")
    report = tmp_path / "report.json"
    argv = [sys.executable, "-m", "checks", "--hosts", "local://", "--suites", "gpu", "--no-bandwidth-probes"]
    done = subprocess.run(
        argv + ["--report", str(report), "--expect", "gpu_count=8"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    checks = {c["check"]: c for c in json.loads(report.read_text())["checks"]}
    for name in ("gpu count", "nvidia smi present"):
        assert checks[name]["verdict"] == "FAIL", checks[name]
        assert "GPU is lost" in checks[name]["detail"] and "reboot the node that owns the GPU" in checks[name]["detail"]
        assert "re-run the deploy" not in checks[name]["detail"]
    assert "found a GPU lost: Unable to determine the device handle" in checks["gpu count"]["detail"]


def test_a_hung_dmesg_is_not_blamed_on_load(programs, monkeypatch):
    programs("dmesg", "exec sleep 1000")
    short(monkeypatch, "kernel log", 1)
    with pytest.raises(CommandOverrun) as overrun:
        probes.GpuProbe(fresh_host()).kernel_log  # noqa: B018 - the property runs the command
    line = str(overrun.value)
    assert "(kernel log)" in line and "overloaded" not in line and "journalctl -k -b" in line


def test_a_refused_dmesg_reads_the_journal_and_an_empty_journal_is_no_kernel_log(programs):
    """The periodic checks' user is refused dmesg (kernel.dmesg_restrict=1) and reads the kernel's
    lines from the journal (group systemd-journal); a journal with none (a container's) is no
    evidence, a skip, never a clean kernel log that passes the Xid check."""
    programs("dmesg", "echo 'dmesg: read kernel buffer failed: Operation not permitted' >&2; exit 1")
    programs("journalctl", "exit 0")
    empty = probes.GpuProbe(fresh_host()).kernel_log
    assert empty.text is None and "no kernel lines in the journal" in (empty.missing or ""), empty
    assert "Operation not permitted" in (empty.missing or "") and "systemd-journal" in (empty.missing or "")
    programs("journalctl", "echo 'NVRM: Xid (PCI:0000:01:00): 79, pid=0, GPU has fallen off the bus.'")
    assert "Xid" in (probes.GpuProbe(fresh_host()).kernel_log.text or "")


def test_a_hung_dcgmi_that_ignores_term_follows_the_deadline_and_leaves_nothing(programs, tmp_path, monkeypatch):
    """A hung dcgmi held `check --dcgm-level 2` for the level's 1200 s whatever --deadline-s
    said; now its bound is --dcgm-timeout, never more than --deadline-s, the TERM-ignoring
    program and its child are gone after it, and the engine is started again."""
    fake_systemctl(programs, tmp_path / "state")
    marker = stubborn(programs, tmp_path, "dcgmi")
    monkeypatch.setattr(bounded, "KILL_AFTER_S", 1)
    assert checks_main.dcgm_bound(2, None, None) == 1200  # no --deadline-s given: the level's own
    assert checks_main.dcgm_bound(2, 600, 900) == 600
    bound_s = checks_main.dcgm_bound(2, 600, 2)
    assert bound_s == 2
    started = time.monotonic()
    try:
        run = checks_main.dcgm_diag(fresh_host(), 2, "inference-engine", bound_s)
        took = time.monotonic() - started
        left = left_with(marker)
    finally:
        end_left(marker)
    assert left == [], left
    assert "`dcgmi diag -r 2 -j` to finish within 2 s (dcgmi)" in run.problem and "none of it is left" in run.problem
    assert took < 2 + 2 + bounded.GONE_WAIT_S + 5, took
    assert run.restart_problem is None and (tmp_path / "state").read_text().strip() == "active"


def test_dcgm_says_it_is_still_running_at_a_terminal_only(programs, tmp_path, monkeypatch, capsys):
    fake_systemctl(programs, tmp_path / "state")
    programs("dcgmi", "sleep 1.6; cat " + json.dumps(str(ROOT / "tests/unit/data/gpu/dcgm/diag-r1-pass.json")))
    monkeypatch.setattr(bounded, "PROGRESS_EVERY_S", 0.5)
    run = checks_main.dcgm_diag(fresh_host(), 2, "inference-engine", 30, progress=True)
    assert run.tests and run.problem is None
    lines = [line for line in capsys.readouterr().out.splitlines() if "still running" in line]
    assert len(lines) >= 2 and all(
        re.match(r"dcgmi diag -r 2: still running after \d+ s \(bound 30 s\)$", x) for x in lines
    )
    with contextlib.redirect_stdout(io.StringIO()):  # as `inference-host check --json` runs it
        assert not checks_main.progress_wanted()


DCGM_INTERRUPTED = """
import sys
from checks import __main__ as checks_main
sys.exit(checks_main.main(sys.argv[1:]))
"""


def test_ctrl_c_during_dcgm_is_a_line_not_a_traceback_and_the_engine_comes_back(programs, tmp_path):
    """Ctrl-C while a hung dcgmi ran printed a traceback and no verdict, and left the
    `timeout ... dcgmi` chain running; now: an INTERRUPTED line, the engine started again,
    exit 130, nothing of dcgmi left."""
    fake_systemctl(programs, tmp_path / "state")
    marker = stubborn(programs, tmp_path, "dcgmi")
    argv = [sys.executable, "-m", "checks", "--hosts", "local://", "--dcgm-level", "2", "--suites", "gpu"]
    process = _popen(
        argv + ["--report", str(tmp_path / "r.json")],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(marker)
        time.sleep(0.5)
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=60)
        left = left_with(marker)
    finally:
        process.kill()
        end_left(marker)
    assert left == [], left
    assert process.returncode == 130, stdout[-2000:] + stderr[-2000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    assert "dcgmi diag -r 2: INTERRUPTED (interrupted: `dcgmi diag` was killed on the host" in stdout
    assert "engine restart after dcgmi diag -r 2: PASS" in stdout
    assert (tmp_path / "state").read_text().strip() == "active"


def test_a_driver_slow_to_answer_is_a_warn_line_naming_it(programs, monkeypatch):
    """A driver answering each call in 25 s passed every GPU check after 207 s and nothing said
    so; each nvidia-smi call is timed, and one over SLOW_DRIVER_CALL_S is a WARN line."""
    from checks import test_gpus
    from checks.conftest import verdict_table

    programs("nvidia-smi", "sleep 0.6; echo 'NVIDIA-SMI 580.159.04'")
    monkeypatch.setattr(test_gpus, "SLOW_DRIVER_CALL_S", 0.5)
    gpu = probes.GpuProbe(fresh_host())
    gpu.smi_plain  # noqa: B018 - the property runs the command
    request = SimpleNamespace(node=SimpleNamespace(user_properties=[]))
    test_gpus.test_driver_answers_promptly(gpu, request)
    warned = [text for name, text in request.node.user_properties if name == "warn"]
    assert len(warned) == 1 and "the slowest `nvidia-smi (no arguments)`" in warned[0], warned
    assert "within 0.5 s; found 1 of 1 slower" in warned[0]
    row = {"suite": "gpu", "check": "driver answers promptly", "gpu": None, "verdict": "WARN", "detail": warned[0]}
    table = verdict_table([row])
    assert "GPU           WARN" in table and "  WARN  driver answers promptly" in table
    assert table.splitlines()[-1] == "VERDICT: HEALTHY (0 failed of 1 checks, 1 with a warning)"


SSH_INTERRUPTED = """
import sys
from checks import bounded
from tests.unit.test_bounded_commands import ssh_host
host = ssh_host("ssh://root@gpu-node")
print("running", flush=True)
bounded.run(host, "nvidia-smi -q", what="nvidia-smi")
"""


def test_an_interrupted_run_ends_the_command_on_a_host_behind_ssh(programs, tmp_path):
    """Behind a transport, killing the local ssh leaves the host's command running (sshd sends
    no signal to a command without a terminal): the command's group is ended there by a second,
    short command. Here `ssh` is a stand-in that runs its command on this machine, so the
    host's processes are this machine's and can be looked for."""
    programs("ssh", 'for word; do last="$word"; done; exec sh -c "$last"')
    marker = stubborn(programs, tmp_path, "nvidia-smi")
    process = _popen(
        [sys.executable, "-c", SSH_INTERRUPTED], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_for(marker)
        time.sleep(0.5)
        process.send_signal(signal.SIGINT)
        process.communicate(timeout=60)
        left = left_with(marker)
    finally:
        process.kill()
        end_left(marker)
    assert left == [], left
