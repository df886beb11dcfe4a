"""Replicas behind SGLang's model gateway: the addresses roles/serving and roles/gateway share.

A replica is one gpu node serving a whole copy of the model (serving_topology = "replicas");
with serving_topology = "tensor_parallel" the group is one server and only rank 0 serves HTTP
(sglang 0.5.9 srt/entrypoints/engine.py: ranks >= 1 run a dummy health server only).
"""

from __future__ import annotations

from roles.shared.layout import GATEWAY_TLS_FILES, REPLICA_GATEWAY_CA_FILE, SYSTEM_CA_BUNDLE
from roles.shared.tls import curl_tls_options, https_url, local_address, url_host
from roles.site import HostSettings, address_of


def worker_url(node: HostSettings) -> str:
    """Where the gateway reaches a gpu node's server: its bind address, or for a wildcard bind
    the address the node is reached at (ssh_hostname or its name); with serving_tls_*,
    https://NAME:PORT, NAME that address (address_of), the name the certificate covers."""
    if node.serving.tls_enabled:
        return https_url(address_of(node), node.serving.port)
    bound = node.serving.host
    address = address_of(node) if bound in ("0.0.0.0", "::") else bound
    return f"http://{url_host(address)}:{node.serving.port}"


def replicas(hosts: dict[str, HostSettings]) -> list[HostSettings]:
    """The gpu nodes that serve HTTP, in inventory order."""
    nodes = [h for h in hosts.values() if h.in_group("gpu_nodes")]
    if nodes and nodes[0].serving.topology == "tensor_parallel":
        return nodes[:1]
    return nodes


def gateway_url(gateway: HostSettings) -> str:
    """Where the gpu nodes reach a gateway's control plane (GET/POST/DELETE /workers); with
    gateway_tls_*, https://NAME:PORT, NAME the gateway's address_of, the name its certificate covers."""
    if gateway.gateway.tls_enabled:
        return https_url(address_of(gateway), gateway.gateway.port)
    bound = gateway.gateway.host
    address = address_of(gateway) if bound in ("0.0.0.0", "::") else bound
    return f"http://{url_host(address)}:{gateway.gateway.port}"


def gateways(hosts: dict[str, HostSettings]) -> list[HostSettings]:
    return [h for h in hosts.values() if h.in_group("gateways")]


def control_plane_key_secret(hosts: dict[str, HostSettings]) -> str | None:
    """The vault key of the gateways' control-plane key: one for every gateway (the site rules),
    which a replica's rolling upgrade drains it with."""
    return next((g.gateway.control_plane_api_key_secret for g in gateways(hosts)), None)


def gateway_ca_file(hosts: dict[str, HostSettings]) -> str | None:
    """The local CA file the gateways' certificates are verified with (gateway_tls_ca_file: one
    for every gateway that serves TLS, a site rule), or None: the hosts' bundles."""
    return next(
        (g.gateway.tls_ca_file for g in gateways(hosts) if g.gateway.tls_enabled and g.gateway.tls_ca_file), None
    )


def workers_ca_file(hosts: dict[str, HostSettings]) -> str | None:
    """The local CA file the gateway verifies its TLS workers with (--ca-cert-paths): their
    serving_tls_ca_file, one for every replica that serves TLS (a site rule); None: no TLS worker."""
    return next((n.serving.tls_ca_file for n in replicas(hosts) if n.serving.tls_enabled), None)


def gateway_on_its_host(gateway: HostSettings) -> tuple[str, list[str]]:
    """The gateway's base URL for a client on its own host (the deploy's readiness wait, the gateway
    check, `inference-host status`) and curl's TLS options: plain HTTP on its local address, or with
    gateway_tls_* https://NAME:PORT (NAME its address_of, which its certificate covers) verified
    with gateway_tls_ca_file's copy (else the host's bundle), connecting to its local address."""
    settings, address = gateway.gateway, local_address(gateway.gateway.host)
    if not settings.tls_enabled:
        return f"http://{address}:{settings.port}", []
    ca = GATEWAY_TLS_FILES["ca"] if settings.tls_ca_file else SYSTEM_CA_BUNDLE
    return https_url(address_of(gateway), settings.port), curl_tls_options(ca, address)


def gateways_ca_on_replicas(hosts: dict[str, HostSettings]) -> str:
    """The CA file on a replica its clients (the rolling drain, the benchmark through a gateway)
    verify the gateways with: gateway_tls_ca_file's copy (roles/serving), else the host's bundle."""
    return REPLICA_GATEWAY_CA_FILE if gateway_ca_file(hosts) else SYSTEM_CA_BUNDLE
