"""Cross-host rules about the services of ours: monitoring, topology (gateways and gpu
nodes) and the ports each host's listeners take."""

from __future__ import annotations

from collections.abc import Callable

from roles.site.rules_secrets import _reference_problem
from roles.site.schema import HostSettings
from roles.site.sections.monitoring import DCGM_KEEP_S, url_credential
from roles.site.stack import Stack

GatewayCheck = Callable[[HostSettings, dict[str, HostSettings]], list[str]]


LOOPBACK = ("127.0.0.1", "::1")


def _unreachable_by(monitor: HostSettings, host: HostSettings) -> list[str]:
    """What the monitor's Prometheus would scrape on host but cannot: a loopback-only address
    on another machine."""
    if monitor.name == host.name:
        return []
    binds = []
    if host.in_group("gpu_nodes"):
        binds.append(("monitoring_exporter_address", host.monitoring.exporter_address or "0.0.0.0"))
        if host.serving.enable_metrics:
            binds.append(("serving_host", host.serving.host))
    if host.in_group("gateways"):
        binds.append(("gateway_prometheus_host", host.gateway.prometheus_host))
    return [
        f"{key} = {value!r} cannot be scraped by the monitors host {monitor.name}; expected an address"
        " it reaches (the host's private address), or put the monitor on this host"
        for key, value in binds
        if value in LOOPBACK and host.valid(key)
    ]


# The monitor's vault references (roles/monitoring writes each value into a 0600 file).
MONITOR_SECRETS = (
    "web_password_secret",
    "email_auth_password_secret",
    "webhook_url_secret",
    "slack_api_url_secret",
    "pagerduty_routing_key_secret",
    "heartbeat_url_secret",
)


def _receiver_problems(host: HostSettings) -> list[str]:
    """A monitor's receivers: at least one, a plain webhook URL without a credential, and each
    severity routed only to receivers that are configured."""
    m, out = host.monitoring, []
    if host.valid("monitoring_webhook_url") and m.webhook_url is not None:
        credential = url_credential(m.webhook_url)
        if credential:
            # The value is not repeated: it is the credential.
            out.append(
                f"monitoring_webhook_url holds {credential} (value not shown); a URL that carries a credential"
                " belongs in the vault: inference-host vault set FILE NAME (value on stdin), then"
                " monitoring_webhook_url_secret = NAME in place of monitoring_webhook_url"
            )
        if m.webhook_url_secret is not None:
            out.append(
                "monitoring_webhook_url and monitoring_webhook_url_secret are both set; expected one webhook:"
                " the plain URL (no credential in it) or the vault key"
            )
    names = ("monitoring_webhook_url", "monitoring_email_to", "monitoring_critical_receivers")
    configured = m.configured_receivers()
    if not configured:
        if not host.valid(*names):
            return out  # the invalid setting's own line says it
        out.append(
            "the monitors group has no receiver; expected monitoring_email_to (with monitoring_email_from and"
            " monitoring_email_smarthost), monitoring_webhook_url, or a vault key in monitoring_webhook_url_secret,"
            " monitoring_slack_api_url_secret or monitoring_pagerduty_routing_key_secret"
        )
        return out
    for severity in ("critical", "warning"):
        key = f"monitoring_{severity}_receivers"
        if not host.valid(key):
            continue
        chosen = m.receivers_for(severity)
        missing = [kind for kind in chosen if kind not in configured]
        if missing:
            out.append(
                f"{key} = {chosen!r} names {', '.join(missing)}, which this monitor has no settings for;"
                f" expected receivers from the configured ones: {', '.join(configured)}"
            )
        elif severity == "critical" and not chosen:
            out.append(f"{key} = [] sends critical alerts nowhere; expected at least one of {', '.join(configured)}")
    return out


