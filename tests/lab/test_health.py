"""roles/health in the lab: the checks run as the last operation of a real deploy, their verdict
table reaches the user, their report is written, and a failed check fails the deploy.

The lab has no GPU, so only the service and server suites can judge it, against the engine's
stand-in server that roles/serving runs there.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

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
    assert run.health_checks and run.health_checks[-1] == steps[-1], (
        "the health check must be the deploy's last step")


def test_a_failing_check_fails_the_deploy(lab_first_deploy):
    # No GPU here: the gpu suite finds none of the 8 GPUs the inventory describes.
    run = run_deploy(LAB_INVENTORY, "--data", 'health_after_deploy=["gpu"]')
    assert run.returncode != 0, run.explain()
    failed = [op["name"] for op in run.results["operations"] if op["error"]] if run.results else []
    assert any("Check health of" in name for name in failed) or "health checks of" in run.stderr, (
        run.explain())
    assert "health checks of @docker/" in run.stderr and "failed (exit" in run.stderr, run.explain()


def run_checks(*extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "checks", "--inventory", str(LAB_INVENTORY),
         "--suites", "service,server", *extra], cwd=PROJECT_ROOT, capture_output=True, text=True,
        timeout=600)


def test_service_and_server_suites_pass_against_the_stand_in(lab_first_deploy):
    completed = run_checks()
    assert completed.returncode == 0, completed.stdout[-4000:] + completed.stderr[-2000:]
    assert "VERDICT: HEALTHY" in completed.stdout


def test_a_wrong_expectation_fails_with_expected_found_and_what_to_do(lab_first_deploy):
    completed = run_checks("--expect", "serving_served_model_name=deepseek-v3")
    assert completed.returncode == 1, completed.stdout[-4000:]
    assert "VERDICT: UNHEALTHY" in completed.stdout
    assert "expected served model name 'deepseek-v3'" in completed.stdout
    assert "what to do" in completed.stdout
