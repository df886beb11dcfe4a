"""checks/bench.py: bench_serving's output -> history -> comparison -> chart."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from checks import answer_parsers, bench

DATA = Path(__file__).parent / "data" / "sglang" / "bench-serving-output.jsonl"
WORKLOAD = {
    "dataset": "random-ids",
    "input_len": 1024,
    "output_len": 512,
    "concurrency": [1, 16],
    "prompts_per_stream": 4,
}


def _results(scale: float = 1.0):
    results = answer_parsers.parse_bench_serving_jsonl(DATA.read_text())
    return [r.__class__(**{**r.__dict__, "output_throughput": r.output_throughput * scale}) for r in results]


def test_parse_bench_serving_output():
    results = answer_parsers.parse_bench_serving_jsonl(DATA.read_text())
    assert [r.max_concurrency for r in results] == [1, 16]
    assert results[0].output_throughput == 90.4 and results[0].mean_ttft_ms == 310.5
    assert results[0].accept_length is None  # no speculative decoding: null, not 0


def test_command_uses_random_ids_offline_and_the_sweep_concurrency():
    command = bench.bench_command(
        "/opt/inference-host/venv/bin/python",
        "http://127.0.0.1:30000",
        "kimi-k2.5",
        "/models/Kimi-K2.5",
        1024,
        512,
        64,
        16,
        "/tmp/out.jsonl",
    )
    text = " ".join(command)
    assert "-m sglang.bench_serving --backend sglang-oai-chat" in text
    assert "--dataset-name random-ids" in text and "--random-range-ratio 1" in text
    assert "--max-concurrency 16" in text and "--num-prompts 64" in text


def test_history_append_and_compare(tmp_path):
    history_file = tmp_path / "history.jsonl"
    first = bench.make_record("gpu1", "default", "sglang-0.5.9-cu128", WORKLOAD, _results(), "2026-11-01T10:00")
    bench.append_history(history_file, first)
    second = bench.make_record("gpu1", "default", "sglang-0.5.23-cu130", WORKLOAD, _results(0.8), "2026-11-29T10:00")
    history = bench.read_history(history_file)
    assert bench.previous_comparable(history, second) == first
    other_workload = dict(second, workload={**WORKLOAD, "input_len": 2048})
    assert bench.previous_comparable(history, other_workload) is None
    table = bench.comparison_table(second, first, bench.load_reference())
    assert "-20.0% WORSE" in table  # 90.4 -> 72.3 tok/s
    assert "SGLang, tuned NCCL env + settings" in table and "80%" in table  # 72.3 of 90
    baseline = bench.comparison_table(first, None, bench.load_reference())
    assert "this one is the baseline" in baseline


def test_ab_table():
    on = bench.make_record("gpu1", "p2p-on", "s", WORKLOAD, _results())
    off = bench.make_record("gpu1", "p2p-off", "s", WORKLOAD, _results(1.1))
    table = bench.ab_table({"p2p-on": on, "p2p-off": off})
    assert "p2p-on vs p2p-off" in table and "+10.0%" in table


def _needs_matplotlib():
    """The chart's library, a default dependency: `uv sync` (the README's set-up) installs it, so
    a test that needs it fails, never skips, without it."""
    import matplotlib  # noqa: F401


def test_without_the_extra_the_benchmark_says_which_to_install(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # importing it fails
    assert bench.main(["--chart-only", "--history", str(tmp_path / "h.jsonl")]) == 2
    assert "matplotlib, which is not installed here: run `uv sync`" in capsys.readouterr().err
    with pytest.raises(bench.MissingExtra, match="run `uv sync` in the repository"):
        bench.draw_history([], tmp_path / "h.png", bench.load_reference())


def test_chart_is_a_png(tmp_path):
    _needs_matplotlib()
    history = [
        bench.make_record("gpu1", "default", f"stack-{i}", WORKLOAD, _results(1 + i / 10), f"2026-11-2{i}T10:00")
        for i in range(3)
    ]
    path = bench.draw_history(history, tmp_path / "history.png", bench.load_reference())
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.stat().st_size > 10_000


def test_chart_only_command(tmp_path, capsys):
    _needs_matplotlib()
    history_file = tmp_path / "h.jsonl"
    bench.append_history(history_file, bench.make_record("gpu1", "default", "s", WORKLOAD, _results()))
    assert bench.main(["--chart-only", "--history", str(history_file)]) == 0
    assert (tmp_path / "h.png").exists()
    assert json.loads(history_file.read_text())["results"][0]["concurrency"] == 1


def test_the_benchmark_command_reads_back_with_its_temporary_folder():
    """Each word of the benchmark's argv arrives unchanged through sh, "$d" (the host's temporary
    folder) expanded alone or as a path's first part."""
    import subprocess

    from checks import bench_workload

    words = ["/opt/ih envs/x/bin/python", "-m", "sglang.bench_serving", "--model", "kimi 'k2' $(touch pwned)"]
    words += ["--output-file", "$d/out.jsonl", "--result-dir", "$d", "--result-filename", "out.jsonl"]
    command = bench_workload._in_temporary_folder(words)
    done = subprocess.run(
        ["sh", "-c", f"d='/tmp/a b'; set -- {command}; printf '%s\\n' \"$@\""],
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
    )
    expected = [w.replace("$d", "/tmp/a b") for w in words]
    assert done.stdout.splitlines() == expected