def _check_monitoring(
    site_hosts: dict[str, HostSettings],
    where: str,
    secret_names,
    secrets_file,
    problems: list[str],
    stack: Stack | None,
) -> None:
    """The monitors group: its pins, receiver and secrets; every gpu node: the checks' budget."""
    monitors = [h for h in site_hosts.values() if h.in_group("monitors")]
    if monitors and stack is not None and stack.monitoring is None:
        problems.append(
            f"{where}: the monitors group needs the monitoring package pins in {stack.file};"
            " expected a `monitoring:` mapping (debian12, ubuntu2404, dcgm_exporter; see inventory/stack.yml)"
        )
    for host in site_hosts.values():
        here, m = f"{where}: host {host.name}", host.monitoring
        if (
            monitors
            and host.in_group("gpu_nodes")
            and host.valid("monitoring_check_timeout_s", "monitoring_check_interval")
            and m.check_timeout_s >= m.check_interval_seconds
        ):
            problems.append(
                f"{here}: monitoring_check_timeout_s = {m.check_timeout_s} is not below"
                f" monitoring_check_interval = {m.check_interval!r}; expected a run shorter than its interval"
            )
        if monitors and host.in_group("gpu_nodes") and m.node_exporter_port == m.dcgm_exporter_port:
            problems.append(
                f"{here}: monitoring_dcgm_exporter_port = {m.dcgm_exporter_port} equals"
                " monitoring_node_exporter_port; expected two different ports"
            )
        for mon in monitors:
            problems.extend(f"{here}: {p}" for p in _unreachable_by(mon, host))
            if (
                host.in_group("gpu_nodes")
                and m.dcgm_exporter
                and host.valid("monitoring_xid_window_s")
                and mon.valid("monitoring_scrape_interval")
                and m.xid_window_s < mon.monitoring.scrape_interval_seconds
            ):
                problems.append(
                    f"{here}: monitoring_xid_window_s = {m.xid_window_s} is shorter than the monitors host"
                    f" {mon.name}'s monitoring_scrape_interval = {mon.monitoring.scrape_interval!r}: an Xid could"
                    f" enter and leave the window between two scrapes; expected"
                    f" {mon.monitoring.scrape_interval_seconds} to {DCGM_KEEP_S} seconds"
                )
        if not host.in_group("monitors"):
            continue
        for key in MONITOR_SECRETS:
            problem = _reference_problem(f"monitoring_{key}", getattr(m, key), secret_names, secrets_file)
            if problem and host.valid(f"monitoring_{key}"):
                problems.append(f"{here}: {problem}")
        problems.extend(f"{here}: {p}" for p in _receiver_problems(host))
        if m.web_password_secret is None and m.listen_address not in LOOPBACK:
            problems.append(
                f"{here}: monitoring_listen_address = {m.listen_address!r} exposes Prometheus and"
                " Alertmanager without monitoring_web_password_secret; expected a vault secret"
                " (basic auth) or monitoring_listen_address = '127.0.0.1'"
            )
        if m.email_to and not (m.email_from and m.email_smarthost) and host.valid("monitoring_email_smarthost"):
            problems.append(
                f"{here}: monitoring_email_to = {m.email_to!r} needs monitoring_email_from and"
                " monitoring_email_smarthost; expected both set"
            )
        if m.prometheus_port == m.alertmanager_port:
            problems.append(
                f"{here}: monitoring_alertmanager_port = {m.alertmanager_port} equals"
                " monitoring_prometheus_port; expected two different ports"
            )


