"""One acceptance report of a deployed machine: what only the machine itself can show, collected
and judged in one run, with a verdict per line.

    uv run python -m checks.acceptance --inventory inventory/prod.py
    uv run python -m checks.acceptance --inventory inventory/prod.py --out reports/acceptance-1 --no-dcgm
    uv run python -m checks.acceptance --hosts local:// --expect gpu_count=1 ...   # a machine in no inventory

Each line names what it expects and what it found, and where the answer came from: the target,
or a lab stand-in (which says so in its own file: a line judged on a stand-in's answer is marked
as such). Writes report.md, report.json and chart.png (with the bench extra) into one folder.

Verdicts: PASS, FAIL, UNREACHED (could not be collected: said in one line, never counted as
passed), N/A (does not apply to this site, e.g. no KVM guest, no drafter served).
Exit status: 0 every line PASS or N/A (ACCEPTED); 1 a line failed; 3 none failed but one was
unreached; 4 every line PASS or N/A but one or more answered by a lab stand-in (ACCEPTED ON
STAND-INS: a rehearsal of the collection and the judging, which accepts no machine); 2 bad input
(no host contacted); 130 interrupted (Ctrl-C, or SIGTERM: the command running then is killed on
its host, and the report holds the lines collected before, the step that was running as a line
"not judged", and "interrupted": true, verdict INTERRUPTED).

Order on a GPU node: DCGM level 2 first (the engine stopped, started again, and whether it came
back is a line of its own), then the health checks, so that the verdict and every line read
from them judge the machine as DCGM left it. Every command is bounded (checks/bounded.py); an
overrun is a FAIL line naming the command. Time bound per GPU node: DCGM's 1200 s plus the
unit's TimeoutStopSec and TimeoutStartSec (+30 s each), the health checks' 900 s, the
benchmark's 1800 s, and a minute per other command.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from dataclasses import asdict
from pathlib import Path

from checks.__main__ import INTERRUPTED, SUITES, interrupt_on_sigterm
from checks.acceptance_line import (
    _RUNNING,
    FAIL,
    NOT_APPLICABLE,
    NOT_JUDGED,
    PASS,
    TARGET,
    UNREACHED,
    Line,
    running,
    standin,
)
from checks.acceptance_node import (
    _KVM_GPUS,
    node_lines,
)
from checks.acceptance_report import draw_chart, markdown, overall
from checks.bounded import DCGM_DIAG_BOUND_S
from checks.reach import unreachable
from checks.site_cache import site_of
from checks.timespan import parse_timespan
from roles.shared.shell import sh
from roles.site import SiteError
from roles.site.command_line import OneLineParser
from roles.site.errors import output_path_problem

# The lab's Hub (lab/standins/hf_hub) marks the config.json of each repository it serves.
HUB_STANDIN = "stand-in: lab Hugging Face Hub (it served the files; their download and verification are real)"
# A benchmark figure within this fraction of the seed's single-stream figure passes: the seed was
# measured once, on the target, by hand (checks/reference.yml).
BENCH_TOLERANCE = 0.9


# -- collecting on the node --------------------------------------------------------------------


# -- collecting on the GPU guest -------------------------------------------------------------------


def health_report(args, name: str, folder: Path) -> dict | None:
    """Runs the health checks (every suite) as `python -m checks` does; their JSON report."""
    from checks import __main__ as checks_main

    report = folder / f"health-{re.sub(r'[^A-Za-z0-9_.-]+', '_', name)}.json"
    if args.inventory:
        argv = ["--inventory", args.inventory, "--host", name, "--report", str(report)]
    else:
        argv = ["--hosts", args.hosts, "--report", str(report)] + [f"--expect={e}" for e in args.expect]
    if args.suites:
        argv += ["--suites", args.suites]
    print(f"\n## health checks of {name}", flush=True)
    running("health checks", name)
    if checks_main.main(argv) == INTERRUPTED:  # its own report (marked interrupted) stays in the folder
        raise KeyboardInterrupt
    return json.loads(report.read_text()) if report.is_file() else None


def rows(report: dict, *checks: str) -> list[dict]:
    return [row for row in report.get("checks", []) if row["check"] in checks]


def evidence(report: dict, name: str) -> float | None:
    for row in report.get("checks", []):
        for item in row.get("evidence", []):
            if item["name"] == name and isinstance(item["value"], (int, float)):
                return float(item["value"])
    return None


def from_health(
    report: dict | None, area: str, host: str, expectation: str, checks: tuple[str, ...], source: str = TARGET
) -> Line:
    if report is None:
        return Line(area, host, expectation, "the health checks wrote no report", UNREACHED, source)
    found = rows(report, *checks)
    if not found:
        return Line(area, host, expectation, f"no {' / '.join(checks)} check ran", UNREACHED, source)
    failed = [r for r in found if r["verdict"] == "FAIL"]
    skipped = [r for r in found if r["verdict"] == "SKIP"]
    verdict = FAIL if failed else UNREACHED if len(skipped) == len(found) else PASS
    shown = failed or skipped if verdict != PASS else found
    observed = "; ".join(dict.fromkeys(" ".join(r["detail"].split()) for r in shown))[:600]
    return Line(area, host, expectation, observed or verdict.lower(), verdict, source)


def gpu_source(host) -> str:
    smi = host.run("command -v nvidia-smi").stdout.strip()
    return "stand-in: lab nvidia-smi" if smi and standin(host, smi) else TARGET


def weights_source(host, site, name: str) -> str:
    """Weights downloaded from the lab's Hub stand-in are named so: their manifest and sizes are
    real, the repository they match is the stand-in's."""
    if site is None:
        return TARGET
    from roles.site import weight_sets_of

    sets = weight_sets_of(site.hosts[name], site.hosts)
    return HUB_STANDIN if any(standin(host, f"{ws.guest_dir}/config.json") for ws in sets) else TARGET


