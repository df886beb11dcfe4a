"""The health checks as metrics: run the fast suites on this host and write their verdicts and
evidence for node_exporter's textfile collector, atomically.

    python -m checks.textfile --expect-file /etc/inference-host/checks/expect.json \\
        --suites gpu,service,server --out /var/lib/prometheus/node-exporter/inference_host_checks.prom

roles/monitoring runs it from a systemd timer on every gpu node (monitoring_check_interval),
under the unit's CPUQuota= and TimeoutStartSec= (monitoring_check_cpu_quota_percent,
monitoring_check_timeout_s). It runs `python -m checks --hosts local://` with the
expectations the deploy rendered from the site model, without the probes that load every GPU
(--no-bandwidth-probes), and never stops or restarts the engine (only `--dcgm-level` would, and
it is not passed). Every command the checks run is bounded (checks/bounded.py) and the whole run
ends within --deadline-s (default 90 s, under the unit's default TimeoutStartSec=120): a wedged
`nvidia-smi` is a failed check named in inference_host_check_failure_info, not a killed unit.

Output, the Prometheus text exposition format 0.0.4 (prometheus/docs, "Exposition formats";
node_exporter's textfile collector reads it), one family per metric with HELP and TYPE:

    inference_host_check_ok{suite,check[,gpu]}            1 passed, 0 failed
    inference_host_check_skipped{suite,check[,gpu]}       1 (no evidence on this host)
    inference_host_check_failure_info{suite,check[,gpu],detail}   1, detail = expected/found/what to do
    inference_host_<evidence>{[gpu,...]}                  the numbers the checks judged
    inference_host_checks_last_run_timestamp_seconds, _run_seconds, _failed

The file is written to a temporary name beside it (not *.prom, which the collector would read
half-written) and renamed over the old one: a scrape sees the old run or the new one, never a
mix. When the run produced no report, the old file stays (its timestamp ages: ChecksNotRunning).
A malformed expectations file (not JSON, not an object, a value the site model refuses) is one
line naming the file, what is wrong and what is valid, exit 2, and the old file stays too.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import tempfile
import time
from pathlib import Path

from roles.site.command_line import OneLineParser

PREFIX = "inference_host_"
NAME_RE = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
LABEL_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
DETAIL_MAX = 400  # characters of a failure's detail kept in its label

HELP = {
    "check_ok": "1 when the inference-host health check passed, 0 when it failed (skipped: absent).",
    "check_skipped": "1 when the health check had no evidence on this host and was skipped.",
    "check_failure_info": "A failing health check's message: expected, found, what to do.",
    "check_seconds": "How long the health check took.",
    "checks_last_run_timestamp_seconds": "When the periodic health checks last completed.",
    "checks_run_seconds": "How long the last run of the periodic health checks took.",
    "checks_failed": "How many health checks failed in the last run.",
}


def escape(value: str) -> str:
    """A label value as the text format wants it: backslash, double quote and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(int(value)) if float(value).is_integer() and abs(value) < 2**53 else repr(float(value))


class Families:
    """Samples grouped by metric name, each name once with its HELP and TYPE (all gauges)."""

    def __init__(self):
        self.samples: dict[str, dict[tuple, float]] = {}
        self.help: dict[str, str] = {}

    def add(self, name: str, labels: dict[str, str], value: float, help_text: str) -> None:
        full = PREFIX + name
        if not NAME_RE.match(full):
            raise ValueError(f"not a metric name: {full!r}")
        bad = [k for k in labels if not LABEL_RE.match(k) or k.startswith("__")]
        if bad:
            raise ValueError(f"not label names: {bad}")
        self.help.setdefault(full, help_text)
        key = tuple(sorted((k, str(v)) for k, v in labels.items() if v is not None and str(v) != ""))
        self.samples.setdefault(full, {})[key] = float(value)

    def text(self) -> str:
        lines = []
        for name in sorted(self.samples):
            lines.append(f"# HELP {name} {self.help[name]}")
            lines.append(f"# TYPE {name} gauge")
            for key, value in sorted(self.samples[name].items()):
                labels = ",".join(f'{k}="{escape(v)}"' for k, v in key)
                lines.append(f"{name}{{{labels}}} {number(value)}" if labels else f"{name} {number(value)}")
        return "\n".join(lines) + "\n"


