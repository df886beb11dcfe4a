"""Step 5, the A/B run: the drafter the export replaced (or speculative decoding off) against the
export, on the same workload (sglang.bench_serving), each served by the root helper through a
drop-in on the engine's unit (engine_control.py; the job names a verb, never a path), the deployed
engine restored afterwards whatever happened. Standard library only.
"""

from __future__ import annotations

import json
import time

try:
    from . import engine_control, jobspec
except ImportError:  # a script on the host: its folder is sys.path[0]
    import engine_control  # type: ignore[no-redef]
    import jobspec  # type: ignore[no-redef]

# Which helper verb serves which side (engine_helper.py computes the drafter from the root-owned
# config with jobspec.ab_drafters, as the job does here for its record).
VARIANTS = {"current": "baseline", "new": "candidate"}


def serve(cfg: dict, log: jobspec.Log, verb: str) -> None:
    engine_control.ask(log, verb)
    timeout = cfg["bench"]["restart_timeout_s"]
    if not engine_control.healthy_within(cfg, timeout):
        raise jobspec.StepError(f"{cfg['target']['unit']} did not answer /health within {timeout} s")


def bench(cfg: dict, log: jobspec.Log, label: str) -> list[dict]:
    key, b, target = engine_control.api_key(cfg), cfg["bench"], cfg["target"]
    results = []
    for concurrency in b["concurrency"]:
        out = jobspec.paths(cfg)["reports"] / f"bench-{label}-{concurrency}.jsonl"
        out.unlink(missing_ok=True)
        prompts = max(b["min_prompts"], concurrency * b["prompts_per_stream"])
        jobspec.run_command(
            log,
            [
                cfg["engine_python"],
                "-m",
                "sglang.bench_serving",
                "--backend",
                "sglang-oai-chat",
                "--base-url",
                f"http://{target['server']}",
                "--model",
                target["served_model_name"],
                "--tokenizer",
                target["model_path"],
                "--dataset-name",
                "random-ids",
                "--random-input-len",
                str(b["input_len"]),
                "--random-output-len",
                str(b["output_len"]),
                "--random-range-ratio",
                "1",
                "--num-prompts",
                str(prompts),
                "--max-concurrency",
                str(concurrency),
                "--output-file",
                str(out),
            ],
            env={"OPENAI_API_KEY": key} if key else None,
        )
        row = json.loads(out.read_text().splitlines()[-1])
        results.append(
            {
                "concurrency": concurrency,
                "output_throughput": row.get("output_throughput"),
                "accept_length": row.get("accept_length"),
            }
        )
    return results


def step_ab(cfg: dict, log: jobspec.Log) -> dict:
    jobspec.paths(cfg)["reports"].mkdir(parents=True, exist_ok=True)
    variants = jobspec.ab_drafters(cfg)
    results: dict[str, list[dict]] = {}
    record = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "variants": variants, "results": results}
    try:
        for label, drafter in variants.items():
            log(f"== {label}: {drafter or 'speculative decoding off'}")
            serve(cfg, log, VARIANTS[label])
            results[label] = bench(cfg, log, label)
    finally:
        engine_control.ask(log, "restore")
    for label, rows in results.items():
        for row in rows:
            log(
                f"{label:8} concurrency {row['concurrency']:>3}: {row['output_throughput']} tok/s,"
                f" accept length {row['accept_length']}"
            )
    with open(jobspec.paths(cfg)["reports"] / "ab-history.jsonl", "a") as history:
        history.write(json.dumps(record) + "\n")
    return record
