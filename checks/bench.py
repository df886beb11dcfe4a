"""Benchmark the deployed server with its engine's own benchmark client (SGLang's bench_serving,
or `vllm bench serve` on a vLLM stack), keep a history labelled by engine, compare, chart.

    uv run python -m checks.bench --inventory inventory/prod.py            # first gpu node
    uv run python -m checks.bench --inventory inventory/prod.py --concurrency 1,8,32,64
    uv run python -m checks.bench --inventory inventory/prod.py --ab-p2p    # NCCL P2P on vs off
    uv run python -m checks.bench --chart-only                             # redraw the PNG
    uv run python -m checks.bench --compare-engines       # vLLM vs SGLang from the history

The client runs ON the host with the engine's python (the server usually binds 127.0.0.1),
dataset random-ids / random (random token ids: no download, offline), a single stream and then each
concurrency of the sweep. Each run appends one record to the history (reports/bench-history.jsonl)
and prints the comparison with the previous comparable run (same host, workload and label) and
with the reference figures recorded on the target (checks/reference.yml), then redraws
reports/bench-history.png.

    uv run python -m checks.bench --inventory inventory/prod.py --ab-spec   # EAGLE-3 on vs off
    uv run python -m checks.bench --inventory inventory/prod.py --ab-drafter /models/new-drafter
    uv run python -m checks.bench --inventory inventory/prod.py --ab-spec-v2  # overlap scheduler cost

--ab-spec and --ab-drafter restart the service with another command line: the deployed
launcher's `exec` line with the --speculative-* flags removed (off) or the draft model path
replaced, written beside a systemd drop-in that overrides ExecStart; removed afterwards.
With speculative decoding each record also keeps the server's accept length: bench_serving's
`accept_length` (/server_info avg_spec_accept_length: the average since the server started,
which the A/B restarts reset) and the sglang:spec_accept_length gauge of /metrics after the run.

--ab-p2p restarts the service twice: once with NCCL_P2P_DISABLE=0 and once with =1, through a
temporary systemd drop-in that adds an EnvironmentFile read after the unit's own (later files
win), and removes the drop-in afterwards (restarting once more), so the host ends as deployed.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path

import yaml

from checks import gpu_parsers as parse
from checks.connection import testinfra_url
from roles.shared import eagle3
from roles.shared.layout import unit_dropin_dir
from roles.site import SiteError, load_site
from roles.site.command_line import OneLineParser
from roles.site.errors import output_path_problem

HERE = Path(__file__).resolve().parent
REFERENCE_FILE = HERE / "reference.yml"
DEFAULT_HISTORY = Path("reports") / "bench-history.jsonl"
METRICS = ("output_throughput", "mean_ttft_ms", "mean_itl_ms", "accept_length")
LOWER_IS_BETTER = {"mean_ttft_ms", "mean_itl_ms"}
AB_DROPIN = "90-inference-host-bench-ab.conf"
AB_ENV = "bench-ab.env"
SPEC_DROPIN = "90-inference-host-bench-spec.conf"
SPEC_LAUNCHER = "bench-spec-launch"


# -- the workload --------------------------------------------------------------------------------


def bench_command(
    python: str,
    url: str,
    model: str,
    tokenizer: str,
    input_len: int,
    output_len: int,
    prompts: int,
    concurrency: int,
    output_file: str,
    engine: str = "sglang",
) -> list[str]:
    """One benchmark run. SGLang: sglang.bench_serving's flags. vLLM 0.16.0: `vllm bench serve`
    (vllm/benchmarks/serve.py; run as its CLI module, which also works for the CPU build whose
    `vllm` script is missing), dataset `random` (token ids, fixed lengths at range ratio 0),
    the chat endpoint, and --save-result writing one JSON line with the same metric names
    (output_throughput, mean_ttft_ms, mean_itl_ms, max_concurrency, ...)."""
    if engine == "vllm":
        folder, _, name = output_file.rpartition("/")
        return [
            python,
            "-m",
            "vllm.entrypoints.cli.main",
            "bench",
            "serve",
            "--backend",
            "openai-chat",
            "--endpoint",
            "/v1/chat/completions",
            "--base-url",
            url,
            "--model",
            model,
            "--tokenizer",
            tokenizer,
            "--dataset-name",
            "random",
            "--random-input-len",
            str(input_len),
            "--random-output-len",
            str(output_len),
            "--num-prompts",
            str(prompts),
            "--max-concurrency",
            str(concurrency),
            # Greedy, as the history's earlier runs: vllm 0.16.0's client no longer sends
            # temperature 0 by itself (it warns), leaving sampling to the server's default.
            "--temperature",
            "0",
            "--save-result",
            "--result-dir",
            folder,
            "--result-filename",
            name,
        ]
    return [
        python,
        "-m",
        "sglang.bench_serving",
        "--backend",
        "sglang-oai-chat",
        "--base-url",
        url,
        "--model",
        model,
        "--tokenizer",
        tokenizer,
        "--dataset-name",
        "random-ids",
        "--random-input-len",
        str(input_len),
        "--random-output-len",
        str(output_len),
        "--random-range-ratio",
        "1",
        "--num-prompts",
        str(prompts),
        "--max-concurrency",
        str(concurrency),
        "--output-file",
        output_file,
    ]


def run_workload(host, target, args) -> list[parse.BenchResult]:
    from checks import server_checks

    expect = target["expect"]
    key_setup = ""
    if expect.api_key_configured:  # bench_serving reads OPENAI_API_KEY; the key stays on the host
        key_setup = server_checks.api_key_assignment(expect, "OPENAI_API_KEY") + "export OPENAI_API_KEY; "
    results = []
    for concurrency in args.concurrency:
        prompts = max(args.min_prompts, concurrency * args.prompts_per_stream)
        command = bench_command(
            expect.engine_python,
            target.get("base_url") or server_checks.base_url(expect),
            expect.served_model_name,
            target["model_path"],
            args.input_len,
            args.output_len,
            prompts,
            concurrency,
            "$d/out.jsonl",
            expect.engine,
        )
        text = " ".join(shlex.quote(c) if not c.startswith("$d") else f'"{c}"' for c in command)
        script = f'{key_setup}d=$(mktemp -d); {text} >&2 && cat "$d/out.jsonl"; rc=$?; rm -rf "$d"; exit $rc'
        print(
            f"  {expect.engine} benchmark: concurrency {concurrency}, {prompts} prompts, "
            f"{args.input_len} in / {args.output_len} out",
            flush=True,
        )
        result = host.run(f"bash -c {shlex.quote(script)}")
        if result.rc != 0:
            raise RuntimeError(
                f"the {expect.engine} benchmark failed (rc {result.rc}): {result.stderr.strip()[-1500:]}"
            )
        results.extend(parse.parse_bench_serving_jsonl(result.stdout))
    return results


# -- history, comparison, chart (pure apart from files) --------------------------------------------


def make_record(
    host_name: str,
    label: str,
    stack: str,
    workload: dict,
    results: list[parse.BenchResult],
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


class MissingExtra(RuntimeError):
    pass


def require_matplotlib():
    """matplotlib is the optional extra "bench" (pyproject.toml): only the chart needs it."""
    try:
        import matplotlib
    except ImportError:
        raise MissingExtra(
            "the benchmark draws its chart with matplotlib, which is the optional"
            " extra 'bench': run `uv sync --extra bench` (or `uv run --extra bench"
            " python -m checks.bench ...`)"
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


def load_reference() -> dict:
    return yaml.safe_load(REFERENCE_FILE.read_text())


# -- the A/B switch on the host --------------------------------------------------------------------


def _wait_healthy(host, expect, timeout_s: int) -> None:
    from checks import server_checks

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server_checks.request(host, expect, "/health", with_key=False, timeout_s=10).status == 200:
            return
        time.sleep(10)
    raise RuntimeError(f"{expect.unit_name} did not answer /health within {timeout_s} s after a restart")


def set_p2p(host, expect, disabled: bool | None, timeout_s: int) -> None:
    """disabled None: remove the A/B drop-in (as deployed). Restarts the unit and waits."""
    set_environment(host, expect, None if disabled is None else f"NCCL_P2P_DISABLE={int(disabled)}", timeout_s)


def set_environment(host, expect, assignment: str | None, timeout_s: int) -> None:
    """One VAR=value over the unit's environment (None: the drop-in removed, as deployed)."""
    folder = unit_dropin_dir(expect.unit_name)
    if assignment is None:
        script = f"rm -f {folder}/{AB_DROPIN} {folder}/{AB_ENV}"
    else:
        script = (
            f"mkdir -p {folder} && printf '{assignment}\\n' > {folder}/{AB_ENV} && "
            f"printf '[Service]\\nEnvironmentFile={folder}/{AB_ENV}\\n' > {folder}/{AB_DROPIN}"
        )
    result = host.run(
        f"bash -c {shlex.quote(script + f' && systemctl daemon-reload && systemctl restart {expect.unit_name}')}"
    )
    if result.rc != 0:
        raise RuntimeError(f"could not set {assignment} on {expect.unit_name}: {result.stderr.strip()}")
    _wait_healthy(host, expect, timeout_s)


