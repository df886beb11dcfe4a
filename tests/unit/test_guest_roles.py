"""What the guest roles would run: `pct create` / `qm create` command lines and the `set` plans
for existing guests, from a site model and sample configs (no host needed)."""

from __future__ import annotations

import shlex
from pathlib import Path
from types import SimpleNamespace

import pytest

from roles.kvm_guest import create_command as qm_create
from roles.kvm_guest import plan_sshkeys as qm_keys
from roles.kvm_guest import plan_update as qm_plan
from roles.lxc_guest import create_command as pct_create
from roles.lxc_guest import plan_keys as pct_keys
from roles.lxc_guest import plan_update as pct_plan
from roles.lxc_guest import wanted_devices
from roles.shared import pve
from roles.shared.guest_keys import qm_sshkeys, with_pve_block
from roles.shared.proxmox_facts import parse_authorized_keys
from roles.site import load_site
from tests.unit.test_site import NODE

GPU1, GPU2 = NODE[1]["proxmox_gpu_addresses"]
PROXMOX = Path(__file__).parent / "data" / "proxmox"
HOST_DEVICES = {
    "minors": {GPU1: 0, GPU2: 1},
    "nodes": {
        "/dev/nvidia0": (195, 0),
        "/dev/nvidia1": (195, 1),
        "/dev/nvidiactl": (195, 255),
        "/dev/nvidia-uvm": (507, 0),
        "/dev/nvidia-uvm-tools": (507, 1),
    },
}


@pytest.fixture
def site(inventory):
    return load_site(
        inventory.groups(
            proxmox_hosts=[NODE],
            lxc_guests=[
                (
                    "gpu-lxc",
                    {
                        "guest_vmid": 201,
                        "guest_node": "pve",
                        "guest_gpu_addresses": [GPU1],
                        "guest_cores": 96,
                        "guest_memory_mib": 786432,
                        "guest_disk_gib": 2000,
                    },
                )
            ],
            kvm_guests=[
                (
                    "gpu-vm",
                    {
                        "guest_vmid": 202,
                        "guest_node": "pve",
                        "guest_gpu_addresses": [GPU2],
                        "guest_cores": 32,
                        "guest_memory_mib": 131072,
                        "guest_disk_gib": 200,
                        "guest_mmio_window_mb": 262144,
                    },
                )
            ],
        )
    )


def test_pct_create_command(site):
    guest = site.hosts["gpu-lxc"]
    args = shlex.split(pct_create(guest, wanted_devices(guest, HOST_DEVICES)[0]))
    assert args[:4] == ["pct", "create", "201", "local:vztmpl/ubuntu-24.04-standard_24.04-2_amd64.tar.zst"]
    options = dict(zip(args[4::2], args[5::2], strict=True))
    assert options == {
        "--unprivileged": "1",
        "--rootfs": "local-lvm:2000",
        "--net0": "name=eth0,bridge=vmbr0,ip=dhcp,type=veth",
        "--hostname": "gpu-lxc",
        "--cores": "96",
        "--memory": "786432",
        "--swap": "0",
        "--onboot": "1",
        "--features": "keyctl=1,nesting=1",
        "--dev0": "/dev/nvidia0",
        "--dev1": "/dev/nvidiactl",
        "--dev2": "/dev/nvidia-uvm",
        "--dev3": "/dev/nvidia-uvm-tools",
    }


def test_missing_uvm_node_makes_the_guest_wait_with_a_reason(site):
    # No exception while planning: the guest waits for a later run of the same command.
    devices = {**HOST_DEVICES, "nodes": {k: v for k, v in HOST_DEVICES["nodes"].items() if "uvm" not in k}}
    paths, waiting = wanted_devices(site.hosts["gpu-lxc"], devices)
    assert paths == []
    assert "/dev/nvidia-uvm, /dev/nvidia-uvm-tools missing on the node" in waiting
    assert "nvidia-modprobe -u -c0" in waiting


def test_node_driver_listing_no_gpu_yet_makes_the_guest_wait(site):
    # A bare node: its driver is installed in this very run and loads only after the reboot.
    paths, waiting = wanted_devices(site.hosts["gpu-lxc"], {"minors": {}, "nodes": {}})
    assert paths == []
    assert f"lists no GPU {GPU1} yet" in waiting


