"""`smg launch`'s command line, rendered from the inventory and checked against the pinned
smg release's real options (roles/gateway/cli/<version>.json, made by cli_capture.py from
the wheel)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

from roles.shared.layout import GATEWAY_TLS_FILES, GATEWAY_WORKERS_CA_FILE
from roles.shared.replicas import replicas, worker_url, workers_ca_file
from roles.site import HostSettings

CLI_DIR = Path(__file__).resolve().parent / "cli"


def api_key_secret(hosts: dict[str, HostSettings]) -> str | None:
    """The key the gateway checks: the replicas' serving_api_key_secret (one for all)."""
    return next((n.serving.api_key_secret for n in replicas(hosts) if n.serving.api_key_secret), None)


def gateway_arguments(settings: HostSettings, hosts: dict[str, HostSettings]) -> list[str]:
    """`smg launch` arguments (smg/router_args.py, 1.13.0); the key is added by smg-launch."""
    gateway = settings.gateway
    return [
        "--host",
        gateway.host,
        "--port",
        str(gateway.port),
        "--worker-urls",
        *[worker_url(node) for node in replicas(hosts)],
        "--policy",
        gateway.policy,
        "--prometheus-host",
        gateway.prometheus_host,
        "--prometheus-port",
        str(gateway.prometheus_port),
        "--health-check-interval-secs",
        str(gateway.health_check_interval),
        "--health-failure-threshold",
        str(gateway.health_failure_threshold),
        # A worker that does not answer when smg starts is checked again every this many seconds
        # (default 30 in smg/router_args.py, 1.13.0): at the probe's own cadence instead.
        "--worker-startup-check-interval",
        str(gateway.health_check_interval),
        # SGLang's /health answers 200 once the server is up (http_server.py, 0.5.9).
        "--health-check-endpoint",
        "/health",
        *tls_arguments(settings, hosts),
    ]


def tls_arguments(settings: HostSettings, hosts: dict[str, HostSettings]) -> list[str]:
    """smg 1.13.0's own TLS options (smg/router_args.py): --tls-cert-path/--tls-key-path (its
    RouterArgs' server_cert_path/server_key_path) with gateway_tls_*, files written 0600 for smg
    (never the PEM on the command line); --ca-cert-paths, the CA its workers' HTTP client adds as a
    root (add_root_certificate; nothing in smg turns verification off), when the replicas serve TLS
    and so are reached at https:// (roles/shared/replicas.py worker_url)."""
    arguments = []
    if settings.gateway.tls_enabled:
        arguments += ["--tls-cert-path", GATEWAY_TLS_FILES["cert"], "--tls-key-path", GATEWAY_TLS_FILES["key"]]
    if workers_ca_file(hosts):
        arguments += ["--ca-cert-paths", GATEWAY_WORKERS_CA_FILE]
    return arguments


@cache
def cli_options(version: str) -> dict | None:
    path = CLI_DIR / f"{version}.json"
    return json.loads(path.read_text())["options"] if path.is_file() else None


def flag_problems(args: list[str], version: str) -> list[str]:
    """Problems with args against `smg launch` of smg==version (values of nargs='*' options
    run until the next --flag)."""
    options = cli_options(version)
    if options is None:
        return [
            f"no captured command line for smg {version} (roles/gateway/cli/{version}.json); expected one"
            f" made by `uv run --no-project --with smg=={version} python roles/gateway/cli_capture.py`"
        ]
    problems, index = [], 0
    while index < len(args):
        flag, option = args[index], options.get(args[index])
        values = []
        index += 1
        while index < len(args) and not args[index].startswith("--"):
            values.append(args[index])
            index += 1
        if option is None:
            problems.append(f"{flag} is not an option of smg {version}")
        elif option["takes_value"] and not values:
            problems.append(f"{flag} needs a value")
        elif not option["takes_value"] and values:
            problems.append(f"{flag} takes no value (got {' '.join(values)})")
        elif len(values) > 1 and not option["many"]:
            problems.append(f"{flag} takes one value (got {' '.join(values)})")
        elif option["choices"] and any(v not in option["choices"] for v in values):
            problems.append(f"{flag} {' '.join(values)} is not one of {option['choices']} in smg {version}")
    return problems


def gateway_problems(settings: HostSettings, hosts: dict[str, HostSettings]) -> list[str]:
    """Validation-time check of a gateways host."""
    if not replicas(hosts):
        return ["the gateways group needs gpu nodes to send requests to; expected at least one host in gpu_nodes"]
    return [
        f"the gateway command line is invalid: {p}; expected the flags of `smg launch --help` of smg"
        f" {settings.gateway.version}"
        for p in flag_problems(gateway_arguments(settings, hosts), settings.gateway.version)
    ]
