"""The monitors' files, rendered from a site model and judged by the real tools: `promtool check
config`, `promtool check rules`, `amtool check-config`, and `promtool test rules` with a firing
and a quiet case for every alert (Debian's prometheus and prometheus-alertmanager packages).

Without promtool these tests skip, except in CI (CI=true or INFERENCE_HOST_REQUIRE_LAB=1), where a
missing tool fails them: .ci/run installs it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from roles.monitoring import config, runbook
from roles.shared import xid_catalog
from roles.site import load_site
from tests.unit.conftest import (
    ADMIN,
    CLIENT_KEY,
    CONTROL,
    GATEWAY_PLAINTEXT,
    PROJECT_ROOT,
    ROLE_KEYS,
    SERVING_PLAINTEXT,
    gpu_node,
)


def speculative_ready(inventory) -> dict:
    """A drafter the site model accepts with or without the role checks (validation.py's compare
    it with the target at load): the real Kimi-K2.5 and EAGLE-3 configs, on the stack with the
    capture hook."""
    import shutil

    data = PROJECT_ROOT / "tests" / "unit" / "data" / "eagle3"
    shutil.copy(data / "kimi-k2.5-config.json", inventory.dir / "target.json")
    shutil.copy(data / "torchspec-kimi-k25-eagle3.json", inventory.dir / "drafter.json")
    inventory.edit_stack("active: sglang-0.5.9-cu128", "active: sglang-0.5.10-cu128")
    return {"draft_config": "drafter.json", "target_config": "target.json"}


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path:
        return path
    if os.environ.get("INFERENCE_HOST_REQUIRE_LAB") == "1" or os.environ.get("CI") == "true":
        pytest.fail(f"{name} is not installed; CI needs it (apt-get install prometheus prometheus-alertmanager)")
    pytest.skip(f"{name} is not installed (Debian: apt-get install prometheus prometheus-alertmanager)")


@pytest.fixture
def site(inventory):
    vault = inventory.vault(api_key=CLIENT_KEY, prom_pw="pw", **ROLE_KEYS)
    common = {"secrets_file": vault, "serving_api_key_secret": "api_key", **ADMIN, **SERVING_PLAINTEXT}
    path = inventory.groups(
        gpu_nodes=[
            gpu_node(
                "gpu1",
                ssh_hostname="10.0.0.11",
                serving_host="10.0.0.11",
                **common,
                serving_context_length=512,  # fits the KV cache with a drafter
                serving_speculative={"draft_model_path": "/models/drafter", **speculative_ready(inventory)},
            ),
            gpu_node(
                "gpu2",
                gpu_count=4,
                ssh_hostname="10.0.0.12",
                serving_host="10.0.0.12",
                health_min_temp_margin_c=15,
                health_max_unit_restarts=2,
                **common,
            ),
        ],
        gateways=[("gw", {"ssh_hostname": "10.0.0.2", "secrets_file": vault, **CONTROL, **GATEWAY_PLAINTEXT})],
        monitors=[
            (
                "gw",
                {
                    "monitoring_webhook_url": "http://127.0.0.1:9099/alerts",
                    "monitoring_web_password_secret": "prom_pw",
                    "monitoring_listen_address": "10.0.0.2",
                },
            )
        ],
    )
    return load_site(path)


@pytest.fixture
def rendered(site, tmp_path) -> Path:
    """The monitor's files under tmp_path, the rule file named relative to prometheus.yml."""
    files = config.files(site, site.hosts["gw"], "$2b$12$" + "a" * 53)
    for path, text in files.items():
        (tmp_path / Path(path).name).write_text(
            text.replace(config.RULES_FILE, Path(config.RULES_FILE).name).replace(config.PASSWORD_FILE, "password")
        )
    (tmp_path / "password").write_text("pw\n")
    return tmp_path


def run(*command, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False)


