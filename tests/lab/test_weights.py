"""roles/weights in the lab: the node downloads the guest's model from the stand-in Hub with the
real huggingface_hub client, verifies it, and the guest's service loads it read-only.

The session's first deploy is the first download (tests/lab/conftest.py). The tests below then
deploy the node alone (`--limit` the node: the weights are its work) to prove: a no-change deploy
neither downloads nor hashes; a download killed midway resumes with a Range request; a corrupt
file is found and fetched again; a too-small disk is refused before any file is fetched; a
branch name is refused at validation.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

import lab
from lab.standins import hf_hub
from lab.standins.hf_hub import server as hub_server
from tests.lab.harness import LAB_INVENTORY, PROJECT_ROOT, DeployRun, run_deploy

pytestmark = pytest.mark.lab

MODEL_DIR = f"{lab.MODELS_HOST_PATH}/tiny-moe"
GUEST_DIR = f"{lab.MODELS_GUEST_PATH}/tiny-moe"
SHARD = "model-00002-of-00002.safetensors"
REPO = hub_server.generate(hf_hub.MODEL_REPO, hub_server.LAB_REPOS[hf_hub.MODEL_REPO])


def node(*command: str, check: bool = True) -> str:
    completed = subprocess.run(
        ["docker", "exec", lab.container_name("pve"), *command], capture_output=True, text=True, check=False
    )
    if check and completed.returncode != 0:
        raise AssertionError(f"{command} failed: {completed.stderr}")
    return completed.stdout


def guest(*command: str) -> str:
    return subprocess.run(
        ["docker", "exec", lab.container_name("gpu"), *command], capture_output=True, text=True, check=True
    ).stdout


def unit() -> str:
    return json.loads(node("cat", f"/etc/inference-host/weights/{config_name()}.json"))["unit"]


def config_name() -> str:
    names = node("ls", "/etc/inference-host/weights").split()
    return next(n for n in names if n.startswith("tiny-moe-")).removesuffix(".json")


def hub_log() -> list[str]:
    """The stand-in Hub's requests for repository data (not its own /ready probes)."""
    path = hf_hub.log_path(lab.PREFIX)
    lines = path.read_text().splitlines() if path.exists() else []
    return [line for line in lines if any(k in line for k in ("/api/", "/resolve/", "/lfs-cdn/"))]


def deploy_node(**env: str) -> DeployRun:
    return run_deploy(LAB_INVENTORY, "--limit", lab.pyinfra_name("pve"), env=env)


def weights_changes(run: DeployRun) -> list[str]:
    return [name for name in run.changed if name.startswith("Weights |")]


def manifest() -> dict:
    return json.loads(node("cat", f"{MODEL_DIR}/.inference-host/manifest.json"))


def test_first_deploy_downloads_verifies_and_the_guest_serves_it(lab_first_deploy):
    files = {f["path"]: f for f in manifest()["files"]}
    # Every file of the pinned commit but the ignored ones, with the Hub's LFS sha256.
    assert set(files) == {p for p in REPO.files if not p.startswith("original/")}
    assert files[SHARD]["sha256"] == REPO.files[SHARD].sha256
    assert files["config.json"]["git_sha1"] == REPO.files["config.json"].blob_id
    on_disk = node("sha256sum", f"{MODEL_DIR}/{SHARD}").split()[0]
    assert on_disk == REPO.files[SHARD].sha256
    # Progress lines from the unit, printed by the deploy; the token reached the client
    # (the stand-in answers 401 without it).
    if os.environ.get("INFERENCE_HOST_LAB_REUSE") != "1":  # a fresh lab: this deploy downloaded
        assert "Weights | Download and verify" in " ".join(weights_changes(lab_first_deploy))
        assert "manifest verified" in lab_first_deploy.stderr
    assert not [line for line in hub_log() if '" 401 ' in line]
    # Downloaded by its own user, not root (issue 53): the unit's user owns the store and its files.
    from roles import weights

    assert node("systemctl", "show", "-p", "User", "--value", unit()).strip() == weights.USER
    assert set(node("find", MODEL_DIR, "-printf", "%u\\n").split()) == {weights.USER}
    # The node passes the directory read-only; the guest's service loaded that copy.
    assert f"{lab.MODELS_HOST_PATH},mp={lab.MODELS_GUEST_PATH},ro=1" in node("cat", "/etc/pve/lxc/101.conf")
    assert (
        "Read-only file system"
        in subprocess.run(
            ["docker", "exec", lab.container_name("gpu"), "touch", f"{GUEST_DIR}/x"], capture_output=True, text=True
        ).stderr
    )
    journal = guest("journalctl", "-u", "inference-engine", "--no-pager", "-o", "cat")
    size = REPO.files[SHARD].size + REPO.files["model-00001-of-00002.safetensors"].size
    assert f"loaded 2 weight file(s), {size} bytes, from {GUEST_DIR}" in journal
    assert f"AssertPathExists={GUEST_DIR}/.inference-host/manifest.json" in guest(
        "cat", "/etc/systemd/system/inference-engine.service"
    )


