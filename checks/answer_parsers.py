"""Pure parsers of what the engine answers: its OpenAI-compatible JSON, its Prometheus text, and
the benchmark client's output file. No I/O here; checks/server_checks.py, checks/speculative_checks.py
and the benchmark (checks/bench_*.py) read through them, and tests/unit holds each to real output.
(Split from checks/gpu_parsers.py by concern: that module parses the GPU tools.)
"""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass, field

# ----------------------------------------------------------------------------------------------
# Server: OpenAI-compatible responses and Prometheus text


def model_ids(models_json: dict) -> list[str]:
    """Returns the ids listed by /v1/models ({"object": "list", "data": [{"id": ...}]})."""
    return [entry.get("id", "") for entry in models_json.get("data", [])]


def completion_text(chat_json: dict) -> str:
    """Returns the assistant text of a /v1/chat/completions response."""
    choices = chat_json.get("choices") or []
    if not choices:
        raise ValueError(f"the completion has no choices; the engine answered: {engine_error(chat_json)}")
    message = choices[0].get("message") or {}
    return message.get("content") or ""


def engine_error(body: dict, limit: int = 600) -> str:
    """Returns the engine's own error from a response body, or the body itself (cut to limit).
    An engine may answer HTTP 200 with an error body: vllm 0.16.0's OpenAI server does when the
    engine core dies during a request (entrypoints/openai/engine/protocol.py ErrorResponse:
    {"error": {"message", "type", "param", "code"}}); SGLang 0.5.x writes
    {"object": "error", "message", "type", "code"} (entrypoints/openai/protocol.py ErrorResponse)."""
    found = body.get("error") if isinstance(body.get("error"), dict) else body
    error = found if isinstance(found, dict) else {}
    message = error.get("message")
    if message:
        kind = ", ".join(str(error[k]) for k in ("type", "code") if error.get(k) not in (None, ""))
        text = f"{message} ({kind})" if kind else str(message)
    else:
        text = json.dumps(body, separators=(",", ":"))
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def degenerate_reason(text: str, max_run: int = 8, min_distinct_ratio: float = 0.2) -> str | None:
    """Returns why generated text looks degenerate (a token repeated in a long run, or very few
    distinct tokens), or None when it looks like language. Tokens are whitespace words, and
    characters for text without spaces, so "!!!!!!!!" is caught too."""
    stripped = text.strip()
    if not stripped:
        return "the text is empty"
    tokens = stripped.split()
    if len(tokens) < 3:
        tokens = list(stripped)
    run, longest, longest_token = 1, 1, tokens[0]
    for previous, token in itertools.pairwise(tokens):
        run = run + 1 if token == previous else 1
        if run > longest:
            longest, longest_token = run, token
    if longest >= max_run:
        return f"{longest_token!r} repeated {longest} times in a row"
    if len(tokens) >= 20 and len(set(tokens)) / len(tokens) < min_distinct_ratio:
        return f"only {len(set(tokens))} distinct tokens out of {len(tokens)}"
    return None


PROMETHEUS_LINE_RE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?P<labels>\{[^}]*\})?\s+(?P<value>\S+)")


def parse_prometheus(text: str) -> dict[str, float]:
    """Returns {metric name with labels: value} of the Prometheus text format (comments skipped)."""
    metrics = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        match = PROMETHEUS_LINE_RE.match(line)
        if match:
            try:
                metrics[match.group("name") + (match.group("labels") or "")] = float(match.group("value"))
            except ValueError:
                continue
    return metrics


# ----------------------------------------------------------------------------------------------
# Benchmark: sglang.bench_serving --output-file (one JSON object per run)


@dataclass(frozen=True)
class BenchResult:
    max_concurrency: int | None
    completed: int | None
    output_throughput: float | None  # output tok/s
    request_throughput: float | None
    mean_ttft_ms: float | None
    median_ttft_ms: float | None
    mean_itl_ms: float | None
    median_itl_ms: float | None
    mean_tpot_ms: float | None
    accept_length: float | None
    extra: dict = field(default_factory=dict, compare=False)


def _leading_int(value) -> int | None:
    """The integer a value starts with ("8", 8, "8 (auto)"), None when it has none."""
    match = None if value is None else re.match(r"^-?\d+", str(value))
    return int(match.group(0)) if match else None


def _float(value) -> float | None:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


def parse_bench_serving_jsonl(text: str) -> list[BenchResult]:
    """Returns one BenchResult per line of bench_serving's --output-file (it appends a line per run)."""
    results = []
    for line in text.splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        results.append(
            BenchResult(
                max_concurrency=_leading_int(row.get("max_concurrency")),
                completed=row.get("completed"),
                output_throughput=_float(row.get("output_throughput")),
                request_throughput=_float(row.get("request_throughput")),
                mean_ttft_ms=_float(row.get("mean_ttft_ms")),
                median_ttft_ms=_float(row.get("median_ttft_ms")),
                mean_itl_ms=_float(row.get("mean_itl_ms")),
                median_itl_ms=_float(row.get("median_itl_ms")),
                mean_tpot_ms=_float(row.get("mean_tpot_ms")),
                accept_length=_float(row.get("accept_length")),
                extra={
                    k: row[k]
                    for k in ("backend", "dataset_name", "random_input_len", "random_output_len", "duration")
                    if k in row
                },
            )
        )
    return results
