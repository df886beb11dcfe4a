"""Health checks against a real host (testinfra), parametrized from the site model.

    uv run pytest checks --hosts=ssh://root@gpu-node --inventory=inventory/prod.py
    uv run pytest checks --hosts=local:// --expect gpu_count=1 --expect gpu_arch=sm90 \\
        --expect driver_version=580.159.04 -m "gpu or interconnect"
    uv run python -m checks ...        # the same, with a verdict table and a JSON report

The inventory host a testinfra host stands for is found by name (ssh://root@NAME -> NAME,
docker://C -> @docker/C) or given with --site-host. Without --inventory the expectations are a
gpu node's defaults plus the --expect overrides (a machine described in no inventory).
"""

from __future__ import annotations

import json
import re
import textwrap
import time
from pathlib import Path

import pytest

from checks import bounded
from checks.expectations import Expectations
from checks.probes import GpuProbe
from checks.site_cache import site_of
from roles.site import SiteError

SUITES = ("gpu", "interconnect", "service", "server")


def pytest_addoption(parser):
    group = parser.getgroup("inference-host health checks")
    group.addoption("--inventory", help="inventory file whose site model gives the expectations")
    group.addoption("--site-host", help="inventory host name of the checked host (default: from --hosts)")
    group.addoption(
        "--expect",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one expectation (inventory keys, driver_version, api_key_file)",
    )
    group.addoption("--report-json", metavar="PATH", help="write the verdicts as JSON to PATH")
    group.addoption(
        "--deadline-s",
        type=float,
        default=bounded.DEFAULT_DEADLINE_S,
        help="total bound of the run per host: commands after it are not run and fail (default %(default)s)",
    )
    group.addoption(
        "--no-bandwidth-probes",
        action="store_true",
        help="skip the probes that load every GPU (memory bandwidth, PCIe link under load):"
        " the periodic checks beside a serving engine (roles/monitoring)",
    )


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """The checks run in this one process, in order, whatever the project's addopts ask for
    (`-n auto`: the project's own tests run on pytest-xdist's workers). The bounded runner's
    state (one wedge of a kind refuses its kin, the run's total deadline) and the verdict table
    live in this process; split over workers, a wedged driver would cost one bound per worker and
    the table would be empty. 0 workers is xdist's "not distributed" (its pytest_cmdline_main)."""
    return 0


def pytest_configure(config):
    for suite in SUITES:
        config.addinivalue_line("markers", f"{suite}: the {suite} health-check suite")
    config._ih_started = time.time()
    config._ih_started_monotonic = time.monotonic()
    _validate_expectations(config)


def _validate_expectations(config) -> None:
    """Bad --inventory / --expect input stops the run before any host is contacted."""
    overrides = config.getoption("--expect")
    try:
        if config.getoption("--inventory"):
            site = site_of(config.getoption("--inventory"))
            name = config.getoption("--site-host")
            for host_name in [name] if name else [h.name for h in site.group("gpu_nodes")][:1]:
                Expectations.from_site(site, host_name, overrides)
        else:
            Expectations.from_overrides(overrides)
    except SiteError as error:
        raise pytest.UsageError(
            "the health checks' expectations are invalid; no host was contacted:\n  - " + "\n  - ".join(error.problems)
        ) from None


# ----------------------------------------------------------------------------------------------
# Expectations per checked host


def _site_host_name(config, host) -> str:
    if config.getoption("--site-host"):
        return config.getoption("--site-host")
    backend = host.backend
    name = getattr(backend, "host", None) or backend.get_hostname()
    if backend.NAME == "docker":
        return f"@docker/{backend.name}"
    if backend.NAME == "local":
        return "@local"
    return getattr(name, "name", name)


_EXPECTATIONS: dict[str, Expectations] = {}


def expectations_for(config, host) -> Expectations:
    key = host.backend.get_pytest_id()
    if key not in _EXPECTATIONS:
        overrides = config.getoption("--expect")
        try:
            if config.getoption("--inventory"):
                site = site_of(config.getoption("--inventory"))
                _EXPECTATIONS[key] = Expectations.from_site(site, _site_host_name(config, host), overrides)
            else:
                _EXPECTATIONS[key] = Expectations.from_overrides(overrides, _site_host_name(config, host))
        except SiteError as error:
            raise pytest.UsageError(
                "the health checks' expectations are invalid:\n  - " + "\n  - ".join(error.problems)
            ) from None
    return _EXPECTATIONS[key]


@pytest.fixture(scope="module")
def expect(request, host) -> Expectations:
    return expectations_for(request.config, host)


