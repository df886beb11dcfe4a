"""Proxmox config parsing, rendered config lines, the smallest set/--delete plans, the node's
facts on sample output, and the kernel arguments for both boot loaders."""

from __future__ import annotations

from pathlib import Path

import jinja2
import pytest

from roles.proxmox_host import iommu_kernel_args, systemd_boot_cmdline
from roles.shared import pve
from roles.shared.proxmox_facts import (
    parse_boot_loader,
    parse_guest_state,
    parse_nvidia_host_devices,
    parse_pci_devices,
)
from tests.unit.conftest import PROJECT_ROOT

DATA = Path(__file__).parent / "data"
PROXMOX = DATA / "proxmox"
H200 = DATA / "gpu" / "h200-1gpu"


# --- parsing what Proxmox writes ---------------------------------------------------------------


def test_lxc_conf_with_pending_section_and_snapshot():
    config = pve.parse_config((PROXMOX / "lxc-201.conf").read_text(), "lxc")
    assert config.current["dev1"] == "/dev/nvidia1"
    assert config.pending == {"dev5": "/dev/nvidia2,mode=0666"}
    assert config.pending_delete == {"dev1"}
    assert config.current["cores"] == "96"  # the snapshot's cores: 64 does not leak in
    assert ("lxc.cgroup2.devices.allow", "c 10:200 rwm") in config.lxc
    assert config.has_pending


def test_effective_config_equals_what_pct_config_prints():
    from_file = pve.parse_config((PROXMOX / "lxc-201.conf").read_text(), "lxc").effective()
    printed = pve.parse_config((PROXMOX / "pct-config-201.txt").read_text(), "lxc").current
    printed.pop("description")  # pct config prints it, the file keeps it as # lines
    assert from_file == printed


def test_qemu_conf_hostpci_and_pending_delete():
    config = pve.parse_config((PROXMOX / "qemu-202.conf").read_text(), "qemu")
    assert pve.hostpci_address(config.current["hostpci1"]) == "0000:a1:00.0"
    assert pve.parse_property_string(config.current["hostpci1"], "host") == {
        "host": "0000:a1:00.0",
        "pcie": "1",
        "x-vga": "1",
    }
    assert config.pending_delete == {"hostpci1"}
    assert config.effective()["hostpci2"] == "0000:c1:00.0,pcie=1"
    assert "hostpci1" not in config.effective()


def test_qemu_conf_cloudinit_and_snapshot_sections_stay_out():
    config = pve.parse_config((PROXMOX / "qemu-202.conf").read_text(), "qemu")
    effective = config.effective()
    assert effective["ipconfig0"] == "ip=dhcp"  # not [special:cloudinit]'s older value
    assert effective["name"] == "gpu-vm"  # not the cloud-init section's old name
    assert effective["cores"] == "32"  # not the snapshot's 16
    assert "hostpci3" not in effective and "snaptime" not in effective
    assert config.pending == {"hostpci2": "0000:c1:00.0,pcie=1"}


def test_vm_pending_is_not_read_from_a_container_header():
    # A VM's pending section is [PENDING]; read as a container's config it would be a snapshot
    # named PENDING (pve-container's snapshot regex), so the pending delete is not seen.
    text = (PROXMOX / "qemu-202.conf").read_text()
    assert pve.parse_config(text, "lxc").pending_delete == frozenset()
    assert pve.parse_config(text, "qemu").pending_delete == {"hostpci1"}


def test_upstream_qemu_server_sections_sample():
    # qemu-server 8.4.10 src/test/parse-config-input/sections.conf, verbatim.
    config = pve.parse_config((PROXMOX / "upstream-qemu-server-8.4.10-sections.conf").read_text(), "qemu")
    assert config.pending == {"bios": "ovmf"}
    assert config.current["ipconfig0"] == "ip6=dhcp"
    assert config.current["name"] == "deb1223"
    assert config.current["parent"] == "foo"
    assert "snaptime" not in config.current
    assert config.effective()["bios"] == "ovmf"


def test_upstream_qemu_server_snapshot_named_cloudinit():
    # A snapshot may be called "cloudinit": only [special:cloudinit] is the special section.
    config = pve.parse_config((PROXMOX / "upstream-qemu-server-8.4.10-cloudinit-snapshot.conf").read_text(), "qemu")
    assert config.current["numa"] == "0"  # the snapshot's bogus "numa: verify meee~ :)" stays out
    assert config.current["ipconfig0"] == "ip6=dhcp"
    assert not config.has_pending


