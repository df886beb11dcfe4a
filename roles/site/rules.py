"""Cross-host rules: checked once every host is typed (GPUs, guests, VMIDs, IOMMU groups, driver
versions, secrets). Rules that need a role's knowledge (the rendered server command line against
the release's CLI) are passed in from above the model as RoleChecks: see validation.py."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from roles.site.errors import shown
from roles.site.placement import sysctl_conflicts
from roles.site.schema import HostSettings
from roles.site.sections.guest import KVM_MAX_HOSTPCI, LXC_MAX_DEVICES, LXC_MAX_MOUNT_POINTS
from roles.site.sections.monitoring import DCGM_KEEP_S, url_credential
from roles.site.sections.serving import SpeculativeSettings
from roles.site.stack import EngineStack, Stack
from roles.site.vault import RENAMED_SECRETS

# Checks that need a role's knowledge, passed in from above the model (validation.py's
# ROLE_CHECKS; the model imports no role). Each returns problems without the "file: host" prefix.
# engine: (gpu node, all hosts, active stack), e.g. the command line rendered for the pinned
#   release against that release's real CLI;
# gateway: (gateways host, all hosts);
# speculative: (gpu node, stack, folder of the inventory file, against which the drafter's and
#   target's config.json copies are found).
EngineCheck = Callable[[HostSettings, dict[str, HostSettings], EngineStack], list[str]]
GatewayCheck = Callable[[HostSettings, dict[str, HostSettings]], list[str]]
SpeculativeCheck = Callable[[HostSettings, Stack, Path], list[str]]


@dataclass(frozen=True)
class RoleChecks:
    """The role checks one validation runs; empty: the model's own rules only."""

    engine: tuple[EngineCheck, ...] = ()
    gateway: tuple[GatewayCheck, ...] = ()
    speculative: tuple[SpeculativeCheck, ...] = ()


NO_ROLE_CHECKS = RoleChecks()


def check_site(
    site_hosts: dict[str, HostSettings],
    where: str,
    secret_names,
    secrets_file,
    problems: list[str],
    stack: Stack | None = None,
    checks: RoleChecks = NO_ROLE_CHECKS,
) -> None:
    vmids: dict[int, str] = {}
    gpu_owner: dict[str, tuple[str, str]] = {}
    for host in site_hosts.values():
        here = f"{where}: host {host.name}"
        gpu = host.gpu
        if not host.valid(
            "gpu_count",
            "guest_gpu_addresses",
            "guest_vmid",
            "guest_node",
            "guest_features",
            "guest_unprivileged",
            "serving_host",
            "serving_api_key_secret",
            "serving_hf_token_secret",
            "serving_speculative",
        ):
            continue  # its own message already names the mistake
        if host.in_group("gpu_nodes") and gpu.count < 1:
            problems.append(f"{here}: gpu_count = {gpu.count} is invalid; a gpu node needs an integer >= 1")
        if (
            host.in_group("gpu_nodes")
            and host.serving.host not in ("127.0.0.1", "::1")
            and not host.serving.api_key_secret
        ):
            problems.append(
                f"{here}: serving_host = {host.serving.host!r} exposes the server beyond this host"
                " without serving_api_key_secret; expected an API key secret or serving_host = '127.0.0.1'"
            )
        for key in ("api_key_secret", "hf_token_secret"):
            problem = _reference_problem(f"serving_{key}", getattr(host.serving, key), secret_names, secrets_file)
            if problem:
                problems.append(f"{here}: {problem}")
        if host.sglang.install_leave_out and host.sglang.install_mode == "full":
            problems.append(
                f"{here}: sglang_install_leave_out = {shown(host.sglang.install_leave_out)} with"
                " sglang_install_mode = 'full'; a full environment is the whole lock, expected"
                " no leave-out or sglang_install_mode = 'no-gpu-deps'"
            )
        speculative_problem = _speculative_problem(host.serving.speculative)
        if speculative_problem:
            problems.append(f"{here}: {speculative_problem}")
        elif host.in_group("gpu_nodes") and stack is not None:
            speculative = [
                p for check in checks.speculative if host.speculative for p in check(host, stack, Path(where).parent)
            ]
            # e.g. the command line rendered per release, checked against that release's real CLI;
            # a bad speculative value is named once, by its own check.
            for check in checks.engine:
                problems.extend(
                    f"{here}: {p}"
                    for p in check(host, site_hosts, stack.active)
                    if not (speculative and "--speculative-" in p)
                )
            problems.extend(f"{here}: {p}" for p in speculative)
        is_guest = host.in_group("lxc_guests") or host.in_group("kvm_guests")
        if host.in_group("lxc_guests") and host.in_group("kvm_guests"):
            problems.append(f"{here}: in both lxc_guests and kvm_guests; expected one of them")
        if is_guest:
            _check_guest(host, here, site_hosts, vmids, gpu_owner, problems)
        if host.in_group("proxmox_hosts"):
            problems.extend(f"{here}: {p}" for p in sysctl_conflicts(host, site_hosts))
    _check_iommu_groups(site_hosts, gpu_owner, where, problems)
    _check_ports(site_hosts, where, problems)
    _check_guest_ips(site_hosts, where, problems)
    _check_topology(site_hosts, where, problems, stack, checks.gateway)
    _check_monitoring(site_hosts, where, secret_names, secrets_file, problems, stack)