_PROBES: dict[str, GpuProbe] = {}
_BOUNDED: list = []


def _bounded(config, host):
    """Every command on the checked host bounded, within the run's total deadline (checks/bounded.py)."""
    if host not in _BOUNDED:
        bounded.bound(host, config.getoption("--deadline-s"), config._ih_started_monotonic)
        _BOUNDED.append(host)
    return host


@pytest.fixture(autouse=True)
def _bounded_host(request):
    params = getattr(request.node, "callspec", None)
    testinfra_host = params.params.get("_testinfra_host") if params else None
    if testinfra_host is not None:
        _bounded(request.config, testinfra_host)


@pytest.fixture(scope="module")
def gpu(request, host) -> GpuProbe:
    key = host.backend.get_pytest_id()
    return _PROBES.setdefault(key, GpuProbe(_bounded(request.config, host)))


def pytest_unconfigure(config):
    """The bounds are this run's: pytest-testinfra's hosts are testinfra's cached ones, which a
    later caller in the same process (a test, checks.acceptance) gets as they were left."""
    while _BOUNDED:
        bounded.release(_BOUNDED.pop())


def pytest_generate_tests(metafunc):
    """Per-GPU checks are one test per GPU: as many as the expectations name (most of all hosts)."""
    if "gpu_index" not in metafunc.fixturenames:
        return
    try:
        if metafunc.config.getoption("--inventory"):
            site = site_of(metafunc.config.getoption("--inventory"))
            count = max((h.gpu.count for h in site.hosts.values()), default=0)
            overrides = metafunc.config.getoption("--expect")
            for item in overrides:
                if item.startswith("gpu_count="):
                    count = int(item.split("=", 1)[1])
        else:
            count = Expectations.from_overrides(metafunc.config.getoption("--expect")).gpu_count
    except (SiteError, ValueError) as error:
        raise pytest.UsageError(f"the health checks' expectations are invalid: {error}") from None
    metafunc.parametrize("gpu_index", range(max(count, 1)), ids=lambda i: f"GPU{i}")


# ----------------------------------------------------------------------------------------------
# Verdicts: a table a person reads at a glance, and the same as JSON


def _suite_of(item) -> str:
    for suite in SUITES:
        if item.get_closest_marker(suite):
            return suite
    return "other"


def _message(report) -> str:
    if report.passed:
        return "; ".join(text for name, text in report.user_properties if name == "detail")
    if report.skipped and isinstance(report.longrepr, tuple):
        return report.longrepr[2].removeprefix("Skipped: ")
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash else str(report.longrepr)
    text = re.sub(r"^(?:[\w.]+\.)?CommandOverrun: ", "", text)
    return text.removeprefix("AssertionError: ").removeprefix("Failed: ").split("\nassert ")[0]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    report.ih_suite = _suite_of(item)
    report.ih_check = item.originalname.removeprefix("test_").replace("_", " ")
    params = getattr(item, "callspec", None)
    testinfra_host = params.params.get("_testinfra_host") if params else None
    report.ih_host = testinfra_host.backend.get_pytest_id() if testinfra_host else ""
    report.ih_gpu = params.params.get("gpu_index") if params else None


_RUNNING: list = []  # the check running now (an interruption leaves it without a report)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _RUNNING[:] = [item]
    yield


def _interrupted_row() -> dict | None:
    """The check an interruption stopped: in the report as not judged, not left out."""
    if not _RUNNING or any(r["nodeid"] == _RUNNING[0].nodeid for r in _CONFIG_RESULTS):
        return None  # stopped between two checks
    item = _RUNNING[0]
    params = getattr(item, "callspec", None)
    return {
        "suite": _suite_of(item),
        "check": item.originalname.removeprefix("test_").replace("_", " "),
        "gpu": params.params.get("gpu_index") if params else None,
        "host": "",
        "verdict": "SKIP",
        "detail": "not judged: the run was interrupted (Ctrl-C or SIGTERM) while this check ran",
        "nodeid": item.nodeid,
        "seconds": 0,
        "evidence": [],
    }


def pytest_runtest_logreport(report):
    if report.when == "call" or (report.when == "setup" and not report.passed):
        verdict = "PASS" if report.passed else "SKIP" if report.skipped else "FAIL"
        if verdict == "PASS" and any(name == "warn" for name, _ in report.user_properties):
            verdict = "WARN"  # probes.warn: passed, with a finding a person should read
        _CONFIG_RESULTS.append(
            {
                "suite": getattr(report, "ih_suite", "other"),
                "check": getattr(report, "ih_check", report.nodeid),
                "gpu": getattr(report, "ih_gpu", None),
                "host": getattr(report, "ih_host", ""),
                "verdict": verdict,
                "detail": _message(report),
                "nodeid": report.nodeid,
                "seconds": round(report.duration, 2),
                "evidence": _evidence(report),
            }
        )