def exposition(report: dict, now: float) -> str:
    """The metrics of one JSON report of `python -m checks` (checks/conftest.py)."""
    families = Families()
    failed = 0
    for result in report.get("checks", []):
        labels = {
            "suite": result["suite"],
            "check": result["check"],
            "gpu": None if result.get("gpu") is None else str(result["gpu"]),
        }
        verdict = result["verdict"]
        if verdict == "SKIP":
            families.add("check_skipped", labels, 1, HELP["check_skipped"])
        else:
            families.add("check_ok", labels, 1 if verdict in ("PASS", "WARN") else 0, HELP["check_ok"])
        if verdict == "FAIL":
            failed += 1
            detail = " ".join(str(result.get("detail", "")).split())[:DETAIL_MAX]
            families.add("check_failure_info", {**labels, "detail": detail}, 1, HELP["check_failure_info"])
        families.add("check_seconds", labels, result.get("seconds") or 0, HELP["check_seconds"])
        for item in result.get("evidence", []):
            evidence_labels = {"gpu": labels["gpu"], **item.get("labels", {})}
            families.add(
                item["name"],
                evidence_labels,
                item["value"],
                f"Evidence of the health check '{result['check']}' ({result['suite']}).",
            )
    families.add("checks_last_run_timestamp_seconds", {}, now, HELP["checks_last_run_timestamp_seconds"])
    families.add("checks_run_seconds", {}, report.get("seconds") or 0, HELP["checks_run_seconds"])
    families.add("checks_failed", {}, failed, HELP["checks_failed"])
    return families.text()


def write_atomically(path: Path, text: str) -> None:
    """Temporary file in the same directory (same filesystem: rename is atomic), then rename."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temporary, 0o644)  # node_exporter runs as its own user
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


class ExpectationsError(ValueError):
    """The expectations file cannot be used: one line, the file, what is wrong, what is valid."""


VALID = 'expected a JSON object of expectation keys, e.g. {"gpu_count": 8} (roles/monitoring writes it)'


def expect_arguments(path: Path) -> list[str]:
    """--expect KEY=VALUE arguments from the JSON object roles/monitoring renders. Values go as
    JSON (which --expect reads as YAML: None stays None, "1.0" stays a string); the few keys
    that are no setting (driver_version, engine, api_key_file) are taken as plain text."""
    from checks.expectations import EXTRA_KEYS

    try:
        data = json.loads(path.read_text())
    except OSError as error:
        raise ExpectationsError(f"{path}: cannot be read ({error.strerror or error}); {VALID}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ExpectationsError(f"{path}: not JSON ({error}); {VALID}") from None
    if not isinstance(data, dict):
        raise ExpectationsError(f"{path}: a JSON {_json_kind(data)}, not an object; {VALID}")
    return [f"--expect={key}={value if key in EXTRA_KEYS else json.dumps(value)}" for key, value in data.items()]


def _json_kind(value) -> str:
    kinds = {list: "list", str: "string", bool: "boolean", int: "number", float: "number", type(None): "null"}
    return kinds.get(type(value), type(value).__name__)


def checked_arguments(path: Path) -> list[str]:
    """The file's --expect arguments, each value judged by the site model as in an inventory
    (checks.expectations), so that a wrong type is one line here, before the checks run."""
    from checks.expectations import Expectations
    from roles.site import SiteError

    arguments = expect_arguments(path)
    try:
        Expectations.from_overrides([a.removeprefix("--expect=") for a in arguments])
    except SiteError as error:
        problems = "; ".join(p.removeprefix("--expect ").removeprefix("--expect: host local: ") for p in error.problems)
        raise ExpectationsError(f"{path}: {problems}") from None
    return arguments


def run(expect_file: Path, suites: str, out: Path, deadline_s: float = 90) -> int:
    from checks.__main__ import main as run_checks

    try:
        expectations = checked_arguments(expect_file)
    except ExpectationsError as error:
        print(f"inference-host checks: {error}; {out} is left as it was", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="inference-host-checks-") as folder:
        report = Path(folder) / "report.json"
        code = run_checks(
            [
                "--hosts",
                "local://",
                "--suites",
                suites,
                "--report",
                str(report),
                "--no-bandwidth-probes",
                f"--deadline-s={deadline_s:g}",
                *expectations,
            ]
        )
        if not report.exists():
            print(f"inference-host checks: no report (exit {code}); {out} is left as it was", file=sys.stderr)
            return 2
        write_atomically(out, exposition(json.loads(report.read_text()), time.time()))
    print(f"inference-host checks: exit {code}; wrote {out}")
    return 0  # a failed check is a metric, not a failed unit


def main(argv=None) -> int:
    parser = OneLineParser(prog="python -m checks.textfile", description=__doc__.split("\n")[0])
    parser.add_argument("--expect-file", required=True, type=Path)
    parser.add_argument("--suites", default="gpu,service,server")
    parser.add_argument("--out", required=True, type=Path, help="the .prom file in the textfile directory")
    parser.add_argument(
        "--deadline-s",
        type=float,
        default=90,
        help="total bound of the checks (default %(default)g s: under the unit's default "
        "TimeoutStartSec of 120 s, so a wedged command is a failure metric, not a killed run)",
    )
    args = parser.parse_args(argv)
    return run(args.expect_file, args.suites, args.out, args.deadline_s)


if __name__ == "__main__":
    raise SystemExit(main())
