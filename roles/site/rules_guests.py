"""Cross-host rules about guests: VMIDs, addresses, GPUs given to guests, IOMMU groups,
LXC device and mount-point indices, KVM passthrough."""

from __future__ import annotations

import ipaddress

from roles.site.errors import shown
from roles.site.schema import HostSettings
from roles.site.sections.guest import KVM_MAX_HOSTPCI, LXC_MAX_DEVICES, LXC_MAX_MOUNT_POINTS


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


def _address_key(address: str) -> str:
    """One spelling per address: an IP address as ipaddress writes it, a DNS name in lower
    case without its final dot (DNS names are case-insensitive, RFC 4343)."""
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        return address.lower().rstrip(".")


def _check_addresses(site_hosts: dict[str, HostSettings], where: str, problems: list[str]) -> None:
    """One address, one host: the deploy (and the checks) reach a host by its ssh_hostname; two
    hosts of the inventory at one address are one machine deployed twice with two roles (a node
    and its guest both at the node's address: the guest's role runs on the node)."""
    owner: dict[str, str] = {}
    for host in site_hosts.values():
        if not host.valid("ssh_hostname") or (not host.ssh_hostname and host.name.startswith("@")):
            continue  # a connector's host (@docker/...) is reached by its container, not an address
        address = host.ssh_hostname or host.name  # pyinfra connects to the name when no ssh_hostname
        first = owner.setdefault(_address_key(address), host.name)
        if first != host.name:
            problems.append(
                f"{where}: host {host.name}: ssh_hostname = {address!r} is {first}'s address too;"
                " expected each host of the inventory at an address of its own"
                + ("" if host.ssh_hostname else " (no ssh_hostname: pyinfra connects to the host's name)")
            )


def is_ip_text(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


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