_CONFIG_RESULTS: list[dict] = []


def _evidence(report) -> list[dict]:
    """The numbers a check recorded with probes.evidence: name, value, labels."""
    found = [value for key, value in report.user_properties if key == "evidence"]
    return [{"name": name, "value": value, "labels": labels} for name, value, labels in found]


def verdict_table(results: list[dict], width: int = 110, interrupted: bool = False) -> str:
    """The one-screen summary: one line per check, worst first within each suite."""
    order = {"FAIL": 0, "WARN": 1, "SKIP": 2, "PASS": 3}
    lines = []
    for suite in SUITES + ("other",):
        rows = [r for r in results if r["suite"] == suite]
        if not rows:
            continue
        counts = {v: sum(r["verdict"] == v for r in rows) for v in order}
        status = "FAIL" if counts["FAIL"] else "WARN" if counts["WARN"] else "PASS" if counts["PASS"] else "SKIP"
        lines.append(
            f"{suite.upper():13} {status}   ({counts['PASS'] + counts['WARN']} passed, {counts['FAIL']} failed,"
            f" {counts['SKIP']} skipped" + (f", {counts['WARN']} with a warning)" if counts["WARN"] else ")")
        )
        rows = _collapse_repeated_skips(sorted(rows, key=lambda r: order[r["verdict"]]))
        for row in rows:
            check = row["check"] + (f" [GPU{row['gpu']}]" if row["gpu"] is not None else "")
            detail = " ".join(row["detail"].split())
            line = f"  {row['verdict']:4}  {check:38.38}  {detail}"
            if row["verdict"] in ("FAIL", "WARN"):  # read in full: it says what to do
                lines.extend(textwrap.wrap(line, width, subsequent_indent=" " * 48))
            else:
                lines.append(line if len(line) <= width else line[: width - 1] + "…")
    failed = sum(r["verdict"] == "FAIL" for r in results)
    verdict = "INTERRUPTED" if interrupted else "UNHEALTHY" if failed else "HEALTHY"
    warned = sum(r["verdict"] == "WARN" for r in results)
    lines.append(
        f"VERDICT: {verdict} ({failed} failed of {len(results)} checks"
        + (f", {warned} with a warning)" if warned else ")")
    )
    return "\n".join(lines)


def _collapse_repeated_skips(rows: list[dict]) -> list[dict]:
    """Per-GPU checks skipped for one reason (e.g. missing GPUs) read as one line, not dozens."""
    groups: dict[str, list[dict]] = {}
    for row in rows:
        if row["verdict"] == "SKIP":
            groups.setdefault(re.sub(r"GPU\d+", "GPU#", row["detail"]), []).append(row)
    collapsed, done = [], set()
    for row in rows:
        key = re.sub(r"GPU\d+", "GPU#", row["detail"]) if row["verdict"] == "SKIP" else None
        if key is None or len(groups[key]) == 1:
            collapsed.append(row)
        elif key not in done:
            done.add(key)
            collapsed.append({**row, "gpu": None, "check": f"{len(groups[key])} checks", "detail": key})
    return collapsed


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    interrupted = exitstatus == pytest.ExitCode.INTERRUPTED
    stopped = _interrupted_row() if interrupted else None
    if stopped:
        _CONFIG_RESULTS.append(stopped)
    if not _CONFIG_RESULTS:
        return
    terminalreporter.write_sep("=", "inference-host health verdict")
    terminalreporter.write_line(verdict_table(_CONFIG_RESULTS, interrupted=interrupted))
    path = config.getoption("--report-json")
    if path:
        write_report(Path(path), _CONFIG_RESULTS, config, interrupted=interrupted)
        terminalreporter.write_line(f"JSON report: {path}")


def write_report(path: Path, results: list[dict], config, interrupted: bool = False) -> None:
    """The JSON report. An interrupted run (Ctrl-C, SIGTERM) keeps the checks that ran, and is
    never "healthy": the checks it did not reach said nothing."""
    hosts = {key: {k: v for k, v in vars(e).items()} for key, e in _EXPECTATIONS.items()}
    failed = any(r["verdict"] == "FAIL" for r in results)
    payload = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(config._ih_started)),
        "seconds": round(time.time() - config._ih_started, 1),
        "verdict": "interrupted" if interrupted else "unhealthy" if failed else "healthy",
        "interrupted": interrupted,
        "expectations": hosts,
        "checks": results,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
