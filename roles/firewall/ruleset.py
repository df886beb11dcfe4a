"""The host's nftables ruleset, derived from the site model (who may reach which port), and the
one encoder of nft's language it is written with. Pure functions: roles/firewall writes the text,
roles/render previews it, tests/unit/test_firewall.py reads it back with nft's own parser
(`nft -c -f`).

Only the table `inet inference_host` is ours: the file adds it empty, deletes it and writes it
again, in one transaction (`nft -f` applies a file atomically: nftables wiki, "Atomic rule
replacement"), so a reload replaces our rules and nothing else. Other tables, Docker's NAT or a
Proxmox node's, are never flushed (Debian's own /etc/nftables.conf begins with `flush ruleset`;
ours does not).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from roles.shared.replicas import replicas
from roles.site import HostSettings, Site, address_of, exporter_bind

TABLE = "inference_host"
CONF_FILE = "/etc/nftables.conf"
LOOPBACK = ("127.0.0.1", "::1")
# ICMP that a host needs answered or let in for the network to work: errors (path MTU discovery:
# packet-too-big, fragmentation-needed is a destination-unreachable code), ping, and IPv6's
# neighbour discovery and multicast listener queries (RFC 4890 section 4.4.1: must not be dropped).
ICMP_TYPES = ("echo-request", "destination-unreachable", "time-exceeded", "parameter-problem")
ICMPV6_TYPES = (
    "echo-request",
    "destination-unreachable",
    "packet-too-big",
    "time-exceeded",
    "parameter-problem",
    "nd-router-advert",
    "nd-neighbor-solicit",
    "nd-neighbor-advert",
    "mld-listener-query",
)


# ----------------------------------------------------------------------------------------------
# The encoder: every value that reaches the file passes one of these, which refuse anything nft
# could read as something else.


def _network(value: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    return ipaddress.ip_network(value, strict=True)  # the site model gave it in this form


def nft_port(port: int) -> str:
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        raise ValueError(f"{port!r} is not a TCP port for nft")
    return str(port)


def nft_set(elements: list[str]) -> str:
    """An anonymous set `{ a, b }`: each element a network in the stdlib's normal form."""
    for element in elements:
        if str(_network(element)) != element:
            raise ValueError(f"{element!r} is not an IP network in normal form for nft")
    return "{ " + ", ".join(elements) + " }"


_COMMENT_RE = re.compile(r"[A-Za-z0-9 _.,:;()/+-]{1,128}")


def nft_comment(text: str) -> str:
    """A rule's comment (at most 128 bytes, NFT_USERDATA_MAXLEN), in quotes that hold no quote."""
    if not _COMMENT_RE.fullmatch(text):
        raise ValueError(f"{text!r} cannot be an nft comment (letters, digits, spaces and _.,:;()/+- only)")
    return f'"{text}"'


# ----------------------------------------------------------------------------------------------
# Who may reach what.


@dataclass(frozen=True)
class Opening:
    """TCP ports (or every port: ports == ()) let in from sources, with why."""

    ports: tuple[int, ...]
    sources: tuple[str, ...]
    why: str


def host_networks(hosts: list[HostSettings]) -> list[str]:
    """The other hosts as sources: each by the address it is reached at (the site model requires
    an IP address there when the firewall names the host)."""
    return [str(ipaddress.ip_network(address_of(h))) for h in hosts]


def _others(hosts: list[HostSettings], me: HostSettings) -> list[HostSettings]:
    return [h for h in hosts if h.name != me.name]


