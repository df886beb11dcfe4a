"""roles/proxmox_host, lxc_guest and kvm_guest in the lab: the node stand-in (a Debian 12
container with tests/standins/proxmox) prepared, the gpu container created as its LXC guest
before the deploy continues inside it, a second deploy that changes nothing and calls no
`pct set`, a GPU moved between guests with the fewest set/--delete calls, and an invalid
assignment refused before any host is touched."""

from __future__ import annotations

import os

import pytest
import testinfra

import lab
from roles.shared import pve
from roles.site import load_site
from tests.lab.harness import LAB_INVENTORY, PROJECT_ROOT, run_deploy

pytestmark = pytest.mark.lab

SITE = load_site(LAB_INVENTORY)
GUEST = next(iter(SITE.group("lxc_guests")))
VMID = GUEST.guest.vmid
MOVE_INVENTORY = PROJECT_ROOT / "tests" / "lab" / "inventories" / "proxmox_move.py"
MOVE_VMIDS = (201, 202, 203, 204)


@pytest.fixture(scope="module")
def pve_node(lab_first_deploy):
    return testinfra.get_host(f"docker://{lab.container_name('pve')}")


def standin_calls(node) -> list[str]:
    """Every pct/qm/pvesh/proxmox-boot-tool call so far, as logged by the stand-ins."""
    return node.file(lab.PVE_STANDIN_LOG).content_string.splitlines()


def changing_calls(lines: list[str]) -> list[str]:
    """The successful calls that change a guest (refused ones exit 255 and change nothing)."""
    return [line.rsplit(" => ", 1)[0] for line in lines if line.endswith(" => 0")
            and line.startswith(("pct create", "pct set", "pct start", "qm create", "qm set"))]


# --- the node ----------------------------------------------------------------------------------


def test_kernel_args_added_for_systemd_boot_and_refreshed(pve_node):
    cmdline = pve_node.file("/etc/kernel/cmdline").content_string.split()
    assert cmdline[:2] == ["root=ZFS=rpool/ROOT/pve-1", "boot=zfs"], "the root= part must stay"
    assert "iommu=pt" in cmdline
    assert any(arg in cmdline for arg in ("intel_iommu=on", "amd_iommu=on"))
    # proxmox-boot-tool refresh copied the new command line to the ESP (stand-in's record)
    esp = pve_node.run("cat /var/lib/pve-standin/esp/*/cmdline").stdout.split()
    assert esp == cmdline


def test_vfio_modules_and_nouveau_blacklist(pve_node):
    modules = pve_node.file("/etc/modules-load.d/vfio.conf").content_string.split()
    assert [m for m in modules if not m.startswith("#")][-3:] == ["vfio", "vfio_iommu_type1", "vfio_pci"]
    assert pve_node.file("/etc/modprobe.d/blacklist-nouveau.conf").contains("^blacklist nouveau$")
    assert not pve_node.file("/etc/default/grub.d/inference-host-iommu.cfg").exists  # not GRUB


@pytest.mark.skipif(os.environ.get("INFERENCE_HOST_LAB_REUSE") == "1",
                    reason="containers were reused: the first deploy had nothing to do")
def test_walk_from_a_bare_node(lab_walk, pve_node):
    """Run 1: node prepared, driver built, node rebooted, guest waits (no exception while
    planning). Run 2: the module is loaded, the guest is created and started. Run 3: the deploy
    continues inside the guest."""
    first, second, third = lab_walk
    assert any("Mark the node: reboot required (NVIDIA driver" in n for n in first.changed)
    assert any(n.startswith("Proxmox node reboot | Reboot the node") for n in first.changed)
    assert f"LXC guest {VMID} ({GUEST.name}) waits: the node's NVIDIA driver lists no GPU" in first.stdout + first.stderr
    assert not any(n.startswith("Base |") for n in first.changed + second.changed)
    assert any(f"Create LXC guest {VMID}" in n for n in second.changed)
    assert not any("reboot" in n.lower() for n in second.changed + third.changed)
    assert any(n.startswith("Base |") for n in third.changed)
    assert not any("LXC guest" in n for n in third.changed)
    # The reboot emptied /run; what the boot made is what a real node's boot makes.
    assert not pve_node.file("/run/reboot-required").exists
    assert pve_node.run("test -c /dev/nvidia-uvm && test -c /dev/nvidia-uvm-tools").rc == 0
    assert pve_node.run("dkms status -m nvidia").stdout.strip().endswith(": installed")
    assert pve_node.service("nvidia-persistenced").is_running
    assert pve_node.service("nvidia-uvm-devices").is_enabled


def test_guest_gets_the_deploys_ssh_key(pve_node):
    keys = pve_node.file(f"/var/lib/pve-standin/lxc/{VMID}.authorized_keys").content_string
    assert keys.strip() == GUEST.guest.ssh_public_keys[0]
    assert pve_node.file(f"/etc/inference-host/guest-keys/{VMID}.pub").mode == 0o600


def test_guest_config_has_every_gpu_and_settings(pve_node):
    config = pve.parse_config(pve_node.file(f"/etc/pve/lxc/{VMID}.conf").content_string, "lxc")
    effective = config.effective()
    devices = [pve.device_path(effective[k]) for k in pve.LXC_DEVICE_KEYS if k in effective]
    assert sorted(devices) == sorted(
        [f"/dev/nvidia{i}" for i in range(8)] + ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    )
    assert effective["unprivileged"] == "1" and effective["swap"] == "0"
    assert effective["features"] == "keyctl=1,nesting=1"
    assert effective["memory"] == str(GUEST.guest.memory_mib)
    assert pve_node.run(f"pct status {VMID}").stdout.strip() == "status: running"


