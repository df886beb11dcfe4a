"""roles/proxmox_host, lxc_guest and kvm_guest in the lab: the node stand-in (a Debian 12
container with lab/standins/proxmox) prepared, the gpu container created as its LXC guest
before the deploy continues inside it, a second deploy that changes nothing and calls no
`pct set`, a GPU moved between guests with the fewest set/--delete calls, and an invalid
assignment refused before any host is touched."""

from __future__ import annotations

import os
import subprocess

import paramiko
import pytest
import testinfra

import lab
from roles.shared import pve
from roles.shared.guest_keys import PVE_BEGIN, PVE_END
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
    return [
        line.rsplit(" => ", 1)[0]
        for line in lines
        if line.endswith(" => 0") and line.startswith(("pct create", "pct set", "pct start", "qm create", "qm set"))
    ]


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


@pytest.mark.skipif(
    os.environ.get("INFERENCE_HOST_LAB_REUSE") == "1",
    reason="containers were reused: the first deploy had nothing to do",
)
def test_walk_from_a_bare_node(lab_walk, pve_node):
    """One run of the main command from a bare lab, in the passes the node starts itself.
    Pass 1: node prepared, driver built, node rebooted, guest waits (no exception while
    planning). Pass 2: the module is loaded, the guest is created and started. Pass 3: the
    deploy continues inside the guest and ends with the health verdict."""
    assert lab_walk.pass_count == 3, lab_walk.pass_count
    first, second, third = (lab_walk.changed_in_pass(n) for n in (1, 2, 3))
    output = lab_walk.stdout + lab_walk.stderr
    assert any("Mark the node: reboot required (NVIDIA driver" in n for n in first)
    assert any(n.startswith("Proxmox node reboot | Reboot the node") for n in first)
    assert f"LXC guest {VMID} ({GUEST.name}) waits: the node's NVIDIA driver lists no GPU" in output
    assert not any(n.startswith("Base |") for n in first + second)
    assert any(f"Create LXC guest {VMID}" in n for n in second)
    assert not any("reboot" in n.lower() for n in second + third)
    assert any(n.startswith("Base |") for n in third)
    assert not any("LXC guest" in n for n in third)
    # The story: each pass says why the next one runs, and the last ends healthy.
    assert "--> Pass 2 (of at most 3): the node is done" in output
    assert "--> Pass 3 (of at most 3): the node is done" in output
    assert any(n.startswith("Proxmox guests continue | Continue the deploy inside") for n in first + second)
    assert lab_walk.health_checks and "inference-host health verdict" in output
    # The reboot emptied /run; what the boot made is what a real node's boot makes.
    assert not pve_node.file("/run/reboot-required").exists
    assert pve_node.run("test -c /dev/nvidia-uvm && test -c /dev/nvidia-uvm-tools").rc == 0
    assert pve_node.run("dkms status -m nvidia").stdout.strip().endswith(": installed")
    assert pve_node.service("nvidia-persistenced").is_running
    assert pve_node.service("nvidia-uvm-devices").is_enabled


def test_guest_gets_the_deploys_ssh_key(pve_node, gpu_guest):
    keys = pve_node.file(f"/var/lib/pve-standin/lxc/{VMID}.authorized_keys").content_string
    assert keys.strip() == GUEST.guest.ssh_public_keys[0]
    assert pve_node.file(f"/etc/inference-host/guest-keys/{VMID}.pub").mode == 0o600
    # what pct create's post-create hook wrote in the guest itself (Setup/Base.pm: the PVE block,
    # a new file of mode 0700, ~/.ssh 0700)
    authorized = gpu_guest.file("/root/.ssh/authorized_keys")
    assert authorized.content_string == f"{PVE_BEGIN}\n{GUEST.guest.ssh_public_keys[0]}\n{PVE_END}\n"
    assert authorized.mode == 0o700 and authorized.user == "root"
    assert gpu_guest.file("/root/.ssh").mode == 0o700


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