def _exec_start_path(host, unit: str) -> str:
    """The script the unit runs (`systemctl show -p ExecStart`: "{ path=/... ; argv[]=... }")."""
    text = host.run(f"systemctl show -p ExecStart --value {shlex.quote(unit)}").stdout
    for part in text.replace("{", " ").split(";"):
        part = part.strip()
        if part.startswith("path="):
            return part.removeprefix("path=").strip()
    raise RuntimeError(f"could not read the ExecStart of {unit}: {text.strip()!r}")


def set_speculative(
    host, expect, speculative: bool | None, timeout_s: int, draft_model_path: str | None = None
) -> None:
    """speculative None: remove the A/B drop-in (as deployed). Else run the deployed command with
    speculative decoding on (optionally another drafter) or off. Restarts the unit and waits."""
    import base64

    folder = unit_dropin_dir(expect.unit_name)
    if speculative is None:
        script = f"rm -f {folder}/{SPEC_DROPIN} {folder}/{SPEC_LAUNCHER}"
    else:
        launcher = _exec_start_path(host, expect.unit_name)
        text = host.run(f"cat {shlex.quote(launcher)}").stdout
        argv = eagle3.speculative_variant(eagle3.launcher_argv(text), speculative, draft_model_path)
        content = (
            "#!/bin/sh\n# A/B variant of the deployed launcher (checks/bench.py); removed after the run.\n"
            f"exec {shlex.join(argv)}\n"
        )
        encoded = base64.b64encode(content.encode()).decode()
        script = (
            f"mkdir -p {folder} && echo {encoded} | base64 -d > {folder}/{SPEC_LAUNCHER} && "
            f"chmod 0755 {folder}/{SPEC_LAUNCHER} && "
            f"printf '[Service]\\nExecStart=\\nExecStart={folder}/{SPEC_LAUNCHER}\\n' > {folder}/{SPEC_DROPIN}"
        )
    result = host.run(
        f"bash -c {shlex.quote(script + f' && systemctl daemon-reload && systemctl restart {expect.unit_name}')}"
    )
    if result.rc != 0:
        raise RuntimeError(f"could not switch speculative decoding on {expect.unit_name}: {result.stderr.strip()}")
    _wait_healthy(host, expect, timeout_s)


