"""Plain HTTP beyond loopback is acknowledged in the inventory, never silent.

The engine (SGLang, vLLM) and the gateway (smg) take the bearer key on every request
(Authorization header). Bound to anything but loopback and served without TLS, the key and the
prompts cross the network in clear to whoever can listen on it. The deploy renders no TLS for
either listener yet (docs/security.md#tls says which component could terminate it on each stack),
so such a bind must say why plain HTTP is acceptable there: serving_plaintext_acknowledged on a
gpu node, gateway_plaintext_acknowledged on a gateway. Without it the inventory is refused, one
line per listener, before any host is touched. With it, `python -m roles.site` still shows each
such listener as a WARNING line with the reason given (roles/site/schema.py, plaintext_lines).
"""

from __future__ import annotations

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
        ):
            problems.append(_problem(here, "serving_host", host.serving.host, "the engine", not behind_gateway))
        if (
            host.in_group("gateways")
            and host.valid("gateway_host", "gateway_plaintext_acknowledged")
            and not is_loopback(host.gateway.host)
            and host.gateway.plaintext_acknowledged is None
        ):
            problems.append(_problem(here, "gateway_host", host.gateway.host, "the gateway"))