def test_scrape_jobs_come_from_the_inventory(site):
    jobs = {j["job_name"]: j["static_configs"] for j in config.scrape_jobs(site, site.hosts["gw"])}
    targets = {job: {(c["labels"]["host"], c["targets"][0]) for c in configs} for job, configs in jobs.items()}
    assert targets["node"] == {("gpu1", "10.0.0.11:9100"), ("gpu2", "10.0.0.12:9100"), ("gw", "127.0.0.1:9100")}
    assert targets["dcgm"] == {("gpu1", "10.0.0.11:9400"), ("gpu2", "10.0.0.12:9400")}
    assert targets["engine"] == {("gpu1", "10.0.0.11:30000"), ("gpu2", "10.0.0.12:30000")}
    assert targets["gateway"] == {("gw", "127.0.0.1:29000")}  # smg's --prometheus-host default


def test_promtool_and_amtool_accept_the_files(rendered):
    promtool, amtool = _tool("promtool"), _tool("amtool")
    checked = run(promtool, "check", "config", "prometheus.yml", cwd=rendered)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS" in checked.stdout + checked.stderr
    checked = run(promtool, "check", "web-config", "web.yml", cwd=rendered)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    checked = run(amtool, "check-config", "alertmanager.yml", cwd=rendered)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_thresholds_are_the_health_settings(site):
    rules = {a.name: a for a in config.alerts(site, site.hosts["gw"])}
    assert 'inference_host_gpu_temperature_margin_celsius{host=~"gpu1"} < 10' in rules["GpuTemperatureMargin"].expr
    assert 'inference_host_gpu_temperature_margin_celsius{host=~"gpu2"} < 15' in rules["GpuTemperatureMargin"].expr
    assert '{host=~"gpu1"} < 8' in rules["GpuMissing"].expr and '{host=~"gpu2"} < 4' in rules["GpuMissing"].expr
    assert "> 2" in rules["EngineRestartLooping"].expr and "> 0" in rules["EngineRestartLooping"].expr
    assert 'sglang:spec_accept_length{host=~"gpu1"} < 1.5' in rules["SpeculativeAcceptLengthLow"].expr
    assert "gpu2" not in rules["SpeculativeAcceptLengthLow"].expr  # no drafter there
    for alert in rules.values():
        assert "What to do" in alert.description or alert.name == "HealthCheckFailing", alert.name


XID_COUNT = "DCGM_EXP_XID_ERRORS_COUNT"
XID_LAST = 'DCGM_FI_DEV_XID_ERRORS{host="gpu1",gpu="3",pci_bus_id="00000000:61:00.0"}'