def _reference_problem(setting: str, ref: str | None, secret_names, secrets_file: str | None) -> str | None:
    """Why a *_secret setting's vault key cannot be read, or None. An old name of a renamed key
    (vault.RENAMED_SECRETS) is refused in the inventory, which is plain text; the vault's own entry
    under the old name is still read for one release (vault.load)."""
    if ref in RENAMED_SECRETS:
        new = RENAMED_SECRETS[ref]
        return (
            f"{setting} = {ref!r} names the vault key by its old name; write {setting} = {new!r}"
            f" (docs/upgrades.md#engine-neutral-setting-names)"
        )
    if ref and secret_names is not None and ref not in secret_names:
        return f"{setting} = {ref!r} names no secret in {_vault_state(secrets_file, secret_names)}"
    return None


def _vault_state(secrets_file: str | None, secret_names) -> str:
    """The vault as it is, for a reference to a key it lacks (an unreadable vault is named by its
    own line, and its references are not judged: secret_names None)."""
    if not secrets_file:
        return (
            "the vault (no secrets_file set); expected secrets_file = '<file>.vault.yml' beside the inventory"
            " (python -m roles.site.vault set FILE NAME makes it)"
        )
    if not secret_names:
        return (
            f"{secrets_file}, which has no keys; expected a key set with"
            f" python -m roles.site.vault set {secrets_file} NAME"
        )
    return f"{secrets_file}; expected one of: {', '.join(sorted(secret_names))}"


LOOPBACK = ("127.0.0.1", "::1")


def _unreachable_by(monitor: HostSettings, host: HostSettings) -> list[str]:
    """What the monitor's Prometheus would scrape on host but cannot: a loopback-only address
    on another machine."""
    if monitor.name == host.name:
        return []
    binds = []
    if host.in_group("gpu_nodes"):
        binds.append(("monitoring_exporter_address", host.monitoring.exporter_address))
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
                " belongs in the vault: python -m roles.site.vault set FILE NAME (value on stdin), then"
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
        if m.email_to and not (m.email_from and m.email_smarthost):
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


def _speculative_problem(speculative: dict | None) -> str | None:
    if speculative is None:
        return None
    try:
        SpeculativeSettings.model_validate(speculative)
    except ValidationError as error:
        reasons = "; ".join(_reason(detail) for detail in error.errors())
        return (
            f"serving_speculative = {shown(speculative)} is invalid ({reasons});"
            " expected {'draft_model_path': '/models/...', 'algorithm': 'EAGLE3',"
            " 'num_steps': 3, 'eagle_topk': 1, 'num_draft_tokens': 4, 'spec_v2': False,"
            " 'draft_config': '<drafter config.json>', 'target_config': '<target config.json>'}"
        )
    return None


def _reason(detail: ErrorDetails) -> str:
    """One pydantic error of serving_speculative as "algorithm 'MEDUSA': one of ..."."""
    where = ".".join(str(part) for part in detail["loc"])
    if detail["type"] == "missing":
        return f"{where} is missing"
    if detail["type"] == "extra_forbidden":
        return f"unknown key {where}"
    valid = detail["ctx"]["valid"] if detail["type"] == "inference_host" else detail["msg"]
    return f"{where} {shown(detail['input'])}: {valid}"