def named(*sources: str) -> str:
    """Every stand-in among the sources of one line, once each; the target when none."""
    return "; ".join(dict.fromkeys(source for source in sources if source != TARGET)) or TARGET


def suites_source(suites: list[str], gpu_from: str, engine_from: str, weights_from: str, python_from: str) -> str:
    """Who answered the suites a verdict judges: the GPU suites ask nvidia-smi and the engine's
    python, the service suite the engine's unit and the weights, the server suite the engine."""
    by_suite = {
        "gpu": [gpu_from, python_from],
        "interconnect": [gpu_from, python_from],
        "service": [engine_from, weights_from],
        "server": [engine_from],
    }
    return named(*(source for suite in suites for source in by_suite.get(suite, [])))


def python_source(host, expect) -> str:
    """The checks run the all-reduce and the benchmark client with the engine's python
    (health_engine_python): in the lab a stand-in that says so in its file."""
    return "stand-in: lab engine python" if standin(host, expect.engine_python) else TARGET


def engine_source(host, expect) -> str:
    """The lab's engine is a stand-in server the launcher runs by path: that file says so."""
    launcher = host.run(sh("cat {file}", file=expect.launcher))
    paths = dict.fromkeys(re.findall(r"(/[\w./-]+\.py)\b", launcher.stdout if launcher.rc == 0 else ""))
    return "stand-in: lab SGLang server" if any(standin(host, path) for path in paths) else TARGET


def load_time_line(host, expect, source: str) -> Line:
    shown = host.run(
        sh(
            "systemctl show {unit} -p InactiveExitTimestampMonotonic -p ActiveEnterTimestampMonotonic"
            " -p TimeoutStartUSec",
            unit=expect.unit_name,
        )
    )
    values = dict(line.split("=", 1) for line in shown.stdout.splitlines() if "=" in line)
    try:
        started = int(values["InactiveExitTimestampMonotonic"])
        ready = int(values["ActiveEnterTimestampMonotonic"])
    except (KeyError, ValueError):
        return Line(
            "model load time",
            expect.host_name,
            "ready within the unit's start timeout",
            f"systemctl show gave no start and ready times: {shown.stdout.strip()[:200]!r}",
            UNREACHED,
            source,
        )
    limit = parse_timespan(values.get("TimeoutStartUSec", ""))
    if not started or not ready or ready < started:
        return Line(
            "model load time",
            expect.host_name,
            "ready within the unit's start timeout",
            f"{expect.unit_name} is not active since its last start",
            FAIL,
            source,
        )
    seconds = (ready - started) / 1e6
    # The unit is "active" only once ExecStartPost's readiness probe answered (roles/serving):
    # from leaving "inactive" to "active" is the load, the probe included.
    return Line(
        "model load time",
        expect.host_name,
        f"ready within {limit:.0f} s (TimeoutStartSec)" if limit else "ready",
        f"{seconds:.1f} s from start to ready",
        PASS if not limit or seconds <= limit else FAIL,
        source,
        figure=round(seconds, 1),
        expected_figure=limit,
        unit="s",
    )


