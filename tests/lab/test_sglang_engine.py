"""roles/sglang + roles/serving in the lab: the real sglang wheel in its versioned uv
environment, patched; the stand-in server under the real systemd unit; restarts only on
change; cleanup of stubborn children; upgrade and health-gated rollback with measured downtime."""

from __future__ import annotations

import json
import shutil
import statistics
import time
from pathlib import Path

import pytest

from roles.shared.layout import env_dir
from roles.site import load_site
from tests.lab.harness import LAB_INVENTORY, PROJECT_ROOT, run_deploy

pytestmark = pytest.mark.lab

SITE = load_site(LAB_INVENTORY)
HOST = SITE.group("gpu_nodes")[0]
OLD = SITE.stack.active
NEW = SITE.stack.stacks["sglang-0.5.23-cu130"]
ROOT = HOST.base.install_root
URL = f"http://127.0.0.1:{HOST.serving.port}"
OLD_ENV = env_dir(HOST, OLD, SITE)  # <root>/envs/<stack id>-<stamp of its lock>
NEW_ENV = env_dir(HOST, NEW, SITE)
POLLER = "/run/ih-downtime-poller.py"
POLL_LOG = "/run/ih-downtime.log"


def _main_pid(gpu_guest) -> str:
    return gpu_guest.check_output("systemctl show -p MainPID --value sglang.service")


def _api_key() -> str:
    from roles.site import vault as secrets

    return secrets.decrypt_all(SITE.secrets_file, ["sglang_api_key"])["sglang_api_key"]


def _inventory_with_active(tmp_path: Path, stack_id: str) -> Path:
    """inventory/lab.py beside a stack file whose `active` is stack_id (the user's edit)."""
    folder = tmp_path / "inventory"
    folder.mkdir(exist_ok=True)
    shutil.copy(LAB_INVENTORY, folder / "lab.py")
    if not (folder / "locks").exists():
        shutil.copytree(PROJECT_ROOT / "inventory/locks", folder / "locks")
    text = (PROJECT_ROOT / "inventory/stack.yml").read_text()
    (folder / "stack.yml").write_text(text.replace(f"active: {OLD.id}", f"active: {stack_id}"))
    return folder / "lab.py"


