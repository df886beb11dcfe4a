"""`qm start`'s passthrough refusals: the lab's qm stand-in dies as qemu-server's PCI.pm does
(a GPU another running VM holds, a node without an IOMMU), and the KVM guest role's start
command names each with its next step, qm's own line and exit status kept."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import subprocess

import pytest

from roles.kvm_guest import START_REFUSALS, start_command
from tests.unit.conftest import PROJECT_ROOT

GPU = "0000:01:00.0"


@pytest.fixture
def qm(tmp_path, monkeypatch):
    """The qm stand-in in this process, its node state under tmp_path."""
    path = str(PROJECT_ROOT / "lab" / "standins" / "proxmox" / "qm")
    loader = importlib.machinery.SourceFileLoader("qm_standin", path)
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader("qm_standin", loader))
    loader.exec_module(module)
    monkeypatch.setattr(module.pve, "PVE_DIR", tmp_path / "pve")
    monkeypatch.setattr(module.pve, "STATE_DIR", tmp_path / "state")
    monkeypatch.setattr(module.pve, "LOG_FILE", tmp_path / "log")
    monkeypatch.setattr(module, "RESERVATIONS", tmp_path / "run" / "pci-id-reservations")
    monkeypatch.setattr(module, "NO_IOMMU", tmp_path / "state" / "no-iommu")
    for vmid in (101, 102):
        module.handle("create", [str(vmid), "--machine", "q35", "--hostpci0", f"{GPU},pcie=1"])
    return module


def _refusal(qm, vmid: int) -> str:
    with pytest.raises(qm.pve.PveError) as refused:
        qm.handle("start", [str(vmid)])
    return str(refused.value)


def test_a_gpu_another_running_vm_holds_is_refused(qm):
    qm.handle("start", ["101"])
    assert _refusal(qm, 102) == f"PCI device '{GPU}' already in use by VMID '101'"
    assert qm.pve.get_status("qemu-server", 102) == "stopped"
    qm.handle("stop", ["101"])  # its reservation goes with it
    qm.handle("start", ["102"])
    assert qm.pve.get_status("qemu-server", 102) == "running"


def test_a_node_without_an_iommu_is_refused(qm):
    qm.NO_IOMMU.parent.mkdir(parents=True, exist_ok=True)
    qm.NO_IOMMU.touch()
    assert _refusal(qm, 101) == "cannot prepare PCI pass-through, IOMMU not present"
    qm.NO_IOMMU.unlink()
    qm.handle("start", ["101"])


@pytest.mark.parametrize("case", ["in-use", "no-iommu"])
def test_the_roles_start_command_names_each_refusal(qm, tmp_path, case):
    """The role's command run by sh with a `qm` that says what the stand-in says and exits 255."""
    if case == "in-use":
        qm.handle("start", ["101"])
    else:
        qm.NO_IOMMU.parent.mkdir(parents=True, exist_ok=True)
        qm.NO_IOMMU.touch()
    said = _refusal(qm, 102)
    fake = tmp_path / "bin" / "qm"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\nprintf '%s\\n' {said!r} >&2\nexit 255\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}"}
    run = subprocess.run(["sh", "-c", start_command(102)], capture_output=True, text=True, env=env, timeout=30)
    hint = next(h for needle, h in START_REFUSALS if needle in said)
    assert run.returncode == 255
    assert run.stderr.splitlines() == [said, f"KVM guest 102: {hint}"]


def test_a_start_that_succeeds_says_nothing(tmp_path):
    fake = tmp_path / "qm"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    run = subprocess.run(["sh", "-c", start_command(102)], capture_output=True, text=True, env=env, timeout=30)
    assert (run.returncode, run.stdout, run.stderr) == (0, "", "")


@pytest.mark.parametrize(
    ("machine", "pcie", "refused"),
    [
        ("type=q35,viommu=intel", "pcie=1", False),  # the machine's property string, type= spelled out
        ("pc-q35-8.1", "pcie=1", False),
        ("pc", "pcie=on", True),  # pcie is a boolean: on, yes and true are 1 as well
        ("pc", "pcie=0", False),
    ],
)
def test_pcie_needs_q35_as_qemu_server_reads_both_property_strings(qm, machine, pcie, refused):
    """PCI.pm parse_hostpci_devices: `die "q35 machine model is not enabled" if !$q35 && $d->{pcie}`,
    $d parsed by the hostpci schema (pcie a boolean) and $q35 from Machine.pm machine_type_is_q35
    (the machine's `type`, its default key, matching /q35/) (qemu-server stable-bookworm)."""
    qm.handle("create", ["103", "--machine", machine, "--hostpci0", f"0000:02:00.0,{pcie}"])
    if refused:
        assert _refusal(qm, 103) == "q35 machine model is not enabled"
    else:
        qm.handle("start", ["103"])
        assert qm.pve.get_status("qemu-server", 103) == "running"