def speculative_figures(host, expect) -> dict | None:
    """sglang:spec_accept_length after a run (None when the server does not speculate)."""
    from checks import server_checks, speculative_checks

    if not expect.enable_metrics:
        return None
    answer = server_checks.request(host, expect, "/metrics", with_key=False)
    value = speculative_checks.metrics_accept_length(answer.body) if answer.status == 200 else None
    return {"metrics_accept_length": value} if value else None


# -- command line ------------------------------------------------------------------------------------


def _arguments(argv):
    parser = OneLineParser(prog="python -m checks.bench", description=__doc__.split("\n")[0])
    parser.add_argument("--inventory", help="inventory file")
    parser.add_argument("--host", help="inventory host (default: the first gpu node)")
    parser.add_argument("--hosts", help="testinfra URL instead of the inventory's connection")
    parser.add_argument(
        "--through-gateway",
        metavar="GATEWAY",
        nargs="?",
        const="",
        help="send the workload through a host of the gateways group (default: the first)"
        " instead of to --host's own server; bench_serving still runs on --host",
    )
    parser.add_argument(
        "--concurrency",
        default="1,4,16,64",
        type=lambda v: [int(c) for c in v.split(",")],
        help="sweep; 1 is the single stream",
    )
    parser.add_argument("--input-len", type=int, default=1024)
    parser.add_argument("--output-len", type=int, default=512)
    parser.add_argument("--prompts-per-stream", type=int, default=4)
    parser.add_argument("--min-prompts", type=int, default=8)
    parser.add_argument("--label", default="default", help="names this configuration in the history")
    parser.add_argument("--ab-p2p", action="store_true", help="run the workload with NCCL P2P on, then off")
    parser.add_argument(
        "--ab-spec", action="store_true", help="run the workload with speculative decoding (EAGLE-3) on, then off"
    )
    parser.add_argument(
        "--ab-spec-v2",
        action="store_true",
        help="speculative decoding with SGLANG_ENABLE_SPEC_V2 off (overlap scheduler off), then on",
    )
    parser.add_argument(
        "--ab-drafter",
        metavar="PATH",
        help="run the workload with the deployed drafter, then with the drafter at PATH (on the host)",
    )
    parser.add_argument("--restart-timeout-s", type=int, default=1800, help="model load after a restart")
    parser.add_argument("--history", type=Path, default=DEFAULT_HISTORY)
    parser.add_argument("--chart", type=Path, help="PNG (default: the history's name with .png)")
    parser.add_argument("--chart-only", action="store_true", help="only redraw the chart from the history")
    parser.add_argument(
        "--compare-engines",
        action="store_true",
        help="print the latest run of each engine (vLLM vs SGLang) per host and workload",
    )
    return parser.parse_args(argv)