def _wait_healthy(gpu_guest, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if gpu_guest.run(f"curl -sf -o /dev/null {URL}/health_generate").rc == 0:
            return
        time.sleep(0.5)
    raise AssertionError("the service did not become healthy")


def test_serves_from_the_versioned_environment(gpu_guest, lab_second_deploy):
    assert gpu_guest.file(f"{ROOT}/current").linked_to == OLD_ENV
    version = gpu_guest.check_output(f"{ROOT}/current/bin/python -c "
                                     "'import importlib.metadata as m; print(m.version(\"sglang\"))'")
    assert version == OLD.sglang  # the real wheel of the pinned release
    assert gpu_guest.service("sglang").is_running and gpu_guest.service("sglang").is_enabled
    models = json.loads(gpu_guest.check_output(
        f"curl -sf -H 'Authorization: Bearer {_api_key()}' {URL}/v1/models"))
    assert models["data"][0]["id"] == HOST.serving.served_model_name
    assert gpu_guest.check_output(f"curl -s -o /dev/null -w '%{{http_code}}' {URL}/v1/models") == "401"
    assert gpu_guest.check_output(f"curl -s -o /dev/null -w '%{{http_code}}' {URL}/metrics") == "200"


def test_api_key_and_environment_stay_private(gpu_guest, lab_second_deploy):
    cmdline = gpu_guest.check_output(f"cat /proc/{_main_pid(gpu_guest)}/cmdline | tr '\\0' ' '")
    assert _api_key() not in cmdline and "--config /etc/sglang/sglang-secret-args.yaml" in cmdline
    assert gpu_guest.check_output(f"ps -o user= -p {_main_pid(gpu_guest)}") == HOST.base.service_user
    secret_args = gpu_guest.file("/etc/sglang/sglang-secret-args.yaml")
    assert secret_args.mode == 0o600 and secret_args.user == HOST.base.service_user
    env_file = gpu_guest.file("/etc/sglang/sglang.env")
    assert env_file.mode == 0o600 and env_file.contains("^NCCL_P2P_LEVEL=SYS$")


def test_patches_are_applied_to_the_real_wheel(gpu_guest, lab_second_deploy):
    source = gpu_guest.check_output(
        f"cat {ROOT}/current/lib/python3*/site-packages/sglang/srt/distributed/device_communicators/custom_all_reduce.py")
    assert "SGLANG_CUSTOM_AR_ALLOW_PCIE" in source


def test_unit_verifies_clean(gpu_guest, lab_second_deploy):
    result = gpu_guest.run("systemd-analyze verify /etc/systemd/system/sglang.service")
    assert result.rc == 0 and "sglang.service" not in result.stderr, result.stderr


def test_stop_leaves_no_process_of_the_service_user(gpu_guest, lab_second_deploy):
    user = HOST.base.service_user
    # The stand-in runs with a child that ignores SIGTERM (INFERENCE_HOST_STANDIN_STUBBORN_CHILD).
    assert len(gpu_guest.check_output(f"pgrep -u {user} -f signal.SIG_IGN || true").split()) >= 1
    # And a stray process of the service user outside the unit (a manual run's orphan).
    gpu_guest.check_output(f"systemd-run --quiet --uid={user} --unit=ih-stray sh -c 'trap \"\" TERM; sleep 600'")
    started = time.monotonic()
    gpu_guest.check_output("systemctl stop sglang.service")
    assert time.monotonic() - started < 30
    assert gpu_guest.run(f"pgrep -u {user}").stdout.strip() == "", "processes of the service user survived the stop"
    gpu_guest.check_output("systemctl start sglang.service")  # ExecStartPost waits for readiness
    _wait_healthy(gpu_guest)


def test_changed_setting_restarts_unchanged_does_not(gpu_guest, lab_second_deploy):
    before = _main_pid(gpu_guest)
    unchanged = run_deploy()
    assert unchanged.returncode == 0 and unchanged.changed == [], unchanged.changed
    assert _main_pid(gpu_guest) == before
    changed = run_deploy(env={"INFERENCE_HOST_LAB_READY_TIMEOUT": "21"})
    try:
        assert changed.returncode == 0, changed.explain()
        assert _main_pid(gpu_guest) != before
        assert any("restart" in name.lower() for name in changed.changed)
    finally:
        assert run_deploy().returncode == 0


def _start_poller(gpu_guest):
    script = (
        "import time, urllib.request\n"
        f"log = open('{POLL_LOG}', 'w', buffering=1)\n"
        "while True:\n"
        "    try:\n"
        f"        ok = urllib.request.urlopen('{URL}/health_generate', timeout=2).status == 200\n"
        "    except Exception:\n"
        "        ok = False\n"
        "    log.write(f'{time.time():.3f} {int(ok)}\\n')\n"
        "    time.sleep(0.05)\n"
    )
    gpu_guest.check_output(f"cat > {POLLER} <<'EOF'\n{script}EOF")
    gpu_guest.check_output(f"systemd-run --quiet --unit=ih-downtime-poller python3 {POLLER}")


def _stop_poller(gpu_guest) -> float:
    """Longest stretch in which /health_generate did not answer 200, in seconds."""
    gpu_guest.run("systemctl stop ih-downtime-poller")
    samples = [line.split() for line in gpu_guest.check_output(f"cat {POLL_LOG}").splitlines()]
    longest, down_since = 0.0, None
    for stamp, ok in samples:
        if ok == "0" and down_since is None:
            down_since = float(stamp)
        elif ok == "1" and down_since is not None:
            longest, down_since = max(longest, float(stamp) - down_since), None
    assert down_since is None, "the service was still down at the end"
    return longest


def _timed_deploy(gpu_guest, inventory, env=None):
    _start_poller(gpu_guest)
    run = run_deploy(inventory, env=env)
    return run, _stop_poller(gpu_guest)


def test_upgrade_and_rollback(gpu_guest, lab_second_deploy, tmp_path):
    upgrade = _inventory_with_active(tmp_path, NEW.id)
    rounds = int(__import__("os").environ.get("INFERENCE_HOST_LAB_DOWNTIME_ROUNDS", "1"))
    good, rolled = [], []
    try:
        for _ in range(rounds):
            # A new release that never becomes ready: switched back, the old one serves again.
            run, downtime = _timed_deploy(gpu_guest, upgrade, env={"INFERENCE_HOST_LAB_NEVER_HEALTHY": NEW.sglang})
            assert run.returncode != 0, "the deploy must fail when the upgrade never becomes ready"
            assert "ROLLED BACK" in run.stdout + run.stderr, run.explain()
            assert gpu_guest.file(f"{ROOT}/current").linked_to == OLD_ENV
            assert gpu_guest.file(f"{NEW_ENV}/bin/python").exists  # built beside
            _wait_healthy(gpu_guest, timeout=5)
            assert f"{OLD_ENV}/" in gpu_guest.check_output(f"cat /proc/{_main_pid(gpu_guest)}/cmdline | tr '\\0' ' '")
            rolled.append(downtime)
            # Back to the normal settings (the never-healthy switch is in the env file).
            assert run_deploy().returncode == 0
            # A good upgrade: the new release's own flags, served from its environment.
            run, downtime = _timed_deploy(gpu_guest, upgrade)
            assert run.returncode == 0, run.explain()
            assert gpu_guest.file(f"{ROOT}/current").linked_to == NEW_ENV
            launcher = gpu_guest.file(f"{NEW_ENV}/inference-host-launch").content_string
            assert f"{NEW_ENV}/bin/python" in launcher
            good.append(downtime)
            # Downgrade to the original stack: also a good switch.
            assert run_deploy().returncode == 0
            assert gpu_guest.file(f"{ROOT}/current").linked_to == OLD_ENV
    finally:
        run_deploy()
    print(f"\ndowntime (s) good upgrade: {good} median {statistics.median(good):.2f};"
          f" rollback: {rolled} median {statistics.median(rolled):.2f}")
