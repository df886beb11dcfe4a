"""The main lab watches itself (inventory/lab.py's monitors group, roles/monitoring): after the
README's main command and the run after it, the real Prometheus scrapes the engine, node_exporter
with the checks' textfile and the DCGM exporter stand-in, and the real Alertmanager holds only
the alerts docs/monitoring.md names for the lab, read with the operator's command
(`amtool alert query`, no URL or password typed).

No deploy of its own: the lab of the session's walk (tests/lab/conftest.py), after the second
deploy. Named to run right after test_base.py (pytest collects a folder's modules by name), before
the modules that deploy other settings on the same guest (DCGM, EAGLE-3, the engine wheels) change
what it watches.

Real here: Debian 12's prometheus, prometheus-alertmanager (with its amtool) and
prometheus-node-exporter at their pins, basic auth, the checks' timer. Stand-ins: the SGLang
server (lab/standins/sglang_server), NVIDIA's DCGM exporter package and nvidia-smi
(lab/standins/nvidia_apt_repo), as in tests/lab/test_monitoring.py, and the dead man's switch
service the Watchdog beats to (lab/standins/heartbeat), served on this machine by the last test,
which stops the guest and sees the beats stop.
"""

from __future__ import annotations

import json
import subprocess
import time
from urllib.parse import quote

import pytest

import lab
from roles.monitoring import config as monitoring_config
from tests.lab.harness import LAB_INVENTORY, load_lab_site

pytestmark = pytest.mark.lab

# The alerts the main lab fires all along, and why (docs/monitoring.md, "In the lab"): the
# checks' gpu suite runs in the lab's GPU-free engine environment, which has no torch; the
# Watchdog always fires (it is the heartbeat).
EXPECTED_FIRING = {("HealthCheckFailing", "cuda works"), ("Watchdog", "")}


def _exec(command: str, stdin: str = "", timeout: float = 150) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["docker", "exec", "-i", lab.container_name("gpu"), "sh", "-c", command],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def monitor(lab_second_deploy):
    """The guest, its own monitor, once the run after the walk has changed nothing."""
    return load_lab_site(LAB_INVENTORY).group("monitors")[0]