# Each alert: series that make it fire, series that keep it quiet (both over 40 minutes).
CASES: dict[str, dict] = {
    # Always fires, from the first evaluation on, whatever the series: it has no quiet case (the
    # beats stopping outside is its "quiet", proven in the lab).
    "Watchdog": {"fire": [], "quiet": None},
    "InferenceHostDown": {
        "fire": [('up{job="node",host="gpu1",instance="10.0.0.11:9100"}', "0x40")],
        "quiet": [('up{job="node",host="gpu1",instance="10.0.0.11:9100"}', "1x40")],
    },
    "EngineDown": {
        "fire": [('up{job="engine",host="gpu1",instance="10.0.0.11:30000"}', "0x40")],
        "quiet": [('up{job="engine",host="gpu1",instance="10.0.0.11:30000"}', "1x40")],
    },
    "GatewayDown": {
        "fire": [('up{job="gateway",host="gw",instance="127.0.0.1:29000"}', "0x40")],
        "quiet": [('up{job="gateway",host="gw",instance="127.0.0.1:29000"}', "1x40")],
    },
    "ChecksNotRunning": {
        # the last run's timestamp stays at 0 s while the clock moves on to 40 minutes
        "fire": [('inference_host_checks_last_run_timestamp_seconds{host="gpu1"}', "0x40")],
        "quiet": [('inference_host_checks_last_run_timestamp_seconds{host="gpu1"}', "0+60x40")],
    },
    "HealthCheckFailing": {
        "fire": [
            ('inference_host_check_ok{host="gpu1",suite="service",check="unit active"}', "0x40"),
            (
                'inference_host_check_failure_info{host="gpu1",suite="service",check="unit active",'
                'detail="expected inference-engine.service active; found failed"}',
                "1x40",
            ),
        ],
        "quiet": [('inference_host_check_ok{host="gpu1",suite="service",check="unit active"}', "1x40")],
        "description": "expected inference-engine.service active; found failed",
    },
    "GpuXidError": {
        "fire": [
            (
                XID_COUNT + '{host="gpu1",gpu="3",pci_bus_id="00000000:61:00.0",xid="79",window_size_in_ms="300000"}',
                "1x40",
            )
        ],
        # DCGM's last Xid stays at 79 for good; no Xid in the exporter's window: quiet
        "quiet": [
            (XID_LAST, "79x40"),
            (XID_COUNT + '{host="gpu1",gpu="3",pci_bus_id="00000000:61:00.0",window_size_in_ms="300000"}', "0x40"),
        ],
    },
    "GpuUncorrectableEcc": {
        "fire": [('inference_host_gpu_ecc_uncorrectable_errors{host="gpu1",gpu="2",scope="volatile"}', "1x40")],
        "quiet": [
            ('inference_host_gpu_ecc_uncorrectable_errors{host="gpu1",gpu="2",scope="volatile"}', "0x40"),
            ('DCGM_FI_DEV_ROW_REMAP_FAILURE{host="gpu1",gpu="2"}', "0x40"),
        ],
    },
    "GpuThrottling": {
        "fire": [('inference_host_gpu_clock_events_active{host="gpu1",gpu="0"}', "1x40")],
        "quiet": [('inference_host_gpu_clock_events_active{host="gpu1",gpu="0"}', "0x40")],
    },
    "GpuTemperatureMargin": {
        # 12 C is enough on gpu1 (floor 10) but not on gpu2 (floor 15)
        "fire": [('inference_host_gpu_temperature_margin_celsius{host="gpu2",gpu="1"}', "12x40")],
        "quiet": [('inference_host_gpu_temperature_margin_celsius{host="gpu1",gpu="1"}', "12x40")],
    },
    "GpuMissing": {
        "fire": [('inference_host_gpus_visible{host="gpu1"}', "7x40")],
        "quiet": [
            ('inference_host_gpus_visible{host="gpu1"}', "8x40"),
            ('inference_host_gpus_visible{host="gpu2"}', "4x40"),
        ],
    },
    "EngineRestartLooping": {
        "fire": [('inference_host_unit_restarts{host="gpu1"}', "0x20 1x20")],
        # gpu2 allows 2 restarts; gpu1's count drops to 0 at 20 min (the unit started by hand,
        # which resets systemd's NRestarts): no restart since
        "quiet": [
            ('inference_host_unit_restarts{host="gpu2"}', "0x20 2x20"),
            ('inference_host_unit_restarts{host="gpu1"}', "3x20 0x20"),
        ],
    },
    "SpeculativeAcceptLengthLow": {
        "fire": [('sglang:spec_accept_length{host="gpu1",model_name="kimi-k2.5"}', "1.1x40")],
        "quiet": [('sglang:spec_accept_length{host="gpu1",model_name="kimi-k2.5"}', "2.4x40")],
    },
    "TimeToFirstTokenHigh": {
        # every request in the slowest bucket (over 5 s) vs every request under 0.5 s
        "fire": [
            ('sglang:time_to_first_token_seconds_bucket{host="gpu1",le="0.5"}', "0x40"),
            ('sglang:time_to_first_token_seconds_bucket{host="gpu1",le="10"}', "0+10x40"),
            ('sglang:time_to_first_token_seconds_bucket{host="gpu1",le="+Inf"}', "0+10x40"),
        ],
        "quiet": [
            ('sglang:time_to_first_token_seconds_bucket{host="gpu1",le="0.5"}', "0+10x40"),
            ('sglang:time_to_first_token_seconds_bucket{host="gpu1",le="10"}', "0+10x40"),
            ('sglang:time_to_first_token_seconds_bucket{host="gpu1",le="+Inf"}', "0+10x40"),
        ],
    },
    "InterTokenLatencyHigh": {
        "fire": [
            ('sglang:inter_token_latency_seconds_bucket{host="gpu2",le="0.1"}', "0x40"),
            ('sglang:inter_token_latency_seconds_bucket{host="gpu2",le="1"}', "0+50x40"),
            ('sglang:inter_token_latency_seconds_bucket{host="gpu2",le="+Inf"}', "0+50x40"),
        ],
        "quiet": [
            ('sglang:inter_token_latency_seconds_bucket{host="gpu2",le="0.1"}', "0+50x40"),
            ('sglang:inter_token_latency_seconds_bucket{host="gpu2",le="1"}', "0+50x40"),
            ('sglang:inter_token_latency_seconds_bucket{host="gpu2",le="+Inf"}', "0+50x40"),
        ],
    },
    "WeightsManifestMismatch": {
        "fire": [
            ('inference_host_check_ok{host="gpu1",suite="service",check="weights manifest matches the pin"}', "0x40")
        ],
        "quiet": [
            ('inference_host_check_ok{host="gpu1",suite="service",check="weights manifest matches the pin"}', "1x40")
        ],
    },
    "DiskFilling": {
        "fire": [
            ('node_filesystem_avail_bytes{host="gpu1",mountpoint="/models",fstype="ext4"}', "5x40"),
            ('node_filesystem_size_bytes{host="gpu1",mountpoint="/models",fstype="ext4"}', "100x40"),
        ],
        # 5% free on a disk that holds neither weights nor Prometheus' data
        "quiet": [
            ('node_filesystem_avail_bytes{host="gpu1",mountpoint="/scratch",fstype="ext4"}', "5x40"),
            ('node_filesystem_size_bytes{host="gpu1",mountpoint="/scratch",fstype="ext4"}', "100x40"),
            ('node_filesystem_avail_bytes{host="gw",mountpoint="/var",fstype="ext4"}', "50x40"),
            ('node_filesystem_size_bytes{host="gw",mountpoint="/var",fstype="ext4"}', "100x40"),
        ],
    },
}