def dcgm_lines(args, host, expect, source: str, restart_source: str = TARGET) -> list[Line]:
    """DCGM level 2 with the engine stopped around it, and whether the engine came back: two
    lines. Run before the health checks, so that every line after it judges the machine as DCGM
    left it (a GPU DCGM disturbed, an engine that did not start again)."""
    from checks.__main__ import dcgm_diag

    area, expectation = "DCGM diagnostics level 2", "every test Pass or Skip (dcgmi diag -r 2 -j)"
    restart_area = "engine restart after DCGM"
    restart_expectation = f"{expect.unit_name}.service active again after DCGM stopped it"
    if not args.dcgm:
        return [
            Line(area, expect.host_name, expectation, "not run (--no-dcgm)", UNREACHED, source),
            Line(restart_area, expect.host_name, restart_expectation, "DCGM did not run", NOT_APPLICABLE),
        ]
    from checks.__main__ import dcgm_bound, progress_wanted

    bound_s = dcgm_bound(2, getattr(args, "dcgm_timeout", None), None)
    running(area, expect.host_name)
    run = dcgm_diag(host, 2, expect.unit_name, bound_s, progress=progress_wanted())
    if run.interrupted:  # the engine is started again; the interruption goes on
        raise KeyboardInterrupt
    if run.was_active:
        restart = Line(
            restart_area,
            expect.host_name,
            restart_expectation,
            run.restart_problem or f"{expect.unit_name}.service active",
            FAIL if run.restart_problem else PASS,
            restart_source,
        )
    else:
        restart = Line(
            restart_area,
            expect.host_name,
            restart_expectation,
            f"{expect.unit_name}.service was not active before DCGM: not stopped, not started "
            "(the health verdict judges it)",
            NOT_APPLICABLE,
            restart_source,
        )
    if run.tests is None:
        return [Line(area, expect.host_name, expectation, run.problem or "could not run", UNREACHED, source), restart]
    if run.problem:
        return [Line(area, expect.host_name, expectation, run.problem, FAIL, source), restart]
    bad = [f"{t.name}: {t.result}" for t in run.tests if t.result in ("Fail", "Warn")]
    dcgm = Line(
        area,
        expect.host_name,
        expectation,
        f"{len(run.tests)} tests" + (", " + ", ".join(bad) if bad else ", none failed"),
        FAIL if bad or not run.tests else PASS,
        source,
        details=[f"{t.section} {t.name}: {t.result}" for t in run.tests],
    )
    return [dcgm, restart]


def bench_line(args, site, name: str, host, expect, source: str, folder: Path) -> Line:
    from checks import bench

    area = "single-stream benchmark"
    reference = bench.load_reference()["single_stream_output_tok_s"]
    label = (
        "vLLM"
        if expect.engine == "vllm"
        else ("SGLang + third-party EAGLE-3 drafter (~42% accept)" if expect.speculative else "SGLang, base")
    )
    seed = reference[label]
    expectation = (
        f">= {BENCH_TOLERANCE:.0%} of the seed's {seed} tok/s ({label}); "
        f"tuned on the target: {reference['SGLang, tuned NCCL env + settings']} tok/s"
    )
    if not args.bench:
        return Line(area, name, expectation, "not run (--no-bench)", UNREACHED, source)
    if site is None:
        return Line(area, name, expectation, "no inventory: the served model's path is unknown", UNREACHED, source)
    workload = argparse.Namespace(
        concurrency=[1],
        input_len=args.bench_input_len,
        output_len=args.bench_output_len,
        prompts_per_stream=args.bench_prompts,
        min_prompts=args.bench_prompts,
    )
    target = {"expect": expect, "model_path": site.hosts[name].serving.model_path}
    try:
        results = bench.run_workload(host, target, workload)
    except RuntimeError as error:
        return Line(area, name, expectation, " ".join(str(error).split())[:400], UNREACHED, source)
    if not results or results[0].output_throughput is None:
        return Line(area, name, expectation, "the benchmark printed no output throughput", UNREACHED, source)
    value = float(results[0].output_throughput)
    (folder / "bench.json").write_text(json.dumps([asdict(r) for r in results], indent=2, default=str) + "\n")
    return Line(
        area,
        name,
        expectation,
        f"{value:.1f} tok/s ({args.bench_prompts} prompts, {args.bench_input_len} in / "
        f"{args.bench_output_len} out, concurrency 1)",
        PASS if value >= BENCH_TOLERANCE * seed else FAIL,
        source,
        figure=round(value, 1),
        expected_figure=seed,
        unit="tok/s",
    )


