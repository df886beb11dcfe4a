"""Speculative decoding suite (part of "server"): when serving_speculative is set, the drafter
is accepted often enough: accept length at or above health_min_accept_length, read from
/metrics (sglang:spec_accept_length) and from /server_info after a short warm-up."""

from __future__ import annotations

import pytest

from checks import server_checks
from checks import speculative_checks as spec
from checks.probes import evidence, report

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def warmed(host, expect):
    if not expect.speculative:
        pytest.skip("speculative decoding is off (serving_speculative unset): no accept length to judge")
    body = {
        "model": expect.served_model_name,
        "temperature": 0,
        "max_tokens": spec.WARMUP_MAX_TOKENS,
        "messages": [{"role": "user", "content": spec.WARMUP_PROMPT}],
    }
    for _ in range(spec.WARMUP_REQUESTS):
        answer = server_checks.request(host, expect, "/v1/chat/completions", body, timeout_s=300)
        assert answer.status == 200, f"warm-up chat completion failed: HTTP {answer.status} {answer.body[:200]}"
    return True


def test_accept_length_from_metrics(host, expect, request, warmed):
    if not expect.enable_metrics:
        pytest.skip("serving_enable_metrics is off: no sglang:spec_accept_length to read")
    answer = server_checks.request(host, expect, "/metrics", with_key=False)
    assert answer.status == 200, f"/metrics answered HTTP {answer.status}"
    value = spec.metrics_accept_length(answer.body)
    evidence(request, "accept_length", value)
    problem = spec.judge_accept_length(
        value, expect.min_accept_length, "sglang:spec_accept_length", expect.speculative_num_steps
    )
    assert problem is None, problem
    report(request, f"{value:.2f} (floor {expect.min_accept_length})")


def test_accept_length_since_start(host, expect, request, warmed):
    answer = server_checks.request(host, expect, "/server_info")
    assert answer.status == 200, f"/server_info answered HTTP {answer.status}"
    value = spec.server_info_accept_length(answer.json())
    problem = spec.judge_accept_length(
        value, expect.min_accept_length, "/server_info avg_spec_accept_length", expect.speculative_num_steps
    )
    assert problem is None, problem
    report(request, f"{value:.2f} since start (floor {expect.min_accept_length})")