def _rule_test(alert: str, series: list[tuple[str, str]], firing: bool, case: dict) -> dict:
    """One promtool test: the alert's state at 40 minutes (after every `for:`)."""
    expected = []
    if firing:
        want: dict = {}
        if "description" in case:
            want = {"exp_annotations_contain": case["description"]}
        expected = [want]
    return {
        "interval": "1m",
        "input_series": [{"series": s, "values": v} for s, v in series],
        "alert_rule_test": [{"eval_time": "40m", "alertname": alert, "exp_alerts": expected}],
    }


def test_every_alert_has_a_firing_and_a_quiet_case(site):
    assert sorted(CASES) == config.alert_names(site, site.hosts["gw"])


def test_promtool_unit_tests_of_every_alert(rendered, site):
    promtool = _tool("promtool")
    tests = []
    for alert, case in CASES.items():
        tests.append(_rule_test(alert, case["fire"], True, case))
        if case["quiet"] is not None:
            tests.append(_rule_test(alert, case["quiet"], False, case))
    annotations = {}
    for test in tests:
        for check in test["alert_rule_test"]:
            if check["exp_alerts"] and "exp_annotations_contain" in check["exp_alerts"][0]:
                annotations[check["alertname"]] = check["exp_alerts"][0].pop("exp_annotations_contain")
    # promtool compares labels and annotations exactly: fill them from the rendered rules, with
    # the firing series' own labels, so the test states the whole alert.
    rules = {
        r["alert"]: r for r in yaml.safe_load((rendered / "inference-host.rules.yml").read_text())["groups"][0]["rules"]
    }
    for test in tests:
        check = test["alert_rule_test"][0]
        if not check["exp_alerts"]:
            continue
        check["exp_alerts"] = EXPECTED[check["alertname"]](rules[check["alertname"]])
        if check["alertname"] in annotations:
            assert annotations[check["alertname"]] in check["exp_alerts"][0]["exp_annotations"]["description"]
    (rendered / "tests.yml").write_text(
        yaml.safe_dump(
            {"rule_files": ["inference-host.rules.yml"], "evaluation_interval": "1m", "tests": tests}, sort_keys=False
        )
    )
    result = run(promtool, "test", "rules", "tests.yml", cwd=rendered)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout + result.stderr


