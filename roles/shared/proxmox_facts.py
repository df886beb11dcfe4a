"""Facts of roles/proxmox_host (and the guest roles, which run on the node too)."""

from __future__ import annotations

import json
import re

from pyinfra.api import FactBase

from roles.shared.fact_batch import batched
from roles.shared.pve import parse_config
from roles.shared.shell import Shell, sh


def parse_boot_loader(lines: list[str]) -> str:
    """`proxmox-boot-tool status` -> "systemd-boot" or "grub".

    proxmox-boot-tool prints "<ESP UUID> is configured with: uefi (versions: ...)" for ESPs
    booted with systemd-boot (kernel command line in /etc/kernel/cmdline) and "... with: grub"
    for GRUB. Without the tool or with no ESP set up ("E: /etc/kernel/proxmox-boot-uuids does
    not exist."), the node boots GRUB from /etc/default/grub (Proxmox admin guide, "Host
    Bootloader").
    """
    configured = [line for line in lines if "is configured with:" in line]
    if any("configured with: uefi" in line for line in configured):
        return "systemd-boot"
    return "grub"


class BootLoader(FactBase):
    """Returns the boot loader whose kernel command line counts: "systemd-boot" or "grub"."""

    def command(self) -> str:
        return "! command -v proxmox-boot-tool >/dev/null || proxmox-boot-tool status 2>&1 || true"

    def process(self, output) -> str:
        return parse_boot_loader(list(output))


@batched
class KernelCmdline(FactBase):
    """Returns the contents of /etc/kernel/cmdline (systemd-boot), or None if it is absent."""

    def command(self) -> str:
        return "! test -f /etc/kernel/cmdline || cat /etc/kernel/cmdline"

    def process(self, output) -> str | None:
        text = " ".join(line.strip() for line in output).strip()
        return text or None


@batched
class CpuVendor(FactBase):
    """Returns "intel" or "amd" from /proc/cpuinfo's vendor_id, or None for anything else."""

    def command(self) -> str:
        return "grep -m1 '^vendor_id' /proc/cpuinfo || true"

    def process(self, output) -> str | None:
        text = "".join(output)
        if "GenuineIntel" in text:
            return "intel"
        if "AuthenticAMD" in text or "HygonGenuine" in text:
            return "amd"
        return None


_NODE_RE = re.compile(r"^node (character special file|[\w ]+)\|([0-9a-f]+):([0-9a-f]+)\|(\S+)$")


def parse_nvidia_host_devices(lines: list[str]) -> dict:
    """Parse NvidiaHostDevices output: char device nodes, and GPU address -> device minor."""
    nodes: dict[str, tuple[int, int]] = {}
    minors: dict[str, int] = {}
    address = None
    for line in lines:
        line = line.rstrip("\n")
        node = _NODE_RE.match(line)
        if node:
            if node.group(1) == "character special file":
                nodes[node.group(4)] = (int(node.group(2), 16), int(node.group(3), 16))
            continue
        if line.startswith("== "):
            address = line.rstrip("/").rsplit("/", 1)[-1].lower()
        elif line.startswith("Bus Location:"):
            address = line.split(":", 1)[1].strip().lower()
        elif line.startswith("Device Minor:") and address:
            minors[address] = int(line.split(":", 1)[1].strip())
    return {"nodes": nodes, "minors": minors}


class NvidiaHostDevices(FactBase):
    """Returns {"nodes": {path: (major, minor)}, "minors": {pci address: device minor}}.

    nodes: the /dev/nvidia* character devices present on the host (what an LXC guest's devN
    may point at); minors: from <proc_dir>/gpus/<address>/information ("Device Minor"), so that
    the GPU at a PCI address is passed as the right /dev/nvidiaN.
    """

    def command(self, proc_dir: str = "/proc/driver/nvidia") -> Shell:
        return sh(
            'for n in /dev/nvidia* /dev/nvidia-caps/*; do [ -e "$n" ] &&'
            " stat -c 'node %F|%t:%T|%n' \"$n\"; done;"
            ' for d in {gpus}/*; do [ -f "$d/information" ] || continue;'
            ' echo "== $d"; cat "$d/information"; done; true',
            gpus=proc_dir.rstrip("/") + "/gpus",
        )

    def process(self, output) -> dict:
        return parse_nvidia_host_devices(list(output))

    @staticmethod
    def default() -> dict:
        # A bare node prints nothing (no driver, no nodes); pyinfra then returns the default.
        return {"nodes": {}, "minors": {}}


