"""Run the health checks against inventory hosts: one verdict table per host and a JSON report.

    uv run python -m tests.infra --inventory inventory/prod.py                 # every gpu node
    uv run python -m tests.infra --inventory inventory/prod.py --host sglang-lxc.example.internal \\
        --suites gpu,interconnect
    uv run python -m tests.infra --hosts local:// --expect gpu_count=1 --expect gpu_arch=sm90 ...

Exit status 0 when every check passed or was skipped with a reason, 1 when one failed, 2 for
bad input. Reports land in reports/health-<host>-<time>.json unless --report names a file.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

import pytest

from roles.site import SiteError, load_site, testinfra_url

HERE = Path(__file__).resolve().parent
SUITES = ("gpu", "interconnect", "service", "server")


def _arguments(argv):
    parser = argparse.ArgumentParser(prog="python -m tests.infra", description=__doc__.split("\n")[0])
    parser.add_argument("--inventory", help="inventory file (expectations and how to reach hosts)")
    parser.add_argument("--host", action="append", default=[],
                        help="inventory host to check (default: every host of gpu_nodes)")
    parser.add_argument("--hosts", help="testinfra URL for a host outside the inventory (local://, ssh://...)")
    parser.add_argument("--suites", default=",".join(SUITES), help=f"comma list of {', '.join(SUITES)}")
    parser.add_argument("--expect", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--report", help="JSON report file (one host) or folder")
    parser.add_argument("--sudo", action="store_true", help="run the host's commands with sudo")
    return parser.parse_args(argv)


def _targets(args) -> list[tuple[str | None, str]]:
    """(inventory host name or None, testinfra URL) for each host to check."""
    if args.hosts:
        return [(args.host[0] if args.host else None, args.hosts)]
    if not args.inventory:
        raise SiteError(["give --inventory (and optionally --host), or --hosts for a machine in no inventory"])
    site = load_site(args.inventory)
    names = args.host or [h.name for h in site.group("gpu_nodes")]
    unknown = [n for n in names if n not in site.hosts]
    if unknown:
        raise SiteError([f"{args.inventory}: no host {', '.join(unknown)}; expected one of: "
                         + ", ".join(site.hosts)])
    return [(name, testinfra_url(args.inventory, name)) for name in names]


def _report_path(args, name: str, several: bool) -> str:
    if args.report and not several and not args.report.endswith("/"):
        return args.report
    folder = Path(args.report or "reports")
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "host"
    return str(folder / f"health-{safe}-{time.strftime('%Y%m%d-%H%M%S')}.json")


def pytest_arguments(args, name: str | None, url: str, report: str) -> list[str]:
    suites = [s.strip() for s in args.suites.split(",") if s.strip()]
    bad = [s for s in suites if s not in SUITES]
    if bad:
        raise SiteError([f"--suites {args.suites!r}: unknown {', '.join(bad)}; expected from {', '.join(SUITES)}"])
    argv = [str(HERE), "-p", "no:cacheprovider", "-q", "--tb=no", "-rN", "--no-header",
            f"--hosts={url}", "-m", " or ".join(suites), f"--report-json={report}",
            "-o", "addopts=", "-o", "testpaths="]
    if args.inventory:
        argv.append(f"--inventory={args.inventory}")
    if name:
        argv.append(f"--site-host={name}")
    if args.sudo:
        argv.append("--sudo")
    argv += [f"--expect={item}" for item in args.expect]
    return argv


def main(argv=None) -> int:
    args = _arguments(argv)
    try:
        targets = _targets(args)
        runs = [(name, url, pytest_arguments(args, name, url, _report_path(args, name or url, len(targets) > 1)))
                for name, url in targets]
    except SiteError as error:
        print("inference-host health checks: bad input, no host was contacted:", file=sys.stderr)
        for problem in error.problems:
            print(f"  - {problem}", file=sys.stderr)
        return 2
    worst = 0
    for name, url, pytest_argv in runs:
        print(f"\n### health checks of {name or url} ({url})", flush=True)
        code = int(pytest.main(pytest_argv))
        worst = max(worst, 1 if code == 1 else 2 if code not in (0, 1, 5) else 0)
    return worst


if __name__ == "__main__":
    raise SystemExit(main())
