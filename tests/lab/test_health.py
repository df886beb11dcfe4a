"""roles/health in the lab: the checks run as the last operation of a real deploy, their verdict
table reaches the user, their report is written, and a failed check fails the deploy.

The lab has no GPU, so only the service and server suites can judge it, against the engine's
stand-in server that roles/serving runs there.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys

import pytest

import lab
from tests.lab.harness import LAB_INVENTORY, PROJECT_ROOT, run_deploy

pytestmark = pytest.mark.lab


def test_deploy_ends_with_the_health_checks(lab_first_deploy):
    before = set((PROJECT_ROOT / "reports").glob("health-*.json"))
    run = run_deploy(LAB_INVENTORY, "--data", 'health_after_deploy=["service"]')
    assert "inference-host health verdict" in run.stderr, run.explain()
    assert "Check health of @docker/" in run.stderr, run.explain()
    reports = set((PROJECT_ROOT / "reports").glob("health-*.json")) - before
    assert len(reports) == 1, f"expected one new JSON report under reports/, found {sorted(reports)}"
    report = json.loads(reports.pop().read_text())
    assert {c["suite"] for c in report["checks"]} == {"service"}
    assert run.returncode == 0 and report["verdict"] == "healthy", run.explain()
    # Last of the guest's steps; only the node's hand-over to the next pass (roles/proxmox_host
    # continue_in_guests, which changes nothing once everything exists) comes after it.
    steps = [op["name"] for op in run.results["operations"] if not op["name"].startswith("Proxmox guests continue |")]
    assert run.health_checks and run.health_checks[-1] == steps[-1], "the health check must be the deploy's last step"


def test_a_failing_check_fails_the_deploy(lab_first_deploy):
    # No CUDA here: the gpu suite's 'cuda works' fails (no torch in the lab's GPU-free environment).
    run = run_deploy(LAB_INVENTORY, "--data", 'health_after_deploy=["gpu"]')
    assert run.returncode != 0, run.explain()
    failed = [op["name"] for op in run.results["operations"] if op["error"]] if run.results else []
    assert any("Check health of" in name for name in failed) or "health checks of" in run.stderr, run.explain()
    assert "health checks of @docker/" in run.stderr and "failed (exit" in run.stderr, run.explain()


def run_checks(*extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "checks", "--inventory", str(LAB_INVENTORY), "--suites", "service,server", *extra],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )


# The one hardware answer the service suite needs that the lab has none of: nvidia-smi's GPU
# list. This stand-in, put in the GPU guest only while a test runs, prints the real line of
# 1 x H200 (tests/unit/data/gpu/h200-1gpu-health/query-gpu-health.csv) once per GPU, at
# successive PCI addresses; any other nvidia-smi call fails, as on a host without the driver.
H200_ROW = (PROJECT_ROOT / "tests/unit/data/gpu/h200-1gpu-health/query-gpu-health.csv").read_text().splitlines()[0]
NVIDIA_SMI = "/usr/local/bin/nvidia-smi"


@contextlib.contextmanager
def gpus_seen(count: int):
    rows = "\n".join(
        H200_ROW.replace("0, 00000000:00:06.0,", f"{i}, 00000000:00:{6 + i:02x}.0,", 1) for i in range(count)
    )
    script = (
        f"#!/bin/sh\n# Lab stand-in (tests/lab/test_health.py): {count} GPUs, nvidia-smi --query-gpu only\n"
        f"case \"$1\" in --query-gpu=*) cat <<'EOF'\n{rows}\nEOF\n;;\n*) echo 'no driver' >&2; exit 9;; esac\n"
    )
    guest = lab.container_name("gpu")
    subprocess.run(
        ["docker", "exec", "-i", guest, "sh", "-c", f"cat > {NVIDIA_SMI} && chmod 755 {NVIDIA_SMI}"],
        input=script,
        text=True,
        check=True,
    )
    try:
        yield
    finally:
        subprocess.run(["docker", "exec", guest, "rm", "-f", NVIDIA_SMI], check=True)


def _check(report, name: str) -> dict:
    return next(c for c in json.loads(report.read_text())["checks"] if c["check"] == name)


def test_service_and_server_suites_pass_against_the_stand_in(lab_first_deploy, tmp_path):
    with gpus_seen(8):  # the inventory's gpu_count
        completed = run_checks("--report", str(tmp_path / "report.json"))
    assert completed.returncode == 0, completed.stdout[-4000:] + completed.stderr[-2000:]
    assert "VERDICT: HEALTHY" in completed.stdout
    # Read from the launcher the deploy wrote in the guest, against the GPUs seen there.
    tp = _check(tmp_path / "report.json", "tensor parallel size matches the gpus")
    assert tp["verdict"] == "PASS" and tp["detail"] == "--tp-size 8 = 8 GPUs seen (nvidia-smi)", tp


def test_a_wrong_expectation_fails_with_expected_found_and_what_to_do(lab_first_deploy, tmp_path):
    with gpus_seen(7):  # planted: one of the 8 GPUs the unit's --tp-size 8 needs is gone
        completed = run_checks(
            "--expect", "serving_served_model_name=deepseek-v3", "--report", str(tmp_path / "report.json")
        )
    assert completed.returncode == 1, completed.stdout[-4000:]
    assert "VERDICT: UNHEALTHY" in completed.stdout
    assert "expected served model name 'deepseek-v3'" in completed.stdout
    assert "what to do" in completed.stdout
    tp = _check(tmp_path / "report.json", "tensor parallel size matches the gpus")
    assert tp["verdict"] == "FAIL", tp
    assert (
        "expected --tp-size to give this node as many ranks as the GPUs it sees (7, nvidia-smi);"
        " found 8 ranks per node in /opt/inference-host/current/serving/launch; what to do:"
    ) in tp["detail"], tp