def _check_topology(
    site_hosts: dict[str, HostSettings],
    where: str,
    problems: list[str],
    stack: Stack | None = None,
    gateway_checks: tuple[GatewayCheck, ...] = (),
) -> None:
    """serving_topology across the gpu nodes, and what the gateways need to reach them."""
    nodes = [h for h in site_hosts.values() if h.in_group("gpu_nodes") and h.valid("serving_topology")]
    topologies = {h.serving.topology for h in nodes}
    if len(topologies) > 1:
        problems.append(
            f"{where}: serving_topology differs between gpu nodes ("
            + ", ".join(f"{h.name}: {h.serving.topology}" for h in nodes)
            + "); expected one value for the whole gpu_nodes group (set it in group_data)"
        )
        return
    if topologies == {"tensor_parallel"} and len(nodes) > 1 and stack and stack.active.engine != "sglang":
        # roles/serving renders the multi-node group (--nnodes/--node-rank/--dist-init-addr) for
        # SGLang only; vLLM spreads a model over nodes through a Ray cluster, which this project
        # does not set up. Rendering each node alone would run 2 unrelated servers.
        problems.append(
            f"{where}: serving_topology = 'tensor_parallel' across {len(nodes)} gpu nodes needs an"
            f" SGLang stack; the active stack {stack.active.id} is {stack.active.engine}"
            " (expected serving_topology = 'replicas', or an sglang stack)"
        )
    if topologies == {"tensor_parallel"} and len(nodes) > 1:
        counts = {h.gpu.count for h in nodes}
        if len(counts) > 1:
            # sglang gives every node tp_size // nnodes GPUs (srt/entrypoints/engine.py, 0.5.9).
            problems.append(
                f"{where}: serving_topology = 'tensor_parallel' needs the same gpu_count on every"
                " gpu node (SGLang gives each node tp_size / nnodes GPUs); found "
                + ", ".join(f"{h.name}: {h.gpu.count}" for h in nodes)
            )
        for host in nodes:
            if host.valid("nccl_ib_disable") and host.nccl.ib_disable is None:
                problems.append(
                    f"{where}: host {host.name}: nccl_ib_disable is unset, but serving_topology ="
                    " 'tensor_parallel' sends the all-reduce between nodes; expected True (TCP sockets"
                    " over nccl_socket_ifname: works on any network, slow) or False (InfiniBand/RoCE)"
                )
    gateways = [h for h in site_hosts.values() if h.in_group("gateways")]
    if gateways:
        for host in nodes:
            if host.valid("serving_host") and host.serving.host in ("127.0.0.1", "::1"):
                problems.append(
                    f"{where}: host {host.name}: serving_host = {host.serving.host!r} cannot be reached by the"
                    " gateways group; expected the node's private address (the gateway checks the API key"
                    " in front of it)"
                )
        for gateway in gateways:
            for check in gateway_checks:
                problems.extend(f"{where}: host {gateway.name}: {p}" for p in check(gateway, site_hosts))
            keys = {h.serving.api_key_secret for h in nodes}
            if len(keys) > 1:
                problems.append(
                    f"{where}: the gpu nodes behind gateway {gateway.name} have different"
                    " serving_api_key_secret values; expected one key for all replicas (the gateway"
                    " checks it and passes it on)"
                )
            elif keys == {None} and gateway.gateway.host not in ("127.0.0.1", "::1"):
                problems.append(
                    f"{where}: host {gateway.name}: gateway_host = {gateway.gateway.host!r} serves without an API"
                    " key; expected serving_api_key_secret on the gpu nodes (the gateway checks that key)"
                )
            tenants = {tuple(sorted(h.serving.tenant_api_key_secrets.items())) for h in nodes}
            if len(tenants) > 1:
                problems.append(
                    f"{where}: the gpu nodes behind gateway {gateway.name} have different"
                    " serving_tenant_api_key_secrets ("
                    + "; ".join(f"{h.name}: {dict(sorted(h.serving.tenant_api_key_secrets.items()))}" for h in nodes)
                    + "); expected the same tenants and vault keys on every replica (the gateway passes a"
                    " tenant's key on to whichever replica it picks)"
                )


# Ports the node's own services hold, which an engine, a gateway or an exporter of ours cannot
# bind as well (EADDRINUSE at start, or ours takes it first and the service is gone): on every
# host the SSH server the deploy itself comes in by (22, or the host's ssh_port); on a Proxmox
# node its own daemons (pve-manager: pveproxy 8006 for the web UI and API, spiceproxy 3128,
# pvedaemon 85 on loopback; rpcbind 111, installed with the NFS client).
PROXMOX_PORTS = {
    8006: "pveproxy (Proxmox's web UI and API)",
    3128: "spiceproxy (Proxmox's SPICE proxy)",
    85: "pvedaemon (Proxmox's API daemon)",
    111: "rpcbind",
}


def _our_ports(host: HostSettings, monitored: bool) -> list[tuple[str, int]]:
    """(setting, port) of each service of ours that listens on this host."""
    ports = []
    if host.in_group("gpu_nodes"):
        ports.append(("serving_port", host.serving.port))
        if host.serving.topology == "tensor_parallel":  # rank 0's torch.distributed store
            ports.append(("serving_dist_init_port", host.serving.dist_init_port))
        if monitored:
            ports += [
                ("monitoring_node_exporter_port", host.monitoring.node_exporter_port),
                ("monitoring_dcgm_exporter_port", host.monitoring.dcgm_exporter_port),
            ]
    if host.in_group("gateways"):
        ports += [("gateway_port", host.gateway.port), ("gateway_prometheus_port", host.gateway.prometheus_port)]
    if host.in_group("monitors"):
        ports += [
            ("monitoring_prometheus_port", host.monitoring.prometheus_port),
            ("monitoring_alertmanager_port", host.monitoring.alertmanager_port),
            ("monitoring_alert_relay_port", host.monitoring.alert_relay_port),
        ]
    return [(key, port) for key, port in ports if host.valid(key)]


