"""What the guest roles would run: `pct create` / `qm create` command lines and the `set` plans
for existing guests, from a site model and sample configs (no host needed)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from roles.kvm_guest import create_command as qm_create
from roles.kvm_guest import plan_update as qm_plan
from roles.lxc_guest import create_command as pct_create
from roles.lxc_guest import plan_update as pct_plan
from roles.lxc_guest import wanted_devices
from roles.shared import pve
from roles.site import load_site
from tests.unit.test_site import NODE

GPU1, GPU2 = NODE[1]["proxmox_gpu_addresses"]
PROXMOX = Path(__file__).parent / "data" / "proxmox"
HOST_DEVICES = {
    "minors": {GPU1: 0, GPU2: 1},
    "nodes": {"/dev/nvidia0": (195, 0), "/dev/nvidia1": (195, 1), "/dev/nvidiactl": (195, 255),
              "/dev/nvidia-uvm": (507, 0), "/dev/nvidia-uvm-tools": (507, 1)},
}


@pytest.fixture
def site(inventory):
    return load_site(inventory.groups(
        proxmox_hosts=[NODE],
        lxc_guests=[("sglang-lxc", {"guest_vmid": 201, "guest_node": "pve", "guest_gpu_addresses": [GPU1],
                                    "guest_cores": 96, "guest_memory_mib": 786432, "guest_disk_gib": 2000})],
        kvm_guests=[("sglang-vm", {"guest_vmid": 202, "guest_node": "pve", "guest_gpu_addresses": [GPU2],
                                   "guest_cores": 32, "guest_memory_mib": 131072, "guest_disk_gib": 200,
                                   "guest_mmio_window_mb": 262144})],
    ))


def test_pct_create_command(site):
    guest = site.hosts["sglang-lxc"]
    args = shlex.split(pct_create(guest, wanted_devices(guest, HOST_DEVICES)))
    assert args[:4] == ["pct", "create", "201", "local:vztmpl/ubuntu-24.04-standard_24.04-2_amd64.tar.zst"]
    options = dict(zip(args[4::2], args[5::2], strict=True))
    assert options == {
        "--unprivileged": "1", "--rootfs": "local-lvm:2000",
        "--net0": "name=eth0,bridge=vmbr0,ip=dhcp,type=veth", "--hostname": "sglang-lxc",
        "--cores": "96", "--memory": "786432", "--swap": "0", "--onboot": "1",
        "--features": "keyctl=1,nesting=1", "--dev0": "/dev/nvidia0", "--dev1": "/dev/nvidiactl",
        "--dev2": "/dev/nvidia-uvm", "--dev3": "/dev/nvidia-uvm-tools",
    }


def test_missing_uvm_node_is_a_clear_error(site):
    devices = {**HOST_DEVICES, "nodes": {k: v for k, v in HOST_DEVICES["nodes"].items() if "uvm" not in k}}
    with pytest.raises(RuntimeError, match="nvidia-uvm.*missing on the node"):
        wanted_devices(site.hosts["sglang-lxc"], devices)


def test_gpu_unknown_to_host_driver_is_a_clear_error(site):
    with pytest.raises(RuntimeError, match=f"GPU {GPU1}, but the node's NVIDIA driver lists no such GPU"):
        wanted_devices(site.hosts["sglang-lxc"], {**HOST_DEVICES, "minors": {}})


def test_qm_create_command(site):
    args = shlex.split(qm_create(site.hosts["sglang-vm"]))
    assert args[:3] == ["qm", "create", "202"]
    options = dict(zip(args[3::2], args[4::2], strict=True))
    assert options["--machine"] == "q35" and options["--bios"] == "ovmf" and options["--cpu"] == "host"
    assert options["--numa"] == "1" and options["--balloon"] == "0" and options["--memory"] == "131072"
    assert options["--efidisk0"] == "local-lvm:1,efitype=4m,pre-enrolled-keys=0"
    assert options["--scsi0"] == "local-lvm:200,iothread=1" and options["--net0"] == "virtio,bridge=vmbr0"
    assert options["--hostpci0"] == f"{GPU2},pcie=1"
    assert options["--args"] == "-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=262144"


def test_existing_lxc_guest_converges_with_only_the_differences(site):
    # the sample guest: 2 GPUs + pending changes; the inventory wants GPU1 only, hostname sglang-lxc
    config = pve.parse_config((PROXMOX / "lxc-201.conf").read_text())
    guest = site.hosts["sglang-lxc"]
    plan = pct_plan(guest, config, wanted_devices(guest, HOST_DEVICES))
    # dev5 (/dev/nvidia2, pending) goes; firewall=1 on net0 is not ours: net0 is rewritten with the same MAC
    assert plan.delete == ("dev5",)
    assert plan.set == {"net0": "name=eth0,bridge=vmbr0,hwaddr=BC:24:11:5E:3A:91,ip=dhcp,type=veth"}


def test_existing_vm_converges_with_only_the_differences(site):
    config = pve.parse_config((PROXMOX / "qemu-202.conf").read_text())
    plan = qm_plan(site.hosts["sglang-vm"], config)
    # the effective config has hostpci0 (GPU 0000:81..) and pending hostpci2: both replaced by GPU2
    assert plan.set == {"hostpci0": f"{GPU2},pcie=1"}
    assert plan.delete == ("hostpci2",)