def guest_lines(args, site, name: str, url: str, expect, folder: Path) -> list[Line]:
    from checks import bounded

    host = bounded.own_host(url)
    suites = args.suites.split(",") if args.suites else site.hosts[name].health.after_deploy if site else list(SUITES)
    gpu_from, engine_from = gpu_source(host), engine_source(host, expect)
    dcgmi = bounded.run(host, "command -v dcgmi").stdout.strip()
    dcgm_from = "stand-in: lab dcgmi" if dcgmi and standin(host, dcgmi) else TARGET
    weights_from, python_from = weights_source(host, site, name), python_source(host, expect)
    # DCGM first: the health report, and so every line below and the verdict, is taken after it.
    dcgm = dcgm_lines(args, host, expect, dcgm_from, engine_from)
    report = health_report(args, name, folder)
    lines = [
        from_health(
            report,
            "guest GPUs",
            name,
            f"{expect.gpu_count} x {expect.gpu_model}, compute capability {expect.compute_capability}",
            ("gpu count", "gpu name", "compute capability", "memory"),
            gpu_from,
        ),
        allreduce_line(report, name, expect, named(gpu_from, python_from)),
        from_health(
            report,
            "weights at the pinned revision",
            name,
            "every weight set's manifest matches the pin",
            ("weights manifest matches the pin",),
            weights_from,
        ),
        overran_as_line("model load time", name, lambda: load_time_line(host, expect, engine_from)),
        first_generation_line(report, name, engine_from),
        kv_cache_line(report, site, name, engine_from, expect.engine),
        accept_length_line(report, name, expect, engine_from),
        overran_as_line("DCGM profiling rows", name, lambda: profiling_line(site, name, host, expect)),
        overran_as_line(
            "single-stream benchmark",
            name,
            lambda: bench_line(args, site, name, host, expect, named(engine_from, python_from), folder),
        ),
    ]
    verdict_from = suites_source(suites, gpu_from, engine_from, weights_from, python_from)
    return lines + dcgm + [health_verdict_line(report, name, suites, verdict_from)]


def profiling_line(site, name: str, host, expect) -> Line:
    """One DCGM_FI_PROF_* row read from the exporter's /metrics on the host: present, absent with
    the reason (checks/profiling_rows.py), or N/A where the site deploys no DCGM exporter there."""
    from checks import bounded, profiling_rows
    from roles.site.placement import exporter_bind

    area = "DCGM profiling rows"
    expectation = f"{profiling_rows.ROW} in the DCGM exporter's /metrics"
    settings = site.hosts[name] if site is not None else None
    # roles/monitoring `watched`: a gpu node gets the exporter only where the site has monitors
    watched = settings is not None and bool(site.group("monitors"))
    if settings is not None and not (settings.monitoring.dcgm_exporter and watched):
        why = "monitoring_dcgm_exporter is off" if not settings.monitoring.dcgm_exporter else "no monitors group"
        return Line(area, name, expectation, f"not applicable: no DCGM exporter deployed here ({why})", NOT_APPLICABLE)
    if settings is None and bounded.run(host, "systemctl cat nvidia-dcgm-exporter.service >/dev/null 2>&1").rc != 0:
        return Line(
            area, name, expectation, "not applicable: no nvidia-dcgm-exporter unit on this host", NOT_APPLICABLE
        )
    address, port = "127.0.0.1", 9400
    if settings is not None:
        bind = exporter_bind(settings, site.hosts)
        address, port = ("127.0.0.1" if bind == "0.0.0.0" else bind), settings.monitoring.dcgm_exporter_port
    source = "stand-in: lab DCGM exporter" if standin(host, "/usr/bin/dcgm-exporter") else TARGET
    metrics = bounded.run(host, sh("curl -sf --max-time 10 {url}", url=f"http://{address}:{port}/metrics"))

    def text(found) -> str | None:
        return found.stdout if found.rc == 0 else None

    params = text(bounded.run(host, "cat /proc/driver/nvidia/params"))
    uid_map = text(bounded.run(host, "cat /proc/self/uid_map"))
    said = text(
        bounded.run(
            host,
            sh(
                "journalctl -u nvidia-dcgm-exporter -b --no-pager -o cat 2>/dev/null | grep -m1 -F {text}",
                text=profiling_rows.DCP_LOG,
            ),
        )
    )
    container = text(bounded.run(host, "systemd-detect-virt --container 2>/dev/null || echo none")) or ""
    try:
        gpm = float(expect.compute_capability) >= 9.0
    except ValueError:
        gpm = None
    facts = profiling_rows.Facts(
        metrics=metrics.stdout if metrics.rc == 0 else None,
        container=(container.split() or ["unknown"])[0],
        unprivileged=profiling_rows.unprivileged_from_uid_map(uid_map) if uid_map is not None else None,
        restricted=profiling_rows.restricted_value(params) if params is not None else None,
        module_installed=bounded.run(host, sh("test -e {path}", path=profiling_rows.PROFILING_MODULE)).rc == 0,
        gpm=gpm,
        exporter_said=said.strip() or None if said is not None else None,
    )
    verdict = profiling_rows.judge(facts)
    observed = verdict.observed
    if verdict.verdict == UNREACHED:
        observed += f" (`curl http://{address}:{port}/metrics` on the host, rc {metrics.rc})"
    return Line(area, name, expectation, observed, verdict.verdict, source)


