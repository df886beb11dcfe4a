"""The Proxmox inventory rules (docs/upstream.md, "Proxmox VE 8"), each refused with its own message."""

from __future__ import annotations

from roles.site import load_site
from tests.unit.test_site import NODE, assert_names, lxc, only_problem, problems_of

GPU1, GPU2 = NODE[1]["proxmox_gpu_addresses"]


def vm(name="vm", **data):
    return (name, {"guest_vmid": 300, "guest_node": "pve", **data})


def test_valid_lxc_and_kvm_guests(inventory):
    site = load_site(
        inventory.groups(
            proxmox_hosts=[NODE],
            lxc_guests=[lxc(guest_gpu_addresses=[GPU1], guest_mount_points={"/tank/models": "/models"})],
            kvm_guests=[vm(guest_gpu_addresses=[GPU2], guest_x_vga_addresses=[GPU2], guest_mmio_window_mb=262144)],
        )
    )
    assert site.hosts["vm"].guest.machine == "q35" and site.hosts["vm"].guest.bios == "ovmf"


def test_gpu_in_two_lxc_guests_has_no_vfio_remark(inventory):
    path = inventory.groups(
        proxmox_hosts=[NODE],
        lxc_guests=[lxc("a", guest_gpu_addresses=[GPU1]), lxc("b", guest_vmid=201, guest_gpu_addresses=[GPU1])],
    )
    message = only_problem(path)
    assert_names(message, "host b", f"{GPU1}, already given to a")
    assert "vfio" not in message


def test_gpu_never_in_lxc_and_kvm_at_once(inventory):
    path = inventory.groups(
        proxmox_hosts=[NODE], lxc_guests=[lxc(guest_gpu_addresses=[GPU1])], kvm_guests=[vm(guest_gpu_addresses=[GPU1])]
    )
    assert_names(only_problem(path), "never to an LXC guest (host driver) and a KVM guest (vfio-pci) at once")


def test_iommu_group_shared_between_guests(inventory):
    node = ("pve", {**NODE[1], "proxmox_iommu_groups": {GPU1: 7, GPU2: 7}})
    path = inventory.groups(
        proxmox_hosts=[node], lxc_guests=[lxc(guest_gpu_addresses=[GPU1])], kvm_guests=[vm(guest_gpu_addresses=[GPU2])]
    )
    assert_names(only_problem(path), "host vm", f"{GPU2}, which shares IOMMU group 7 with {GPU1} of guest ct")


def test_iommu_group_keys_are_addresses(inventory):
    node = ("pve", {**NODE[1], "proxmox_iommu_groups": {"01:00": 7}})
    assert_names(
        only_problem(inventory.groups(proxmox_hosts=[node])),
        "proxmox_iommu_groups = {'01:00': 7}",
        "{PCI address: group number}",
    )


def test_pci_address_format(inventory):
    path = inventory.groups(proxmox_hosts=[NODE], kvm_guests=[vm(guest_gpu_addresses=["0000:01:00"])])
    assert_names(problems_of(path)[0], "guest_gpu_addresses = ['0000:01:00']", "PCI addresses like 0000:01:00.0")


def test_hostpci_index_range(inventory):
    gpus = [f"0000:{i:02x}:00.0" for i in range(1, 18)]
    node = ("pve", {"proxmox_gpu_addresses": gpus})
    path = inventory.groups(proxmox_hosts=[node], kvm_guests=[vm(guest_gpu_addresses=gpus)])
    assert_names(only_problem(path), "lists 17 GPUs", "at most 16 per VM (hostpci0-hostpci15)")


def test_lxc_device_index_range(inventory):
    gpus = [f"0000:{i // 256:02x}:{i % 256:02x}.0" for i in range(252)]
    node = ("pve", {"proxmox_gpu_addresses": gpus})
    path = inventory.groups(proxmox_hosts=[node], lxc_guests=[lxc(guest_gpu_addresses=gpus)])
    assert_names(only_problem(path), "needs dev0..dev256", "at most 256 device entries (dev0-dev255)")