def _alert(labels: dict, summary: str, description: str) -> list[dict]:
    return [{"exp_labels": labels, "exp_annotations": {"summary": summary, "description": description}}]


def _expand(rule: dict, labels: dict, value: str) -> tuple[str, str]:
    """The annotation text as Prometheus expands it for these labels and value (the templates
    here use only $labels.x, $value, and `with ... query`, whose result the caller gives)."""
    out = []
    for key in ("summary", "description"):
        text = rule["annotations"][key]
        for name, val in labels.items():
            text = text.replace(f"{{{{ $labels.{name} }}}}", val)
        text = text.replace("{{ $value }}", value)
        out.append(text)
    return out[0], out[1]


def _simple(labels: dict, value: str):
    def expected(rule):
        summary, description = _expand(rule, labels, value)
        return _alert({**labels, "severity": rule["labels"]["severity"]}, summary, description)

    return expected


def _check_failing(rule):
    labels = {"host": "gpu1", "suite": "service", "check": "unit active"}
    summary = "Health check 'unit active' (service) fails on gpu1"
    return _alert({**labels, "severity": "warning"}, summary, "expected inference-engine.service active; found failed")


def _latency(host: str, value: str):
    def expected(rule):
        labels = {"host": host}
        summary = (
            rule["annotations"]["summary"]
            .replace("{{ $labels.host }}", host)
            .replace("{{ $value | humanizeDuration }}", value)
        )
        return _alert({**labels, "severity": "warning"}, summary, rule["annotations"]["description"])

    return expected


def _disk(rule):
    labels = {"host": "gpu1", "mountpoint": "/models", "fstype": "ext4"}
    summary = "/models on gpu1 has 5% free"
    return _alert({**labels, "severity": "warning"}, summary, rule["annotations"]["description"])


EXPECTED = {
    "Watchdog": _simple({}, "1"),
    "InferenceHostDown": _simple({"job": "node", "host": "gpu1", "instance": "10.0.0.11:9100"}, "0"),
    "EngineDown": _simple({"job": "engine", "host": "gpu1", "instance": "10.0.0.11:30000"}, "0"),
    "GatewayDown": _simple({"job": "gateway", "host": "gw", "instance": "127.0.0.1:29000"}, "0"),
    "ChecksNotRunning": _simple({"host": "gpu1"}, "2400"),
    "HealthCheckFailing": _check_failing,
    "GpuXidError": lambda rule: _xid_alert(rule, "79", "1"),
    "GpuUncorrectableEcc": _simple({"host": "gpu1", "gpu": "2", "scope": "volatile"}, "1"),
    "GpuThrottling": _simple({"host": "gpu1", "gpu": "0"}, "1"),
    "GpuTemperatureMargin": _simple({"host": "gpu2", "gpu": "1"}, "12"),
    "GpuMissing": _simple({"host": "gpu1"}, "7"),
    "EngineRestartLooping": _simple({"host": "gpu1"}, "1"),
    "SpeculativeAcceptLengthLow": _simple({"host": "gpu1", "model_name": "kimi-k2.5"}, "1.1"),
    # histogram_quantile interpolates inside the bucket holding the 95th percentile:
    # 0.5 + (10 - 0.5) * 0.95 = 9.525 s, and 0.1 + (1 - 0.1) * 0.95 = 0.955 s.
    "TimeToFirstTokenHigh": _latency("gpu1", "9.525s"),
    "InterTokenLatencyHigh": _latency("gpu2", "955ms"),
    "WeightsManifestMismatch": _simple(
        {"host": "gpu1", "suite": "service", "check": "weights manifest matches the pin"}, "0"
    ),
    "DiskFilling": _disk,
}