def _pve_schema():
    """The pct stand-in's own parser module (pve-common 8.3.8's property-string code, ported)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "pve_schema", PROJECT_ROOT / "lab" / "standins" / "proxmox" / "pve_schema.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _guest_with(vmid: int, mount_points: dict) -> tuple[object, list[str]]:
    """The lab's LXC guest typed again from its inventory data with other mount points (the site
    model's rules: roles/site/schema.py build_host), under another VMID and without SSH keys."""
    from roles.site.loading import _pyinfra_inventory
    from roles.site.schema import build_host

    data = {h.name: h.data.dict() for h in _pyinfra_inventory(LAB_INVENTORY)}[GUEST.name]
    problems: list[str] = []
    guest = build_host(
        GUEST.name,
        GUEST.groups,
        {**data, "guest_vmid": vmid, "guest_mount_points": mount_points, "guest_ssh_public_keys": []},
        "inventory/lab.py",
        problems,
    )
    return guest, problems


def test_planted_mount_points_reach_pcts_config_unchanged_or_are_refused(pve_node):
    """Issue 38 in the lab: a space, a `%h` and quotes in a mount point reach Proxmox's config as
    the inventory wrote them (pct create as the deploy builds it, read back from the stand-in's
    config file and from `pct config`, both parsed as pve-common parses property strings); a comma
    is refused by validation, and the raw rendering it replaced let pct read it as an option."""
    from roles.lxc_guest import create_command

    vmid, raw_vmid = 996, 997
    for stale in (vmid, raw_vmid):  # a fresh start (stand-in state only)
        pve_node.run(f"rm -f /etc/pve/nodes/*/*/{stale}.conf /var/lib/pve-standin/*/{stale}.status")
    planted = {"/tank/my models %h": "/models/k2 5 %h"}  # quotes: refused since (host-path rule)
    guest, problems = _guest_with(vmid, planted)
    assert problems == []
    created = pve_node.run(create_command(guest, []))
    assert created.rc == 0, created.stderr
    schema = _pve_schema()
    fields, parse = schema.LXC_MP, schema.parse_property_string
    on_disk = pve.parse_config(pve_node.file(f"/etc/pve/lxc/{vmid}.conf").content_string, "lxc").current["mp0"]
    shown = dict(line.split(": ", 1) for line in pve_node.run(f"pct config {vmid}").stdout.splitlines())["mp0"]
    for text in (on_disk, shown):
        assert parse(text, fields, "volume") == {"volume": "/tank/my models %h", "mp": "/models/k2 5 %h"}

    _, refused = _guest_with(raw_vmid, {"/tank/models,ro=0": "/models"})
    assert len(refused) == 1 and "the host path '/tank/models,ro=0' has a ','" in refused[0]
    # What the raw rendering (volume and mp pasted in) would have handed pct: an extra option.
    raw = pve_node.run(
        f"pct create {raw_vmid} {GUEST.guest.template} --rootfs local-lvm:8 --mp0 '/tank/models,ro=0,mp=/models'"
    )
    assert raw.rc == 0, raw.stderr
    raw_mp = pve.parse_config(pve_node.file(f"/etc/pve/lxc/{raw_vmid}.conf").content_string, "lxc").current["mp0"]
    assert parse(raw_mp, fields, "volume") == {"volume": "/tank/models", "ro": "0", "mp": "/models"}
    pve_node.run(f"pct destroy {vmid}; pct destroy {raw_vmid}")


# --- root's SSH keys of the existing guest ------------------------------------------------------


def _ssh_works(address: str, key_file) -> bool:
    """Key authentication as root against the guest's real sshd (no password, no agent)."""
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.AutoAddPolicy())  # the key is what is tested
    try:
        client.connect(
            address,
            username="root",
            key_filename=str(key_file),
            look_for_keys=False,
            allow_agent=False,
            timeout=20,
            banner_timeout=20,
            auth_timeout=20,
        )
        _, stdout, _ = client.exec_command("id -u")
        return stdout.read().decode().strip() == "0"
    except paramiko.AuthenticationException:
        return False
    finally:
        client.close()


