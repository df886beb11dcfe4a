"""Plain HTTP beyond loopback is acknowledged in the inventory, never silent.

The engine (SGLang, vLLM) and the gateway (smg) take the bearer key on every request
(Authorization header). Bound to anything but loopback and served without TLS, the key and the
prompts cross the network in clear to whoever can listen on it. The engine serves TLS when
serving_tls_cert_secret and serving_tls_key_secret name vault entries, the gateway when
gateway_tls_cert_secret and gateway_tls_key_secret do (check_engine_tls); a bind beyond loopback
without TLS must say why plain HTTP is acceptable there: serving_plaintext_acknowledged on a gpu
node, gateway_plaintext_acknowledged on a gateway. Without it the inventory is refused, one
line per listener, before any host is touched. With it, `inference-host validate` still shows each
such listener as a WARNING line with the reason given (roles/site/schema.py, plaintext_lines).
"""

from __future__ import annotations

from roles.site.rules_secrets import _reference_problem
from roles.site.schema import HostSettings, is_loopback


def _problem(where: str, setting: str, address: str, what: str, loopback_possible: bool = True) -> str:
    prefix = setting.split("_", 1)[0]
    # A replica behind a gateway cannot bind loopback (the gateway reaches it over the network;
    # rules_services refuses it): only the acknowledgement is advice there.
    loopback = f"{setting} = '127.0.0.1', or " if loopback_possible else ""
    return (
        f"{where}: {setting} = {address!r} serves {what} in plain HTTP beyond this host (the API key"
        f" and prompts cross the network in clear); expected {loopback}"
        f"{prefix}_tls_cert_secret and {prefix}_tls_key_secret (it then serves TLS), or"
        f" {prefix}_plaintext_acknowledged = '<why plain HTTP is acceptable on this network>'"
        " (docs/security.md#tls)"
    )


def check_plaintext_listeners(site_hosts: dict[str, HostSettings], where: str, problems: list[str]) -> None:
    """Each gpu node's engine and each gateway bound beyond loopback carries its acknowledgement."""
    behind_gateway = any(host.in_group("gateways") for host in site_hosts.values())
    for host in site_hosts.values():
        here = f"{where}: host {host.name}"
        if (
            host.in_group("gpu_nodes")
            and host.valid("serving_host", "serving_plaintext_acknowledged")
            and not is_loopback(host.serving.host)
            and host.serving.plaintext_acknowledged is None
            and not host.serving.tls_enabled
        ):
            problems.append(_problem(here, "serving_host", host.serving.host, "the engine", not behind_gateway))
        if (
            host.in_group("gateways")
            and host.valid("gateway_host", "gateway_plaintext_acknowledged")
            and not is_loopback(host.gateway.host)
            and host.gateway.plaintext_acknowledged is None
            and not host.gateway.tls_enabled
        ):
            problems.append(_problem(here, "gateway_host", host.gateway.host, "the gateway"))


def _pair_problems(here: str, prefix: str, cert: str | None, key: str | None, secret_names, secrets_file) -> list[str]:
    """<prefix>_tls_cert_secret and <prefix>_tls_key_secret come as a pair, each a key the vault has:
    the engine's (serving) and the gateway's (gateway) alike."""
    problems = []
    for have, lack, value in (("cert", "key", cert), ("key", "cert", key)):
        if value and not (key if have == "cert" else cert):
            problems.append(
                f"{here}: {prefix}_tls_{have}_secret = {value!r} without {prefix}_tls_{lack}_secret; expected both"
                " (the certificate and its private key, each a vault key) or neither"
            )
    for setting, ref in ((f"{prefix}_tls_cert_secret", cert), (f"{prefix}_tls_key_secret", key)):
        problem = _reference_problem(setting, ref, secret_names, secrets_file)
        if problem:
            problems.append(f"{here}: {problem}")
    return problems