def overran_as_line(area: str, name: str, collect) -> Line:
    """A line whose collection ran into a command's bound is a FAIL naming that command."""
    from checks.bounded import CommandOverrun

    running(area, name)
    try:
        return collect()
    except CommandOverrun as error:
        return Line(area, name, "collected within its bound", str(error), FAIL)


def allreduce_line(report: dict | None, name: str, expect, source: str) -> Line:
    line = from_health(
        report,
        "all-reduce bandwidth",
        name,
        f"bus bandwidth >= {expect.allreduce_min_busbw_gbps} GB/s ({expect.allreduce_floor_source})",
        ("allreduce across all gpus",),
        source,
    )
    line.figure = evidence(report or {}, "allreduce_busbw_gbps")
    line.expected_figure, line.unit = expect.allreduce_min_busbw_gbps, "GB/s"
    return line


def first_generation_line(report: dict | None, name: str, source: str) -> Line:
    line = from_health(
        report,
        "first generation",
        name,
        "a chat completion that is not degenerate",
        ("chat completion not degenerate",),
        source,
    )
    seconds = evidence(report or {}, "tiny_request_seconds")
    if seconds is not None:
        line.observed += f" ({seconds:.2f} s)"
        line.figure, line.unit = seconds, "s"
    return line


def accept_length_line(report: dict | None, name: str, expect, source: str) -> Line:
    if not expect.speculative:
        return Line(
            "EAGLE-3 accept length", name, "only when a drafter is served", "no drafter served", NOT_APPLICABLE, source
        )
    line = from_health(
        report,
        "EAGLE-3 accept length",
        name,
        "the accept length the site expects",
        ("accept length from metrics", "accept length since start"),
        source,
    )
    line.figure = evidence(report or {}, "accept_length")
    return line


def kv_cache_line(report: dict | None, site, name: str, source: str, engine: str = "sglang") -> Line:
    """The engine's own KV line (the service suite's check "kv cache allocated" reads it from the
    unit's journal: SGLang's allocation line, roles/shared/sglang_kv_log.py; vLLM's "GPU KV cache
    size: N tokens", checks/vllm_kv_log.py) beside the deploy's estimate
    (roles/shared/kv_cache.py, the figure the deploy's note prints). An allocation below the
    estimate fails: the fit check let through more than the engine really has."""
    from roles.shared import kv_cache

    estimate = None
    if site is not None:
        found = kv_cache.site_estimate(site.hosts[name], Path(site.inventory_file).parent, site.stack.active.sglang)
        estimate = found.kv_tokens if found else None
    line = from_health(
        report,
        "KV cache allocated",
        name,
        ("vLLM's 'GPU KV cache size' line" if engine == "vllm" else "SGLang's allocation line")
        + (
            f" >= the deploy's estimate, {estimate:,} tokens"
            if estimate
            else " (no estimate: serving_speculative has no config.json copies)"
        ),
        ("kv cache allocated",),
        source,
    )
    tokens = evidence(report or {}, "kv_cache_tokens")
    line.figure, line.expected_figure, line.unit = tokens, estimate, "tokens"
    if line.verdict == PASS and estimate and tokens is not None and tokens < estimate:
        line.verdict = FAIL
        line.details.append(
            f"{'vLLM' if engine == 'vllm' else 'SGLang'} allocated {tokens:,.0f} tokens, the estimate "
            f"{estimate:,}: lower serving_mem_fraction_static's limits or the context (docs/serving-memory.md)"
        )
    return line


