"""roles/firewall: inbound traffic lets in only who it should (roles/firewall/README.md).

Debian's and Ubuntu's nftables package, /etc/nftables.conf loaded by nftables.service: one
table of ours (roles/firewall/ruleset.py), replaced whole on each reload, never a flush of other
tables. A drop-in makes the unit's stop delete that table only: the packaged ExecStop is `nft
flush ruleset`, which would take Docker's NAT rules (a builder's) with it.
"""

from __future__ import annotations

import io
import ipaddress

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import apt, files, systemd

from roles.firewall import ruleset
from roles.firewall.facts import SshConnection
from roles.shared.refusal import Refused
from roles.site import HostSettings, current_host, current_site

UNIT = "nftables.service"
DROPIN = f"/etc/systemd/system/{UNIT}.d/90-inference-host.conf"
DROPIN_TEXT = (
    "# Written by inference-host (roles/firewall): stopping the unit removes our table only, not\n"
    "# every table as the packaged `nft flush ruleset` does (Docker's NAT rules among them).\n"
    "[Service]\n"
    "ExecStop=\n"
    f"ExecStop=-/usr/sbin/nft delete table inet {ruleset.TABLE}\n"
)


def own_ssh_cut(settings: HostSettings, connection: tuple[str, int] | None) -> str | None:
    """Why the rules would cut the SSH connection this deploy runs over, or None."""
    if connection is None:
        return None
    client, port = connection
    allowed = settings.firewall.ssh_allowed_sources or []
    wanted_port = settings.ssh.port or 22
    address = ipaddress.ip_address(client.split("%", 1)[0])
    if port != wanted_port:
        return (
            f"this deploy's SSH connection reaches port {port}, but the firewall opens SSH on {wanted_port} (ssh_port)"
        )
    if not any(address in ipaddress.ip_network(net) for net in allowed):
        return (
            f"this deploy's SSH connection comes from {client}, outside firewall_ssh_allowed_sources"
            f" {allowed}: the rules would cut it; add its network"
        )
    return None


@deploy("Firewall")
def firewall() -> None:
    settings, site = current_host(), current_site()
    cut = own_ssh_cut(settings, host.get_fact(SshConnection))
    if cut:
        raise Refused(f"{settings.name}: {cut} (nothing was written)")
    apt.packages(
        name="Install nftables",
        packages=["nftables"],
        update=True,
        cache_time=24 * 3600,
        no_recommends=True,
    )
    files.directory(name=f"Create {DROPIN.rsplit('/', 1)[0]}", path=DROPIN.rsplit("/", 1)[0], mode="0755")
    dropin = files.put(
        name=f"Write {DROPIN} (stop removes table inet {ruleset.TABLE} only)",
        src=io.StringIO(DROPIN_TEXT),
        dest=DROPIN,
        mode="0644",
    )
    openings = ruleset.openings(settings, site)
    conf = files.put(
        name=f"Write {ruleset.CONF_FILE} (table inet {ruleset.TABLE}: {len(openings)} openings, the rest refused)",
        src=io.StringIO(ruleset.ruleset(settings, site)),
        dest=ruleset.CONF_FILE,
        user="root",
        group="root",
        mode="0755",  # as the package ships it: an nft script (#!/usr/sbin/nft -f)
    )
    # A reload (nft -f, one transaction) replaces our table; a restart would run ExecStop first.
    systemd.service(
        name=f"Enable and start {UNIT} (reload: the new table replaces the old in one transaction)",
        service=UNIT,
        running=True,
        enabled=True,
        daemon_reload=dropin.will_change,
        reloaded=conf.will_change,
    )
