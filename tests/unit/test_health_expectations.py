"""Expectations of the health checks come from the site model (or validated overrides), and the
verdict table reads at a glance."""

from __future__ import annotations

import pytest

from checks.conftest import verdict_table
from checks.expectations import Expectations
from roles.site import SiteError, load_site

PROD = "inventory/prod.py"
NODE = "gpu-lxc.example.internal"


def test_from_the_production_inventory():
    expect = Expectations.from_site(load_site(PROD), NODE)
    assert expect.gpu_count == 8 and expect.compute_capability == "12.0"
    assert expect.gpu_model == "NVIDIA RTX PRO 6000 Blackwell Server Edition"
    assert expect.driver_version == load_site(PROD).stack.driver_version
    assert (expect.unit_name, expect.serving_host, expect.serving_port) == ("inference-engine", "0.0.0.0", 30000)
    assert expect.served_model_name == "kimi-k2.5" and expect.api_key_configured
    assert expect.nccl_env == {"NCCL_DEBUG": "WARN", "NCCL_P2P_LEVEL": "SYS", "NCCL_IB_DISABLE": "1"}
    assert expect.engine_python == "/opt/inference-host/current/bin/python"


def test_overrides_for_a_machine_in_no_inventory():
    expect = Expectations.from_overrides(
        [
            "gpu_count=2",
            "gpu_arch=sm90",
            "gpu_model=NVIDIA H200",
            "driver_version=580.159.04",
            "nccl_p2p_level=off",
            "health_allreduce_min_busbw_gbps=100",
        ]
    )
    assert (expect.gpu_count, expect.compute_capability, expect.gpu_model) == (2, "9.0", "NVIDIA H200")
    assert expect.driver_version == "580.159.04"
    assert expect.nccl_env["NCCL_P2P_DISABLE"] == "1" and "NCCL_P2P_LEVEL" not in expect.nccl_env
    assert expect.allreduce_min_busbw_gbps == 100.0


def test_overrides_on_top_of_an_inventory_host():
    expect = Expectations.from_site(load_site(PROD), NODE, ["gpu_count=4", "serving_port=31000"])
    assert (expect.gpu_count, expect.serving_port, expect.compute_capability) == (4, 31000, "12.0")


@pytest.mark.parametrize(
    "override, message",
    [
        ("gpu_cont=8", "unknown key gpu_cont = 8; did you mean gpu_count?"),
        ("gpu_arch=sm99", "gpu_arch = 'sm99' is invalid; expected one of 'sm80'"),
        ("health_allreduce_min_busbw_gbps=-1", "expected a number greater than 0"),
        ("gpu_count", "--expect 'gpu_count' is invalid; expected KEY=VALUE"),
    ],
)
def test_bad_overrides_name_key_value_and_what_is_valid(override, message):
    with pytest.raises(SiteError) as error:
        Expectations.from_overrides([override])
    assert message in str(error.value)


def test_unknown_inventory_host():
    with pytest.raises(SiteError, match="no host 'nope'; expected one of"):
        Expectations.from_site(load_site(PROD), "nope")


def test_verdict_table():
    rows = [
        {
            "suite": "gpu",
            "check": "gpu count",
            "gpu": None,
            "verdict": "FAIL",
            "detail": "expected 8 GPUs; found 2; what to do: check passthrough",
        },
        {"suite": "gpu", "check": "memory", "gpu": 0, "verdict": "PASS", "detail": "140.4 GiB"},
        *[
            {
                "suite": "gpu",
                "check": "memory",
                "gpu": i,
                "verdict": "SKIP",
                "detail": f"GPU{i} is missing (found 2): see the failed check 'gpu count'",
            }
            for i in range(2, 8)
        ],
        {
            "suite": "server",
            "check": "metrics exported",
            "gpu": None,
            "verdict": "SKIP",
            "detail": "serving_enable_metrics is off",
        },
    ]
    table = verdict_table(rows)
    lines = table.splitlines()
    assert lines[0].startswith("GPU") and "FAIL" in lines[0] and "(1 passed, 1 failed, 6 skipped)" in lines[0]
    assert "FAIL  gpu count" in lines[1] and "what to do" in lines[1]
    assert any("6 checks" in line and "GPU# is missing" in line for line in lines)  # collapsed
    assert any(line.startswith("SERVER") and "SKIP" in line for line in lines)
    assert lines[-1] == "VERDICT: UNHEALTHY (1 failed of 9 checks)"


def test_deploy_hook_runs_the_cli_with_the_deploys_inventory():
    from roles.health import check_command

    command = check_command("/x/inventory/prod.py", NODE, ["service", "server"], "reports/h.json")
    assert command[1:] == [
        "-m",
        "checks",
        "--inventory",
        "/x/inventory/prod.py",
        "--host",
        NODE,
        "--suites",
        "service,server",
        "--report",
        "reports/h.json",
        "--deadline-s=900",
    ]