def test_lxc_mount_point_index_range(inventory):
    mounts = {f"/tank/m{i}": f"/m{i}" for i in range(257)}
    path = inventory.groups(proxmox_hosts=[NODE], lxc_guests=[lxc(guest_mount_points=mounts)])
    assert_names(only_problem(path), "guest_mount_points has 257 entries", "(mp0-mp255)")


def test_pcie_needs_q35(inventory):
    path = inventory.groups(proxmox_hosts=[NODE], kvm_guests=[vm(guest_gpu_addresses=[GPU1], guest_machine="pc")])
    assert_names(only_problem(path), "guest_machine = 'pc' with guest_pcie = True", "pcie=1 needs q35")


def test_machine_type_pattern(inventory):
    path = inventory.groups(proxmox_hosts=[NODE], kvm_guests=[vm(guest_machine="q36")])
    assert_names(only_problem(path), "guest_machine = 'q36'", "q35, pc, pc-q35-8.1")


def test_at_most_one_x_vga(inventory):
    path = inventory.groups(
        proxmox_hosts=[NODE], kvm_guests=[vm(guest_gpu_addresses=[GPU1, GPU2], guest_x_vga_addresses=[GPU1, GPU2])]
    )
    assert_names(only_problem(path), "guest_x_vga_addresses", "at most one x-vga device per VM")


def test_x_vga_must_be_a_guest_gpu(inventory):
    path = inventory.groups(
        proxmox_hosts=[NODE], kvm_guests=[vm(guest_gpu_addresses=[GPU1], guest_x_vga_addresses=[GPU2])]
    )
    assert_names(only_problem(path), f"guest_x_vga_addresses has {GPU2}", "one of the guest's GPUs")


def test_large_bar_vm_needs_cpu_host(inventory):
    path = inventory.groups(proxmox_hosts=[NODE], kvm_guests=[vm(guest_gpu_addresses=[GPU1], guest_cpu="x86-64-v3")])
    assert_names(only_problem(path), "guest_cpu = 'x86-64-v3' with 96 GB GPUs", "phys-bits=host")


def test_large_bar_vm_accepts_phys_bits(inventory):
    load_site(
        inventory.groups(
            proxmox_hosts=[NODE], kvm_guests=[vm(guest_gpu_addresses=[GPU1], guest_cpu="x86-64-v3,phys-bits=host")]
        )
    )


def test_large_bar_vm_needs_ovmf(inventory):
    path = inventory.groups(proxmox_hosts=[NODE], kvm_guests=[vm(guest_gpu_addresses=[GPU1], guest_bios="seabios")])
    assert_names(only_problem(path), "guest_bios = 'seabios' with 96 GB GPUs", "'ovmf' (with an efidisk)")


def test_guest_driver_must_equal_host_driver(inventory):
    node = ("pve", {**NODE[1], "proxmox_driver_version": "580.95.05"})
    path = inventory.groups(
        proxmox_hosts=[node], lxc_guests=[lxc(guest_gpu_addresses=[GPU1], guest_driver_version="580.82.09")]
    )
    assert_names(
        only_problem(path),
        "guest_driver_version = '580.82.09' but pve runs '580.95.05'",
        "exactly the host's driver version",
    )


def test_guest_driver_defaults_to_the_stack(inventory):
    node = ("pve", {**NODE[1], "proxmox_driver_version": "580.82.09"})
    path = inventory.groups(proxmox_hosts=[node], lxc_guests=[lxc(guest_gpu_addresses=[GPU1])])
    assert_names(only_problem(path), "guest_driver_version = '580.95.05' but pve runs '580.82.09'")


def test_lxc_template_volume_format(inventory):
    path = inventory.groups(proxmox_hosts=[NODE], lxc_guests=[lxc(guest_template="ubuntu-24.04.tar.zst")])
    assert_names(only_problem(path), "guest_template = 'ubuntu-24.04.tar.zst'", "local:vztmpl/")


def test_guest_ip_format(inventory):
    path = inventory.groups(proxmox_hosts=[NODE], lxc_guests=[lxc(guest_ip="10.0.0.5")])
    assert_names(only_problem(path), "guest_ip = '10.0.0.5'", "an IPv4/CIDR")
