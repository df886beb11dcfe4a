"""The checks as metrics (checks/textfile.py): a real JSON report of 1 × H200 (2026-12-01) and a
failing one become the text exposition format that `promtool check metrics` accepts (the same
parser family node_exporter's textfile collector uses), written atomically."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from checks import textfile
from tests.unit.conftest import PROJECT_ROOT

REPORT = PROJECT_ROOT / "tests/unit/data/gpu/h200-1gpu-checks/report-pass.json"


def failing_report() -> dict:
    return {
        "seconds": 4.2,
        "checks": [
            {
                "suite": "service",
                "check": "unit active",
                "gpu": None,
                "verdict": "FAIL",
                "detail": (
                    'expected inference-engine.service active (running); found failed (exited), result "exit-code";\n'
                    "what to do: `journalctl -u inference-engine -n 200`"
                ),
                "seconds": 0.1,
                "evidence": [{"name": "unit_active", "value": 0.0, "labels": {}}],
            },
            {
                "suite": "gpu",
                "check": "temperature margin",
                "gpu": 3,
                "verdict": "PASS",
                "detail": "46 C",
                "seconds": 0.0,
                "evidence": [{"name": "gpu_temperature_margin_celsius", "value": 46.0, "labels": {"gpu": "3"}}],
            },
            {
                "suite": "gpu",
                "check": "ecc enabled no uncorrectable errors",
                "gpu": 3,
                "verdict": "FAIL",
                "detail": "x",
                "seconds": 0.0,
                "evidence": [
                    {"name": "gpu_ecc_uncorrectable_errors", "value": 2.0, "labels": {"gpu": "3", "scope": "volatile"}},
                    {
                        "name": "gpu_ecc_uncorrectable_errors",
                        "value": 0.0,
                        "labels": {"gpu": "3", "scope": "aggregate"},
                    },
                ],
            },
            {
                "suite": "gpu",
                "check": "no retired pages",
                "gpu": 3,
                "verdict": "SKIP",
                "detail": "no evidence",
                "seconds": 0.0,
            },
        ],
    }


def test_verdicts_evidence_and_the_run_become_gauges():
    text = textfile.exposition(failing_report(), now=1764633600.0)
    lines = text.splitlines()
    assert 'inference_host_check_ok{check="unit active",suite="service"} 0' in lines
    assert 'inference_host_check_ok{check="temperature margin",gpu="3",suite="gpu"} 1' in lines
    assert 'inference_host_check_skipped{check="no retired pages",gpu="3",suite="gpu"} 1' in lines
    assert not any(line.startswith('inference_host_check_ok{check="no retired pages"') for line in lines)
    assert 'inference_host_gpu_temperature_margin_celsius{gpu="3"} 46' in lines
    assert 'inference_host_gpu_ecc_uncorrectable_errors{gpu="3",scope="volatile"} 2' in lines
    assert "inference_host_checks_failed 2" in lines
    assert "inference_host_checks_last_run_timestamp_seconds 1764633600" in lines
    # the detail's quotes, backslash-free newlines and spaces survive as one escaped label value
    info = [line for line in lines if line.startswith("inference_host_check_failure_info{") and "unit active" in line]
    assert info == [
        'inference_host_check_failure_info{check="unit active",detail="expected inference-engine.service active'
        ' (running); found failed (exited), result \\"exit-code\\"; what to do: `journalctl -u inference-engine'
        ' -n 200`",suite="service"} 1'
    ]
    assert text.count("# TYPE inference_host_gpu_ecc_uncorrectable_errors gauge") == 1


def test_the_real_h200_report_converts():
    text = textfile.exposition(json.loads(REPORT.read_text()), now=0.0)
    assert 'inference_host_check_ok{check="gpu count",suite="gpu"} 1' in text
    assert "inference_host_checks_failed 0" in text


def test_a_label_value_with_backslash_and_newline_is_escaped():
    assert textfile.escape('a\\b"c\nd') == 'a\\\\b\\"c\\nd'


def test_bad_names_are_refused():
    with pytest.raises(ValueError, match="not a metric name"):
        textfile.Families().add("bad-name", {}, 1, "x")


@pytest.mark.parametrize("report", [failing_report(), json.loads(REPORT.read_text())], ids=["failing", "h200"])
def test_promtool_accepts_the_exposition(report):
    promtool = shutil.which("promtool")
    if promtool is None:
        if os.environ.get("INFERENCE_HOST_REQUIRE_LAB") == "1" or os.environ.get("CI") == "true":
            pytest.fail("promtool is not installed; CI needs it (apt-get install prometheus)")
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus)")
    result = subprocess.run(
        [promtool, "check", "metrics"],
        input=textfile.exposition(report, 1.0),
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_file_is_replaced_atomically(tmp_path):
    out = tmp_path / "inference_host_checks.prom"
    out.write_text("old\n")
    textfile.write_atomically(out, "new\n")
    assert out.read_text() == "new\n" and oct(out.stat().st_mode & 0o777) == "0o644"
    assert [p.name for p in tmp_path.iterdir()] == [out.name]  # no temporary left behind


def test_no_report_leaves_the_old_file(tmp_path, monkeypatch):
    out = tmp_path / "inference_host_checks.prom"
    out.write_text("old\n")
    expect = tmp_path / "expect.json"
    expect.write_text('{"gpu_count": 8}')
    import checks.__main__ as checks_main

    monkeypatch.setattr(checks_main, "main", lambda argv: 2)
    assert textfile.run(expect, "gpu", out) == 2
    assert out.read_text() == "old\n"


@pytest.mark.parametrize(
    "content, wrong, valid",
    [
        ("[1,2]", "a JSON list, not an object", "expected a JSON object"),  # seen on a real H200: a traceback
        ('{"gpu_count": 8', "not JSON (Expecting ',' delimiter: line 1 column 16", "expected a JSON object"),
        ('{"gpu_count": "eight"}', "gpu_count='eight' is invalid", "needs an integer >= 1"),
        ('{"gpu_count": 8, "serving_port": [1]}', "serving_port", "expected"),
    ],
)
def test_a_malformed_expectations_file_is_one_line_exit_2_and_the_old_metrics_stay(
    tmp_path, monkeypatch, capsys, content, wrong, valid
):
    """The timer's unit log says what is wrong with the file in one line; the old metrics stay
    (their timestamp ages into ChecksNotRunning) and the checks never run on half an input."""
    out, expect = tmp_path / "inference_host_checks.prom", tmp_path / "expect.json"
    out.write_text("old\n")
    expect.write_text(content)
    import checks.__main__ as checks_main

    monkeypatch.setattr(checks_main, "main", lambda argv: pytest.fail(f"the checks ran: {argv}"))
    assert textfile.main(["--expect-file", str(expect), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert str(expect) in err and wrong in err and valid in err, err
    assert out.read_text() == "old\n"


def test_a_missing_expectations_file_is_one_line_too(tmp_path, capsys):
    out = tmp_path / "inference_host_checks.prom"
    assert textfile.main(["--expect-file", str(tmp_path / "expect.json"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "expect.json: cannot be read (No such file or directory)" in err, err
    assert not out.exists()


def test_the_runner_passes_the_expectations_and_turns_the_probes_off(tmp_path, monkeypatch):
    out, expect = tmp_path / "checks.prom", tmp_path / "expect.json"
    expect.write_text(json.dumps({"gpu_count": 8, "serving_unit_name": "sglang", "engine": "vllm"}))
    seen = {}

    def fake_main(argv):
        seen["argv"] = argv
        Path(argv[argv.index("--report") + 1]).write_text(json.dumps(failing_report()))
        return 1

    import checks.__main__ as checks_main

    monkeypatch.setattr(checks_main, "main", fake_main)
    assert textfile.run(expect, "gpu,service,server", out) == 0
    assert seen["argv"][:4] == ["--hosts", "local://", "--suites", "gpu,service,server"]
    assert "--no-bandwidth-probes" in seen["argv"]
    assert "--expect=gpu_count=8" in seen["argv"] and "--expect=engine=vllm" in seen["argv"]
    assert '--expect=serving_unit_name="sglang"' in seen["argv"]
    assert "inference_host_checks_failed 2" in out.read_text()


def test_the_expectations_file_round_trips_through_expect(tmp_path):
    """Every kind of value the role writes reads back as the same setting (None, lists, dicts,
    strings that look like numbers)."""
    from checks.expectations import Expectations

    expect = tmp_path / "expect.json"
    expect.write_text(
        json.dumps(
            {
                "gpu_count": 2,
                "serving_served_model_name": "1.0",
                "health_power_limit_w": None,
                "health_after_deploy": ["gpu"],
                "serving_speculative": None,
                "nccl_p2p_level": "off",
                "driver_version": "580.95.05",
                "engine": "vllm",
            }
        )
    )
    values = [a.removeprefix("--expect=") for a in textfile.expect_arguments(expect)]
    found = Expectations.from_overrides(values)
    assert found.served_model_name == "1.0" and found.power_limit_w is None and found.gpu_count == 2
    assert found.nccl_env["NCCL_P2P_DISABLE"] == "1" and found.engine == "vllm"
    assert found.driver_version == "580.95.05"
