"""`inference-host teardown`: what Proxmox's destroy frees and leaves, read from a guest's config
(pve-container 5.3.5 / qemu-server 8.4.10 rules); the commands read back with the shell's own
parser; the confirmation; the order of the calls on the node, and the refusal that changes
nothing when destroy would delete data; the lab's pct/qm stand-ins destroy as upstream does."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import shlex
import subprocess
from types import SimpleNamespace

import pytest

from inference_host import cli, teardown
from roles.shared import pve
from roles.site import load_site
from tests.unit.conftest import PROJECT_ROOT

LXC_CONF = """\
arch: amd64
hostname: gpu
mp0: /tank/models,mp=/models,ro=1
mp1: /srv/scratch dir,mp=/scratch
rootfs: local-lvm:vm-101-disk-0,size=2000G
unused0: local-lvm:vm-102-disk-3
dev0: /dev/nvidia0
"""

KVM_CONF = """\
efidisk0: local-lvm:vm-203-disk-0,efitype=4m,size=4M
ide1: none,media=cdrom
ide0: local:iso/ubuntu-24.04.iso,media=cdrom
ide2: local-lvm:vm-203-cloudinit,media=cdrom
scsi0: local-lvm:vm-203-disk-1,size=64G
"""


def test_lxc_destroy_frees_the_rootfs_and_keeps_bind_mounts_and_others_volumes():
    config = pve.parse_config(LXC_CONF, "lxc")
    plan = teardown.destroy_plan("lxc", 101, config, {"/tank/models"})
    assert plan.refused == []
    assert plan.destroyed == [("rootfs", "local-lvm:vm-101-disk-0")]
    kept = {key: (path, why) for key, path, why in plan.kept}
    assert kept["mp0"] == ("/tank/models", "the guest's weights, at /models in the guest")
    assert kept["mp1"][0] == "/srv/scratch dir" and kept["mp1"][1].startswith("a node folder (bind mount)")
    assert kept["unused0"] == ("local-lvm:vm-102-disk-3", "owned by 102")


def test_a_volume_the_guest_owns_beyond_its_system_disk_is_refused():
    for extra in ("mp2: local-lvm:vm-101-disk-1,mp=/data", "unused1: local-lvm:vm-101-disk-4"):
        plan = teardown.destroy_plan("lxc", 101, pve.parse_config(LXC_CONF + extra + "\n", "lxc"), set())
        assert len(plan.refused) == 1 and "destroy would delete its data" in plan.refused[0]
    # a pending mount point counts too: destroy_lxc_container reads the pending section as well
    pending = LXC_CONF + "\n[pve:pending]\nmp3: local-zfs:subvol-101-disk-2,mp=/more\n"
    plan = teardown.destroy_plan("lxc", 101, pve.parse_config(pending, "lxc"), set())
    assert plan.refused and "mp3 (local-zfs:subvol-101-disk-2)" in plan.refused[0]


def test_weights_that_are_no_mount_point_of_the_guest_are_refused():
    plan = teardown.destroy_plan("lxc", 101, pve.parse_config(LXC_CONF, "lxc"), {"/tank/other"})
    assert plan.refused == ["the weights' folder /tank/other is not a mount point of the guest on the node"]


def test_kvm_destroy_frees_its_disks_and_cloud_init_drive_but_not_a_cdrom():
    plan = teardown.destroy_plan("qemu", 203, pve.parse_config(KVM_CONF, "qemu"), set())
    assert plan.refused == []
    assert sorted(plan.destroyed) == [
        ("efidisk0", "local-lvm:vm-203-disk-0"),
        ("ide2", "local-lvm:vm-203-cloudinit"),
        ("scsi0", "local-lvm:vm-203-disk-1"),
    ]
    assert plan.kept == [("ide0", "local:iso/ubuntu-24.04.iso", "a cdrom image")]
    data_disk = teardown.destroy_plan(
        "qemu", 203, pve.parse_config(KVM_CONF + "scsi1: local-lvm:vm-203-disk-2\n", "qemu"), set()
    )
    assert data_disk.refused and data_disk.refused[0].startswith("scsi1 (local-lvm:vm-203-disk-2)")


@pytest.mark.parametrize(
    ("volid", "owner"),
    [
        ("local-lvm:vm-101-disk-0", 101),
        ("local-zfs:subvol-101-disk-0", 101),
        ("local:101/vm-101-disk-0.raw", 101),
        ("local:100/base-100-disk-0.raw/101/vm-101-disk-0.qcow2", 101),
        ("local:vztmpl/debian-12.tar.zst", None),
        ("local:iso/x.iso", None),
    ],
)
def test_volume_owner_as_parse_volname(volid, owner):
    assert teardown.volume_owner(volid) == owner


def _sh_argv(command: str) -> list[str]:
    """The argument vector a real sh hands the program (printf shows each word on its own line)."""
    done = subprocess.run(["sh", "-c", 'f() { printf "%s\\n" "$@"; }; f ' + command], capture_output=True, text=True)
    return done.stdout.splitlines()


def test_commands_read_back_with_the_shell():
    assert _sh_argv(teardown.destroy_command("lxc", 101)) == [
        "pct",
        "destroy",
        "101",
        "--destroy-unreferenced-disks",
        "0",
    ]
    assert _sh_argv(teardown.stop_command("qemu", 203)) == ["qm", "stop", "203"]
    wrapped = shlex.split(teardown.bounded(30, teardown.destroy_command("qemu", 203)))
    assert wrapped[:5] == ["timeout", "-s", "KILL", "30", "sh"] and wrapped[5] == "-c"
    assert shlex.split(wrapped[6]) == ["qm", "destroy", "203", "--destroy-unreferenced-disks", "0"]
    # a hostile folder name stays one word: the loop sees it whole
    hostile = ["/tank/a b", "/tank/$(touch /tmp/x)", "/tank/'q'"]
    out = subprocess.run(["sh", "-c", teardown.folders_command(hostile)], capture_output=True, text=True).stdout
    assert out.splitlines() == [f"gone {p}" for p in hostile]


# -- the command, with the node answered here ---------------------------------------------------


INVENTORY = "inventory/lab.py"
SITE = load_site(PROJECT_ROOT / INVENTORY)
GUEST = next(iter(SITE.group("lxc_guests")))


class FakeNode:
    """Answers the node's commands in order; records what was run."""

    def __init__(self, status="running", conf=LXC_CONF, fail=None, missing=()):
        self.ran: list[str] = []
        self.bounds: list[int] = []
        self.status, self.conf, self.fail, self.missing = status, conf, fail, set(missing)

    def __call__(self, inventory, node, command, bound):
        self.ran.append(str(command))
        self.bounds.append(bound)
        words = shlex.split(str(command))
        rc, out, err = 0, "", ""
        if "status" in words:  # the state fact
            out = f"status: {self.status}\n---\n{self.conf}" if self.conf is not None else ""
        elif words[:2] in (["pct", "stop"], ["qm", "stop"]) and self.fail == "stop":
            rc, err = 255, "CT 101 not running"
        elif words[:2] in (["pct", "destroy"], ["qm", "destroy"]) and self.fail == "destroy":
            rc, err = 255, "can't remove CT 101 - protection mode enabled"
        elif words[:1] == ["for"]:
            out = "".join(
                f"{'gone' if p in self.missing else 'kept'} {p}\n" for p in ("/tank/models", "/srv/scratch dir")
            )
        return SimpleNamespace(rc=rc, stdout=out, stderr=err)


