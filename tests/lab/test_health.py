"""roles/health in the lab: the checks run as the last operation of a real deploy, their verdict
table reaches the user, their report is written, and a failed check fails the deploy.

The lab has no GPU, so only the service and server suites can judge it; they need the engine's
stand-in server (roles/serving). Until that role runs in the lab, the service suite's finding is
"unit not installed" — which is exactly the failure path this test holds the hook to.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from tests.lab.harness import LAB_INVENTORY, PROJECT_ROOT, run_deploy

pytestmark = pytest.mark.lab

SERVING_ROLE = importlib.util.find_spec("roles.serving") is not None


def test_deploy_ends_with_the_health_checks(lab_first_deploy):
    before = set((PROJECT_ROOT / "reports").glob("health-*.json"))
    run = run_deploy(LAB_INVENTORY, "--data", 'health_after_deploy=["service"]')
    assert "inference-host health verdict" in run.stderr, run.explain()
    assert "Check health of @docker/" in run.stderr, run.explain()
    reports = set((PROJECT_ROOT / "reports").glob("health-*.json")) - before
    assert len(reports) == 1, f"expected one new JSON report under reports/, found {sorted(reports)}"
    report = json.loads(reports.pop().read_text())
    assert {c["suite"] for c in report["checks"]} == {"service"}
    if SERVING_ROLE:
        assert run.returncode == 0 and report["verdict"] == "healthy", run.explain()
        names = [op["name"] for op in run.results["operations"]]
        assert names[-1].startswith("Check health of @docker/"), names[-3:]  # the last step
    else:
        # Nothing serves in the lab yet: the deploy must fail, saying what and why.
        assert run.returncode != 0
        assert report["verdict"] == "unhealthy"
        assert "expected unit sglang.service installed" in run.stderr, run.explain()
        assert "health checks of @docker/" in run.stderr and "failed (exit 1)" in run.stderr


@pytest.mark.skipif(not SERVING_ROLE, reason="roles/serving (the engine and its stand-in server, "
                    "branch sglang-engine) is not merged: nothing serves in the lab yet")
def test_service_and_server_suites_pass_against_the_stand_in(lab_first_deploy):
    completed = subprocess.run(
        [sys.executable, "-m", "tests.infra", "--inventory", str(LAB_INVENTORY),
         "--suites", "service,server"], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stdout[-4000:] + completed.stderr[-2000:]
    assert "VERDICT: HEALTHY" in completed.stdout