def openings(host: HostSettings, site: Site) -> list[Opening]:
    """Every port the host lets in, from whom. Derived from the groups (never typed twice): the
    gateways reach the engines, the gpu nodes the gateways' control plane, the monitors scrape."""
    f = host.firewall
    assert f.ssh_allowed_sources is not None, "the site model requires them with firewall_enabled"
    out = [Opening((host.ssh.port or 22,), tuple(f.ssh_allowed_sources), "ssh from firewall_ssh_allowed_sources")]
    monitors = _others(site.group("monitors"), host)
    gateways = _others(site.group("gateways"), host)
    nodes = _others(site.group("gpu_nodes"), host)
    if host.in_group("gpu_nodes"):
        out += _engine(host, site, monitors, gateways)
        if host.serving.topology == "tensor_parallel" and nodes:
            # NCCL, torch's store and SGLang's dist-init pick their ports at run time.
            out.append(
                Opening((), tuple(host_networks(nodes)), "every port from the other gpu nodes (tensor_parallel)")
            )
    m = host.monitoring
    if (
        (host.in_group("gpu_nodes") or host.in_group("monitors"))
        and monitors
        and exporter_bind(host, site.hosts) not in LOOPBACK
    ):
        ports = [m.node_exporter_port]
        if host.in_group("gpu_nodes") and m.dcgm_exporter:
            ports.append(m.dcgm_exporter_port)
        out.append(Opening(tuple(ports), tuple(host_networks(monitors)), "exporters from the monitors"))
    if host.in_group("gateways"):
        g = host.gateway
        if g.host not in LOOPBACK:
            sources = [*f.serving_allowed_sources, *host_networks(nodes)]
            out.append(Opening((g.port,), tuple(sources), "gateway from firewall_serving_allowed_sources, gpu nodes"))
        if g.prometheus_host not in LOOPBACK and monitors:
            out.append(Opening((g.prometheus_port,), tuple(host_networks(monitors)), "gateway metrics from monitors"))
    if host.in_group("monitors") and m.listen_address not in LOOPBACK:
        web = (m.prometheus_port, m.alertmanager_port)
        out.append(Opening(web, tuple(f.ssh_allowed_sources), "Prometheus, Alertmanager from the SSH sources"))
    return out


def _engine(host: HostSettings, site: Site, monitors, gateways) -> list[Opening]:
    """The engine's port: the endpoint itself on a site without gateways (its clients), a worker
    behind the gateways otherwise; the monitors scrape its /metrics either way."""
    if host.serving.host in LOOPBACK or host.name not in [h.name for h in replicas(site.hosts)]:
        return []
    f = host.firewall
    if site.group("gateways"):
        sources, why = [*host_networks(gateways), *f.worker_allowed_sources], "engine from the gateways"
    else:
        sources, why = list(f.serving_allowed_sources), "engine from firewall_serving_allowed_sources"
    sources += host_networks(monitors)
    return [Opening((host.serving.port,), tuple(sources), why + ", monitors")]


# ----------------------------------------------------------------------------------------------
# The file.


def _by_family(sources: tuple[str, ...]) -> dict[str, list[str]]:
    """Sources per family, overlaps merged (an anonymous interval set refuses overlapping
    elements: 10.0.0.0/8 and 10.1.0.0/16 are one)."""
    nets = [_network(s) for s in sources]
    out = {}
    for family, version in (("ip", 4), ("ip6", 6)):
        mine = [n for n in nets if n.version == version]
        if mine:
            out[family] = [str(n) for n in ipaddress.collapse_addresses(mine)]  # type: ignore[type-var]
    return out


def _rules(opening: Opening) -> list[str]:
    ports = opening.ports
    match = ""
    if len(ports) == 1:
        match = f"tcp dport {nft_port(ports[0])} "
    elif ports:
        match = "tcp dport { " + ", ".join(nft_port(p) for p in ports) + " } "
    return [
        f"{family} saddr {nft_set(nets)} {match}accept comment {nft_comment(opening.why)}"
        for family, nets in _by_family(opening.sources).items()
    ]


def ruleset(host: HostSettings, site: Site) -> str:
    """/etc/nftables.conf: our table, replaced whole on each load; inbound dropped but for what
    `openings` lets in, refused with an ICMP administratively-prohibited (a client is told at
    once, where a silent drop would leave it waiting out its timeout)."""
    rules = [rule for opening in openings(host, site) for rule in _rules(opening)]
    lines = [
        "#!/usr/sbin/nft -f",
        "# Written by inference-host (roles/firewall); docs/security.md, 'The network'.",
        "# Only the table below is replaced (added, deleted, written again in one transaction):",
        "# other tables (Docker's, Proxmox's) are left as they are.",
        f"table inet {TABLE}",
        f"delete table inet {TABLE}",
        f"table inet {TABLE} {{",
        "\tchain input {",
        "\t\ttype filter hook input priority filter; policy drop;",
        '\t\tiif "lo" accept',
        "\t\tct state established,related accept",
        "\t\tct state invalid drop",
        "\t\ticmp type { " + ", ".join(ICMP_TYPES) + " } accept",
        "\t\ticmpv6 type { " + ", ".join(ICMPV6_TYPES) + " } accept",
        *(f"\t\t{rule}" for rule in rules),
        "\t\treject with icmpx type admin-prohibited",
        "\t}",
        "}",
    ]
    return "\n".join(lines) + "\n"