def test_pct_create_puts_the_deploys_ssh_keys(inventory):
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHh0bWJ2ZXhhbXBsZWtleWZvcnRlc3RzMDAwMDAw deploy@control"
    site = load_site(
        inventory.groups(
            proxmox_hosts=[NODE],
            lxc_guests=[
                (
                    "gpu-lxc",
                    {
                        "guest_vmid": 201,
                        "guest_node": "pve",
                        "guest_gpu_addresses": [GPU1],
                        "guest_ssh_public_keys": [key],
                    },
                )
            ],
        )
    )
    guest = site.hosts["gpu-lxc"]
    args = shlex.split(pct_create(guest, wanted_devices(guest, HOST_DEVICES)[0]))
    assert args[args.index("--ssh-public-keys") + 1] == "/etc/inference-host/guest-keys/201.pub"


def test_qm_create_from_a_cloud_image_with_cloud_init(inventory):
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHh0bWJ2ZXhhbXBsZWtleWZvcnRlc3RzMDAwMDAw deploy@control"
    site = load_site(
        inventory.groups(
            proxmox_hosts=[NODE],
            kvm_guests=[
                (
                    "gpu-vm",
                    {
                        "guest_vmid": 202,
                        "guest_node": "pve",
                        "guest_gpu_addresses": [GPU2],
                        "guest_cloud_image": "local:import/noble-server-cloudimg-amd64.img",
                        "guest_ciuser": "root",
                        "guest_ssh_public_keys": [key],
                        "guest_ip": "10.0.0.202/24",
                        "guest_gateway": "10.0.0.1",
                    },
                )
            ],
        )
    )
    args = shlex.split(qm_create(site.hosts["gpu-vm"]))
    options = dict(zip(args[3::2], args[4::2], strict=True))
    assert options["--scsi0"] == "local-lvm:0,import-from=local:import/noble-server-cloudimg-amd64.img,iothread=1"
    assert options["--ide2"] == "local-lvm:cloudinit"
    assert options["--ciuser"] == "root"
    assert options["--sshkeys"] == "/etc/inference-host/guest-keys/202.pub"
    assert options["--ipconfig0"] == "gw=10.0.0.1,ip=10.0.0.202/24"  # stored as given, sorted
    assert options["--boot"] == "order=scsi0" and options["--serial0"] == "socket"


def test_bad_ssh_key_and_cloud_image_are_refused(inventory):
    from roles.site import SiteError

    with pytest.raises(SiteError) as error:
        load_site(
            inventory.groups(
                proxmox_hosts=[NODE],
                kvm_guests=[
                    (
                        "gpu-vm",
                        {
                            "guest_vmid": 202,
                            "guest_node": "pve",
                            "guest_ssh_public_keys": ["AAAA no type"],
                            "guest_cloud_image": "noble.img",
                        },
                    )
                ],
            )
        )
    text = str(error.value)
    assert "guest_ssh_public_keys" in text and "OpenSSH public key lines" in text
    assert "guest_cloud_image" in text and "local:import/" in text


def test_qm_create_command(site):
    args = shlex.split(qm_create(site.hosts["gpu-vm"]))
    assert args[:3] == ["qm", "create", "202"]
    options = dict(zip(args[3::2], args[4::2], strict=True))
    assert options["--machine"] == "q35" and options["--bios"] == "ovmf" and options["--cpu"] == "host"
    assert options["--numa"] == "1" and options["--balloon"] == "0" and options["--memory"] == "131072"
    assert options["--efidisk0"] == "local-lvm:1,efitype=4m,pre-enrolled-keys=0"
    assert options["--scsi0"] == "local-lvm:200,iothread=1" and options["--net0"] == "virtio,bridge=vmbr0"
    assert options["--hostpci0"] == f"{GPU2},pcie=1"
    assert options["--args"] == "-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=262144"


def test_existing_lxc_guest_converges_with_only_the_differences(site):
    # the sample guest: 2 GPUs + pending changes; the inventory wants GPU1 only, hostname gpu-lxc
    config = pve.parse_config((PROXMOX / "lxc-201.conf").read_text(), "lxc")
    guest = site.hosts["gpu-lxc"]
    plan = pct_plan(guest, config, wanted_devices(guest, HOST_DEVICES)[0])
    # dev5 (/dev/nvidia2, pending) goes; firewall=1 on net0 is not ours: net0 is rewritten with the same MAC
    assert plan.delete == ("dev5",)
    assert plan.set == {"net0": "name=eth0,bridge=vmbr0,hwaddr=BC:24:11:5E:3A:91,ip=dhcp,type=veth"}