def test_second_deploy_makes_no_proxmox_call_that_changes(lab_second_deploy, pve_node):
    assert lab_second_deploy.changed == []
    creates = [c for c in changing_calls(standin_calls(pve_node)) if c.startswith(f"pct create {VMID} ")]
    assert len(creates) <= 1
    assert not [c for c in changing_calls(standin_calls(pve_node)) if c.startswith(f"pct set {VMID} ")]


def test_standin_refuses_what_proxmox_refuses(pve_node):
    # keys outside PVE 8's schema, bad values and bad property-string keys fail with 255
    unknown = pve_node.run(f"pct set {VMID} --gpus 8")
    assert unknown.rc == 255 and "Unknown option: gpus" in unknown.stderr
    assert "400 unable to parse option" in unknown.stderr
    bad_value = pve_node.run(f"pct set {VMID} --cores many")
    assert bad_value.rc == 255
    assert "400 Parameter verification failed.\ncores: type check ('integer') failed" in bad_value.stderr
    driver = pve_node.run("qm create 990 --hostpci0 0000:01:00.0,driver=vfio")  # PVE 9 only
    assert driver.rc == 255 and "invalid key in comma-separated list property: driver" in driver.stderr
    missing = pve_node.run(f"pct set {VMID} --dev20 /dev/nvidia9")
    assert missing.rc == 255 and "/dev/nvidia9" in missing.stderr
    readonly = pve_node.run(f"pct set {VMID} --unprivileged 0")
    assert readonly.rc == 255 and "unable to modify read-only option: 'unprivileged'" in readonly.stderr


# --- moving GPUs between guests ----------------------------------------------------------------


def _deploy_move(step: str):
    return run_deploy(MOVE_INVENTORY, "--limit", lab.pyinfra_name("pve"),
                      env={"PROXMOX_MOVE_STEP": step}, timeout=600)


@pytest.fixture(scope="module")
def moved(lab_second_deploy, pve_node):
    """Deploy the 'before' assignment, then the 'after' one, then 'after' again."""
    for vmid in MOVE_VMIDS:  # a fresh start for the four test guests (stand-in state only)
        pve_node.run(f"rm -f /etc/pve/nodes/*/*/{vmid}.conf /var/lib/pve-standin/*/{vmid}.status")
    before = _deploy_move("before")
    assert before.returncode == 0, before.explain()
    mark = len(standin_calls(pve_node))
    after = _deploy_move("after")
    assert after.returncode == 0, after.explain()
    after_calls = changing_calls(standin_calls(pve_node)[mark:])
    mark = len(standin_calls(pve_node))
    again = _deploy_move("after")
    assert again.returncode == 0, again.explain()
    return {"before": before, "after": after, "after_calls": after_calls, "again": again,
            "again_calls": changing_calls(standin_calls(pve_node)[mark:])}


def test_move_creates_guests_with_their_gpus(moved, pve_node):
    names = moved["before"].changed
    assert any("Create LXC guest 201" in n and "with 4 GPUs" in n for n in names)
    assert any("Create KVM guest 203" in n and "with 2 GPUs" in n for n in names)
    # after the move (a stopped VM takes changes at once): 203 kept GPU 5, 204 has 7 and 6
    vm = pve.parse_config(pve_node.file("/etc/pve/qemu-server/203.conf").content_string, "qemu").current
    assert vm["hostpci0"] == f"{lab.PVE_GPUS[5]},pcie=1" and "hostpci1" not in vm
    other = pve.parse_config(pve_node.file("/etc/pve/qemu-server/204.conf").content_string, "qemu").current
    assert other["hostpci0"] == f"{lab.PVE_GPUS[7]},pcie=1"
    assert other["hostpci1"] == f"{lab.PVE_GPUS[6]},pcie=1"
    assert pve_node.run("qm status 203").stdout.strip() == "status: stopped"  # no OS yet: not started
    assert vm["machine"] == "q35" and vm["bios"] == "ovmf" and vm["cpu"] == "host"
    assert vm["balloon"] == "0" and vm["numa"] == "1" and vm["efidisk0"].startswith("local-lvm:vm-203-disk-")
    assert vm["args"] == "-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=262144"


def test_moving_a_gpu_touches_one_key_per_guest(moved):
    # GPU 3 (minor 3) from LXC 201 to LXC 202, GPU 6 from VM 203 to VM 204
    assert sorted(moved["after_calls"]) == sorted([
        "pct set 201 --delete dev3",
        "pct set 202 --dev4 /dev/nvidia3",
        "qm set 203 --delete hostpci1",
        f"qm set 204 --hostpci1 {lab.PVE_GPUS[6]},pcie=1",
    ])


def test_device_change_on_running_container_is_pending_and_reported(moved, pve_node):
    config = pve.parse_config(pve_node.file("/etc/pve/lxc/201.conf").content_string, "lxc")
    assert "dev3" in config.current and config.pending_delete == {"dev3"}
    assert "LXC guest 201 has changes pending until it restarts (dev3)" in moved["after"].stderr
    assert "pct reboot 201" in moved["after"].stderr


def test_converged_move_changes_nothing(moved):
    assert moved["again"].changed == []
    assert moved["again_calls"] == []


def test_invalid_assignment_refused_before_any_call(moved, pve_node):
    calls = len(standin_calls(pve_node))
    refused = _deploy_move("invalid")
    assert refused.returncode == 2
    assert "no host was contacted" in refused.stderr
    assert "host lab-move-c: guest_gpu_addresses has 0000:01:00.0, already given to lab-move-a" in refused.stderr
    assert "never to an LXC guest (host driver) and a KVM guest (vfio-pci) at once" in refused.stderr
    assert "Connected" not in refused.stdout + refused.stderr
    assert len(standin_calls(pve_node)) == calls, "a refused inventory must not reach the node"