# --- GpuXidError: a NEW Xid pages, the last one does not ----------------------------------------
# What NVIDIA's dcgm-exporter 4.8.2 serves (tag 4.5.3-4.8.2): DCGM_FI_DEV_XID_ERRORS is "Value of the last
# XID error encountered" (etc/default-counters.csv) and keeps it until the exporter restarts (dcgm-exporter
# issue #500); DCGM_EXP_XID_ERRORS_COUNT counts the window's Xids per code, labels xid and
# window_size_in_ms, and is one 0 series without xid when the window had none (expcollector.go).
XID_LABELS = {"host": "gpu1", "gpu": "3", "pci_bus_id": "00000000:61:00.0"}


def _series(name: str, **extra) -> str:
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in {**XID_LABELS, **extra}.items()) + "}"


def _branch(phrase: str) -> str:
    """The one branch of the rule's graded advice that starts with `phrase`."""
    import re

    branches = re.split(r"\{\{[^}]*\}\}", config.XID_ADVICE)
    found = [b for b in branches if b.startswith(phrase)]
    assert len(found) == 1, (phrase, branches)
    return found[0]


ADVICE = {
    "13": "NVIDIA's Xid catalog says RESTART_APP",
    "31": "NVIDIA's Xid catalog says RESTART_APP",
    "48": "NVIDIA's Xid catalog says WORKFLOW_XID_48",
    "94": "NVIDIA's Xid catalog says RESTART_APP",
    "79": "NVIDIA's Xid catalog says RESTART_BM",
    "154": "NVIDIA's Xid catalog says XID_154",
    "62": "NVIDIA's Xid catalog says RESET_GPU",
    "95": "NVIDIA's Xid catalog says RESET_GPU",
    "140": "NVIDIA's Xid catalog says RESET_GPU",
    "999": "not in this project's copy of the catalog",
}


def _xid_alert(rule: dict, xid: str, value: str, window_ms: str = "300000") -> list[dict]:
    labels = {**XID_LABELS, "xid": xid, "window_size_in_ms": window_ms}
    description = rule["annotations"]["description"].replace(config.XID_ADVICE, _branch(ADVICE[xid]))
    summary, description = _expand(
        {"annotations": {"summary": rule["annotations"]["summary"], "description": description}}, labels, value
    )
    return _alert({**labels, "severity": xid_catalog.severity(int(xid))}, summary, description)


# Minutes 0-9 nothing; an Xid 79 at 10 (counted through 14, then the series goes, as the exporter's
# does when the window empties); another at 31 and a second of the same code at 33. The gauge of the
# last Xid stays at 79 from minute 10 on.
XID_TIMELINE = [
    (XID_LAST, "0x9 79x40"),
    (_series(XID_COUNT, window_size_in_ms="300000"), "0x9 _x6 0x14 _x6 0x14"),
    (_series(XID_COUNT, xid="79", window_size_in_ms="300000"), "_x10 1x4 stale _x15 1x1 2x2 stale"),
]


def _timeline_test(rules_file: str, expected: dict[int, list]) -> dict:
    return {
        "rule_files": [rules_file],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": s, "values": v} for s, v in XID_TIMELINE],
                "alert_rule_test": [
                    {"eval_time": f"{minute}m", "alertname": "GpuXidError", "exp_alerts": alerts}
                    for minute, alerts in expected.items()
                ],
            }
        ],
    }