# Pairs of ports _check_monitoring names itself (one line per mistake).
REPORTED_PAIRS = {
    frozenset(("monitoring_node_exporter_port", "monitoring_dcgm_exporter_port")),
    frozenset(("monitoring_prometheus_port", "monitoring_alertmanager_port")),
}


def _check_unit_names(site_hosts: dict[str, HostSettings], where: str, problems: list[str]) -> None:
    """One unit, one service per host: the engine's and the gateway's units are files of one
    folder (/etc/systemd/system), so a gateway named like the engine overwrites it."""
    for host in site_hosts.values():
        units = []
        if host.in_group("gpu_nodes") and host.valid("serving_unit_name"):
            units.append(("serving_unit_name", host.serving.unit_name))
        if host.in_group("gateways") and host.valid("gateway_unit_name"):
            units.append(("gateway_unit_name", host.gateway.unit_name))
        seen: dict[str, str] = {}
        for key, name in units:
            unit = name.removesuffix(".service")
            if unit in seen:
                problems.append(
                    f"{where}: host {host.name}: {key} = {name!r} is {seen[unit]} too on this host;"
                    " expected a unit name of its own (one would overwrite the other's unit file)"
                )
            seen.setdefault(unit, key)


def _check_ports(site_hosts: dict[str, HostSettings], where: str, problems: list[str]) -> None:
    """One port, one listener per host: ours against the node's own services, and two of ours."""
    monitored = any(h.in_group("monitors") for h in site_hosts.values())
    for host in site_hosts.values():
        reserved = {host.ssh.port or 22: "the SSH server (the deploy's own way in)"}
        if host.in_group("proxmox_hosts"):
            reserved.update(PROXMOX_PORTS)
        if host.in_group("gpu_nodes") and not monitored:
            # The exporters' ports stay free on a gpu node monitored later (roles/monitoring).
            reserved.setdefault(host.monitoring.node_exporter_port, "node_exporter (roles/monitoring)")
            reserved.setdefault(host.monitoring.dcgm_exporter_port, "DCGM's exporter (roles/monitoring)")
        seen: dict[int, str] = {}
        for key, port in _our_ports(host, monitored):
            if port in reserved:
                problems.append(
                    f"{where}: host {host.name}: {key} = {port} is the port of {reserved[port]} on this"
                    " host; expected a free port"
                )
            elif port in seen and frozenset((seen[port], key)) not in REPORTED_PAIRS:
                problems.append(
                    f"{where}: host {host.name}: {key} = {port} is {seen[port]} too on this host;"
                    " expected two different ports (one listener per port)"
                )
            seen.setdefault(port, key)


def _check_firewall(site_hosts: dict[str, HostSettings], where: str, problems: list[str]) -> None:
    """With the firewall on: the SSH sources are given (the deploy connects over SSH: a default
    would either cut it or let everyone in), and the site's other hosts, which the rules let in
    by their address (roles/firewall/ruleset.py), are named by an IP address."""
    from roles.site.fields import is_ip
    from roles.site.placement import FIREWALL_GROUPS, firewalled
    from roles.site.schema import address_of

    for host in site_hosts.values():
        if not host.valid("firewall_enabled", "firewall_ssh_allowed_sources") or not firewalled(host):
            continue
        here = f"{where}: host {host.name}"
        if host.firewall.ssh_allowed_sources is None:
            problems.append(
                f"{here}: firewall_enabled = True without firewall_ssh_allowed_sources; expected the networks"
                " your SSH comes from (e.g. ['192.0.2.0/24']): the deploy itself connects over SSH"
            )
        for peer in site_hosts.values():
            if peer.name == host.name or not any(peer.in_group(g) for g in FIREWALL_GROUPS):
                continue
            address = address_of(peer)
            if not is_ip(address) or "%" in address:
                problems.append(
                    f"{here}: firewall_enabled = True lets the site's hosts in by address, and host {peer.name}"
                    f" is reached at {address!r}, not an IP address; expected its ssh_hostname set to its IP address"
                )
