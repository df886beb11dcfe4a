"""Server suite: the engine's HTTP API (SGLang or vLLM, the active stack's) answers, names the
served model, generates ordinary text, refuses requests without the key, and exports metrics
under the engine's own names (sglang:* or vllm:*)."""

from __future__ import annotations

import pytest

from checks import server_checks
from checks.probes import evidence, report

pytestmark = pytest.mark.server


@pytest.fixture(autouse=True)
def _api_on_rank_0_only(request, expect):
    """A tensor-parallel node of rank >= 1 runs only sglang's dummy health server (/ping,
    /health, /health_generate; srt/utils/common.py launch_dummy_health_check_server, 0.5.9),
    which starts once its schedulers joined the group: only test_health_answers applies."""
    if expect.node_rank >= 1 and request.node.name != "test_health_answers":
        pytest.skip(f"node rank {expect.node_rank} of a tensor-parallel group serves no API (rank 0 does)")


def test_health_answers(host, expect, request):
    answer = server_checks.request(host, expect, "/health", with_key=False, timeout_s=expect.server_timeout_s + 1)
    problem = server_checks.judge_health(answer, expect.server_timeout_s)
    assert problem is None, problem
    report(
        request,
        f"200 in {answer.seconds:.2f} s"
        + (f" (rank {expect.node_rank}: its schedulers joined the group)" if expect.node_rank else ""),
    )


def test_models_lists_served_name(host, expect, request):
    problem = server_checks.judge_models(server_checks.request(host, expect, "/v1/models"), expect.served_model_name)
    assert problem is None, problem
    report(request, expect.served_model_name)


def test_chat_completion_not_degenerate(host, expect, request):
    body = {
        "model": expect.served_model_name,
        "temperature": 0,
        "max_tokens": server_checks.CHAT_MAX_TOKENS,
        "messages": [{"role": "user", "content": server_checks.CHAT_PROMPT}],
    }
    answer = server_checks.request(host, expect, "/v1/chat/completions", body, timeout_s=120)
    # The whole tiny request (a few tokens, temperature 0): the checks' own latency probe.
    evidence(request, "tiny_request_seconds", answer.seconds if answer.status == 200 else None)
    problem, text = server_checks.judge_chat(answer)
    assert problem is None, problem
    report(request, f"{answer.seconds:.1f} s: {text[:60]!r}")


def test_request_without_key_refused(host, expect, request):
    if not expect.api_key_configured:
        pytest.skip("no API key configured (serving_api_key_secret unset): nothing to refuse")
    problem = server_checks.judge_refused_without_key(server_checks.request(host, expect, "/v1/models", with_key=False))
    assert problem is None, problem
    report(request, "401 without the key")


def test_metrics_exported(host, expect, request):
    if not expect.metrics_exported:
        pytest.skip("serving_enable_metrics is off: no /metrics to check")
    problem, count = server_checks.judge_metrics(
        server_checks.request(host, expect, "/metrics", with_key=False), expect.engine
    )
    assert problem is None, problem
    report(request, f"{count} {expect.engine}:* series")
