"""The benchmark history's chart, drawn with matplotlib (the optional extra "bench")."""

from __future__ import annotations

from pathlib import Path


class MissingExtra(RuntimeError):
    pass


def require_matplotlib():
    """matplotlib draws the chart (a default dependency, pyproject.toml): missing only from an
    environment `uv sync` did not make."""
    try:
        import matplotlib
    except ImportError:
        raise MissingExtra(
            "the benchmark draws its chart with matplotlib, which is not installed here:"
            " run `uv sync` in the repository (it installs the project's dependencies, matplotlib"
            " among them)"
        ) from None
    return matplotlib


def draw_history(history: list[dict], path: Path, reference: dict) -> Path:
    """Output tok/s and mean ITL per run, one line per (engine, label, concurrency); reference lines."""
    matplotlib = require_matplotlib()

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (top, bottom) = plt.subplots(2, 1, figsize=(11, 7.5), sharex=True)
    series: dict[tuple[str, str, int], list[tuple[int, dict]]] = {}
    for index, record in enumerate(history):
        for row in record["results"]:
            series.setdefault((record.get("engine", "sglang"), record["label"], row["concurrency"]), []).append(
                (index, row)
            )
    for (engine, label, concurrency), points in sorted(series.items()):
        xs = [i for i, _ in points]
        name = f"{engine} {label} c={concurrency}"
        top.plot(xs, [p["output_throughput"] for _, p in points], marker="o", label=name)
        bottom.plot(xs, [p["mean_itl_ms"] for _, p in points], marker="o", label=name)
    figures = reference["single_stream_output_tok_s"]
    for figure_value in figures.values():
        top.axhline(figure_value, linestyle="--", linewidth=0.8, color="grey")
    # The figures lie close together: named in one box rather than on the lines.
    top.text(
        0.01,
        0.97,
        "single-stream reference (tok/s):\n"
        + "\n".join(f"{value:g}  {name}" for name, value in sorted(figures.items(), key=lambda kv: -kv[1])),
        transform=top.transAxes,
        fontsize=7,
        color="dimgrey",
        va="top",
        bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "lightgrey"},
    )
    top.set_ylabel("output tok/s")
    top.set_yscale("log")
    top.set_title("SGLang bench_serving history (random-ids); dashed: single-stream reference figures")
    bottom.set_ylabel("mean ITL (ms)")
    bottom.set_xticks(range(len(history)))
    bottom.set_xticklabels([f"{r['time'][:16]}\n{r['stack']}" for r in history], rotation=30, ha="right", fontsize=7)
    top.legend(fontsize=7, ncol=2)
    top.grid(alpha=0.3)
    bottom.grid(alpha=0.3)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
