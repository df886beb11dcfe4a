"""Judging speculative decoding (EAGLE-3) on a running server: the accept length.

Where the figure comes from (SGLang 0.5.9 / 0.5.10 source):
- /metrics: the gauge `sglang:spec_accept_length` (srt/metrics/collector.py in 0.5.9,
  srt/observability/metrics_collector.py in 0.5.10; with --enable-metrics), set at every decode
  log interval to accepted tokens / verify forwards of that interval: the most recent figure;
- /server_info: `internal_states[0].avg_spec_accept_length`, accepted / forwards since the
  server started (srt/managers/scheduler.py get_internal_state) — what bench_serving prints as
  "Accept length" and writes as `accept_length` into its output file.
An accept length of 1.0 means no draft token is ever accepted: an EAGLE-3 drafter served with
algorithm EAGLE, or auxiliary layers off by one (a drafter trained on another engine's states).
The judges are pure and unit-tested; test_speculative.py asks the host.
"""

from __future__ import annotations

from checks import answer_parsers
from checks.probes import explain
from roles.shared import eagle3

# Enough decode steps for the gauge to be set (the default decode log interval is 40 steps).
WARMUP_REQUESTS = 4
WARMUP_MAX_TOKENS = 128
WARMUP_PROMPT = (
    "Explain in three short paragraphs how a bicycle's gears make climbing a hill easier,"
    " and why a cyclist shifts before the slope gets steep."
)


def metrics_accept_length(metrics_text: str) -> float | None:
    return eagle3.accept_length_from_metrics(answer_parsers.parse_prometheus(metrics_text))


def server_info_accept_length(server_info: dict) -> float | None:
    states = server_info.get("internal_states") or [{}]
    if "decode" in server_info:  # disaggregated: bench_serving reads the first decode server
        states = (server_info["decode"][0] or {}).get("internal_states") or [{}]
    value = states[0].get("avg_spec_accept_length")
    return float(value) if value is not None else None


def judge_accept_length(value: float | None, floor: float, source: str, num_steps: int) -> str | None:
    if value is None:
        return explain(
            f"an accept length from {source}",
            "none",
            "the server does not run speculative decoding: check the launcher's"
            " --speculative-* flags and `journalctl -u <unit>` for the drafter loading",
        )
    if value <= 1.0 + 1e-6:
        return explain(
            f"accept length >= {floor} (health_min_accept_length)",
            f"{value:.2f} from {source}",
            "no draft token is ever accepted: an EAGLE-3 drafter needs algorithm EAGLE3, and"
            " its eagle_aux_hidden_state_layer_ids must be in SGLang's convention (config ids,"
            " SGLang adds 1); a drafter trained on another engine's hidden states is"
            " retrained with SGLang-extracted states (the eagle3 training job)",
        )
    if value < floor:
        return explain(
            f"accept length >= {floor} (health_min_accept_length)",
            f"{value:.2f} from {source} (at most {num_steps + 1} with {num_steps} steps)",
            "speculation costs more than it saves at this level: compare with"
            " `python -m checks.bench --ab-spec`, retrain the drafter on this target's"
            " answers (the eagle3 training job) or turn speculative decoding off",
        )
    return None