def test_upstream_pve_container_snapshot_sample():
    # pve-container 5.3.5 src/test/snapshot-expected/create/lxc/101.conf, verbatim.
    config = pve.parse_config((PROXMOX / "upstream-pve-container-5.3.5-snapshot-101.conf").read_text(), "lxc")
    assert config.current["parent"] == "test"
    assert config.current["swap"] == "512"
    assert "snaptime" not in config.current
    assert not config.has_pending


def test_qemu_unknown_section_is_skipped():
    text = "cores: 4\n\n[special:other]\ncores: 8\n\n[pve:pending]\ncores: 16\n"
    config = pve.parse_config(text, "qemu")
    assert config.effective() == {"cores": "4"}


def test_guest_state_fact_output():
    text = "status: running\n---\n" + (PROXMOX / "lxc-201.conf").read_text()
    state = parse_guest_state(text.splitlines(), "lxc")
    assert state["status"] == "running"
    assert state["config"].current["hostname"] == "gpu-lxc"
    assert parse_guest_state([], "lxc") is None


# --- rendering the lines the roles want ---------------------------------------------------------


def test_rendered_lxc_lines():
    assert pve.lxc_features(["nesting", "keyctl"]) == "keyctl=1,nesting=1"
    assert pve.lxc_net0("vmbr0", "dhcp", None) == "name=eth0,bridge=vmbr0,ip=dhcp,type=veth"
    assert (
        pve.lxc_net0("vmbr1", "10.0.0.5/24", "10.0.0.1")
        == "name=eth0,bridge=vmbr1,gw=10.0.0.1,ip=10.0.0.5/24,type=veth"
    )
    assert pve.lxc_mount_point("/tank/models", "/models") == "/tank/models,mp=/models"


def test_rendered_kvm_lines():
    assert pve.hostpci("0000:01:00.0", True, False) == "0000:01:00.0,pcie=1"
    assert pve.hostpci("0000:01:00.0", True, True) == "0000:01:00.0,pcie=1,x-vga=1"
    assert pve.hostpci("0000:01:00.0", False, False) == "0000:01:00.0"
    assert pve.mmio_window_args(262144) == "-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=262144"
    assert pve.mmio_window_args(None) is None


def test_device_paths_only_include_optional_nodes_when_present():
    base = {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}
    assert pve.lxc_device_paths([1, 0], base) == [
        "/dev/nvidia0",
        "/dev/nvidia1",
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
    ]
    full = base | {"/dev/nvidia-modeset", "/dev/nvidia-caps/nvidia-cap2", "/dev/nvidia-caps/nvidia-cap1"}
    assert pve.lxc_device_paths([0], full)[-3:] == [
        "/dev/nvidia-modeset",
        "/dev/nvidia-caps/nvidia-cap1",
        "/dev/nvidia-caps/nvidia-cap2",
    ]
    assert pve.lxc_device_paths([], full) == []


def test_net0_keeps_the_generated_mac_and_ignores_it_when_comparing():
    have = "name=eth0,bridge=vmbr0,hwaddr=BC:24:11:5E:3A:91,ip=dhcp,type=veth"
    assert pve.same_net(have, pve.lxc_net0("vmbr0", "dhcp", None))
    assert not pve.same_net(have, pve.lxc_net0("vmbr1", "dhcp", None))
    assert (
        pve.with_hwaddr(have, pve.lxc_net0("vmbr1", "dhcp", None))
        == "name=eth0,bridge=vmbr1,hwaddr=BC:24:11:5E:3A:91,ip=dhcp,type=veth"
    )


# --- planning the smallest change ---------------------------------------------------------------


def _devices(*paths):
    return {f"dev{i}": p for i, p in enumerate(paths)}


def test_removing_a_gpu_deletes_one_entry_and_renumbers_nothing():
    have = _devices("/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl")
    plan = pve.plan_indexed(
        have, pve.LXC_DEVICE_KEYS, ["/dev/nvidia0", "/dev/nvidiactl"], pve.device_path, pve.same_device
    )
    assert plan == pve.Plan({}, ("dev1",))
    assert plan.arguments() == ["--delete", "dev1"]