@pytest.fixture(scope="module")
def rekeyed(lab_second_deploy, pve_node, gpu_guest, tmp_path_factory):
    """guest_ssh_public_keys changed on the existing, running guest: the node deployed twice."""
    gpu = lab.container_name("gpu")
    subprocess.run(
        [
            "docker",
            "exec",
            gpu,
            "sh",
            "-c",
            "command -v sshd >/dev/null || { DEBIAN_FRONTEND=noninteractive apt-get install -y -q"
            " --no-install-recommends openssh-server >/dev/null || { apt-get update -q >/dev/null &&"
            " DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends"
            " openssh-server >/dev/null; }; }; systemctl start ssh",
        ],
        check=True,
        timeout=600,
    )
    address = subprocess.run(
        ["docker", "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", gpu],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    old_key = lab.STATE_DIR / "guest-ssh-key"
    created_key_works = _ssh_works(address, old_key)
    folder = tmp_path_factory.mktemp("guest-keys")
    new_key = folder / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "rekeyed", "-f", str(new_key)], check=True)
    keys = folder / "keys"
    keys.write_text(new_key.with_suffix(".pub").read_text())
    env = {"INFERENCE_HOST_LAB_GUEST_KEYS_FILE": str(keys)}
    limit = ("--limit", lab.pyinfra_name("pve"))
    mark = len(standin_calls(pve_node))
    first = run_deploy(LAB_INVENTORY, *limit, env=env, timeout=600)
    first_calls = standin_calls(pve_node)[mark:]
    result = {
        "first": first,
        "first_calls": first_calls,
        "created_key_works": created_key_works,
        "new_key": new_key,
        "old_key": old_key,
        "address": address,
        "public": keys.read_text().strip(),
        "file": gpu_guest.file("/root/.ssh/authorized_keys"),
    }
    result["new_key_works"] = _ssh_works(address, new_key)
    result["old_key_works"] = _ssh_works(address, old_key)
    mark = len(standin_calls(pve_node))
    result["again"] = run_deploy(LAB_INVENTORY, *limit, env=env, timeout=600)
    result["again_calls"] = standin_calls(pve_node)[mark:]
    yield result
    # The session's later deploys use the lab's own key again: put back what pct create wrote
    # (guest) and the node's copy, as the walk left them.
    lab_key = GUEST.guest.ssh_public_keys[0]
    subprocess.run(
        ["docker", "exec", "-i", gpu, "sh", "-c", "cat > /root/.ssh/authorized_keys"],
        input=f"{PVE_BEGIN}\n{lab_key}\n{PVE_END}\n",
        text=True,
        check=True,
    )
    subprocess.run(
        [
            "docker",
            "exec",
            "-i",
            lab.container_name("pve"),
            "sh",
            "-c",
            f"cat > /etc/inference-host/guest-keys/{VMID}.pub",
        ],
        input=f"{lab_key}\n",
        text=True,
        check=True,
    )


def test_changed_keys_reach_the_existing_guest_with_one_push(rekeyed):
    first = rekeyed["first"]
    assert first.returncode == 0, first.explain()
    assert rekeyed["created_key_works"], "the key pct create wrote must let root in"
    changed = first.changed
    assert any(f"Public keys for guest {VMID} (1)" in name for name in changed)
    assert any(f"of LXC guest {VMID} (pct push)" in name for name in changed)
    assert len(changed) == 2, changed
    pushes = [c.split() for c in rekeyed["first_calls"] if c.startswith("pct push ")]
    assert len(pushes) == 1 and pushes[0][:3] == ["pct", "push", str(VMID)]
    assert pushes[0][4:] == ["/root/.ssh/authorized_keys", "--perms", "0600", "=>", "0"]
    assert changing_calls(rekeyed["first_calls"]) == []  # no pct set / create / start
    # exactly the setting's keys in the PVE block; the file 0600 and root's
    assert rekeyed["file"].content_string == f"{PVE_BEGIN}\n{rekeyed['public']}\n{PVE_END}\n"
    assert rekeyed["file"].mode == 0o600 and rekeyed["file"].user == "root"


def test_new_key_logs_in_and_the_removed_one_no_longer(rekeyed):
    assert rekeyed["new_key_works"], "sshd in the guest must accept the new key"
    assert not rekeyed["old_key_works"], "a key removed from the setting must leave the guest"