def _teardown(monkeypatch, capsys, node, *extra, typed=None):
    monkeypatch.setattr(teardown, "_on_node", node)
    monkeypatch.setattr("sys.stdin", SimpleNamespace(isatty=lambda: typed is not None))
    if typed is not None:
        monkeypatch.setattr("builtins.input", lambda prompt: typed)
    try:
        code = cli.main(["teardown", INVENTORY, GUEST.name, *extra])
    except SystemExit as done:
        code = done.code
    out, err = capsys.readouterr()
    return code, out, err


def test_teardown_stops_then_destroys_and_says_what_it_kept(monkeypatch, capsys):
    node = FakeNode()
    code, out, err = _teardown(monkeypatch, capsys, node, "--yes-i-typed", GUEST.name)
    assert code == 0, err
    commands = [shlex.split(c) for c in node.ran]
    assert commands[1] == ["pct", "stop", str(GUEST.guest.vmid)]
    assert commands[2] == ["pct", "destroy", str(GUEST.guest.vmid), "--destroy-unreferenced-disks", "0"]
    assert len(node.ran) == 4
    assert node.bounds == [
        teardown.READ_BOUND_S,
        teardown.STOP_BOUND_S,
        teardown.DESTROY_BOUND_S,
        teardown.READ_BOUND_S,
    ]
    assert f"destroyed CT {GUEST.guest.vmid}" in out and "local-lvm:vm-101-disk-0" in out
    assert "kept /tank/models (mp0: the guest's weights, at /models in the guest)" in out
    assert f"inference-host deploy {INVENTORY}" in out