def health_verdict_line(report: dict | None, name: str, suites: list[str], source: str = TARGET) -> Line:
    """The verdict every deploy ends with: the suites the site runs after a deploy
    (health_after_deploy). The other suites' checks are judged in their own lines above."""
    expectation = f"HEALTHY ({', '.join(suites)})"
    if report is None:
        return Line("health verdict", name, expectation, "the health checks wrote no report", UNREACHED, source)
    judged = [r for r in report["checks"] if r["suite"] in suites]
    failed = [r for r in judged if r["verdict"] == "FAIL"]
    return Line(
        "health verdict",
        name,
        expectation,
        f"{'UNHEALTHY' if failed else 'HEALTHY'} ({len(failed)} failed of {len(judged)} checks)",
        FAIL if failed or not judged else PASS,
        source,
        details=[f"{r['suite']} {r['check']}: {' '.join(r['detail'].split())[:300]}" for r in failed],
    )


# -- the report --------------------------------------------------------------------------------------


def _arguments(argv, prog: str = "python -m checks.acceptance"):
    parser = OneLineParser(prog=prog, description=__doc__.split("\n")[0])
    parser.add_argument("--inventory", help="inventory file of the deployed site")
    parser.add_argument(
        "--hosts",
        help="testinfra URL of a GPU machine in no inventory (local://, ssh://...):"
        " its GPU, interconnect and server lines only",
    )
    parser.add_argument(
        "--expect",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="with --hosts: what the machine should be (as `python -m checks --expect`)",
    )
    parser.add_argument("--out", type=Path, help="report folder (default: reports/acceptance-<time>)")
    parser.add_argument(
        "--suites",
        help="health suites to run (default: all; the verdict line judges the site's "
        "health_after_deploy, or these when given)",
    )
    parser.add_argument(
        "--no-dcgm",
        dest="dcgm",
        action="store_false",
        help="skip `dcgmi diag -r 2` (it stops the serving unit for minutes)",
    )
    parser.add_argument(
        "--dcgm-timeout",
        type=float,
        metavar="SECONDS",
        help=f"bound of `dcgmi diag -r 2` (default {DCGM_DIAG_BOUND_S[2]} s)",
    )
    parser.add_argument("--no-bench", dest="bench", action="store_false", help="skip the single-stream benchmark")
    parser.add_argument("--bench-prompts", type=int, default=4)
    parser.add_argument("--bench-input-len", type=int, default=1024)
    parser.add_argument("--bench-output-len", type=int, default=256)
    return parser.parse_args(argv)


def main(argv=None, prog: str = "python -m checks.acceptance") -> int:
    args = _arguments(argv, prog)
    started = time.time()
    folder = args.out or Path("reports") / f"acceptance-{time.strftime('%Y%m%d-%H%M%S')}"
    try:
        if bool(args.inventory) == bool(args.hosts):
            raise SiteError(["give --inventory (a deployed site) or --hosts (a machine in no inventory), one of them"])
        unknown = [s for s in (args.suites or "").split(",") if args.suites and s not in SUITES]
        if unknown:
            raise SiteError(
                [
                    f"--suites {args.suites!r}: unknown {', '.join(unknown) or '(empty)'}; expected a "
                    f"comma list from {', '.join(SUITES)}"
                ]
            )
        site = site_of(args.inventory) if args.inventory else None
        expect = None if site else _expectations_without_inventory(args)
        problem = output_path_problem("--out", folder, folder=True)
        if problem:
            raise SiteError([problem])
    except SiteError as error:
        print("inference-host acceptance: bad input, no host was contacted:", file=sys.stderr)
        for problem in error.problems:
            print(f"  - {problem}", file=sys.stderr)
        return 2
    folder.mkdir(parents=True, exist_ok=True)
    interrupt_on_sigterm()
    lines: list[Line] = []
    _RUNNING.clear()
    try:
        lines = collect(args, site, folder, lines) if site else collect_one(args, expect, folder, lines)
        interrupted = False
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the command running then was killed on its host
        interrupted = True
        lines.extend(Line(area, host, "collected", NOT_JUDGED, UNREACHED) for area, host in _RUNNING)
    meta = {
        "inventory": args.inventory or args.hosts,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "seconds": round(time.time() - started, 1),
        "interrupted": interrupted,
    }
    verdict, status = ("INTERRUPTED", INTERRUPTED) if interrupted else overall(lines)
    (folder / "report.json").write_text(
        json.dumps({**meta, "verdict": verdict, "lines": [asdict(x) for x in lines]}, indent=2, default=str) + "\n"
    )
    (folder / "report.md").write_text(markdown(lines, meta))
    if interrupted:
        print(
            f"inference-host acceptance: interrupted; the report in {folder} holds the lines collected "
            "before, marked interrupted: not accepted",
            file=sys.stderr,
        )
        return status
    chart = draw_chart(lines, folder / "chart.png")
    print("\n" + markdown(lines, meta))
    print(
        f"report: {folder / 'report.md'}, {folder / 'report.json'}"
        + (f", {chart}" if chart else " (no chart: matplotlib is missing; `uv sync` installs it)")
    )
    return status