def test_second_deploy_after_the_key_change_changes_nothing(rekeyed):
    again = rekeyed["again"]
    assert again.returncode == 0, again.explain()
    assert again.changed == []
    assert not [c for c in rekeyed["again_calls"] if c.startswith(f"pct push {VMID} ")]


def test_standin_qm_records_cloud_init_changes_until_the_drive_is_regenerated(pve_node):
    """qemu-server 8.4.10: sshkeys is fast-plugged into a running VM's config, the drive's old
    value kept under [special:cloudinit] until `qm cloudinit update` regenerates the drive."""
    vmid = 995
    pve_node.run(f"rm -f /etc/pve/nodes/*/*/{vmid}.conf /var/lib/pve-standin/*/{vmid}.status")
    key = GUEST.guest.ssh_public_keys[0]
    setup = pve_node.run(
        f"printf '%s\\n' '{key}' > /tmp/k1 && printf '%s\\n' '{key} second' > /tmp/k2 &&"
        f" qm create {vmid} --ide2 local-lvm:cloudinit --sshkeys /tmp/k1 && qm start {vmid} &&"
        f" qm set {vmid} --sshkeys /tmp/k2"
    )
    assert setup.rc == 0, setup.stderr
    config = pve_node.file(f"/etc/pve/qemu-server/{vmid}.conf").content_string
    parsed = pve.parse_config(config, "qemu")
    assert parsed.current["sshkeys"].endswith("%20second%0A") and not parsed.has_pending  # applied at once
    old = "sshkeys: " + parsed.current["sshkeys"].replace("%20second%0A", "%0A")
    assert config.split("[special:cloudinit]\n", 1)[1].splitlines() == [old]
    assert pve_node.run(f"qm cloudinit update {vmid}").rc == 0
    assert "[special:cloudinit]" not in pve_node.file(f"/etc/pve/qemu-server/{vmid}.conf").content_string
    pve_node.run(f"qm stop {vmid} && qm destroy {vmid}; rm -f /tmp/k1 /tmp/k2")


# --- moving GPUs between guests ----------------------------------------------------------------


def _deploy_move(step: str):
    return run_deploy(MOVE_INVENTORY, "--limit", lab.pyinfra_name("pve"), env={"PROXMOX_MOVE_STEP": step}, timeout=600)


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
    return {
        "before": before,
        "after": after,
        "after_calls": after_calls,
        "again": again,
        "again_calls": changing_calls(standin_calls(pve_node)[mark:]),
    }


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
    assert sorted(moved["after_calls"]) == sorted(
        [
            "pct set 201 --delete dev3",
            "pct set 202 --dev4 /dev/nvidia3",
            "qm set 203 --delete hostpci1",
            f"qm set 204 --hostpci1 {lab.PVE_GPUS[6]},pcie=1",
        ]
    )


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


# --- teardown (last in this module: it destroys a guest and deploys it again) ---------------------


