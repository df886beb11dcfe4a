"""Health of the replicas behind SGLang's model gateway: HEALTHY, DEGRADED or FAILED.

    uv run python -m checks.gateway INVENTORY [--host GATEWAY]     # exit 0 / 3 / 1

A replica that is down does not make the endpoint down: the gateway routes around it. So the
verdict has three values, judged from what the gateway itself reports and does:
- HEALTHY: a generation through the gateway succeeds and every replica the inventory names is
  registered and healthy;
- DEGRADED: the endpoint still serves, but some replica is missing, unhealthy or draining
  (named, with what the gateway says about it);
- FAILED: no generation through the gateway succeeds.

smg 1.13.0's GET /workers answers {"workers": [{"id", "url", "is_healthy", "status": "ready" |
"not_ready" | "draining", ...}], "total": N} (checked with the control-plane key where the gateway
has one, /etc/smg/control-plane-api-key: smg then refuses the client key there).
The requests run on the gateway host with curl (with gateway_tls_*: https://NAME:PORT verified with
the CA the deploy put there, --cacert and --connect-to its own address; docs/security.md#tls); the
key is read there from the 0600 file the gateway role wrote (/etc/smg/api-key, root only: run with
--sudo when not connecting as root) and goes to curl on a file descriptor, never on a command
line. Every request is bounded (checks/bounded.py) and marked as the engine's are
(server_checks.marked_request): a gateway that accepts and never answers costs one curl timeout,
and the next request fails at once naming it.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass

from checks.server_checks import STATUS_MARKER, HttpAnswer, marked_request
from roles.shared.layout import GATEWAY_API_KEY_FILE, GATEWAY_CONTROL_PLANE_KEY_FILE
from roles.shared.replicas import gateway_on_its_host
from roles.shared.shell import Shell, argv, sh
from roles.site import SiteError, load_site
from roles.site.command_line import OneLineParser
from roles.site.errors import print_problems

API_KEY_FILE = GATEWAY_API_KEY_FILE  # where roles/gateway writes it
EXIT = {"HEALTHY": 0, "FAILED": 1, "DEGRADED": 3}


@dataclass(frozen=True)
class Verdict:
    status: str  # HEALTHY, DEGRADED, FAILED
    detail: str
    down: tuple[str, ...] = ()


def judge(workers: HttpAnswer, generation: HttpAnswer, expected: list[str]) -> Verdict:
    """Pure: the gateway's /workers answer, one generation through it, the inventory's worker URLs."""
    if generation.status != 200:
        found = f"HTTP {generation.status}" if generation.status else f"no answer ({generation.error})"
        return Verdict(
            "FAILED", f"a generation through the gateway got {found}: {generation.body[:200]}", tuple(expected)
        )
    if workers.status != 200:
        return Verdict(
            "DEGRADED",
            f"the endpoint serves, but GET /workers answered HTTP {workers.status}; the replicas' state is unknown",
            (),
        )
    listed = {w["url"]: w for w in workers.json().get("workers", [])}
    down = []
    for url in expected:
        worker = listed.get(url)
        if worker is None:
            down.append((url, "not registered at the gateway"))
        elif not worker.get("is_healthy") or worker.get("status") != "ready":
            down.append((url, f"status {worker.get('status')}, healthy {worker.get('is_healthy')}"))
    if not down:
        return Verdict("HEALTHY", f"{len(expected)} of {len(expected)} replicas ready; the endpoint serves")
    serving = len(expected) - len(down)
    return Verdict(
        "DEGRADED",
        f"the endpoint serves on {serving} of {len(expected)} replicas; down: "
        + "; ".join(f"{url} ({why})" for url, why in down)
        + ". Read `journalctl -u <serving unit>` on that node; the gateway adds it back when"
        " its /health answers",
        tuple(url for url, _ in down),
    )


def request_command(base_url: str, tls: list[str], path: str, body: dict | None = None, seconds: int = 60) -> Shell:
    """The root shell command (bash) that sends one request to the gateway on its own host
    (base_url and tls: roles/shared/replicas.py gateway_on_its_host; with gateway_tls_* curl verifies
    it with the CA, never -k): the key from the 0600 file, to curl on a file descriptor; every value
    quoted (roles/shared/shell.py)."""
    # curl reads `\n` in -w as a newline: the marker line follows the body on a line of its own.
    curl = sh(
        '{curl} -w {write_out} -K <(printf \'header = "Authorization: Bearer %s"\\n\' "$KEY")',
        curl=argv("curl", "-sS", "-m", str(int(seconds)), *tls),
        write_out="\\n" + STATUS_MARKER + "%{http_code} %{time_total}",
    )
    data = sh("")
    if body is not None:
        curl = sh("{curl} -H 'Content-Type: application/json' --data-binary @-", curl=curl)
        data = sh("printf %s {body} | ", body=json.dumps(body))
    # /workers is the control plane: its own key where the gateway has one, else the API key.
    key_files = [GATEWAY_CONTROL_PLANE_KEY_FILE, API_KEY_FILE] if path.startswith("/workers") else [API_KEY_FILE]
    script = sh(
        "KEY=$(cat {key_files} 2>/dev/null | head -n1); {data}{curl} {url}",
        key_files=key_files,
        data=data,
        curl=curl,
        url=f"{base_url}{path}",
    )
    return sh("bash -c {script}", script=str(script))


def _request(
    host, base_url: str, path: str, body: dict | None = None, sudo: bool = False, timeout_s: int = 60, tls=()
) -> HttpAnswer:
    command = request_command(base_url, list(tls), path, body, timeout_s)
    command = sh("sudo {command}", command=command) if sudo else command
    return marked_request(host, base_url, path, command, timeout_s)


def check(
    host, base_url: str, model: str, expected: list[str], sudo: bool = False, timeout_s: int = 60, tls=()
) -> Verdict:
    """The verdict of the gateway on the bounded host (base_url and tls: gateway_on_its_host):
    raises CommandOverrun when it did not answer (the second request, refused at once, names the first)."""
    generation = _request(
        host,
        base_url,
        "/v1/chat/completions",
        {"model": model, "max_tokens": 4, "temperature": 0, "messages": [{"role": "user", "content": "Say ok."}]},
        sudo,
        timeout_s,
        tls,
    )
    workers = _request(host, base_url, "/workers", sudo=sudo, timeout_s=timeout_s, tls=tls)
    return judge(workers, generation, expected)


def main(argv=None) -> int:
    parser = OneLineParser(prog="python -m checks.gateway", description=__doc__.split("\n")[0])
    parser.add_argument("inventory")
    parser.add_argument("--host", help="the gateway (default: every host of the gateways group)")
    parser.add_argument("--sudo", action="store_true", help="read the key with sudo (non-root SSH user)")
    args = parser.parse_args(argv)

    from checks import bounded
    from checks.connection import testinfra_url
    from roles.shared.replicas import replicas, worker_url

    try:
        site = load_site(args.inventory)
        gateways = [g for g in site.group("gateways") if not args.host or g.name == args.host]
        if not gateways:
            # Nothing checked is no verdict: say so and fail, before any host is contacted.
            known = ", ".join(g.name for g in site.group("gateways"))
            raise SiteError(
                [
                    f"{args.inventory}: no host {args.host!r} in the gateways group; expected one of: {known}"
                    if args.host and known
                    else f"{args.inventory}: the gateways group is empty; nothing to check (add the"
                    " gateway hosts to `gateways`, or check a gpu node with python -m checks)"
                ]
            )
    except SiteError as error:
        print_problems(error)
        return 2
    expected = [worker_url(node) for node in replicas(site.hosts)]
    worst = 0
    for gateway in gateways:
        # Every command bounded (checks/bounded.py): a gateway that never answers is a FAIL line.
        host = bounded.own_host(testinfra_url(args.inventory, gateway.name))
        model = replicas(site.hosts)[0].serving.served_model_name
        try:
            base_url, tls = gateway_on_its_host(gateway)
            verdict = check(host, base_url, model, expected, args.sudo, tls=tls)
        except bounded.CommandOverrun as error:
            print(f"{gateway.name}: FAIL  {error}")
            worst = 1
            continue
        print(f"{gateway.name}: {verdict.status}  {verdict.detail}")
        worst = max(worst, EXIT[verdict.status], key=lambda code: [0, 3, 1].index(code))
    return worst


if __name__ == "__main__":
    sys.exit(main())