def _prometheus(monitor, path: str) -> dict:
    """Prometheus' API on the guest's loopback; the password goes in a curl config on stdin."""
    vault, _ = lab.throwaway_vault()
    password = lab.vault_secret(vault, monitor.monitoring.web_password_secret)
    done = _exec(
        f"curl -sf -g -K - 'http://127.0.0.1:{monitor.monitoring.prometheus_port}{path}'",
        stdin=f'user = "{monitor.monitoring.web_user}:{password}"\n',
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["data"]


def _until(what, done, seconds: float, every: float = 3):
    started, value = time.monotonic(), what()
    while not done(value) and time.monotonic() - started < seconds:
        time.sleep(every)
        value = what()
    return value


def test_prometheus_scrapes_the_engine_node_exporter_and_the_dcgm_exporter(monitor):
    site = load_lab_site(LAB_INVENTORY)
    expected = sorted(
        (job["job_name"], group["targets"][0])
        for job in monitoring_config.scrape_jobs(site, monitor)
        for group in job["static_configs"]
    )
    assert [job for job, _ in expected] == ["dcgm", "engine", "node"], expected  # all on the guest itself

    def targets():
        return _prometheus(monitor, "/api/v1/targets")["activeTargets"]

    found = _until(targets, lambda ts: len(ts) == len(expected) and all(t["health"] == "up" for t in ts), 60)
    assert sorted((t["labels"]["job"], t["labels"]["instance"]) for t in found) == expected
    assert [(t["labels"]["job"], t["lastError"]) for t in found if t["health"] != "up"] == []
    # DCGM_FI_PROF_*: the stand-in exporter serves them only with DCGM's profiling module, which the
    # deploy installs (datacenter-gpu-manager-4-proprietary, pinned with the core).
    for name in (
        "sglang:num_running_reqs",
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "node_filesystem_avail_bytes",
    ):
        assert _prometheus(monitor, f"/api/v1/query?query={quote(f'count({name})')}")["result"], name


def test_prometheus_has_the_checks_textfile(monitor):
    """The timer's verdicts reach Prometheus through node_exporter's textfile collector. A run is
    started if the timer's first one (2 minutes after boot) has not come yet."""

    def last_run():
        return _prometheus(monitor, "/api/v1/query?query=inference_host_checks_last_run_timestamp_seconds")["result"]

    if not last_run():
        started = _exec("systemctl start inference-host-checks.service")  # oneshot: waited for
        assert started.returncode == 0, started.stderr
    assert _until(last_run, bool, 30), "no inference_host_checks_last_run_timestamp_seconds in Prometheus"
    verdicts = _prometheus(monitor, "/api/v1/query?query=inference_host_check_ok")["result"]
    suites = {v["metric"]["suite"] for v in verdicts}
    assert suites == {"gpu", "service", "server"}, suites
    assert {v["metric"]["host"] for v in verdicts} == {monitor.name}


def _firing_in_alertmanager() -> set[tuple[str, str]]:
    """The operator's command, as docs/monitoring.md gives it: amtool with the monitor's own
    configuration (/etc/prometheus/amtool.yml), no URL or password on its command line."""
    done = _exec("amtool alert query -o json", timeout=30)
    assert done.returncode == 0, done.stdout + done.stderr
    return {(a["labels"]["alertname"], a["labels"].get("check", "")) for a in json.loads(done.stdout)}


def test_only_the_expected_alerts_fire(monitor):
    """Once the checks have run and a failing check has failed monitoring_check_failing_for,
    Alertmanager holds exactly the lab's expected alerts, and Prometheus fires no other."""
    wait = 3 * 5 + 20 + 5 + 30  # scrapes, monitoring_check_failing_for, group wait, slack (lab.py)
    firing = _until(_firing_in_alertmanager, lambda found: found == EXPECTED_FIRING, wait)
    assert firing == EXPECTED_FIRING
    alerts = _prometheus(monitor, "/api/v1/alerts")["alerts"]
    in_prometheus = {(a["labels"]["alertname"], a["labels"].get("check", "")) for a in alerts if a["state"] == "firing"}
    assert in_prometheus == EXPECTED_FIRING, alerts
    print(f"\nfiring in the main lab: {sorted(firing)}")


def _docker(*args: str) -> None:
    done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_a_dead_gpu_guest_stops_the_heartbeats(monitor):
    """The Watchdog reaches the heartbeat stand-in (lab/standins/heartbeat, outside the guest) every
    monitoring_heartbeat_interval; with the guest stopped, the beats stop, which is what the outside
    service pages on. The guest is stopped by freezing it (`docker pause`, the cgroup freezer):
    nothing in it runs, as with a hung kernel or a node without power, and it resumes where it was
    (a `docker stop` would add a boot and the services' start before the next modules)."""
    from lab.standins.heartbeat import check_uuid, serving

    # The heartbeat's URL is only in the relay's file, 0600 of its own user; alertmanager.yml (0600
    # since it once held the URL) names the relay on the loopback.
    mode = _exec(f"stat -c '%a %U %G' {monitoring_config.ALERTMANAGER_FILE}", timeout=30)
    assert mode.stdout.split() == ["600", "prometheus", "prometheus"], mode.stdout + mode.stderr
    user = monitoring_config.RELAY_USER
    mode = _exec(f"stat -c '%a %U %G' {monitoring_config.RELAY_CONFIG}", timeout=30)
    assert mode.stdout.split() == ["600", user, user], mode.stdout + mode.stderr
    inline = check_uuid(lab.PREFIX) in _exec(f"cat {monitoring_config.ALERTMANAGER_FILE}", timeout=30).stdout
    assert not inline, "the heartbeat URL is in alertmanager.yml"
    interval = monitor.monitoring.heartbeat_interval  # 5 s in inventory/lab.py
    seconds = int(interval[:-1])
    assert interval.endswith("s") and seconds <= 10, interval
    started = time.monotonic()
    with serving(lab.PREFIX) as pings:
        opened = time.time()
        beats = _until(lambda: pings.since(opened), lambda found: len(found) >= 2, 6 * seconds, every=1)
        assert len(beats) >= 2, f"fewer than two beats in {6 * seconds} s: {beats}"
        for beat in beats:
            assert beat["check"] == check_uuid(lab.PREFIX) and beat["method"] == "POST", beat
            assert beat["user_agent"].startswith("Alertmanager/"), beat
            body = json.loads(beat["body"])
            assert [a["labels"]["alertname"] for a in body["alerts"]] == ["Watchdog"], body
        gaps = [b["at"] - a["at"] for a, b in zip(beats, beats[1:], strict=False)]
        _docker("pause", lab.container_name("gpu"))
        try:
            stopped = time.time()
            time.sleep(3 * seconds)
            silent = pings.since(stopped + 0.5)  # a beat already in flight at the pause may land
        finally:
            _docker("unpause", lab.container_name("gpu"))
        resumed_at = time.time()
        back = _until(lambda: pings.since(resumed_at), bool, 6 * seconds, every=1)
    cost = time.monotonic() - started
    assert silent == [], f"beats while the guest was stopped: {silent}"
    assert back, f"no beat within {6 * seconds} s of the guest running again"
    relay = _exec(f"journalctl --no-pager -o cat -u {monitoring_config.RELAY_UNIT}", timeout=60).stdout
    assert "receiver heartbeat: delivered again" in relay, relay  # the relay saw the service come back
    print(
        f"\nheartbeat every {interval}: gaps {[round(g, 1) for g in gaps]} s before; none in the"
        f" {3 * seconds} s stopped; back {back[0]['at'] - resumed_at:.1f} s after; test {cost:.1f} s"
    )


def test_the_heartbeat_url_is_in_no_line_of_the_journal(monitor):
    """The leak the relay closes: while nothing served the heartbeat (the walk, the guest frozen)
    its deliveries failed; the relay named the receiver and the cause, and the URL's secret (the
    check's UUID) is in no line of the guest's journal (Debian 12's Alertmanager 0.25 printed the
    whole URL in each failure when it posted there itself). Runs after the test above."""
    from lab.standins.heartbeat import check_uuid

    relay = _exec(f"journalctl --no-pager -o cat -u {monitoring_config.RELAY_UNIT}", timeout=60).stdout
    assert "receiver heartbeat: delivery failed: " in relay, relay
    journal = _exec("journalctl --no-pager -o cat", timeout=120)
    assert journal.returncode == 0 and "Notify attempt failed" in journal.stdout, journal.stderr
    leaked = check_uuid(lab.PREFIX) in journal.stdout  # a bool: a failure must not print the journal
    assert not leaked, "the heartbeat URL reached the journal"