def check_engine_tls(
    site_hosts: dict[str, HostSettings], where: str, secret_names, secrets_file: str | None, problems: list[str]
) -> None:
    """serving_tls_* on each gpu node and gateway_tls_* on each gateway come as pairs of vault keys
    (_pair_problems). Whether the release can serve TLS at all is the engine's own check
    (roles/serving/command.py, against the release's captured CLI). Behind gateways, the TLS
    replicas and gateways are refused where smg or the replicas' clients could not verify them."""
    for host in site_hosts.values():
        here = f"{where}: host {host.name}"
        if host.in_group("gpu_nodes") and host.valid("serving_tls_cert_secret", "serving_tls_key_secret"):
            cert, key = host.serving.tls_cert_secret, host.serving.tls_key_secret
            problems += _pair_problems(here, "serving", cert, key, secret_names, secrets_file)
        if host.in_group("gateways") and host.valid("gateway_tls_cert_secret", "gateway_tls_key_secret"):
            cert, key = host.gateway.tls_cert_secret, host.gateway.tls_key_secret
            problems += _pair_problems(here, "gateway", cert, key, secret_names, secrets_file)
    if any(host.in_group("gateways") for host in site_hosts.values()):
        _check_workers_ca(site_hosts, where, problems)
        _check_gateways_ca(site_hosts, where, problems)


def _check_workers_ca(site_hosts: dict[str, HostSettings], where: str, problems: list[str]) -> None:
    """Replicas that serve TLS behind a gateway: smg reaches them at https://NAME:PORT and verifies
    them with the CA the deploy gives it (--ca-cert-paths, their serving_tls_ca_file), so each names
    one, and the same one. smg makes ONE HTTP client for all its workers and adds every
    --ca-cert-paths file to it as a root (model_gateway/src/app_context.rs, with_client, read at
    commit 01c192f of lightseekorg/smg: "a single HTTP client for all workers ... single security
    domain"): a CA per replica would let each vouch for every other's name. Some replicas in TLS
    and others in plain HTTP is not refused: that one client sends each request by its URL's
    scheme (http:// stays plain), and a plain replica beyond loopback is judged on its own
    (serving_plaintext_acknowledged)."""
    served = [
        h
        for h in site_hosts.values()
        if h.in_group("gpu_nodes") and h.valid("serving_tls_ca_file") and h.serving.tls_enabled
    ]
    first = next((h for h in served if h.serving.tls_ca_file), None)
    for host in served:
        here = f"{where}: host {host.name}"
        if not host.serving.tls_ca_file:
            problems.append(
                f"{here}: serving_tls_cert_secret behind a gateway without serving_tls_ca_file; expected"
                " serving_tls_ca_file = '<local PEM file of the CA that signed it>': the gateway verifies"
                " its workers with that CA (smg --ca-cert-paths; docs/security.md#tls)"
            )
        elif first is not None and host.serving.tls_ca_file != first.serving.tls_ca_file:
            problems.append(
                f"{here}: serving_tls_ca_file = {host.serving.tls_ca_file!r} differs from host {first.name}'s"
                f" {first.serving.tls_ca_file!r}; expected one CA for every replica behind the gateway (smg"
                " trusts each --ca-cert-paths CA for all its workers: docs/security.md#tls)"
            )


def _check_gateways_ca(site_hosts: dict[str, HostSettings], where: str, problems: list[str]) -> None:
    """Gateways that serve TLS share one gateway_tls_ca_file (or none: the hosts' bundles): each
    replica verifies every gateway it drains itself at with one CA file (inference-engine-rolling,
    --gateway-ca), as the gateways share one control-plane key."""
    served = [
        h
        for h in site_hosts.values()
        if h.in_group("gateways") and h.valid("gateway_tls_ca_file") and h.gateway.tls_enabled
    ]
    for host in served[1:]:
        if host.gateway.tls_ca_file != served[0].gateway.tls_ca_file:
            problems.append(
                f"{where}: host {host.name}: gateway_tls_ca_file = {host.gateway.tls_ca_file!r} differs from host"
                f" {served[0].name}'s {served[0].gateway.tls_ca_file!r}; expected one CA for every gateway that"
                " serves TLS (the replicas verify them all with it: docs/security.md#tls)"
            )
