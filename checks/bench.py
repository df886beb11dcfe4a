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

import sys
from pathlib import Path

# What it does, one module each; their names stay reachable as checks.bench.<name>.
from checks.bench_chart import MissingExtra, draw_history, require_matplotlib
from checks.bench_history import (
    DEFAULT_HISTORY,
    LOWER_IS_BETTER,
    METRICS,
    REFERENCE_FILE,
    ab_table,
    append_history,
    comparison_table,
    engines_table,
    load_reference,
    make_record,
    previous_comparable,
    read_history,
)
from checks.bench_switch import (
    AB_DROPIN,
    AB_ENV,
    SPEC_DROPIN,
    SPEC_LAUNCHER,
    set_environment,
    set_p2p,
    set_speculative,
    speculative_figures,
)
from checks.bench_workload import bench_command, run_workload
from checks.connection import testinfra_url
from roles.site import SiteError, load_site
from roles.site.command_line import OneLineParser
from roles.site.errors import output_path_problem

__all__ = [
    "AB_DROPIN",
    "AB_ENV",
    "DEFAULT_HISTORY",
    "LOWER_IS_BETTER",
    "METRICS",
    "REFERENCE_FILE",
    "SPEC_DROPIN",
    "SPEC_LAUNCHER",
    "MissingExtra",
    "ab_table",
    "ab_variants",
    "append_history",
    "bench_command",
    "comparison_table",
    "draw_history",
    "engines_table",
    "load_reference",
    "main",
    "make_record",
    "previous_comparable",
    "read_history",
    "require_matplotlib",
    "run_workload",
    "set_environment",
    "set_p2p",
    "set_speculative",
    "speculative_figures",
]

# -- command line ------------------------------------------------------------------------------------


def _arguments(argv, prog: str = "python -m checks.bench"):
    parser = OneLineParser(prog=prog, description=__doc__.split("\n")[0])
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
        from roles.shared.replicas import gateway_url, gateways_ca_on_replicas

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
        if gateway.gateway.tls_enabled:  # https://: its client verifies the gateway with the gateways' CA
            target["tls_ca_file"] = gateways_ca_on_replicas(site.hosts)
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


def main(argv=None, prog: str = "python -m checks.bench") -> int:
    args = _arguments(argv, prog)
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

    assert target is not None  # read above unless --chart-only
    from checks import bounded
    from checks.reach import unreachable

    gone = unreachable(target["url"], target.get("name"))
    if gone:  # exit 3, the same for every command (docs/operations.md)
        print(f"benchmark: {gone}", file=sys.stderr)
        return 3

    # every command bounded (checks/bounded.py): a wedged engine or GPU is a FAIL line, not a hang
    host = bounded.own_host(target["url"])
    workload = {
        "dataset": "random-ids",
        "input_len": args.input_len,
        "output_len": args.output_len,
        "concurrency": args.concurrency,
        "prompts_per_stream": args.prompts_per_stream,
    }
    variants, switch = ab_variants(args, host, target["expect"])
    try:
        records = _run_variants(args, host, target, workload, variants, switch, reference)
    except bounded.CommandOverrun as error:
        print(f"benchmark: FAIL {error}", file=sys.stderr)
        return 1
    if len(records) > 1:
        print(ab_table(records))
    print(f"history: {args.history}\nchart: {draw_history(read_history(args.history), chart, reference)}")
    return 0


def _run_variants(args, host, target, workload, variants, switch, reference) -> dict:
    """{label: record} for each variant, the unit put back as deployed afterwards."""
    from checks import bounded

    expect = target["expect"]
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
            try:
                switch(None)
            except bounded.CommandOverrun as error:  # the run's own failure is the one to show
                print(f"benchmark: FAIL restoring {expect.unit_name}: {error}", file=sys.stderr)
    return records


if __name__ == "__main__":
    from roles.site.command_line import run_command

    run_command(main, "python -m checks.bench")