def test_existing_vm_converges_with_only_the_differences(site):
    config = pve.parse_config((PROXMOX / "qemu-202.conf").read_text(), "qemu")
    plan = qm_plan(site.hosts["gpu-vm"], config)
    # the effective config has hostpci0 (GPU 0000:81..) and pending hostpci2: both replaced by GPU2
    assert plan.set == {"hostpci0": f"{GPU2},pcie=1"}
    assert plan.delete == ("hostpci2",)


# --- SSH keys of an existing guest ---------------------------------------------------------------

KEY_A = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHh0bWJ2ZXhhbXBsZWtleWZvcnRlc3RzMDAwMDAw deploy@control"
KEY_B = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIG5ld2tleWZvcnRlc3RzMDAwMDAwMDAwMDAwMDAw deploy@new"
MINE = "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQC7 admin@laptop"


def _keyed_guest(inventory, keys, **extra):
    site = load_site(
        inventory.groups(
            f"keys{len(keys)}.py",  # one file per setting: a loaded inventory file is not read again
            proxmox_hosts=[NODE],
            lxc_guests=[
                (
                    "gpu-lxc",
                    {
                        "guest_vmid": 201,
                        "guest_node": "pve",
                        "guest_gpu_addresses": [GPU1],
                        "guest_ssh_public_keys": keys,
                    },
                )
            ],
            kvm_guests=[
                (
                    "gpu-vm",
                    {
                        "guest_vmid": 202,
                        "guest_node": "pve",
                        "guest_gpu_addresses": [GPU2],
                        "guest_ssh_public_keys": keys,
                        "guest_cloud_image": "local:import/noble-server-cloudimg-amd64.img",
                        **extra,
                    },
                )
            ],
        )
    )
    return site.hosts["gpu-lxc"], site.hosts["gpu-vm"]


def test_pve_block_is_written_like_pct_create_does():
    # pve-container Setup/Base.pm ct_modify_file: new file, block replaced, block appended
    assert with_pve_block(None, [KEY_A]) == f"# --- BEGIN PVE ---\n{KEY_A}\n# --- END PVE ---\n"
    inside = f"{MINE}\n# --- BEGIN PVE ---\n{KEY_A}\n# --- END PVE ---\n{MINE} second\n"
    assert with_pve_block(inside, [KEY_B]) == (
        f"{MINE}\n# --- BEGIN PVE ---\n{KEY_B}\n# --- END PVE ---\n{MINE} second\n"
    )
    assert with_pve_block(f"{MINE}\n", [KEY_B]) == f"{MINE}\n# --- BEGIN PVE ---\n{KEY_B}\n# --- END PVE ---\n"
    # the markers as ct_modify_file matches them: spacing is free, only END ignores case
    loose = "#---BEGIN PVE---\nold\n# --- end pve ---\n"
    assert with_pve_block(loose, [KEY_A]) == f"# --- BEGIN PVE ---\n{KEY_A}\n# --- END PVE ---\n"


def test_changed_keys_make_one_push_and_same_keys_none(inventory):
    guest, _ = _keyed_guest(inventory, [KEY_B])
    created = {"ssh_dir": True, "content": f"# --- BEGIN PVE ---\n{KEY_A}\n# --- END PVE ---\n{MINE}\n"}
    commands, waiting = pct_keys(guest, "running", created)
    assert waiting is None and len(commands) == 1
    pushed = shlex.split(commands[0].split("printf '%s' ", 1)[1].split(" > ", 1)[0])[0]
    assert pushed == f"# --- BEGIN PVE ---\n{KEY_B}\n# --- END PVE ---\n{MINE}\n"  # KEY_A gone, MINE kept
    assert 'pct push 201 "$keys" /root/.ssh/authorized_keys --perms 0600' in commands[0]
    assert "pct exec 201 -- sha256sum /root/.ssh/authorized_keys" in commands[0]  # read back
    # the file as pushed (trailing blanks and empty lines aside) is converged: nothing to do
    same = {"ssh_dir": True, "content": pushed.replace("\n", "  \n\n")}
    assert pct_keys(guest, "running", same) == ([], None)