def test_no_change_deploy_neither_downloads_nor_hashes(lab_first_deploy):
    status_file = f"/var/lib/inference-host/weights/{config_name()}.status.json"
    before = (node("cat", status_file), node("systemctl", "show", "-p", "InvocationID", unit()))
    requests = len(hub_log())
    run = deploy_node()
    assert run.returncode == 0, run.explain()
    assert weights_changes(run) == []
    # The unit did not run (no hashing, no Hub request): same invocation, same status.
    assert (node("cat", status_file), node("systemctl", "show", "-p", "InvocationID", unit())) == before
    assert len(hub_log()) == requests


def test_interrupted_download_resumes_with_a_range_request(lab_first_deploy):
    node("sh", "-c", f"rm -rf {MODEL_DIR}/* {MODEL_DIR}/.cache {MODEL_DIR}/.inference-host")
    hf_hub.set_rate(lab.PREFIX, 3_000_000)  # bytes/s per connection: ~8 s for the 24 MiB shard
    requests = len(hub_log())
    raw_mark = len(hf_hub.log_path(lab.PREFIX).read_text())
    result: dict = {}
    deploying = threading.Thread(target=lambda: result.setdefault("run", deploy_node()))
    deploying.start()
    try:
        partial = 0
        deadline = time.monotonic() + 120
        while partial < 10 * 1024 * 1024 and time.monotonic() < deadline:  # one 10 MiB chunk
            sizes = node(
                "sh", "-c", f"find {MODEL_DIR}/.cache -name '*.incomplete' -printf '%s\\n'", check=False
            ).split()
            partial = max([int(s) for s in sizes] or [0])
            time.sleep(0.3)
        assert partial >= 10 * 1024 * 1024, "the download never got midway"
        node("systemctl", "kill", "-s", "KILL", unit())  # midway: the unit's process dies
    finally:
        hf_hub.set_rate(lab.PREFIX, None)
        deploying.join(timeout=600)
    run = result["run"]
    assert run.returncode == 0, run.explain()
    assert "downloading" in run.stderr  # the deploy printed progress while it waited
    journal = node("journalctl", "-u", unit(), "--no-pager", "-o", "cat")
    assert "Main process exited, code=killed, status=9/KILL" in node("journalctl", "-u", unit(), "--no-pager")
    assert "verified 5 files" in journal
    # huggingface_hub resumed the .incomplete file: the CDN answered a Range request with 206.
    resumed = [line for line in hub_log()[requests:] if "/lfs-cdn/" in line and '" 206 ' in line]
    assert resumed, "no ranged (206) download after the kill:\n" + "\n".join(hub_log()[requests:])
    # The stand-in offered the shard over Xet too (X-Xet-Hash, as the real Hub does); the unit's
    # HF_HUB_DISABLE_XET=1 kept the client on http_get: it never asked for a Xet token.
    log = hf_hub.log_path(lab.PREFIX).read_text()
    assert f"{hf_hub.MODEL_REPO}/{SHARD} on Xet as " in log
    since = log[raw_mark:]
    assert not [k for k in ("xet-read-token", "GET /v2/reconstructions/", "GET /xorbs/") if k in since]
    assert node("sha256sum", f"{MODEL_DIR}/{SHARD}").split()[0] == REPO.files[SHARD].sha256