def _check_guest(host: HostSettings, here: str, site_hosts, vmids, gpu_owner, problems) -> None:
    guest = host.guest
    if guest.vmid is None:
        problems.append(f"{here}: guest_vmid is missing; expected an integer >= 100, unique per node")
    elif guest.vmid in vmids:
        problems.append(
            f"{here}: guest_vmid = {guest.vmid} is already used by {vmids[guest.vmid]};"
            " expected a VMID unique across LXC and KVM guests"
        )
    else:
        vmids[guest.vmid] = host.name
    _check_guest_address(host, here, problems)
    node = site_hosts.get(guest.node) if guest.node else None
    if node is None or not node.in_group("proxmox_hosts"):
        problems.append(
            f"{here}: guest_node = {shown(guest.node)} is not a host of the proxmox_hosts group; expected one of: "
            + (", ".join(h.name for h in site_hosts.values() if h.in_group("proxmox_hosts")) or "(none)")
        )
    kind = "lxc" if host.in_group("lxc_guests") else "kvm"
    for address in guest.gpu_addresses:
        if address in gpu_owner:
            other, other_kind = gpu_owner[address]
            why = (
                "; never to an LXC guest (host driver) and a KVM guest (vfio-pci) at once" if other_kind != kind else ""
            )
            problems.append(
                f"{here}: guest_gpu_addresses has {address}, already given to {other};"
                f" expected each GPU in at most one guest{why}"
            )
        gpu_owner[address] = (host.name, kind)
        if node is not None and address not in node.proxmox.gpu_addresses:
            problems.append(
                f"{here}: guest_gpu_addresses has {address}, which is not in {node.name}'s"
                f" proxmox_gpu_addresses; expected one of: {', '.join(node.proxmox.gpu_addresses) or '(none)'}"
            )
    if host.in_group("gpu_nodes") and len(guest.gpu_addresses) != host.gpu.count:
        problems.append(
            f"{here}: gpu_count = {host.gpu.count} but guest_gpu_addresses lists"
            f" {len(guest.gpu_addresses)} GPUs; expected as many addresses as GPUs"
        )
    if "keyctl" in guest.features and not guest.unprivileged:
        problems.append(
            f"{here}: guest_features has 'keyctl' with guest_unprivileged = False;"
            " expected keyctl only on unprivileged containers"
        )
    if kind == "lxc":
        _check_lxc_indices(host, here, problems)
    else:
        _check_kvm_passthrough(host, here, problems)


def _check_guest_address(host: HostSettings, here: str, problems: list[str]) -> None:
    """Proxmox takes one family per key pair (ip/gw, ip6/gw6): the gateway must be of guest_ip's.
    The guest reaches its gateway on its own link only (no route to it otherwise: the default
    route is refused or unusable), so the gateway is inside guest_ip's subnet, and another
    machine than the guest itself; the guest's own address is a host of its subnet, not the
    network's or the broadcast address."""
    guest = host.guest
    if guest.ip in ("dhcp", "manual") or not host.valid("guest_ip", "guest_gateway"):
        return
    interface = ipaddress.ip_interface(guest.ip)
    network = interface.network
    if (
        interface.version == 4
        and network.prefixlen <= 30
        and interface.ip in (network.network_address, network.broadcast_address)
    ):
        which = "network" if interface.ip == network.network_address else "broadcast"
        problems.append(
            f"{here}: guest_ip = {guest.ip!r} is the {which} address of {network}; expected a host"
            f" address of the subnet ({network.network_address + 1} to {network.broadcast_address - 1})"
        )
    if not guest.gateway:
        return
    gateway = ipaddress.ip_address(guest.gateway)
    if interface.version != gateway.version:
        problems.append(
            f"{here}: guest_gateway = {guest.gateway!r} is IPv{gateway.version} but guest_ip ="
            f" {guest.ip!r} is IPv{interface.version}; expected a gateway of the same family"
            " (Proxmox writes ip/gw and ip6/gw6 as pairs)"
        )
    elif gateway == interface.ip:
        problems.append(
            f"{here}: guest_gateway = {guest.gateway!r} is the guest's own address (guest_ip ="
            f" {guest.ip!r}); expected the router of its subnet {network}"
        )
    elif gateway not in network:
        problems.append(
            f"{here}: guest_gateway = {guest.gateway!r} is outside the guest's subnet {network}"
            f" (guest_ip = {guest.ip!r}); expected a router the guest reaches on its own link, inside {network}"
        )


def _check_guest_ips(site_hosts: dict[str, HostSettings], where: str, problems: list[str]) -> None:
    """One address, one machine: two guests (or a guest and another host's ssh_hostname) on one
    IP answer ARP for each other, and the deploy and the checks reach whichever answers first."""
    owner: dict[ipaddress._BaseAddress, str] = {}
    for host in site_hosts.values():
        if host.ssh_hostname and is_ip_text(host.ssh_hostname):
            owner.setdefault(ipaddress.ip_address(host.ssh_hostname), host.name)
    for host in site_hosts.values():
        is_guest = host.in_group("lxc_guests") or host.in_group("kvm_guests")
        if not is_guest or host.guest.ip in ("dhcp", "manual") or not host.valid("guest_ip"):
            continue
        address = ipaddress.ip_interface(host.guest.ip).ip
        first = owner.setdefault(address, host.name)
        if first != host.name:
            problems.append(
                f"{where}: host {host.name}: guest_ip = {host.guest.ip!r} is {first}'s address too;"
                " expected one IP address per guest (two machines on one IP answer for each other)"
            )