def parse_pci_devices(text: str) -> dict[str, dict]:
    """`pvesh get /nodes/<node>/hardware/pci --output-format json` -> {address: device}."""
    if not text.strip():
        return {}
    return {device["id"]: device for device in json.loads(text)}


class PciDevices(FactBase):
    """Returns the node's PCI devices from the Proxmox API: {address: {vendor, iommugroup, ...}}."""

    def command(self) -> str:
        return "pvesh get \"/nodes/$(hostname)/hardware/pci\" --pci-class-blacklist '' --output-format json"

    def process(self, output) -> dict[str, dict]:
        return parse_pci_devices("\n".join(output))


def parse_guest_state(lines: list[str], kind: str) -> dict | None:
    """`pct status ID` / `qm status ID`, "---", then the config file -> status and config."""
    if not lines:
        return None
    text = "\n".join(lines)
    head, _, config = text.partition("\n---\n")
    status = head.strip().removeprefix("status:").strip()
    return {"status": status, "config": parse_config(config, kind)}


class _GuestState(FactBase):
    TOOL = ""
    CONF_DIR = ""
    KIND = ""

    def command(self, vmid: int) -> Shell:
        conf = f"{self.CONF_DIR}/{int(vmid)}.conf"
        return sh(
            "! test -f {conf} || {{ {tool} status {vmid} && echo --- && cat -- {conf}; }}",
            conf=conf,
            tool=self.TOOL,
            vmid=int(vmid),
        )

    def process(self, output) -> dict | None:
        return parse_guest_state(list(output), self.KIND)


class LxcGuestState(_GuestState):
    """Returns {"status": "running"|"stopped", "config": GuestConfig} of container ID, or None.

    The config comes from /etc/pve/lxc/ID.conf, pending section included, so that changes
    waiting for a restart can be reported (`pct config` shows them already applied).
    """

    TOOL = "pct"
    CONF_DIR = "/etc/pve/lxc"
    KIND = "lxc"


class KvmGuestState(_GuestState):
    """Returns {"status": "running"|"stopped", "config": GuestConfig} of VM ID, or None."""

    TOOL = "qm"
    CONF_DIR = "/etc/pve/qemu-server"
    KIND = "qemu"


_KEYS_STATE = ("file", "no-file", "no-dir")


def parse_authorized_keys(lines: list[str]) -> dict | None:
    """LxcAuthorizedKeys output: a state line ("file", "no-file", "no-dir"), then the file."""
    if not lines or lines[0].strip() not in _KEYS_STATE:
        return None
    state = lines[0].strip()
    content = "".join(f"{line}\n" for line in lines[1:]) if state == "file" else None
    return {"ssh_dir": state != "no-dir", "content": content}


class LxcAuthorizedKeys(FactBase):
    """Returns {"ssh_dir": bool, "content": str | None} of root's ~/.ssh/authorized_keys in
    running container ID, read with `pct exec` (lxc-attach into the container: pve-container
    5.3.5 src/PVE/CLI/pct.pm exec), or None when it cannot be read (not running)."""

    def command(self, vmid: int) -> Shell:
        vmid = int(vmid)
        inside = (
            "if [ -f /root/.ssh/authorized_keys ]; then echo file;"
            " cat /root/.ssh/authorized_keys; elif [ -d /root/.ssh ]; then echo no-file;"
            " else echo no-dir; fi"
        )
        return sh(
            "! pct status {vmid} 2>/dev/null | grep -qx 'status: running' || pct exec {vmid} -- sh -c {inside}",
            vmid=vmid,
            inside=inside,
        )

    def process(self, output) -> dict | None:
        return parse_authorized_keys(list(output))
