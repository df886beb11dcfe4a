"""Fake answers of a Proxmox node the walk has converged, for the node's "second plan".

What the node holds after the walk: every file the first plan uploaded (their contents, from
PLAN_NODE_UPLOADS, a JSON file {path: content} the plan test writes), its directories, the
packages installed and held, the services enabled and running, the NVIDIA module loaded with
its device nodes and GPU list, no reboot pending, and the LXC guest created and running, with
root's authorized_keys as pct create wrote it (the PVE block of the keys it was created with,
which the node also keeps). Each answer is in the format of the fact's real command (stat -c,
sha1sum, dpkg -l, dpkg -I, systemctl show, /proc/driver/nvidia, pct status + the config file,
pct exec's state line + the file).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from datetime import UTC, datetime

DRIVER = "580.95.05"
PACKAGES = {  # dpkg -l: name -> version
    "pciutils": "1:3.9.0-4",
    "kmod": "30+20221128-1",
    "initramfs-tools": "0.142+deb12u1",
    "curl": "7.88.1-10+deb12u12",
    "gpg": "2.2.40-1.1",
    "proxmox-default-headers": "1.1.0",
    "nvidia-driver-cuda": f"{DRIVER}-1",
    "nvidia-persistenced": f"{DRIVER}-1",
    "nvidia-kernel-open-dkms": f"{DRIVER}-1",
    "nvidia-modprobe": f"{DRIVER}-1",
}
HELD = ["nvidia-driver-cuda", "nvidia-persistenced", "nvidia-kernel-open-dkms", "nvidia-modprobe"]
DIRECTORIES = [
    "/etc/default/grub.d",
    "/etc/modules-load.d",
    "/etc/modprobe.d",
    "/etc/apt/sources.list.d",
    "/etc/apt/preferences.d",
    "/etc/systemd/system",
    "/etc/sysctl.d",
]
SERVICES = {"nvidia-uvm-devices.service": "exited", "nvidia-persistenced.service": "running"}


def _stat(path: str, mode: str, size: int, now: int) -> str:
    return f"user=root group=root mode={mode} atime={now} mtime={now} ctime={now} size={size} '{path}'"


def _guest_config(gpus: list[str]) -> list[str]:
    devices = [f"/dev/nvidia{minor}" for minor in range(len(gpus))]
    devices += ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    return [
        "status: running",
        "---",
        "arch: amd64",
        "cores: 64",
        *[f"dev{index}: {path}" for index, path in enumerate(devices)],
        "features: keyctl=1,nesting=1",
        "hostname: lxc-on-node",
        "memory: 524288",
        "net0: name=eth0,bridge=vmbr0,hwaddr=BC:24:11:5E:3A:91,ip=dhcp,type=veth",
        "onboot: 1",
        "ostype: ubuntu",
        "rootfs: local-lvm:vm-201-disk-0,size=500G",
        "swap: 0",
        "unprivileged: 1",
    ]


def _host_devices(gpus: list[str]) -> list[str]:
    lines = [f"node character special file|c3:{minor:x}|/dev/nvidia{minor}" for minor in range(len(gpus))]
    lines += [
        "node character special file|c3:ff|/dev/nvidiactl",
        "node character special file|1ff:0|/dev/nvidia-uvm",
        "node character special file|1ff:1|/dev/nvidia-uvm-tools",
    ]
    for minor, address in enumerate(gpus):
        lines += [f"== /proc/driver/nvidia/gpus/{address}", f"Bus Location: \t {address}", f"Device Minor: \t {minor}"]
    return lines


def converged_node_responses(gpus: list[str], guest_keys: list[str]) -> dict:
    """guest_keys: the keys the guest was created with (in the guest and the node's copy)."""
    now = int(time.time())
    uploads = json.loads(open(os.environ["PLAN_NODE_UPLOADS"]).read())
    keys_text = "".join(f"{key}\n" for key in guest_keys)
    uploads["/etc/inference-host/guest-keys/201.pub"] = keys_text
    responses: dict = {
        # before "pct status 201", which the keys fact's command also contains
        "pct exec 201 --": ["file", "# --- BEGIN PVE ---", *guest_keys, "# --- END PVE ---"],
        "test -f /run/reboot-required": {"success": False},
        "for n in /dev/nvidia*": _host_devices(gpus),
        "/proc/driver/nvidia/version": [
            f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {DRIVER}  Release Build"
            "  (dvs-builder@U22-I3-AF03-09-1)  Tue Sep 23 17:35:14 UTC 2025",
            "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)",
        ],
        "pct status 201": _guest_config(gpus),
        "dpkg -l": [f"ii  {name}  {version}  amd64  stand-in" for name, version in PACKAGES.items()],
        # The CUDA repository's key in place, the one cuda_repo_key_fingerprint pins (roles/shared/apt_keys.py).
        "[ -e /etc/apt/keyrings/nvidia-cuda.asc ] || exit 0;": ["EB693B3035CD5710E231E123A4B469963BF863CC"],
        "apt-mark showhold": HELD,
        "date +": datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%S%z"),
        "(test -e /var/lib/apt/periodic/update-success-stamp ||": _stat(
            "/var/lib/apt/periodic/update-success-stamp", "-rw-r--r--", 0, now
        ),
    }
    for service, substate in SERVICES.items():
        responses[f"--property SubState {service}"] = [f"Id={service}", f"SubState={substate}"]
        responses[f"--property UnitFileState {service}"] = [f"Id={service}", "UnitFileState=enabled"]
    for path, content in uploads.items():
        data = content.encode()
        responses[f"sha1sum {path} "] = f"{hashlib.sha1(data).hexdigest()}  {path}"
        responses[f"(test -e {path} ||"] = _stat(path, "-rw-r--r--", len(data), now)
    for path in DIRECTORIES:
        responses[f"(test -e {path} ||"] = _stat(path, "drwxr-xr-x", 4096, now)
    responses["(test -e /etc/inference-host/guest-keys/201.pub ||"] = _stat(
        "/etc/inference-host/guest-keys/201.pub", "-rw-------", len(keys_text), now
    )
    responses["(test -e /etc/inference-host/guest-keys ||"] = _stat(
        "/etc/inference-host/guest-keys", "drwx------", 4096, now
    )
    return responses