def _target(args) -> dict:
    from checks.expectations import Expectations

    if not args.inventory:
        raise SiteError(["--inventory is required (the served model, port and key come from it)"])
    site = load_site(args.inventory)
    name = args.host or next((h.name for h in site.group("gpu_nodes")), None)
    if name not in site.hosts:
        raise SiteError([f"{args.inventory}: no host {name!r}; expected one of: {', '.join(site.hosts)}"])
    target = {
        "name": name,
        "url": args.hosts or testinfra_url(args.inventory, name),
        "expect": Expectations.from_site(site, name),
        "model_path": site.hosts[name].serving.model_path,
        "stack": f"{site.stack.active.id} ({site.stack.active.label})",
        "engine": site.stack.active.engine,
    }
    if getattr(args, "through_gateway", None) is not None:
        from roles.shared.replicas import gateway_url

        gateways = site.group("gateways")
        gateway = next((g for g in gateways if g.name == args.through_gateway or not args.through_gateway), None)
        if gateway is None:
            raise SiteError(
                [
                    f"{args.inventory}: --through-gateway {args.through_gateway!r} is no host of the"
                    " gateways group; expected one of: " + (", ".join(g.name for g in gateways) or "(none)")
                ]
            )
        # The replicas share one API key (a rule of the site model): the gpu node's key file serves.
        target.update(base_url=gateway_url(gateway), label_host=f"{gateway.name} (gateway, from {name})")
    return target


def ab_variants(args, host, expect):
    """{label: value} and the function that applies a value (None: as deployed)."""
    timeout = args.restart_timeout_s
    if args.ab_p2p:
        return {"p2p-on": False, "p2p-off": True}, lambda v: set_p2p(host, expect, v, timeout)
    if args.ab_spec:
        return {"spec-on": True, "spec-off": False}, lambda v: set_speculative(host, expect, v, timeout)
    if args.ab_spec_v2:  # server_args.py: EAGLE keeps the overlap scheduler only with spec v2
        return (
            {"spec-v2-off": "SGLANG_ENABLE_SPEC_V2=0", "spec-v2-on": "SGLANG_ENABLE_SPEC_V2=1"},
            lambda v: set_environment(host, expect, v, timeout),
        )
    if args.ab_drafter:

        def drafter(path):
            set_speculative(host, expect, None if path is None else True, timeout, path or None)

        return {"drafter-current": "", "drafter-new": args.ab_drafter}, drafter
    return {args.label: None}, None


def main(argv=None) -> int:
    args = _arguments(argv)
    chart = args.chart or args.history.with_suffix(".png")
    if args.compare_engines:
        print(engines_table(read_history(args.history), args.host))
        return 0
    try:
        # The inventory and the host first (what the user most likely mistyped), then what the
        # run needs locally: all before any host is touched, so a benchmark of minutes fails
        # neither at its chart nor at writing its history.
        target = None if args.chart_only else _target(args)
        given = [("--history", args.history)] if args.history != DEFAULT_HISTORY else []
        given += [("--chart", args.chart)] if args.chart else []
        problems = [problem for flag, path in given if (problem := output_path_problem(flag, path))]
        if problems:
            raise SiteError(problems)
        require_matplotlib()
    except SiteError as error:
        print("benchmark: bad input, no host was contacted:\n  - " + "\n  - ".join(error.problems), file=sys.stderr)
        return 2
    except MissingExtra as error:
        print(f"benchmark: {error}", file=sys.stderr)
        return 2
    reference = load_reference()
    if args.chart_only:
        print(f"chart: {draw_history(read_history(args.history), chart, reference)}")
        return 0
    import testinfra

    host = testinfra.get_host(target["url"])
    workload = {
        "dataset": "random-ids",
        "input_len": args.input_len,
        "output_len": args.output_len,
        "concurrency": args.concurrency,
        "prompts_per_stream": args.prompts_per_stream,
    }
    expect = target["expect"]
    variants, switch = ab_variants(args, host, expect)
    records = {}
    try:
        for label, value in variants.items():
            if switch is not None:
                print(f"== {label}: restarting {expect.unit_name}", flush=True)
                switch(value)
            results = run_workload(host, target, args)
            record = make_record(
                target.get("label_host", target["name"]),
                label,
                target["stack"],
                workload,
                results,
                engine=target["engine"],
                speculative=speculative_figures(host, expect) if expect.speculative else None,
            )
            history = read_history(args.history)
            append_history(args.history, record)
            print(comparison_table(record, previous_comparable(history, record), reference), flush=True)
            records[label] = record
    finally:
        if switch is not None:
            print(f"== restoring {expect.unit_name} as deployed (removing the A/B drop-in)")
            switch(None)
    if len(records) > 1:
        print(ab_table(records))
    print(f"history: {args.history}\nchart: {draw_history(read_history(args.history), chart, reference)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