def test_keys_without_ssh_folder_stopped_guest_and_empty_setting(inventory):
    guest, _ = _keyed_guest(inventory, [KEY_A])
    commands, _ = pct_keys(guest, "running", {"ssh_dir": False, "content": None})
    assert commands[0] == "pct exec 201 -- mkdir -m 0700 /root/.ssh" and len(commands) == 2
    commands, waiting = pct_keys(guest, "stopped", None)
    assert commands == [] and "converged once it runs" in waiting and "pct push" in waiting
    commands, waiting = pct_keys(guest, "running", None)
    assert commands == [] and "could not be read with `pct exec`" in waiting
    unmanaged, _ = _keyed_guest(inventory, [])
    assert pct_keys(unmanaged, "running", {"ssh_dir": True, "content": f"{MINE}\n"}) == ([], None)


def test_authorized_keys_fact_output():
    assert parse_authorized_keys(["file", "# --- BEGIN PVE ---", KEY_A, "# --- END PVE ---"]) == {
        "ssh_dir": True,
        "content": f"# --- BEGIN PVE ---\n{KEY_A}\n# --- END PVE ---\n",
    }
    assert parse_authorized_keys(["no-file"]) == {"ssh_dir": True, "content": None}
    assert parse_authorized_keys(["no-dir"]) == {"ssh_dir": False, "content": None}
    assert parse_authorized_keys([]) is None  # not running: the command printed nothing


def test_vm_keys_set_with_qm_and_the_cloud_init_drive_regenerated(inventory):
    _, vm = _keyed_guest(inventory, [KEY_B])
    # qemu-server keeps sshkeys URI-escaped (qm.pm param_mapping: uri_escape of the file)
    created = pve.GuestConfig(
        {
            "sshkeys": "ssh-ed25519%20AAAAC3NzaC1lZDI1NTE5AAAAIHh0bWJ2ZXhhbXBsZWtleWZvcnRlc3RzMDAwMDAw"
            "%20deploy%40control%0A"
        }
    )
    assert qm_sshkeys(vm) == (
        "ssh-ed25519%20AAAAC3NzaC1lZDI1NTE5AAAAIG5ld2tleWZvcnRlc3RzMDAwMDAwMDAwMDAwMDAw%20deploy%40new%0A"
    )
    assert qm_keys(vm, created) == [
        "qm set 202 --sshkeys /etc/inference-host/guest-keys/202.pub",
        "qm cloudinit update 202",
    ]
    assert qm_keys(vm, pve.GuestConfig({"sshkeys": qm_sshkeys(vm)})) == []
    no_image = load_site(
        inventory.groups(
            proxmox_hosts=[NODE],
            kvm_guests=[
                (
                    "gpu-vm",
                    {
                        "guest_vmid": 202,
                        "guest_node": "pve",
                        "guest_gpu_addresses": [GPU2],
                        "guest_ssh_public_keys": [KEY_B],
                    },
                )
            ],
        )
    ).hosts["gpu-vm"]
    assert qm_keys(no_image, created) == []  # no cloud-init drive: nothing reads sshkeys


def test_a_vm_created_from_a_cloud_image_is_started_by_the_operation_that_pins_its_key(inventory, monkeypatch):
    """The console is read in the operation that starts the VM (what it prints while nobody
    reads is lost); a connector's VM (no pin) is started plainly."""
    import roles.kvm_guest as role
    from roles.shared import guest_host_keys

    _, vm = _keyed_guest(inventory, [KEY_B])
    planned: list[tuple[str, str, dict]] = []
    monkeypatch.setattr(role, "host", SimpleNamespace(name="pve", get_fact=lambda *args, **kwargs: None))
    monkeypatch.setattr(role, "put_guest_keys", lambda guest: None)
    monkeypatch.setattr(role.server, "shell", lambda name, commands: planned.append(("shell", name, {})))
    monkeypatch.setattr(guest_host_keys.python, "call", lambda name, **kwargs: planned.append(("call", name, kwargs)))
    role.kvm_guest.__wrapped__(vm)
    assert [kind for kind, _, _ in planned] == ["shell", "shell", "call"]  # create, grow, start+pin
    assert not any("Start" in name for kind, name, _ in planned if kind == "shell")
    call = planned[-1][2]
    assert call["start"] == role.start_command(202)
    assert call["command"].startswith("perl -e ") and "/var/run/qemu-server/202.serial0" in call["command"]
    assert call["path"] == vm.ssh.known_hosts_file and call["pattern"] == "gpu-vm"
    planned.clear()
    monkeypatch.setattr(guest_host_keys, "pin_target", lambda guest: None)  # a connector's host
    role.kvm_guest.__wrapped__(vm)
    assert [(kind, name) for kind, name, _ in planned][-1] == ("shell", "Start KVM guest 202")