def test_corrupt_file_is_found_and_fetched_again(lab_first_deploy):
    shard = f"{MODEL_DIR}/{SHARD}"
    # Bit rot: one byte flipped, size and mtime kept (huggingface_hub's own bookkeeping still
    # trusts the file; only a full re-hash can tell).
    node(
        "python3",
        "-c",
        f"import os; s = os.stat({shard!r}); f = open({shard!r}, 'r+b'); f.seek(4096);"
        " b = f.read(1); f.seek(4096); f.write(bytes([b[0] ^ 255])); f.close();"
        f" os.utime({shard!r}, ns=(s.st_atime_ns, s.st_mtime_ns))",
    )
    assert node("sha256sum", shard).split()[0] != REPO.files[SHARD].sha256
    plain = deploy_node()  # sizes only: bit rot passes unseen, as documented
    assert plain.returncode == 0 and weights_changes(plain) == []
    forced = deploy_node(INFERENCE_HOST_LAB_WEIGHTS_VERIFY="1")
    assert forced.returncode == 0, forced.explain()
    journal = node("journalctl", "-u", unit(), "--no-pager", "-o", "cat")
    assert f"verify: {SHARD}: content differs from the Hub's hash; fetching it again" in journal
    assert node("sha256sum", shard).split()[0] == REPO.files[SHARD].sha256
    # A file of the wrong size is caught by the ordinary deploy (manifest + sizes).
    node("truncate", "-s", "100", f"{MODEL_DIR}/config.json")
    again = deploy_node()
    assert again.returncode == 0, again.explain()
    assert node("cat", f"{MODEL_DIR}/config.json") == REPO.files["config.json"].content.decode()


def test_too_small_disk_is_refused_before_downloading(lab_first_deploy):
    small = f"{lab.MODELS_HOST_PATH}/tiny-moe"
    node("mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", small)  # 16 MiB for a 44 MiB model
    requests = len(hub_log())
    try:
        run = deploy_node()
    finally:
        node("umount", small)
    assert run.returncode != 0
    assert f"not enough free space on {small}" in run.stderr, run.explain()
    assert "44.0 MiB" in run.stderr and "16.0 MiB free" in run.stderr
    assert not [line for line in hub_log()[requests:] if "/lfs-cdn/" in line or "/resolve/" in line]


def test_branch_name_revision_is_refused_at_validation():
    env = {"INFERENCE_HOST_LAB_WEIGHTS_REVISION": "main"}
    completed = subprocess.run(
        [sys.executable, "-m", "validation", "inventory/lab.py"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, **env},
    )
    assert completed.returncode == 2
    problems = [line for line in completed.stderr.splitlines() if line.startswith("  - ")]
    assert len(problems) == 1, completed.stderr
    assert "weights_revision = 'main' is invalid; expected the 40-character commit hash" in problems[0]
    # The deploy stops on the same message before it connects to anything.
    run = run_deploy(env=env)
    assert run.returncode == 2 and "no host was contacted" in run.stderr
    assert "Connecting to hosts" not in run.stderr + run.stdout


def test_health_suite_checks_the_manifest_and_fails_on_another_pin(lab_first_deploy, tmp_path):
    def service_suite(**env: str) -> tuple[int, str]:
        report = tmp_path / f"health-{len(env)}.json"
        completed = subprocess.run(
            [
                sys.executable,
                "-m",
                "checks",
                "--inventory",
                "inventory/lab.py",
                "--host",
                lab.pyinfra_name("gpu"),
                "--suites",
                "service",
                "--report",
                str(report),
            ],
            cwd=PROJECT_ROOT,
            capture_output=True,
            text=True,
            env={**os.environ, **env},
        )
        checks = json.loads(report.read_text())["checks"] if report.exists() else []
        detail = " ".join(c["detail"] for c in checks if c["check"] == "weights manifest matches the pin")
        return completed.returncode, detail or completed.stdout + completed.stderr

    code, detail = service_suite()
    assert code == 0, detail
    assert f"model {hf_hub.MODEL_REPO}@{REPO.commit[:12]}: 5 files" in detail
    # The inventory now pins another commit than the one on disk: the check must say so.
    other = hf_hub.commit_of(hf_hub.DRAFTER_REPO)
    code, detail = service_suite(INFERENCE_HOST_LAB_WEIGHTS_REVISION=other)
    assert code != 0
    assert f"expected model weights {hf_hub.MODEL_REPO}@{other} in {GUEST_DIR}" in detail
