"""Replicas behind SGLang's model gateway: the addresses roles/serving and roles/gateway share.

A replica is one gpu node serving a whole copy of the model (serving_topology = "replicas");
with serving_topology = "tensor_parallel" the group is one server and only rank 0 serves HTTP
(sglang 0.5.9 srt/entrypoints/engine.py: ranks >= 1 run a dummy health server only).
"""

from __future__ import annotations

import ipaddress

from roles.site import HostSettings, address_of


def _url_host(address: str) -> str:
    try:
        return f"[{address}]" if ipaddress.ip_address(address).version == 6 else address
    except ValueError:
        return address  # a DNS name


def worker_url(node: HostSettings) -> str:
    """Where the gateway reaches a gpu node's server: its bind address, or for a wildcard bind
    the address the node is reached at (ssh_hostname or its name)."""
    bound = node.serving.host
    address = address_of(node) if bound in ("0.0.0.0", "::") else bound
    return f"http://{_url_host(address)}:{node.serving.port}"


def replicas(hosts: dict[str, HostSettings]) -> list[HostSettings]:
    """The gpu nodes that serve HTTP, in inventory order."""
    nodes = [h for h in hosts.values() if h.in_group("gpu_nodes")]
    if nodes and nodes[0].serving.topology == "tensor_parallel":
        return nodes[:1]
    return nodes


def gateway_url(gateway: HostSettings) -> str:
    """Where the gpu nodes reach a gateway's control plane (GET/POST/DELETE /workers)."""
    bound = gateway.gateway.host
    address = address_of(gateway) if bound in ("0.0.0.0", "::") else bound
    return f"http://{_url_host(address)}:{gateway.gateway.port}"


def gateways(hosts: dict[str, HostSettings]) -> list[HostSettings]:
    return [h for h in hosts.values() if h.in_group("gateways")]


def control_plane_key_secret(hosts: dict[str, HostSettings]) -> str | None:
    """The vault key of the gateways' control-plane key: one for every gateway (the site rules),
    which a replica's rolling upgrade drains it with."""
    return next((g.gateway.control_plane_api_key_secret for g in gateways(hosts)), None)