def test_adding_a_gpu_takes_the_lowest_free_index():
    have = {"dev0": "/dev/nvidia0", "dev2": "/dev/nvidiactl"}
    plan = pve.plan_indexed(
        have, pve.LXC_DEVICE_KEYS, ["/dev/nvidia0", "/dev/nvidia5", "/dev/nvidiactl"], pve.device_path, pve.same_device
    )
    assert plan == pve.Plan({"dev1": "/dev/nvidia5"}, ())


def test_replacing_a_gpu_reuses_its_slot_with_one_set():
    have = _devices("/dev/nvidia0", "/dev/nvidiactl")
    plan = pve.plan_indexed(
        have, pve.LXC_DEVICE_KEYS, ["/dev/nvidia3", "/dev/nvidiactl"], pve.device_path, pve.same_device
    )
    assert plan == pve.Plan({"dev0": "/dev/nvidia3"}, ())


def test_changed_options_rewrite_the_entry_in_place_and_path_prefix_is_equivalent():
    have = {"hostpci0": "0000:01:00.0", "hostpci1": "0000:21:00.0,pcie=1"}
    wanted = [pve.hostpci("0000:01:00.0", True, False), pve.hostpci("0000:21:00.0", True, False)]
    plan = pve.plan_indexed(have, pve.KVM_HOSTPCI_KEYS, wanted, pve.hostpci_address, pve.same_hostpci)
    assert plan == pve.Plan({"hostpci0": "0000:01:00.0,pcie=1"}, ())
    assert pve.same_device("path=/dev/nvidia0", "/dev/nvidia0")


def test_converged_config_plans_nothing():
    effective = pve.parse_config((PROXMOX / "qemu-202.conf").read_text(), "qemu").effective()
    wanted = [effective["hostpci0"], effective["hostpci2"]]
    assert not pve.plan_indexed(effective, pve.KVM_HOSTPCI_KEYS, wanted, pve.hostpci_address, pve.same_hostpci)
    assert not pve.plan_scalars(effective, {"cores": "32", "cpu": "host"})
    assert pve.plan_scalars(effective, {"cores": "48"}).arguments() == ["--cores", "48"]


# --- the node's facts on sample output ----------------------------------------------------------


def test_gpu_minor_from_real_proc_driver_output():
    lines = (H200 / "proc-gpus.txt").read_text().splitlines()
    lines += [
        "node character special file|c3:0|/dev/nvidia0",
        "node character special file|c3:ff|/dev/nvidiactl",
        "node character special file|1fb:1|/dev/nvidia-uvm-tools",
        "node regular empty file|0:0|/dev/nvidia-bogus",
    ]
    devices = parse_nvidia_host_devices(lines)
    assert devices["minors"] == {"0000:00:06.0": 0}
    assert devices["nodes"] == {
        "/dev/nvidia0": (195, 0),
        "/dev/nvidiactl": (195, 255),
        "/dev/nvidia-uvm-tools": (507, 1),
    }


def test_pci_devices_from_pvesh_json():
    text = (
        '[{"id":"0000:01:00.0","class":"0x030200","vendor":"0x10de","device":"0x2bb5",'
        '"iommugroup":22,"vendor_name":"NVIDIA Corporation"}]'
    )
    devices = parse_pci_devices(text)
    assert devices["0000:01:00.0"]["iommugroup"] == 22
    assert parse_pci_devices("") == {}


@pytest.mark.parametrize(
    ("sample", "loader"),
    [
        ("pbt-status-uefi.txt", "systemd-boot"),
        ("pbt-status-grub.txt", "grub"),
        ("pbt-status-none.txt", "grub"),
    ],
)
def test_boot_loader_detection(sample, loader):
    assert parse_boot_loader((PROXMOX / sample).read_text().splitlines()) == loader


# --- kernel arguments for both boot loaders -----------------------------------------------------


def test_kernel_args_per_cpu_vendor():
    assert iommu_kernel_args("intel") == ["intel_iommu=on", "iommu=pt"]
    assert iommu_kernel_args("amd") == ["amd_iommu=on", "iommu=pt"]