def _xid_rule(rendered: Path) -> dict:
    rules = yaml.safe_load((rendered / "inference-host.rules.yml").read_text())["groups"][0]["rules"]
    return next(r for r in rules if r["alert"] == "GpuXidError")


def test_a_new_xid_fires_once_resolves_after_the_window_and_fires_again(rendered):
    promtool = _tool("promtool")
    rule = _xid_rule(rendered)
    expected = {
        5: [],
        12: _xid_alert(rule, "79", "1"),
        20: [],  # the window passed: resolved, while DCGM_FI_DEV_XID_ERRORS still reads 79
        32: _xid_alert(rule, "79", "1"),  # a new Xid of the same code pages again
        34: _xid_alert(rule, "79", "2"),  # ... and a second one in the window is counted
        45: [],
    }
    (rendered / "xid.yml").write_text(
        yaml.safe_dump(_timeline_test("inference-host.rules.yml", expected), sort_keys=False)
    )
    result = run(promtool, "test", "rules", "xid.yml", cwd=rendered)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_old_last_xid_rule_never_resolves(rendered):
    """Planted once: the rule we had (DCGM_FI_DEV_XID_ERRORS > 0) against what DCGM really serves
    stays firing after the window, so promtool refuses the expectation the new rule meets."""
    promtool = _tool("promtool")
    (rendered / "old.rules.yml").write_text(
        yaml.safe_dump(
            {"groups": [{"name": "old", "rules": [{"alert": "GpuXidError", "expr": "DCGM_FI_DEV_XID_ERRORS > 0"}]}]}
        )
    )
    (rendered / "old.yml").write_text(yaml.safe_dump(_timeline_test("old.rules.yml", {20: []}), sort_keys=False))
    result = run(promtool, "test", "rules", "old.yml", cwd=rendered)
    assert result.returncode != 0 and "GpuXidError" in result.stdout + result.stderr, result.stdout


@pytest.mark.parametrize("xid", sorted(ADVICE))
def test_the_xid_advice_is_graded_by_the_catalogs_action(rendered, xid):
    promtool = _tool("promtool")
    rule = _xid_rule(rendered)
    series = _series(XID_COUNT, xid=xid, window_size_in_ms="300000")
    test = {
        "rule_files": ["inference-host.rules.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": series, "values": "1x5"}],
                "alert_rule_test": [
                    {"eval_time": "2m", "alertname": "GpuXidError", "exp_alerts": _xid_alert(rule, xid, "1")}
                ],
            }
        ],
    }
    (rendered / "grade.yml").write_text(yaml.safe_dump(test, sort_keys=False))
    result = run(promtool, "test", "rules", "grade.yml", cwd=rendered)
    assert result.returncode == 0, result.stdout + result.stderr
    reset = "nvidia-smi -r" in _xid_alert(rule, xid, "1")[0]["exp_annotations"]["description"]
    assert reset == (xid in ("62", "95", "140")), xid  # the catalog's RESET_GPU codes only
    paged = _xid_alert(rule, xid, "1")[0]["exp_labels"]["severity"] == "critical"
    assert paged == (xid not in ("13", "31", "94", "154")), xid  # RESTART_APP and XID_154: warnings


@pytest.mark.parametrize("xid", ["43", "63", "92"])
def test_an_xid_the_catalog_says_to_ignore_raises_no_alert(rendered, xid):
    """43, 63 and 92 are IGNORE in NVIDIA's catalog; they paged as critical."""
    promtool = _tool("promtool")
    test = {
        "rule_files": ["inference-host.rules.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": _series(XID_COUNT, xid=xid, window_size_in_ms="300000"), "values": "1x5"}],
                "alert_rule_test": [{"eval_time": "2m", "alertname": "GpuXidError", "exp_alerts": []}],
            }
        ],
    }
    (rendered / "ignored.yml").write_text(yaml.safe_dump(test, sort_keys=False))
    result = run(promtool, "test", "rules", "ignored.yml", cwd=rendered)
    assert result.returncode == 0, result.stdout + result.stderr