def test_a_stopped_guest_is_not_stopped_again(monkeypatch, capsys):
    node = FakeNode(status="stopped")
    code, _, err = _teardown(monkeypatch, capsys, node, "--yes-i-typed", GUEST.name)
    assert code == 0, err
    assert not any(" stop " in c for c in node.ran)


def test_typed_confirmation_at_a_terminal(monkeypatch, capsys):
    node = FakeNode()
    code, _, err = _teardown(monkeypatch, capsys, node, typed="gpu")
    assert code == 2 and "is not" in err and "nothing changed" in err
    assert len(node.ran) == 1  # only the read: nothing stopped or destroyed
    node = FakeNode()
    code, _, err = _teardown(monkeypatch, capsys, node, typed=GUEST.name)
    assert code == 0, err
    assert len(node.ran) == 4


def test_without_a_terminal_or_with_another_name_nothing_is_contacted(monkeypatch, capsys):
    node = FakeNode()
    code, _, err = _teardown(monkeypatch, capsys, node)
    assert code == 2 and len(err.splitlines()) == 1 and "--yes-i-typed" in err
    code, _, err = _teardown(monkeypatch, capsys, node, "--yes-i-typed", "someone-else")
    assert code == 2 and len(err.splitlines()) == 1 and "someone-else" in err
    assert node.ran == []


def test_data_on_an_owned_volume_is_refused_before_anything_changes(monkeypatch, capsys):
    node = FakeNode(conf=LXC_CONF + "mp2: local-lvm:vm-101-disk-1,mp=/data\n")
    code, _, err = _teardown(monkeypatch, capsys, node, "--yes-i-typed", GUEST.name)
    assert code == 1 and "mp2 (local-lvm:vm-101-disk-1)" in err and "nothing changed" in err
    assert len(node.ran) == 1


def test_an_absent_guest_is_nothing_to_do_and_failures_are_named(monkeypatch, capsys):
    code, out, _ = _teardown(monkeypatch, capsys, FakeNode(conf=None), "--yes-i-typed", GUEST.name)
    assert code == 0 and "does not exist" in out
    code, _, err = _teardown(monkeypatch, capsys, FakeNode(fail="destroy"), "--yes-i-typed", GUEST.name)
    assert code == 1 and "protection mode enabled" in err
    code, out, err = _teardown(monkeypatch, capsys, FakeNode(missing=["/tank/models"]), "--yes-i-typed", GUEST.name)
    assert code == 1 and "MISSING" in out and "/tank/models no longer on" in err


def test_each_command_runs_under_timeout_and_a_hung_connection_is_named(monkeypatch):
    import threading

    import testinfra

    ran, release = [], threading.Event()

    class Host:
        def run(self, command):
            ran.append(command)
            if "hang" in command:
                release.wait(5)
            return SimpleNamespace(rc=0, stdout="", stderr="")

    monkeypatch.setattr(testinfra, "get_host", lambda url: Host())
    monkeypatch.setattr(teardown, "CONNECT_MARGIN_S", 0.2)
    teardown._on_node(INVENTORY, SITE.group("proxmox_hosts")[0].name, teardown.stop_command("lxc", 101), 7)
    assert shlex.split(ran[0])[:6] == ["timeout", "-s", "KILL", "7", "sh", "-c"]
    with pytest.raises(teardown.Unreachable, match="no answer within 0.2 s"):
        teardown._on_node(INVENTORY, SITE.group("proxmox_hosts")[0].name, teardown.argv("echo", "hang"), 0)
    release.set()


def test_an_unreachable_node_is_exit_3(monkeypatch, capsys):
    def unreachable(*args):
        raise teardown.Unreachable("pve: no answer within 50 s")

    code, _, err = _teardown(monkeypatch, capsys, unreachable, "--yes-i-typed", GUEST.name)
    assert code == 3 and "no answer within 50 s" in err


# -- the lab's stand-ins destroy what Proxmox destroys ------------------------------------------


def _standin(tool: str, tmp_path, monkeypatch):
    path = str(PROJECT_ROOT / "lab" / "standins" / "proxmox" / tool)
    loader = importlib.machinery.SourceFileLoader(f"{tool}_standin", path)
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(f"{tool}_standin", loader))
    loader.exec_module(module)
    standin = module.pve
    monkeypatch.setattr(standin, "PVE_DIR", tmp_path / "etc-pve")
    monkeypatch.setattr(standin, "STATE_DIR", tmp_path / "state")
    monkeypatch.setattr(standin, "STORAGE_DATA", tmp_path / "state" / "storage")
    monkeypatch.setattr(standin, "LAB_BACKING_FILE", tmp_path / "state" / "lab-containers.json")
    return module, standin