def test_systemd_boot_cmdline_appends_once_and_keeps_root():
    args = iommu_kernel_args("intel")
    once = systemd_boot_cmdline("root=ZFS=rpool/ROOT/pve-1 boot=zfs\n", args)
    assert once == "root=ZFS=rpool/ROOT/pve-1 boot=zfs intel_iommu=on iommu=pt\n"
    assert systemd_boot_cmdline(once, args) == once
    assert (
        systemd_boot_cmdline("root=ZFS=rpool/ROOT/pve-1 intel_iommu=off quiet", args)
        == "root=ZFS=rpool/ROOT/pve-1 intel_iommu=on quiet iommu=pt\n"
    )


def test_grub_dropin_extends_the_default_command_line():
    template = jinja2.Template(
        (PROJECT_ROOT / "roles" / "proxmox_host" / "templates" / "inference-host-iommu.cfg.j2").read_text()
    )
    text = template.render(kernel_args=iommu_kernel_args("amd"))
    assert 'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT amd_iommu=on iommu=pt"' in text
    assert [line for line in text.splitlines() if not line.startswith("#")] == [
        'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT amd_iommu=on iommu=pt"'
    ]


def test_vfio_modules_file():
    from roles.proxmox_host import VFIO_MODULES

    template = jinja2.Template((PROJECT_ROOT / "roles" / "proxmox_host" / "templates" / "vfio.conf.j2").read_text())
    lines = [line for line in template.render(modules=VFIO_MODULES).splitlines() if not line.startswith("#")]
    assert lines == ["vfio", "vfio_iommu_type1", "vfio_pci"]


# --- the lab's pct/qm stand-ins write the sections upstream writes -------------------------------


@pytest.mark.parametrize(
    ("kind", "folder", "header"), [("lxc", "lxc", "[pve:pending]"), ("qemu", "qemu-server", "[PENDING]")]
)
def test_standin_writes_upstreams_pending_header_and_keeps_snapshots(tmp_path, monkeypatch, kind, folder, header):
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "pve_standin", PROJECT_ROOT / "lab" / "standins" / "proxmox" / "pve_standin.py"
    )
    standin = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(standin)
    monkeypatch.setattr(standin, "PVE_DIR", tmp_path)
    path = standin.conf_path(folder, 300)
    path.parent.mkdir(parents=True)
    path.write_text("cores: 4\nparent: snap1\n\n[snap1]\ncores: 2\nsnaptime: 1732789000\n")
    standin.write_conf(folder, 300, {"cores": "4", "parent": "snap1"}, {"cores": "8", "delete": "dev0"})
    text = path.read_text()
    assert f"\n{header}\ncores: 8\ndelete: dev0\n" in text
    assert text.endswith("\n[snap1]\ncores: 2\nsnaptime: 1732789000\n")
    config = pve.parse_config(text, kind)
    assert config.pending == {"cores": "8"} and config.pending_delete == {"dev0"}
    assert config.current == {"cores": "4", "parent": "snap1"}


@pytest.mark.skipif(not __import__("shutil").which("ssh-keygen"), reason="ssh-keygen is not installed")
def test_pct_standin_validates_keys_with_ssh_keygen_as_pve_common_does(tmp_path):
    """PVE::Tools::validate_ssh_public_keys (pve-common) runs `ssh-keygen -l -f` on each line:
    a key of the right shape whose base64 is corrupt is refused, blank lines are skipped."""
    import importlib.machinery
    import importlib.util
    import subprocess

    path = str(PROJECT_ROOT / "lab" / "standins" / "proxmox" / "pct")
    loader = importlib.machinery.SourceFileLoader("pct_standin", path)
    pct = importlib.util.module_from_spec(importlib.util.spec_from_loader("pct_standin", loader))
    loader.exec_module(pct)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "lab", "-f", str(tmp_path / "k")], check=True)
    good = (tmp_path / "k.pub").read_text().strip()
    pct.validate_ssh_public_keys(f"{good}\n\n   \n{good}\n")
    kind, blob, comment = good.split()
    # The key's inner length field says 36 bytes, not 32: still [A-Za-z0-9+/=]+, not a key.
    assert blob[20:25] == "AAAAI"
    corrupt = f"{kind} {blob[:20]}AAAAJ{blob[25:]} {comment}"
    for bad in (corrupt, f"{kind} {blob[:-8]} {comment}", "not a key"):
        with pytest.raises(pct.pve.PveError, match=r"^SSH public key validation error$"):
            pct.validate_ssh_public_keys(f"{good}\n{bad}\n")
