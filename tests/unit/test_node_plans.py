"""Plan tests of a Proxmox node that installs its own NVIDIA driver (full mode), planned twice:
once bare (what the first run of the walk does, in order, with no exception while planning)
and once as the walk leaves it (that plan must change nothing).

The real pyinfra CLI runs deploy.py against @fake hosts (tests/unit/plans/record.py); the
converged node's answers are built from the first plan's own uploads
(tests/unit/plans/_node_converged.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[2]
PLANS = Path(__file__).parent / "plans"
NODE = "@fake/pve-node"
APT_INSTALL = (
    'DEBIAN_FRONTEND=noninteractive apt-get -y -o Dpkg::Options::="--force-confdef"'
    ' -o Dpkg::Options::="--force-confold" install --no-install-recommends'
)


def _plan(state: str, uploads: Path | None = None) -> tuple[list[dict], str]:
    env = {**os.environ, "PLAN_NODE_STATE": state}
    if uploads:
        env["PLAN_NODE_UPLOADS"] = str(uploads)
    completed = subprocess.run(
        [
            sys.executable,
            str(PLANS / "record.py"),
            "--limit",
            NODE,
            str(PLANS / "inventory_node_debian12.py"),
            "deploy.py",
        ],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=env,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    records = [json.loads(line) for line in completed.stdout.splitlines() if line.strip()]
    return [r for r in records if r["host"] == NODE], completed.stderr


@pytest.fixture(scope="module")
def bare():
    return _plan("bare")


@pytest.fixture(scope="module")
def converged(bare, tmp_path_factory):
    uploads = {r["upload"]: r["content"] for r in bare[0] if "upload" in r}
    path = tmp_path_factory.mktemp("node") / "uploads.json"
    path.write_text(json.dumps(uploads))
    return _plan("converged", path)


def _commands(records):
    return [r["command"] for r in records if "command" in r]


def test_bare_node_walk_order(bare):
    commands = _commands(bare[0])

    def at(prefix: str) -> int:
        return next(i for i, c in enumerate(commands) if c.startswith(prefix))

    headers = commands.index(f"{APT_INSTALL} proxmox-default-headers")
    driver = at(f"{APT_INSTALL} --allow-downgrades --allow-change-held-packages nvidia-driver-cuda=580.95.05-1")
    dkms = at("dkms status -m nvidia -v 580.95.05 | grep -q ': installed'")
    marked = commands.index("touch /run/reboot-required && echo nvidia-driver >> /run/reboot-required.pkgs")
    reboot = commands.index("( sleep 1 && systemctl reboot ) </dev/null >/dev/null 2>&1 &")
    assert headers < driver < dkms < marked < reboot
    assert "nvidia-modprobe=580.95.05-1" in commands[driver]
    # persistenced and the uvm unit are enabled, not started before the module is loaded
    assert commands.index("systemctl enable nvidia-persistenced.service") < reboot
    assert commands.index("systemctl enable nvidia-uvm-devices.service") < reboot
    assert not any(c.startswith("systemctl start") for c in commands)
    # the guest is not created this run, and says why (no exception while planning)
    assert not any(c.startswith("pct create") for c in commands)
    assert "LXC guest 201 (@fake/lxc-on-node) waits: the node's NVIDIA driver lists no GPU" in bare[1]


def test_bare_node_has_one_nouveau_blacklist_and_the_uvm_boot_unit(bare):
    uploads = [r["upload"] for r in bare[0] if "upload" in r]
    assert uploads.count("/etc/modprobe.d/blacklist-nouveau.conf") == 1
    commands = _commands(bare[0])
    assert commands.count("update-initramfs -u -k all") == 1 and "update-initramfs -u" not in commands
    unit = next(r["content"] for r in bare[0] if r.get("upload") == "/etc/systemd/system/nvidia-uvm-devices.service")
    assert "ExecStart=/usr/bin/nvidia-modprobe -u -c0" in unit and "Before=pve-guests.service" in unit
    assert (
        next(r["content"] for r in bare[0] if r.get("upload") == "/etc/modules-load.d/nvidia-uvm.conf").splitlines()[-1]
        == "nvidia-uvm"
    )


def test_converged_node_plan_changes_nothing(converged):
    records, stderr = converged
    # Only fact-like reads remain: the reboot step's check of /run/reboot-required.
    assert _commands(records) == ["test -f /run/reboot-required"], "\n".join(_commands(records))
    assert not [r for r in records if "upload" in r]
    assert "waits" not in stderr


def test_changed_guest_keys_are_pushed_once_and_only_then(converged, tmp_path_factory):
    """guest_ssh_public_keys changed on an existing, running guest: the node's copy and one
    `pct push` of root's authorized_keys (its PVE block holding exactly the new key); the
    converged plan above, same keys, makes neither."""
    uploads = {r["upload"]: r["content"] for r in _plan("bare")[0] if "upload" in r}
    path = tmp_path_factory.mktemp("node-new-key") / "uploads.json"
    path.write_text(json.dumps(uploads))
    records, _ = _plan("converged-new-key", path)
    commands = [
        c
        for c in _commands(records)
        if c != "test -f /run/reboot-required" and c != "chmod 600 /etc/inference-host/guest-keys/201.pub"
    ]  # the upload's
    assert [r["upload"] for r in records if "upload" in r] == ["/etc/inference-host/guest-keys/201.pub"]
    assert len(commands) == 1, "\n".join(commands)
    assert 'pct push 201 "$keys" /root/.ssh/authorized_keys --perms 0600' in commands[0]
    assert "AAAAIG5ld2tleWZvcnRlc3Rz" in commands[0] and "AAAAIHh0bWJ2ZXhhbXBsZWtleWZvcnRlc3Rz" not in commands[0]
    assert "# --- BEGIN PVE ---" in commands[0] and "# --- END PVE ---" in commands[0]
    assert not any(c.startswith("pct exec 201 -- mkdir") for c in commands)
    unchanged, _ = converged
    assert not any("pct push" in c for c in _commands(unchanged))
