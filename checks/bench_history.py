"""The benchmark's history (reports/bench-history.jsonl), the comparisons printed after a run,
and the reference figures (checks/reference.yml). Pure apart from files."""

from __future__ import annotations

import json
import time
from pathlib import Path

import yaml

from checks import answer_parsers

HERE = Path(__file__).resolve().parent
REFERENCE_FILE = HERE / "reference.yml"
DEFAULT_HISTORY = Path("reports") / "bench-history.jsonl"
METRICS = ("output_throughput", "mean_ttft_ms", "mean_itl_ms", "accept_length")
LOWER_IS_BETTER = {"mean_ttft_ms", "mean_itl_ms"}

# -- history, comparison, chart (pure apart from files) --------------------------------------------


def make_record(
    host_name: str,
    label: str,
    stack: str,
    workload: dict,
    results: list[answer_parsers.BenchResult],
    when: str | None = None,
    engine: str = "sglang",
    speculative: dict | None = None,
) -> dict:
    return {
        "time": when or time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": host_name,
        "engine": engine,
        "label": label,
        "stack": stack,
        "workload": workload,
        **({"speculative": speculative} if speculative else {}),
        "results": [
            {
                "concurrency": r.max_concurrency or 1,
                **{m: getattr(r, m) for m in METRICS},
                "median_ttft_ms": r.median_ttft_ms,
                "median_itl_ms": r.median_itl_ms,
                "request_throughput": r.request_throughput,
            }
            for r in results
        ],
    }


def read_history(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def append_history(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        handle.write(json.dumps(record) + "\n")


def previous_comparable(history: list[dict], record: dict) -> dict | None:
    for old in reversed(history):
        if old is record:
            continue
        # Records from before the engine field were SGLang's.
        if (old["host"], old.get("engine", "sglang"), old["label"], old["workload"]) == (
            record["host"],
            record.get("engine", "sglang"),
            record["label"],
            record["workload"],
        ):
            return old
    return None


def _change(new, old, metric) -> str:
    if new is None or old in (None, 0):
        return ""
    percent = (new - old) / old * 100
    better = percent < 0 if metric in LOWER_IS_BETTER else percent > 0
    return f"{percent:+.1f}%{'' if abs(percent) < 2 else (' better' if better else ' WORSE')}"


def _fmt(value, digits=1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def comparison_table(record: dict, previous: dict | None, reference: dict) -> str:
    """Per concurrency: this run, the previous comparable run and the change; then single stream
    against the reference figures recorded on the target."""
    lines = [
        f"Benchmark {record['time']}  {record['host']}  {record.get('engine', 'sglang')}"
        f" [{record['label']}]  stack {record['stack']}",
        f"workload: {record['workload']}",
        (
            f"{'conc':>4}  {'out tok/s':>10} {'prev':>9} {'change':>14}   {'TTFT ms':>9} {'prev':>9}"
            f"   {'ITL ms':>7} {'prev':>7}   {'accept':>6}"
        ),
    ]
    before = {r["concurrency"]: r for r in (previous or {}).get("results", [])}
    for row in record["results"]:
        old = before.get(row["concurrency"], {})
        lines.append(
            f"{row['concurrency']:>4}  {_fmt(row['output_throughput']):>10} {_fmt(old.get('output_throughput')):>9}"
            f" {_change(row['output_throughput'], old.get('output_throughput'), 'output_throughput'):>14}"
            f"   {_fmt(row['mean_ttft_ms']):>9} {_fmt(old.get('mean_ttft_ms')):>9}"
            f"   {_fmt(row['mean_itl_ms'], 2):>7} {_fmt(old.get('mean_itl_ms'), 2):>7}"
            f"   {_fmt(row['accept_length'], 2):>6}"
        )
    if previous is None:
        lines.append("(no previous comparable run in the history: this one is the baseline)")
    single = next((r for r in record["results"] if r["concurrency"] == 1), None)
    if single and single["output_throughput"]:
        lines.append(f"single stream vs {reference['source']}:")
        for name, figure in reference["single_stream_output_tok_s"].items():
            lines.append(
                f"  {name:55.55} {figure:7.1f} tok/s   this run {single['output_throughput'] / figure * 100:5.0f}%"
            )
    return "\n".join(lines)


def engines_table(history: list[dict], host_name: str | None = None) -> str:
    """The latest run of each engine per host and workload, side by side (vLLM vs SGLang on the
    same host and workload): what `--compare-engines` prints from the history."""
    latest: dict[tuple, dict[str, dict]] = {}
    for record in history:
        if host_name and record["host"] != host_name:
            continue
        key = (record["host"], json.dumps(record["workload"], sort_keys=True))
        latest.setdefault(key, {})[record.get("engine", "sglang")] = record
    lines = []
    for (host, workload), by_engine in latest.items():
        engines = sorted(by_engine)
        lines.append(f"{host}  workload {workload}")
        lines.append(f"{'conc':>4}  " + "  ".join(f"{e + ' tok/s':>14}" for e in engines))
        rows = {e: {r["concurrency"]: r for r in by_engine[e]["results"]} for e in engines}
        for concurrency in sorted({c for e in engines for c in rows[e]}):
            lines.append(
                f"{concurrency:>4}  "
                + "  ".join(f"{_fmt(rows[e].get(concurrency, {}).get('output_throughput')):>14}" for e in engines)
            )
        lines.append(
            "  runs: "
            + "; ".join(
                f"{e} {by_engine[e]['time']} [{by_engine[e]['label']}] {by_engine[e]['stack']}" for e in engines
            )
        )
    return "\n".join(lines) or "no runs in the history"


def ab_table(records: dict[str, dict]) -> str:
    labels = list(records)
    rows = {label: {r["concurrency"]: r for r in rec["results"]} for label, rec in records.items()}
    accept = any(r.get("accept_length") for rec in rows.values() for r in rec.values())
    lines = [
        f"A/B {' vs '.join(labels)} (same workload, same host)",
        f"{'conc':>4}  "
        + "  ".join(f"{label + ' tok/s':>16}" for label in labels)
        + f"  {'B vs A':>8}"
        + ("  " + "  ".join(f"{label + ' accept':>16}" for label in labels) if accept else ""),
    ]
    for concurrency in sorted(rows[labels[0]]):
        values = [rows[label].get(concurrency, {}).get("output_throughput") for label in labels]
        change = _change(values[1], values[0], "output_throughput") if len(values) > 1 else ""
        line = f"{concurrency:>4}  " + "  ".join(f"{_fmt(v):>16}" for v in values) + f"  {change:>8}"
        if accept:
            line += "  " + "  ".join(
                f"{_fmt(rows[label].get(concurrency, {}).get('accept_length'), 2):>16}" for label in labels
            )
        lines.append(line)
    return "\n".join(lines)


def load_reference() -> dict:
    return yaml.safe_load(REFERENCE_FILE.read_text())
