"""roles/firewall: the host's nftables ruleset, default deny inbound (firewall_*)."""

from __future__ import annotations

import ipaddress
from typing import Annotated, ClassVar

from pydantic import AfterValidator, Field
from pydantic_core import PydanticCustomError

from roles.site.fields import _RULE_TEXT, Section

NETWORKS_TEXT = "a list of IP networks like '192.0.2.0/24', '2001:db8::/32' or one address ('192.0.2.7')"


def network(value: str) -> str:
    """One source as nft writes it: the stdlib's normal form of an IPv4 or IPv6 network, host
    bits clear (192.0.2.7/24 is refused: which was meant, the host or its network?)."""
    return str(ipaddress.ip_network(value, strict=True))


def _networks(value: list[str]) -> list[str]:
    out = []
    for item in value:
        try:
            out.append(network(item))
        except ValueError as error:
            raise PydanticCustomError(
                "inference_host", "{valid}", {"valid": f"{NETWORKS_TEXT}; {item!r} is not one ({error})"}
            ) from None
    return out


_networks_rule = AfterValidator(_networks)
_RULE_TEXT[id(_networks_rule)] = NETWORKS_TEXT
Networks = Annotated[list[str], _networks_rule]


class FirewallSettings(Section):
    """roles/firewall on every gpu node, gateway and monitor (never on a Proxmox node, whose
    firewall is Proxmox's own): an nftables table that drops what it does not let in. Who may
    reach the engine, the gateway's control plane and the exporters is derived from the
    inventory's groups; only the people are typed here."""

    PREFIX: ClassVar[str] = "firewall_"

    enabled: bool = Field(
        False,
        description=(
            "Load the inference-host nftables table (Debian's nftables package, /etc/nftables.conf): inbound"
            " traffic is dropped but for loopback, replies, ICMP and the sources below and the inventory's own"
            " hosts (docs/security.md, 'The network')."
        ),
    )
    ssh_allowed_sources: Networks | None = Field(
        None,
        description=(
            "Networks SSH (ssh_port, else 22) is let in from: your desk's and the control machine's. Required"
            " with firewall_enabled, and a deploy whose own SSH connection comes from outside them is refused"
            " before anything is written."
        ),
    )
    serving_allowed_sources: Networks = Field(
        ["0.0.0.0/0", "::/0"],
        description=(
            "Networks the serving endpoint is let in from: the gateway's port on the gateways, else the"
            " engine's on the gpu node that serves HTTP (the API key still guards it). Default: everyone."
        ),
    )
    worker_allowed_sources: Networks = Field(
        [],
        description=(
            "More networks let in to the engine's port of a gpu node behind a gateway (a benchmark machine),"
            " besides the gateways and the monitors, which the inventory already names."
        ),
    )