def test_pct_standin_destroy_frees_owned_volumes_and_leaves_bind_mounts(tmp_path, monkeypatch, capsys):
    pct, standin = _standin("pct", tmp_path, monkeypatch)
    monkeypatch.setattr(pct, "TEMPLATE_DIR", tmp_path)
    (tmp_path / "debian-12.tar.zst").write_text("")
    weights = tmp_path / "tank" / "models"
    weights.mkdir(parents=True)
    (weights / "model.safetensors").write_text("weights")
    data = standin.volume_data("local-lvm:vm-300-disk-1")
    data.mkdir(parents=True)
    (data / "file").write_text("data")
    stray = standin.volume_data("local-lvm:vm-300-disk-7")
    stray.mkdir(parents=True)
    foreign = standin.volume_data("local-lvm:vm-301-disk-0")
    foreign.mkdir(parents=True)
    pct.handle(
        "create",
        ["300", "local:vztmpl/debian-12.tar.zst", "--rootfs", "local-lvm:8",
         "--mp0", f"{weights},mp=/models,ro=1", "--mp1", "local-lvm:vm-300-disk-1,mp=/data",
         "--unused0", "local-lvm:vm-301-disk-0"],
    )  # fmt: skip
    rootfs = standin.volume_data("local-lvm:vm-300-disk-0")
    assert rootfs.is_dir()  # the new rootfs has its data folder
    pct.handle("start", ["300"])
    with pytest.raises(standin.PveError, match=r"^unable to destroy CT 300 - container is running$"):
        pct.handle("destroy", ["300"])
    pct.handle("destroy", ["300", "--force"])
    err = capsys.readouterr().err
    assert "forced to stop CT 300 before destroying!" in err
    assert "ignore deletion of 'local-lvm:vm-301-disk-0', CT 300 isn't the owner!" in err
    assert not standin.conf_path("lxc", 300).exists()
    assert not rootfs.exists() and not data.exists()  # the CT's own volumes, mount point included
    assert (weights / "model.safetensors").read_text() == "weights"  # a bind mount's folder stays
    assert foreign.is_dir() and stray.is_dir()  # unreferenced: only with the flag
    with pytest.raises(standin.PveError, match="does not exist"):
        pct.handle("destroy", ["300"])


def test_pct_standin_destroy_unreferenced_disks_and_protection(tmp_path, monkeypatch):
    pct, standin = _standin("pct", tmp_path, monkeypatch)
    monkeypatch.setattr(pct, "TEMPLATE_DIR", tmp_path)
    (tmp_path / "debian-12.tar.zst").write_text("")
    stray = standin.volume_data("local-lvm:vm-300-disk-7")
    stray.mkdir(parents=True)
    pct.handle("create", ["300", "local:vztmpl/debian-12.tar.zst", "--rootfs", "local-lvm:8", "--protection", "1"])
    with pytest.raises(standin.PveError, match=r"^can't remove CT 300 - protection mode enabled$"):
        pct.handle("destroy", ["300"])
    pct.handle("set", ["300", "--delete", "protection"])
    pct.handle("destroy", ["300", "--destroy-unreferenced-disks", "1"])
    assert not stray.exists()


def test_qm_standin_destroy_frees_disks_but_not_cdroms(tmp_path, monkeypatch):
    qm, standin = _standin("qm", tmp_path, monkeypatch)
    qm.handle(
        "create",
        ["400", "--scsi0", "local-lvm:8", "--efidisk0", "local-lvm:1", "--ide0", "local:iso/x.iso,media=cdrom"],
    )
    disks = [standin.volume_data(f"local-lvm:vm-400-disk-{n}") for n in (0, 1)]
    assert all(d.is_dir() for d in disks)
    iso = standin.volume_data("local:iso/x.iso")
    iso.mkdir(parents=True)
    qm.handle("start", ["400"])
    with pytest.raises(standin.PveError, match=r"^VM 400 is running - destroy failed$"):
        qm.handle("destroy", ["400"])
    qm.handle("stop", ["400"])
    qm.handle("destroy", ["400"])
    assert not any(d.exists() for d in disks) and iso.is_dir()
    assert not standin.conf_path("qemu-server", 400).exists()
