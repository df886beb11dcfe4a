"""Run the health checks against inventory hosts: one verdict table per host and a JSON report.

    uv run python -m checks --inventory inventory/prod.py                 # every gpu node
    uv run python -m checks --inventory inventory/prod.py --host gpu-lxc.example.internal \\
        --suites gpu,interconnect
    uv run python -m checks --hosts local:// --expect gpu_count=1 --expect gpu_arch=sm90 ...

Exit status 0 when every check passed or was skipped with a reason, 1 when one failed, 2 for
bad input, 3 when a host could not be reached (one line for it, its checks not run:
checks/reach.py), 130 when interrupted (Ctrl-C, or SIGTERM: the command running then is killed
on the host, and the report holds the checks that ran, marked "interrupted"). Reports land in
reports/health-<host>-<time>.json unless --report names a file.

Every command on the host is bounded (checks/bounded.py): one that overruns is a FAIL line that
names it, its bound, the likely cause and the next step, and each host's run ends within
--deadline-s (default 900 s) plus one kill grace of 23 s; `--dcgm-level` adds DCGM's bound
(--dcgm-timeout, at most --deadline-s) and the unit's stop and start timeouts before it.
"""

from __future__ import annotations

import re
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from checks import bounded
from checks.connection import testinfra_url
from checks.reach import unreachable
from checks.site_cache import site_of
from roles.shared.shell import sh
from roles.site import SiteError
from roles.site.command_line import UNREACHABLE, OneLineParser
from roles.site.errors import output_path_problem

HERE = Path(__file__).resolve().parent
SUITES = ("gpu", "interconnect", "service", "server")


