"""roles/firewall: who each host lets in, derived from the inventory's groups; the ruleset read
back by nft's own parser; the settings refused in one line; the deploy's own SSH path kept;
firewall=1 on a guest's net0; the exporters on the loopback where the host is its own monitor."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from roles import render
from roles.firewall import own_ssh_cut, ruleset
from roles.firewall.facts import parse_ssh_connection
from roles.shared import pve
from roles.site import SiteError, exporter_bind, load_site
from tests.unit.conftest import PROJECT_ROOT, gpu_node

REPLICAS = PROJECT_ROOT / "inventory" / "lab_replicas.py"
SSH = {"firewall_enabled": True, "firewall_ssh_allowed_sources": ["192.0.2.0/24"]}
TP = {"gpu_count": 8, "serving_topology": "tensor_parallel", "nccl_ib_disable": True, "nccl_socket_ifname": "ens1f0"}


def nft_check(path) -> subprocess.CompletedProcess:
    """nft's own parser and evaluator (`nft -c`: everything but the commit). It needs
    CAP_NET_ADMIN even to check (its cache reads the kernel's ruleset): as root in CI, else in a
    network namespace of a user namespace of its own (`unshare -rn`), never this machine's."""
    nft = shutil.which("nft") or "/usr/sbin/nft"
    if not os.path.exists(nft):
        pytest.fail("nft is missing: apt-get install nftables (.ci/run installs it)")
    command = [nft, "-c", "-f", str(path)]
    if os.geteuid() != 0:
        command = ["unshare", "-rn", *command]
    return subprocess.run(command, capture_output=True, text=True, timeout=30)


def _problems(path) -> list[str]:
    with pytest.raises(SiteError) as caught:
        load_site(path)
    return caught.value.problems


# ----------------------------------------------------------------------------------------------
# Who is let in where (the replicas lab: two replicas, the gateway also the monitor).


@pytest.fixture(scope="module")
def replicas_site():
    return load_site(REPLICAS)


def _sources(site, name: str, port: int) -> set[str]:
    host = site.hosts[name]
    return {s for o in ruleset.openings(host, site) if port in o.ports or not o.ports for s in o.sources}


def test_a_replica_lets_in_the_gateway_and_not_the_other_replica(replicas_site):
    site = replicas_site
    rep_a, rep_b, gw = (site.group("gpu_nodes")[0], site.group("gpu_nodes")[1], site.group("gateways")[0])
    control = set(rep_a.firewall.worker_allowed_sources)
    address = {h.name: h.ssh_hostname + "/32" for h in (rep_a, rep_b, gw)}
    assert _sources(site, rep_a.name, rep_a.serving.port) == {address[gw.name], *control}
    assert address[rep_b.name] not in _sources(site, rep_a.name, rep_a.serving.port)
    # The exporters: the monitor only; the SSH port: the SSH sources only.
    assert _sources(site, rep_a.name, 9100) == _sources(site, rep_a.name, 9400) == {address[gw.name]}
    assert _sources(site, rep_a.name, 22) == set(rep_a.firewall.ssh_allowed_sources or [])
    # The gateway's port: its clients and the gpu nodes (the rolling drain calls its /workers).
    assert _sources(site, gw.name, gw.gateway.port) == {*gw.firewall.serving_allowed_sources, *address.values()} - {
        address[gw.name]
    }


def test_the_exporters_bind_the_loopback_only_where_the_host_is_its_only_monitor(replicas_site, inventory):
    site = replicas_site
    gw, rep_a = site.group("gateways")[0], site.group("gpu_nodes")[0]
    assert exporter_bind(gw, site.hosts) == "127.0.0.1" and exporter_bind(rep_a, site.hosts) == "0.0.0.0"
    alone = load_site(
        inventory.groups(
            gpu_nodes=[gpu_node()], monitors=[("gpu1", {"monitoring_webhook_url": "http://127.0.0.1:9/a"})]
        )
    )
    host = alone.hosts["gpu1"]
    assert exporter_bind(host, alone.hosts) == "127.0.0.1"
    from roles.monitoring import config, units

    assert "--web.listen-address=127.0.0.1:9100" in units.node_exporter_template(host, alone)[2]["args"]
    assert " -a 127.0.0.1:9400 " in units.dcgm_dropin(host, alone)[1]
    assert "127.0.0.1:9100" in config.prometheus_config(alone, host)  # and Prometheus scrapes it there


def test_tensor_parallel_nodes_let_each_other_in_on_every_port(inventory):
    site = load_site(
        inventory.groups(
            gpu_nodes=[
                ("node-a", {**TP, **SSH, "ssh_hostname": "10.0.0.11"}),
                ("node-b", {**TP, **SSH, "ssh_hostname": "10.0.0.12"}),
            ]
        )
    )
    every = [o for o in ruleset.openings(site.hosts["node-b"], site) if not o.ports]
    assert [o.sources for o in every] == [("10.0.0.11/32",)]
    # The engine on the loopback (serving_host's default): no opening of its own.
    assert _sources(site, "node-a", 30000) == {"10.0.0.12/32"}


# ----------------------------------------------------------------------------------------------
# The file, read back by nft.


def test_every_previewed_ruleset_parses_with_nft(replicas_site, tmp_path, inventory):
    out = tmp_path / "preview"
    assert render.main([str(REPLICAS), "--out", str(out)]) == 0
    files = sorted(out.rglob("etc/nftables.conf"))
    assert len(files) == 3, files
    # IPv6 sources, overlapping networks merged (an interval set refuses overlaps), every port.
    v6 = inventory.groups(
        gpu_nodes=[
            (
                "node-a",
                {
                    **TP,
                    **SSH,
                    "ssh_hostname": "2001:db8::11",
                    "firewall_ssh_allowed_sources": ["10.0.0.0/8", "10.1.0.0/16", "2001:db8::/32", "192.0.2.7"],
                    "firewall_serving_allowed_sources": ["::/0"],
                },
            ),
            ("node-b", {**TP, **SSH, "ssh_hostname": "2001:db8::12"}),
        ],
        name="v6.py",
    )
    assert render.main([str(v6), "--out", str(out / "v6")]) == 0
    files += sorted((out / "v6").rglob("etc/nftables.conf"))
    for path in files:
        result = nft_check(path)
        assert result.returncode == 0, f"{path}: {result.stderr}"
    text = (out / "v6" / "node-a" / "etc" / "nftables.conf").read_text()
    assert "ip saddr { 10.0.0.0/8, 192.0.2.7/32 } tcp dport 22 accept" in text
    assert "ip6 saddr { 2001:db8::12/128 } accept" in text
    assert "flush ruleset" not in text  # other tables (Docker's) are left alone


def test_nft_refuses_a_broken_ruleset(tmp_path):
    """The read-back can fail: a rule nft cannot parse is named."""
    path = tmp_path / "broken.nft"
    path.write_text("table inet t {\n\tchain input {\n\t\tip saddr { 10.0.0.0/33 } accept\n\t}\n}\n")
    result = nft_check(path)
    assert result.returncode != 0 and "10.0.0.0/33" in result.stderr


@pytest.mark.parametrize(
    "call",
    [
        lambda: ruleset.nft_set(["10.0.0.1/8"]),
        lambda: ruleset.nft_set(["10.0.0.0/8 } accept; {"]),
        lambda: ruleset.nft_port(0),
        lambda: ruleset.nft_port(True),
        lambda: ruleset.nft_comment('a" accept'),
    ],
)
def test_the_encoder_refuses_what_nft_would_misread(call):
    with pytest.raises(ValueError):
        call()


# ----------------------------------------------------------------------------------------------
# Settings: one line each.


@pytest.mark.parametrize(
    "data, parts",
    [
        (
            {"firewall_enabled": True},
            ["firewall_enabled = True without firewall_ssh_allowed_sources", "the deploy itself connects over SSH"],
        ),
        ({**SSH, "firewall_ssh_allowed_sources": ["192.0.2.7/24"]}, ["'192.0.2.7/24' is not one", "has host bits"]),
        ({**SSH, "firewall_serving_allowed_sources": ["lan"]}, ["firewall_serving_allowed_sources", "'lan'"]),
        ({**SSH, "firewall_ssh_allowed_sources": "192.0.2.0/24"}, ["firewall_ssh_allowed_sources", "list"]),
    ],
)
def test_bad_firewall_settings_are_one_line(inventory, data, parts):
    problems = _problems(inventory.groups(gpu_nodes=[gpu_node(**data)]))
    assert len(problems) == 1, problems
    for part in parts:
        assert part in problems[0], (part, problems[0])


def test_a_peer_named_by_a_dns_name_is_refused(inventory):
    problems = _problems(
        inventory.groups(
            gpu_nodes=[("node-a", {**TP, **SSH, "ssh_hostname": "10.0.0.11"}), ("node-b.example", {**TP, **SSH})]
        )
    )
    assert len(problems) == 1, problems
    assert "host node-b.example is reached at 'node-b.example', not an IP address" in problems[0]


def test_the_firewall_is_off_by_default_and_never_on_a_proxmox_node():
    import dataclasses

    from roles.site import FirewallSettings, firewalled

    site = load_site(PROJECT_ROOT / "inventory" / "prod.py")
    assert not any(h.firewall.enabled for h in site.hosts.values())
    on = FirewallSettings(enabled=True, ssh_allowed_sources=["192.0.2.0/24"])
    guest, node = site.group("gpu_nodes")[0], site.group("proxmox_hosts")[0]
    assert firewalled(dataclasses.replace(guest, firewall=on))
    # Even a node that is a monitor too: its firewall is Proxmox's own.
    assert not firewalled(dataclasses.replace(node, groups=(*node.groups, "monitors"), firewall=on))


# ----------------------------------------------------------------------------------------------
# The deploy's own SSH path.


def test_the_deploys_own_ssh_connection_is_kept(replicas_site):
    rep_a = replicas_site.group("gpu_nodes")[0]
    control = (rep_a.firewall.ssh_allowed_sources or [""])[0].split("/")[0]
    assert own_ssh_cut(rep_a, None) is None  # docker exec, @local: no SSH to cut
    assert own_ssh_cut(rep_a, (control, 22)) is None
    assert "comes from 198.51.100.9, outside firewall_ssh_allowed_sources" in (
        own_ssh_cut(rep_a, ("198.51.100.9", 22)) or ""
    )
    assert "reaches port 2222" in (own_ssh_cut(rep_a, (control, 2222)) or "")


def test_ssh_connection_is_read_from_sshds_variable():
    assert parse_ssh_connection(["SSH_CONNECTION=192.0.2.5 51234 10.0.0.7 22"]) == ("192.0.2.5", 22)
    assert parse_ssh_connection(["SSH_CONNECTION=fe80::1%eth0 5 fe80::2%eth0 22"]) == ("fe80::1%eth0", 22)
    assert parse_ssh_connection([]) is None


# ----------------------------------------------------------------------------------------------
# Proxmox: firewall=1 on a guest's net0.


def test_guest_firewall_sets_firewall_1_on_net0():
    assert pve.lxc_net0("vmbr0", "dhcp", None, firewall=True) == "name=eth0,bridge=vmbr0,firewall=1,ip=dhcp,type=veth"
    assert pve.lxc_net0("vmbr0", "dhcp", None) == "name=eth0,bridge=vmbr0,ip=dhcp,type=veth"
    assert pve.kvm_net0("vmbr0", firewall=True) == "virtio,bridge=vmbr0,firewall=1"
    have = "virtio=BC:24:11:AA:BB:CC,bridge=vmbr0"
    # Its MAC kept (qm takes the keys in any order: `virtio` is an alias of macaddr in $net_fmt).
    assert pve.kvm_net0_firewall(have, True) == "bridge=vmbr0,firewall=1,virtio=BC:24:11:AA:BB:CC"
    assert pve.kvm_net0_firewall(have + ",firewall=1", True) is None
    assert pve.kvm_net0_firewall(have + ",firewall=1", False) == "bridge=vmbr0,virtio=BC:24:11:AA:BB:CC"
    assert pve.kvm_net0_firewall(have, False) is None