def _inference_host(*argv: str, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    """The installed `inference-host` command, as an operator runs it."""
    import sys
    from pathlib import Path

    return subprocess.run(
        [str(Path(sys.executable).with_name("inference-host")), *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=PROJECT_ROOT,
        env={**os.environ, **(env or {})},
    )


def _files_under(node, folder: str) -> str:
    return node.run(f"cd {folder} && find . -type f -exec sha256sum {{}} + | sort").stdout


def test_teardown_keeps_the_weights_and_the_next_deploy_makes_the_guest_again(moved, pve_node):
    """`inference-host teardown` of the move inventory's LXC guest A (CT 201, the node's model
    storage mounted at /models): refused without the typed name; then stopped and destroyed with
    the stand-in destroying what pve-container destroys (the rootfs volume's data goes), the node's
    weights folder and every file in it kept; the deploy of the same inventory creates it again."""
    import time

    env = {"PROXMOX_MOVE_STEP": "after"}
    inventory = str(MOVE_INVENTORY)
    name = "lab-move-a"
    weights_before = _files_under(pve_node, lab.MODELS_HOST_PATH)
    assert weights_before.strip(), "the main lab's deploy put the weights on the node first"
    rootfs = pve.parse_config(pve_node.file("/etc/pve/lxc/201.conf").content_string, "lxc").current["rootfs"]
    rootfs_data = "/var/lib/pve-standin/storage/" + rootfs.split(",")[0].replace(":", "/", 1)
    assert pve_node.run(f"touch {rootfs_data}/planted").rc == 0, "the stand-in keeps a folder per volume"

    refused = _inference_host("teardown", inventory, name, "--yes-i-typed", "lab-move-b", env=env)
    assert refused.returncode == 2 and "nothing changed" in refused.stderr
    assert pve_node.run("pct status 201").stdout.strip() == "status: running"

    started = time.monotonic()
    done = _inference_host("teardown", inventory, name, "--yes-i-typed", name, env=env)
    took = time.monotonic() - started
    assert done.returncode == 0, done.stdout + done.stderr
    assert "destroyed CT 201" in done.stdout
    assert f"kept {lab.MODELS_HOST_PATH} (mp0: a node folder (bind mount), at /models in the guest)" in done.stdout
    assert not pve_node.file("/etc/pve/lxc/201.conf").exists
    assert not pve_node.file(rootfs_data).exists, "pct destroy frees the rootfs volume the CT owns"
    assert _files_under(pve_node, lab.MODELS_HOST_PATH) == weights_before
    calls = [c for c in standin_calls(pve_node) if " 201" in c][-2:]
    assert calls == ["pct stop 201 => 0", "pct destroy 201 --destroy-unreferenced-disks 0 => 0"]

    started = time.monotonic()
    again = _deploy_move("after")
    redeploy = time.monotonic() - started
    assert again.returncode == 0, again.explain()
    assert any("Create LXC guest 201" in n for n in again.changed)
    config = pve.parse_config(pve_node.file("/etc/pve/lxc/201.conf").content_string, "lxc").current
    assert pve.mount_identity(config["mp0"]) == pve.mount_identity(f"{lab.MODELS_HOST_PATH},mp=/models")
    assert pve_node.run("pct status 201").stdout.strip() == "status: running"
    print(f"\nteardown of CT 201: {took:.1f} s; the deploy that made it again: {redeploy:.1f} s")


@pytest.mark.skipif(
    os.environ.get("INFERENCE_HOST_LAB_TEARDOWN") != "1",
    reason="the lab guest's teardown is followed by a first deploy of the guest (minutes): opt-in,"
    " INFERENCE_HOST_LAB_TEARDOWN=1",
)
def test_teardown_of_the_lab_guest_and_the_deploy_that_makes_it_again(lab_second_deploy, pve_node):
    """The main lab's own guest (CT 101, the gpu container behind it): `inference-host teardown`
    destroys it as pct destroy does (its rootfs, here the container, is gone), the node's weights
    are kept file for file, and the README's deploy makes the guest again and ends healthy."""
    import time

    name = GUEST.name
    weights_before = _files_under(pve_node, lab.MODELS_HOST_PATH)
    started = time.monotonic()
    done = _inference_host("teardown", str(LAB_INVENTORY), name, "--yes-i-typed", name)
    took = time.monotonic() - started
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"kept {lab.MODELS_HOST_PATH} (mp0: the guest's weights, at /models in the guest)" in done.stdout
    assert lab.container_state(lab.container_name("gpu")) is None, "the CT's rootfs (its container) must go"
    assert not pve_node.file(f"/etc/pve/lxc/{VMID}.conf").exists
    assert _files_under(pve_node, lab.MODELS_HOST_PATH) == weights_before

    started = time.monotonic()
    again = run_deploy()
    redeploy = time.monotonic() - started
    assert again.returncode == 0, again.explain()
    assert any(f"Create LXC guest {VMID}" in n for n in again.changed)
    assert any(n.startswith("Base |") for n in again.changed), "the deploy continued inside the new guest"
    assert again.health_checks and "inference-host health verdict" in again.stdout + again.stderr
    print(f"\nteardown of the lab guest (CT {VMID}): {took:.1f} s; the deploy that made it again: {redeploy:.0f} s")