def _arguments(argv, prog: str = "python -m checks"):
    parser = OneLineParser(prog=prog, description=__doc__.split("\n")[0])
    parser.add_argument("--inventory", help="inventory file (expectations and how to reach hosts)")
    parser.add_argument(
        "--host", action="append", default=[], help="inventory host to check (default: every host of gpu_nodes)"
    )
    parser.add_argument("--hosts", help="testinfra URL for a host outside the inventory (local://, ssh://...)")
    parser.add_argument("--suites", default=",".join(SUITES), help=f"comma list of {', '.join(SUITES)}")
    parser.add_argument("--expect", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--report", help="JSON report file (one host) or folder")
    parser.add_argument("--sudo", action="store_true", help="run the host's commands with sudo")
    parser.add_argument(
        "--no-bandwidth-probes",
        action="store_true",
        help="skip the probes that load every GPU (memory bandwidth, PCIe link under load)",
    )
    parser.add_argument(
        "--dcgm-level",
        type=int,
        choices=(2, 3),
        metavar="2|3",
        help="also run `dcgmi diag -r 2|3` (minutes; needs idle GPUs) before the suites: the "
        "serving unit is stopped for it and started again, and the suites judge it afterwards",
    )
    parser.add_argument(
        "--dcgm-timeout",
        type=float,
        metavar="SECONDS",
        help="bound of `dcgmi diag` (default: by level, "
        + ", ".join(f"{level}: {seconds} s" for level, seconds in bounded.DCGM_DIAG_BOUND_S.items() if level > 1)
        + "; never more than --deadline-s)",
    )
    parser.add_argument(
        "--deadline-s",
        type=float,
        help="total bound of each host's checks in seconds: commands after it are not run and "
        f"fail (default {bounded.DEFAULT_DEADLINE_S:g}); when given, also the most DCGM may take",
    )
    return parser.parse_args(argv)


# Connection schemes testinfra has a backend for (testinfra/backend/__init__.py, 10.x).
SCHEMES = ("local", "ssh", "paramiko", "docker", "podman", "kubectl", "openshift", "winrm", "ansible", "salt", "lxc")


def _check_hosts_url(url: str) -> None:
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in SCHEMES:
        raise SiteError(
            [
                f"--hosts {url!r}: unknown connection; expected SCHEME://HOST with SCHEME one "
                f"of {', '.join(SCHEMES)} (e.g. ssh://root@gpu-node, local://)"
            ]
        )
    if scheme != "local" and not rest.split("?")[0].strip("/"):
        raise SiteError([f"--hosts {url!r}: no host after {scheme}://"])


def _targets(args) -> list[tuple[str | None, str]]:
    """(inventory host name or None, testinfra URL) for each host to check."""
    if args.hosts:
        _check_hosts_url(args.hosts)
        return [(args.host[0] if args.host else None, args.hosts)]
    if not args.inventory:
        raise SiteError(["give --inventory (and optionally --host), or --hosts for a machine in no inventory"])
    site = site_of(args.inventory)
    names = args.host or [h.name for h in site.group("gpu_nodes")]
    unknown = [n for n in names if n not in site.hosts]
    if unknown:
        raise SiteError([f"{args.inventory}: no host {', '.join(unknown)}; expected one of: " + ", ".join(site.hosts)])
    return [(name, testinfra_url(args.inventory, name)) for name in names]


def _report_path(args, name: str, several: bool) -> str:
    if args.report and not several and not args.report.endswith("/"):
        return args.report
    folder = Path(args.report or "reports")
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "host"
    return str(folder / f"health-{safe}-{time.strftime('%Y%m%d-%H%M%S')}.json")


def pytest_arguments(args, name: str | None, url: str, report: str) -> list[str]:
    suites = [s.strip() for s in args.suites.split(",")]
    bad = [s or "(empty)" for s in suites if s not in SUITES]
    if bad:
        raise SiteError(
            [f"--suites {args.suites!r}: unknown {', '.join(bad)}; expected a comma list from {', '.join(SUITES)}"]
        )
    argv = [
        str(HERE),
        "-p",
        "no:cacheprovider",
        "-q",
        "--tb=no",
        "-rN",
        "--no-header",
        f"--hosts={url}",
        "-m",
        " or ".join(suites),
        f"--report-json={report}",
        f"--deadline-s={getattr(args, 'deadline_s', None) or bounded.DEFAULT_DEADLINE_S:g}",
        "-o",
        "addopts=",
        "-o",
        "testpaths=",
    ]
    if args.inventory:
        argv.append(f"--inventory={args.inventory}")
    if name:
        argv.append(f"--site-host={name}")
    if args.sudo:
        argv.append("--sudo")
    if getattr(args, "no_bandwidth_probes", False):
        argv.append("--no-bandwidth-probes")
    argv += [f"--expect={item}" for item in args.expect]
    return argv


def _validate_expectations(args, targets) -> None:
    """--expect values are checked here, before any host is contacted (pytest would check them
    too, but only after starting)."""
    from checks.expectations import Expectations

    if args.inventory:
        site = site_of(args.inventory)
        for name, _ in targets:
            if name:
                Expectations.from_site(site, name, args.expect)
    else:
        Expectations.from_overrides(args.expect)


INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command Ctrl-C ended


def interrupt_on_sigterm() -> None:
    """SIGTERM (systemd stopping the checks' unit, `kill`) ends the run as Ctrl-C does: the
    command running on the host is killed and the report of what ran is written. Python's
    default for SIGTERM ends the process at once, leaving both undone."""

    from roles.site.command_line import interrupt_on_sigterm as every_commands

    if threading.current_thread() is threading.main_thread():
        every_commands()


def main(argv=None, prog: str = "python -m checks") -> int:
    args = _arguments(argv, prog)
    if args.dcgm_timeout is not None and args.dcgm_timeout <= 0:
        print(
            f"inference-host health checks: bad input, no host was contacted:\n  - --dcgm-timeout "
            f"{args.dcgm_timeout:g}: expected a number of seconds > 0",
            file=sys.stderr,
        )
        return 2
    try:
        targets = _targets(args)
        runs = [
            (name, url, pytest_arguments(args, name, url, _report_path(args, name or url, len(targets) > 1)))
            for name, url in targets
        ]
        report_problem = args.report and output_path_problem(
            "--report", Path(args.report), folder=len(targets) > 1 or args.report.endswith("/")
        )
        if report_problem:
            raise SiteError([report_problem])
        _validate_expectations(args, targets)
    except SiteError as error:
        print("inference-host health checks: bad input, no host was contacted:", file=sys.stderr)
        for problem in error.problems:
            print(f"  - {problem}", file=sys.stderr)
        return 2
    interrupt_on_sigterm()
    worst = 0
    for name, url, pytest_argv in runs:
        gone = unreachable(url, name)
        if gone:  # one line, not a table of failed checks each blaming a slow host
            print(f"inference-host health checks: {gone}", file=sys.stderr, flush=True)
            worst = UNREACHABLE
            continue
        try:
            if args.dcgm_level:  # first: the suites then judge the machine DCGM leaves behind
                bound_s = dcgm_bound(args.dcgm_level, args.dcgm_timeout, args.deadline_s)
                worst = max(worst, dcgm_on_demand(url, args.dcgm_level, name, args.inventory, args.sudo, bound_s))
        except KeyboardInterrupt:
            print(
                f"inference-host health checks: interrupted during DCGM on {name or url}: not healthy", file=sys.stderr
            )
            return INTERRUPTED
        print(f"\n### health checks of {name or url} ({url})", flush=True)
        code = int(pytest.main(pytest_argv))
        if code == pytest.ExitCode.INTERRUPTED:
            print(
                f"inference-host health checks: interrupted on {name or url}; the report holds the checks "
                "that ran, marked interrupted: not healthy",
                file=sys.stderr,
            )
            return INTERRUPTED
        if code == 5:
            print(
                f"inference-host health checks: no check ran on {name or url} (pytest collected nothing): not healthy",
                file=sys.stderr,
            )
        elif code not in (0, 1):
            print(
                f"inference-host health checks: the run on {name or url} stopped (pytest exit "
                f"{code}): see the error above; not healthy",
                file=sys.stderr,
            )
        worst = max(worst, 0 if code == 0 else 1 if code in (1, 5) else 2)
    return worst  # the worst: an unreachable host (3) over a failed check (1)


def dcgm_bound(level: int, timeout_s: float | None, deadline_s: float | None) -> float:
    """DCGM's bound: --dcgm-timeout, else the level's (DCGM_DIAG_BOUND_S), never more than a
    --deadline-s given (a hung nv-hostengine held the run for the level's 1200 s whatever it
    said). The suites' default deadline does not cut it: level 3 takes about 15 minutes."""
    bound_s = timeout_s or bounded.DCGM_DIAG_BOUND_S[level]
    return min(bound_s, deadline_s) if deadline_s else bound_s


def dcgm_on_demand(
    url: str, level: int, name: str | None, inventory: str | None, sudo: bool = False, bound_s: float | None = None
) -> int:
    """`dcgmi diag -r 2|3` with the serving unit stopped, its verdict printed: 0 pass, 1 fail.
    An engine that does not come back afterwards is a FAIL line of its own. Interrupted, it
    prints what it did (the engine started again) and raises KeyboardInterrupt on."""
    from checks.expectations import Expectations
    from roles.site import ServingSettings

    host = bounded.own_host(url, sudo=sudo)
    unit = ServingSettings.model_fields["unit_name"].default  # the deploy's default, without an inventory
    if inventory and name:
        unit = Expectations.from_site(site_of(inventory), name).unit_name
    run = dcgm_diag(host, level, unit, bound_s, progress=progress_wanted())
    code = 0
    if run.interrupted:
        print(f"dcgmi diag -r {level}: INTERRUPTED ({run.problem})")
        code = 1
    elif run.tests is None:
        print(f"dcgmi diag -r {level}: FAIL ({run.problem})")
        code = 1
    elif run.problem:
        print(f"dcgmi diag -r {level}: FAIL ({run.problem})")
        code = 1
    else:
        for test in run.tests:
            print(f"  {test.section} {test.name}: {test.result}" + "".join(f"\n    {d}" for d in test.details))
        failed = [t for t in run.tests if t.result in ("Fail", "Warn")]
        verdict = "FAIL" if failed or not run.tests else "PASS"
        print(
            f"dcgmi diag -r {level}: {verdict} ({len(run.tests)} tests"
            + (", failed: " + ", ".join(f"{t.name} {t.result}" for t in failed) if failed else "")
            + ")"
        )
        code = 1 if verdict == "FAIL" else 0
    if run.restart_problem:
        print(f"engine restart after dcgmi diag -r {level}: FAIL ({run.restart_problem})")
        code = 1
    elif run.was_active:
        print(f"engine restart after dcgmi diag -r {level}: PASS ({unit}.service active again)")
    if run.interrupted:
        raise KeyboardInterrupt
    return code


def progress_wanted() -> bool:
    """Progress lines only for a person at a terminal: not in a pipe, a log, or `--json` (which
    sends this process's stdout elsewhere, contextlib.redirect_stdout)."""
    return sys.stdout is sys.__stdout__ and sys.__stdout__ is not None and sys.__stdout__.isatty()


@dataclass
class DcgmRun:
    """One `dcgmi diag` run with the engine stopped around it.

    tests: DCGM's results; None when it could not run (problem says why), [] with problem when
    DCGM refused or overran. restart_problem: the engine, active before, is not active again."""

    tests: list | None
    problem: str | None = None
    was_active: bool = False
    restart_problem: str | None = None
    interrupted: bool = False


def unit_timeouts(host, unit: str) -> tuple[float, float]:
    """The unit's TimeoutStartSec and TimeoutStopSec (systemctl show; infinity: 1800 s)."""
    from checks.timespan import parse_timespan

    shown = bounded.run(host, sh("systemctl show -p TimeoutStartUSec -p TimeoutStopUSec {unit}", unit=unit))
    values = dict(line.split("=", 1) for line in shown.stdout.splitlines() if "=" in line)
    start = parse_timespan(values.get("TimeoutStartUSec", "")) or 1800
    stop = parse_timespan(values.get("TimeoutStopUSec", "")) or 1800
    return start, stop


def dcgm_diag(host, level: int, unit: str, bound_s: float | None = None, progress: bool = False) -> DcgmRun:
    """Runs `dcgmi diag -r 2|3 -j` with the serving unit stopped (levels 2 and 3 need idle GPUs:
    DCGM's nvvs refuses or disturbs a GPU in use), started again afterwards whatever the outcome
    (an interruption included), and whether it came back. Every command is bounded: DCGM by
    bound_s (DCGM_DIAG_BOUND_S by default), the unit's stop and start by its own
    TimeoutStopSec/TimeoutStartSec plus 30 s. With progress, a line every PROGRESS_EVERY_S while
    DCGM runs."""
    from checks import gpu_parsers as parse

    if bounded.run(host, "command -v dcgmi").rc != 0:
        return DcgmRun(None, "dcgmi is not installed (set nvidia_driver_dcgm = true)")
    try:
        active = bounded.run(host, sh("systemctl is-active {unit}", unit=unit)).stdout.strip() == "active"
        start_s, stop_s = unit_timeouts(host, unit) if active else (1800, 1800)
    except bounded.CommandOverrun as error:
        return DcgmRun(None, str(error))
    run = DcgmRun([], was_active=active)
    try:
        if active:
            print(f"dcgmi diag -r {level}: stopping {unit}.service for the run (the GPUs must be idle)", flush=True)
            bounded.run(host, sh("systemctl stop {unit}", unit=unit), what="systemctl", bound_s=stop_s + 30)
        bound = bound_s or bounded.DCGM_DIAG_BOUND_S[level]
        with bounded.progress(f"dcgmi diag -r {level}", bound, enabled=progress):
            result = bounded.run(host, sh("dcgmi diag -r {level} -j", level=int(level)), what="dcgmi", bound_s=bound)
        run.tests = parse.parse_dcgmi_diag_json(result.stdout)
    except bounded.CommandOverrun as error:
        run.problem = str(error)
    except ValueError as error:  # DcgmRuntimeError included: DCGM's own message
        run.problem = str(error)
    except KeyboardInterrupt:
        run.interrupted = True
        run.problem = "interrupted: `dcgmi diag` was killed on the host before it gave a verdict"
    finally:
        if active:
            print(f"dcgmi diag -r {level}: starting {unit}.service again", flush=True)
            run.restart_problem = start_again(host, unit, start_s)
    return run


def start_again(host, unit: str, start_s: float) -> str | None:
    """Starts the unit and says why it is not active afterwards (None: it is)."""
    try:
        started = bounded.run(host, sh("systemctl start {unit}", unit=unit), what="systemctl", bound_s=start_s + 30)
        state = bounded.run(host, sh("systemctl is-active {unit}", unit=unit)).stdout.strip() or "unknown"
    except bounded.CommandOverrun as error:
        return str(error)
    if started.rc == 0 and state == "active":
        return None
    said = " ".join((started.stderr or started.stdout).split())[:300]
    return (
        f"expected {unit}.service active again after DCGM; found `systemctl start` rc {started.rc}"
        f"{f' ({said})' if said else ''}, state {state}; what to do: the engine is not serving: read "
        f"`journalctl -u {unit} -b` for why it did not start (a GPU DCGM left in a bad state: "
        "`nvidia-smi -q`, the kernel log's Xid lines), then `systemctl start` it by hand"
    )


if __name__ == "__main__":
    from roles.site.command_line import run_command

    run_command(main, "python -m checks")