def test_amtool_asks_alertmanager_through_the_basic_auth_with_no_password_on_its_command_line(site, rendered):
    """`amtool alert query` with only the monitor's /etc/prometheus/amtool.yml (here under $HOME,
    Debian's amtool's other location): the real amtool reaches an Alertmanager API stand-in that answers 401 without
    the web user's password, which comes from the password file the HTTP client file names."""
    import base64
    import http.server
    import json
    import threading

    amtool = _tool("amtool")
    expected = "Basic " + base64.b64encode(b"inference-host:pw").decode()
    alert = {
        "labels": {"alertname": "HealthCheckFailing", "host": "gpu1", "check": "cuda works"},
        "annotations": {"summary": "s"},
        "startsAt": "2026-12-04T00:00:00Z",
        "endsAt": "2026-12-04T01:00:00Z",
        "updatedAt": "2026-12-04T00:00:00Z",
        "fingerprint": "0123456789abcdef",
        "receivers": [{"name": "r"}],
        "status": {"state": "active", "silencedBy": [], "inhibitedBy": []},
        "generatorURL": "http://x/graph",
    }
    seen = []

    class AlertmanagerApi(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append((self.path, self.headers.get("Authorization") == expected))
            if self.headers.get("Authorization") != expected:
                self.send_response(401)
                self.end_headers()
                return
            body = json.dumps([alert] if self.path.startswith("/api/v2/alerts") else {}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), AlertmanagerApi)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        files = config.amtool_configs(site.hosts["gw"])
        assert "pw" not in "".join(files.values()).replace("password_file", "")
        assert yaml.safe_load(files[config.AMTOOL_CONFIG])["alertmanager.url"] == "http://10.0.0.2:9093"
        home, client = rendered / "home", rendered / "amtool-http.yml"
        client.write_text(files[config.AMTOOL_HTTP_CONFIG].replace(config.PASSWORD_FILE, str(rendered / "password")))
        (home / ".config" / "prometheus").mkdir(parents=True)
        (home / ".config" / "prometheus" / "amtool.yml").write_text(
            files[config.AMTOOL_CONFIG]
            .replace("http://10.0.0.2:9093", f"http://127.0.0.1:{server.server_port}")
            .replace(config.AMTOOL_HTTP_CONFIG, str(client))
        )
        done = subprocess.run(
            [amtool, "alert", "query", "-o", "json"],
            capture_output=True,
            text=True,
            env={"HOME": str(home), "PATH": os.environ.get("PATH", "")},
            timeout=30,
        )
    finally:
        server.shutdown()
    assert done.returncode == 0, done.stdout + done.stderr
    assert [a["labels"]["check"] for a in json.loads(done.stdout)] == ["cuda works"]
    assert any(path.startswith("/api/v2/alerts") and authorized for path, authorized in seen), seen


# The alerts' prose lives in roles/monitoring/runbook.py: every alert the rules can raise has its
# summary and description there, no text is left over for an alert that no longer exists, and no
# `${field}` of ours reaches Prometheus unfilled (it would be printed to the person paged).
def test_every_alert_has_its_runbook_text_and_every_text_its_alert(site):
    emitted = {a.name for monitor in site.group("monitors") for a in config.alerts(site, monitor)}
    assert "SpeculativeAcceptLengthLow" in emitted and "DiskFilling" in emitted  # the fixture has them all
    assert emitted == set(runbook.RUNBOOK)


def test_no_field_of_ours_is_left_in_the_rules(site):
    for monitor in site.group("monitors"):
        assert "${" not in config.rules_config(site, monitor)


def test_a_field_the_rule_does_not_pass_is_an_error():
    with pytest.raises(KeyError, match="runbook text of EngineDown needs engine"):
        runbook.text("EngineDown")
    assert (
        runbook.text("EngineDown", engine="vllm")[0] == "The vllm server on {{ $labels.host }} does not answer /metrics"
    )
