"""Plain HTTP beyond loopback is acknowledged in the inventory, never silent.

The engine (SGLang, vLLM) and the gateway (smg) take the bearer key on every request
(Authorization header). Bound to anything but loopback and served without TLS, the key and the
prompts cross the network in clear to whoever can listen on it. The engine serves TLS when
serving_tls_cert_secret and serving_tls_key_secret name vault entries (check_engine_tls); a bind
beyond loopback without it must say why plain HTTP is acceptable there:
serving_plaintext_acknowledged on a gpu node, gateway_plaintext_acknowledged on a gateway (the
deploy renders no TLS for the gateway yet). Without it the inventory is refused, one
line per listener, before any host is touched. With it, `python -m roles.site` still shows each
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
        f"{prefix}_plaintext_acknowledged = '<why plain HTTP is acceptable on this network>'"
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
        ):
            problems.append(_problem(here, "gateway_host", host.gateway.host, "the gateway"))


def check_engine_tls(
    site_hosts: dict[str, HostSettings], where: str, secret_names, secrets_file: str | None, problems: list[str]
) -> None:
    """serving_tls_cert_secret and serving_tls_key_secret come as a pair, each a key the vault has,
    on a gpu node not behind a gateway (which would need https:// worker URLs and its own CA; not
    built). Whether the release can serve TLS at all is the engine's own check
    (roles/serving/command.py, against the release's captured CLI)."""
    behind_gateway = any(host.in_group("gateways") for host in site_hosts.values())
    for host in site_hosts.values():
        if not host.in_group("gpu_nodes") or not host.valid("serving_tls_cert_secret", "serving_tls_key_secret"):
            continue
        here = f"{where}: host {host.name}"
        cert, key = host.serving.tls_cert_secret, host.serving.tls_key_secret
        if cert and not key:
            problems.append(
                f"{here}: serving_tls_cert_secret = {cert!r} without serving_tls_key_secret; expected both (the"
                " certificate and its private key, each a vault key) or neither"
            )
        if key and not cert:
            problems.append(
                f"{here}: serving_tls_key_secret = {key!r} without serving_tls_cert_secret; expected both (the"
                " certificate and its private key, each a vault key) or neither"
            )
        for setting, ref in (("serving_tls_cert_secret", cert), ("serving_tls_key_secret", key)):
            problem = _reference_problem(setting, ref, secret_names, secrets_file)
            if problem:
                problems.append(f"{here}: {problem}")
        if cert and key and behind_gateway:
            problems.append(
                f"{here}: serving_tls_cert_secret with a gateway in front: smg would reach this replica at an"
                " http:// URL; TLS from the gateway to its workers is not built yet; expected no serving_tls_*"
                " on a replica behind a gateway (and serving_plaintext_acknowledged, or a network only the"
                " gateways reach: docs/security.md#tls)"
            )
