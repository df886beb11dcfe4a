"""The accept-length judges and the benchmark's speculative A/B, on recorded server output."""

from __future__ import annotations

from checks import bench
from checks import speculative_checks as spec
from tests.unit.conftest import PROJECT_ROOT

DATA = PROJECT_ROOT / "tests" / "unit" / "data" / "sglang"


def test_accept_length_is_read_from_metrics_and_server_info():
    assert spec.metrics_accept_length((DATA / "metrics-speculative.txt").read_text()) == 2.84
    assert spec.metrics_accept_length((DATA / "metrics.txt").read_text()) is None
    assert spec.server_info_accept_length({"internal_states": [{"avg_spec_accept_length": 3.1}]}) == 3.1
    assert spec.server_info_accept_length({"internal_states": [{}]}) is None
    assert spec.server_info_accept_length({"decode": [{"internal_states": [{"avg_spec_accept_length": 2.0}]}]}) == 2.0


def test_judge_accept_length():
    assert spec.judge_accept_length(2.84, 1.5, "m", 3) is None
    low = spec.judge_accept_length(1.3, 1.5, "sglang:spec_accept_length", 3)
    assert low.startswith("expected accept length >= 1.5") and "found 1.30" in low and "--ab-spec" in low
    never = spec.judge_accept_length(1.0, 1.5, "m", 3)
    assert "no draft token is ever accepted" in never and "SGLang adds 1" in never
    assert "does not run speculative decoding" in spec.judge_accept_length(None, 1.5, "m", 3)


def test_ab_table_shows_accept_length_when_present():
    def record(label, tok_s, accept):
        return {"label": label, "results": [{"concurrency": 1, "output_throughput": tok_s, "accept_length": accept}]}

    text = bench.ab_table({"spec-on": record("spec-on", 95.0, 2.8), "spec-off": record("spec-off", 90.0, None)})
    assert "spec-on accept" in text and "2.80" in text and "-5.3% WORSE" in text


def test_a_record_keeps_the_metrics_accept_length():
    record = bench.make_record("h", "spec-on", "s", {}, [], when="t", speculative={"metrics_accept_length": 2.8})
    assert record["speculative"] == {"metrics_accept_length": 2.8}
    assert "speculative" not in bench.make_record("h", "x", "s", {}, [], when="t")


def test_ab_variants_and_their_restore(monkeypatch):
    calls = []
    monkeypatch.setattr(bench, "set_speculative", lambda host, expect, on, timeout, path=None: calls.append((on, path)))
    monkeypatch.setattr(bench, "set_environment", lambda host, expect, value, timeout: calls.append(("env", value)))
    variants, switch = bench.ab_variants(bench._arguments(["--ab-drafter", "/models/new"]), None, None)
    assert list(variants) == ["drafter-current", "drafter-new"]
    for value in [*variants.values(), None]:
        switch(value)
    assert calls == [(True, None), (True, "/models/new"), (None, None)]  # None: back as deployed
    calls.clear()
    variants, switch = bench.ab_variants(bench._arguments(["--ab-spec-v2"]), None, None)
    switch(variants["spec-v2-on"])
    switch(None)
    assert calls == [("env", "SGLANG_ENABLE_SPEC_V2=1"), ("env", None)]
    variants, switch = bench.ab_variants(bench._arguments(["--ab-spec"]), None, None)
    assert variants == {"spec-on": True, "spec-off": False}