def is_ip_text(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


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
        ]
    return [(key, port) for key, port in ports if host.valid(key)]


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
            elif port in seen and not (seen[port].startswith("monitoring_") and key.startswith("monitoring_")):
                problems.append(
                    f"{where}: host {host.name}: {key} = {port} is {seen[port]} too on this host;"
                    " expected two different ports (one listener per port)"
                )
            seen.setdefault(port, key)


def _check_lxc_indices(host: HostSettings, here: str, problems: list[str]) -> None:
    # Each GPU takes a devN; nvidiactl, nvidia-uvm, nvidia-uvm-tools, nvidia-modeset and the
    # nvidia-caps nodes (at most 2) take up to 5 more.
    devices = len(host.guest.gpu_addresses) + 5 if host.guest.gpu_addresses else 0
    if devices > LXC_MAX_DEVICES:
        problems.append(
            f"{here}: guest_gpu_addresses needs dev0..dev{devices - 1};"
            f" expected at most {LXC_MAX_DEVICES} device entries (dev0-dev255)"
        )
    if len(host.guest.mount_points) > LXC_MAX_MOUNT_POINTS:
        problems.append(
            f"{here}: guest_mount_points has {len(host.guest.mount_points)} entries;"
            f" expected at most {LXC_MAX_MOUNT_POINTS} (mp0-mp255)"
        )


def _check_kvm_passthrough(host: HostSettings, here: str, problems: list[str]) -> None:
    guest = host.guest
    if len(guest.gpu_addresses) > KVM_MAX_HOSTPCI:
        problems.append(
            f"{here}: guest_gpu_addresses lists {len(guest.gpu_addresses)} GPUs;"
            f" expected at most {KVM_MAX_HOSTPCI} per VM (hostpci0-hostpci15)"
        )
    if guest.pcie and guest.gpu_addresses and not guest.machine.startswith(("q35", "pc-q35")):
        problems.append(
            f"{here}: guest_machine = {guest.machine!r} with guest_pcie = True;"
            " expected a q35 machine (pcie=1 needs q35) or guest_pcie = False"
        )
    if len(guest.x_vga_addresses) > 1:
        problems.append(
            f"{here}: guest_x_vga_addresses = {guest.x_vga_addresses!r}; expected at most one x-vga device per VM"
        )
    for address in guest.x_vga_addresses:
        if address not in guest.gpu_addresses:
            problems.append(
                f"{here}: guest_x_vga_addresses has {address}, which is not in"
                " guest_gpu_addresses; expected one of the guest's GPUs"
            )
    # 16 GB and more of VRAM means a BAR beyond what a default CPU model and SeaBIOS map.
    if guest.gpu_addresses and host.gpu.memory_gib >= 16:
        if guest.cpu != "host" and "phys-bits=" not in guest.cpu:
            problems.append(
                f"{here}: guest_cpu = {guest.cpu!r} with {host.gpu.memory_gib} GB GPUs;"
                " expected 'host' or a CPU type with phys-bits=host (large BARs)"
            )
        if guest.bios != "ovmf":
            problems.append(
                f"{here}: guest_bios = {guest.bios!r} with {host.gpu.memory_gib} GB GPUs;"
                " expected 'ovmf' (with an efidisk) for large BARs"
            )


def _check_iommu_groups(site_hosts: dict[str, HostSettings], gpu_owner: dict, where: str, problems: list[str]) -> None:
    """Proxmox binds a GPU's whole IOMMU group to vfio-pci: a group belongs to one guest."""
    for node in (h for h in site_hosts.values() if h.in_group("proxmox_hosts")):
        group_owner: dict[int, tuple[str, str]] = {}
        for address, group in node.proxmox.iommu_groups.items():
            if address not in gpu_owner:
                continue
            owner = gpu_owner[address][0]
            first = group_owner.setdefault(group, (owner, address))
            if first[0] != owner:
                problems.append(
                    f"{where}: host {owner}: guest_gpu_addresses has {address}, which shares IOMMU"
                    f" group {group} with {first[1]} of guest {first[0]} ({node.name}'s"
                    " proxmox_iommu_groups); expected all GPUs of one group in one guest"
                )


def check_driver_match(
    site_hosts: dict[str, HostSettings], stack: Stack | None, where: str, problems: list[str]
) -> None:
    """An LXC guest uses the node's kernel module: its userspace must be the same version."""
    default = stack.driver_version if stack else None
    for host in site_hosts.values():
        node = site_hosts.get(host.guest.node or "")
        if not (host.in_group("lxc_guests") and host.guest.gpu_addresses and node):
            continue
        guest_version = host.guest.driver_version or default
        node_version = node.proxmox.driver_version or default
        if guest_version != node_version:
            problems.append(
                f"{where}: host {host.name}: guest_driver_version = {guest_version!r} but {node.name}"
                f" runs {node_version!r} (proxmox_driver_version); expected exactly the host's"
                " driver version in an LXC guest"
            )
