"""The SGLang stand-in's /metrics (--enable-metrics): the names, help texts, labels and buckets of
SGLang 0.5.9's srt/metrics/collector.py, rendered as prometheus_client renders them. A lab
stand-in, beside server.py on the lab's gpu node (not a package: server.py puts its folder first
on sys.path)."""

from __future__ import annotations

# srt/metrics/collector.py (0.5.9) TokenizerMetricsCollector's default buckets.
TTFT_BUCKETS = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400]
ITL_BUCKETS = [
    0.002,
    0.004,
    0.006,
    0.008,
    0.010,
    0.015,
    0.020,
    0.025,
    0.030,
    0.035,
    0.040,
    0.060,
    0.080,
    0.100,
    0.200,
    0.400,
    0.600,
    0.800,
    1.000,
    2.000,
    4.000,
    6.000,
    8.000,
]
E2E_BUCKETS = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200, 1800, 2400]


class Histogram:
    """prometheus_client's Histogram as it renders: cumulative _bucket{le=...}, +Inf, _sum, _count."""

    def __init__(self, buckets: list[float]):
        self.bounds, self.counts, self.sum, self.count = buckets, [0] * len(buckets), 0.0, 0

    def observe(self, value: float) -> None:
        self.sum, self.count = self.sum + value, self.count + 1
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += 1

    def lines(self, name: str, labels: str) -> list[str]:
        out = [f'{name}_bucket{{{labels},le="{float(b)}"}} {c}' for b, c in zip(self.bounds, self.counts, strict=True)]
        return out + [
            f'{name}_bucket{{{labels},le="+Inf"}} {self.count}',
            f"{name}_sum{{{labels}}} {self.sum}",
            f"{name}_count{{{labels}}} {self.count}",
        ]


class Metrics:
    """What --enable-metrics exports, by collector.py's names (the module docstring lists them)."""

    def __init__(self):
        self.prompt_tokens = 0
        self.ttft, self.itl, self.e2e = Histogram(TTFT_BUCKETS), Histogram(ITL_BUCKETS), Histogram(E2E_BUCKETS)
        self.last_throughput = 0.0

    def finished(self, prompt_tokens: int, tokens: int, began: float, first: float, end: float) -> None:
        self.prompt_tokens += prompt_tokens
        self.ttft.observe(first - began)
        self.e2e.observe(end - began)
        if tokens > 1:  # the tokenizer manager observes the interval per new token
            for _ in range(tokens - 1):
                self.itl.observe((end - first) / (tokens - 1))
            self.last_throughput = (tokens - 1) / max(end - first, 1e-6)

    def text(self, state) -> str:
        name = state.args.served_model_name or state.args.model_path
        sched = f'model_name="{name}",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"'
        tok = f'model_name="{name}"'
        gauges = [
            ("num_running_reqs", "The number of running requests.", state.scheduler.num_running_reqs),
            ("num_used_tokens", "The number of used tokens.", 0),
            ("token_usage", "The token usage.", 0.0),
            ("gen_throughput", "The generation throughput (token/s).", self.last_throughput if state.running else 0.0),
            ("num_queue_reqs", "The number of requests in the waiting queue.", state.scheduler.num_queue_reqs),
            ("cache_hit_rate", "The prefix cache hit rate.", 0.0),
            ("spec_accept_length", "The average acceptance length of speculative decoding.", state.last_accept_length),
            (
                "spec_accept_rate",
                "The average acceptance rate of speculative decoding"
                " (`accepted tokens / total draft tokens` in batch).",
                state.last_accept_rate,
            ),
        ]
        lines = []
        for short, doc, value in gauges:
            lines += [
                f"# HELP sglang:{short} {doc}",
                f"# TYPE sglang:{short} gauge",
                f"sglang:{short}{{{sched}}} {value}",
            ]
        for short, doc, value in (
            ("prompt_tokens", "Number of prefill tokens processed.", self.prompt_tokens),
            ("generation_tokens", "Number of generation tokens processed.", state.generated_tokens),
            ("num_requests", "Number of requests processed.", state.requests),
        ):
            lines += [
                f"# HELP sglang:{short}_total {doc}",
                f"# TYPE sglang:{short}_total counter",
                f"sglang:{short}_total{{{tok}}} {float(value)}",
            ]
        for short, doc, hist in (
            ("time_to_first_token_seconds", "Histogram of time to first token in seconds.", self.ttft),
            ("inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", self.itl),
            ("e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds", self.e2e),
        ):
            lines += [f"# HELP sglang:{short} {doc}", f"# TYPE sglang:{short} histogram"]
            lines += hist.lines(f"sglang:{short}", tok)
        return "\n".join(lines) + "\n"