def collect(args, site, folder: Path, lines: list[Line] | None = None) -> list[Line]:
    """Every host's lines, appended to `lines` as each host's are in (an interrupted run keeps them)."""
    from checks import bounded
    from checks.connection import testinfra_url
    from checks.expectations import Expectations

    lines = [] if lines is None else lines
    for node in site.group("proxmox_hosts"):
        running("node", node.name)
        _KVM_GPUS[node.name] = [
            guest.guest.gpu_addresses
            for guest in site.group("kvm_guests")
            if guest.guest.node == node.name and guest.guest.gpu_addresses
        ]
        url = testinfra_url(args.inventory, node.name)
        gone = unreachable(url, node.name)
        if gone:  # one line; its checks are not run (they would each fail on the connection)
            lines.append(Line("node", node.name, "reachable", gone, UNREACHED))
            continue
        try:
            lines.extend(node_lines(node, bounded.own_host(url)))
        except bounded.CommandOverrun as error:
            lines.append(Line("node", node.name, "every command within its bound", str(error), FAIL))
        except Exception as error:  # an unreachable node is one line, not a traceback
            lines.append(Line("node", node.name, "reachable", f"{type(error).__name__}: {error}"[:300], UNREACHED))
    for gpu_node in site.group("gpu_nodes"):
        running("gpu node", gpu_node.name)
        url = testinfra_url(args.inventory, gpu_node.name)
        gone = unreachable(url, gpu_node.name)
        if gone:
            lines.append(Line("gpu node", gpu_node.name, "reachable", gone, UNREACHED))
            continue
        try:
            expect = Expectations.from_site(site, gpu_node.name)
            lines.extend(guest_lines(args, site, gpu_node.name, url, expect, folder))
        except bounded.CommandOverrun as error:
            lines.append(Line("gpu node", gpu_node.name, "every command within its bound", str(error), FAIL))
        except Exception as error:
            lines.append(
                Line("gpu node", gpu_node.name, "reachable", f"{type(error).__name__}: {error}"[:300], UNREACHED)
            )
    return lines


def _expectations_without_inventory(args):
    from checks import __main__ as checks_main
    from checks.expectations import Expectations

    checks_main._check_hosts_url(args.hosts)
    return Expectations.from_overrides(args.expect)


def collect_one(args, expect, folder: Path, lines: list[Line] | None = None) -> list[Line]:
    """A machine in no inventory: no node to read; its GPU, interconnect and server lines."""
    lines = [] if lines is None else lines
    lines.append(
        Line("node", "(none)", "the node's kernel arguments, nouveau, vfio", "no inventory: no node to read", UNREACHED)
    )
    from checks.bounded import CommandOverrun

    name = expect.host_name or args.hosts
    running("gpu node", name)
    gone = unreachable(args.hosts, name)
    if gone:
        lines.append(Line("gpu node", name, "reachable", gone, UNREACHED))
        return lines
    try:
        lines.extend(guest_lines(args, None, name, args.hosts, expect, folder))
    except CommandOverrun as error:
        lines.append(Line("gpu node", name, "every command within its bound", str(error), FAIL))
    return lines


if __name__ == "__main__":
    from roles.site.command_line import run_command

    run_command(main, "python -m checks.acceptance")
