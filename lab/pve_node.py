"""The lab's Proxmox VE node and its GPUs: the stand-ins (pct, qm, pvesh, proxmox-boot-tool, the
kernel) and the hardware they report, installed into the node container; and the same GPUs'
answers planted in guests that have no node under them."""

from __future__ import annotations

import json
import re

from lab.containers import GUEST_VMID, container_name
from lab.contents import _stamp, _tree_digest, _unchanged
from lab.docker_engine import PREFIX, PROJECT_ROOT, _docker

# The lab's Proxmox node: what its stand-ins report. Eight GPUs at the production addresses,
# one IOMMU group each, device minors in bus order (what the NVIDIA driver does).
PVE_STANDINS = PROJECT_ROOT / "lab" / "standins" / "proxmox"
PVE_STANDIN_DIR = "/usr/local/lib/pve-standin"
PVE_STANDIN_LOG = "/var/log/pve-standin.log"
# Stands in for /proc/driver/nvidia: written by the stand-in kernel at boot once the driver is
# built (lab/standins/proxmox/pve-standin-kernel); /run is emptied at every boot like /proc.
PVE_PROC_DIR = "/run/pve-standin/proc-driver-nvidia"
PVE_GPUS = [
    "0000:01:00.0",
    "0000:21:00.0",
    "0000:41:00.0",
    "0000:61:00.0",
    "0000:81:00.0",
    "0000:a1:00.0",
    "0000:c1:00.0",
    "0000:e1:00.0",
]
PVE_IOMMU_GROUPS = {address: 20 + index for index, address in enumerate(PVE_GPUS)}
PVE_TEMPLATE = "ubuntu-24.04-standard_24.04-2_amd64.tar.zst"
# A real captured /proc/driver/nvidia/gpus/<address>/information, re-addressed per lab GPU.
GPU_INFORMATION_SAMPLE = PROJECT_ROOT / "tests" / "unit" / "data" / "gpu" / "h200-1gpu" / "proc-gpus.txt"


# inventory/lab_replicas.py's gpu nodes have no driver stand-in listing GPUs (no node made them),
# yet their DCGM exporter stand-in needs GPUs to serve (the real one exits when NVML finds none),
# and the checks' timer there judges nvidia-smi's answers (roles/monitoring). What the hardware
# would answer is planted where only those stand-ins read it: the captured information file,
# re-addressed to the lab node's eight GPUs, as the stand-in kernel does
# (lab/standins/nvidia_apt_repo/dcgm_exporter.py reads it), and the same list where the
# nvidia-smi stand-in looks for a driver (lab/standins/nvidia_apt_repo/nvidia_smi.py: it then
# answers from the real captures instead of failing as without a driver), with its empty list of
# processes holding a GPU. /run is emptied at every boot.
REPLICA_ROLES = ("rep-a", "rep-b")
# The main lab's guest gets the same answers: a real LXC guest shares its node's kernel, so its
# nvidia-smi and DCGM exporter see the GPUs through the node's /proc/driver/nvidia, while the lab's
# guest container has a /proc of its own. Its monitor (inventory/lab.py) scrapes that exporter and
# the checks' timer judges those answers.
GPU_ANSWER_ROLES = ("gpu", *REPLICA_ROLES)


DCGM_STANDIN_GPUS = "/run/dcgm-exporter-standin/proc-driver-nvidia"


def replica_gpu_information() -> dict[str, str]:
    """{PCI address: its /proc/driver/nvidia/gpus/<address>/information} of the lab's GPUs."""
    sample = GPU_INFORMATION_SAMPLE.read_text().split("\n", 1)[1]
    out = {}
    for minor, address in enumerate(PVE_GPUS):
        info = re.sub(r"Bus Location:\s*\S+", f"Bus Location: \t {address}", sample)
        info = re.sub(r"Device Minor:\s*\d+", f"Device Minor: \t {minor}", info)
        info = re.sub(r"GPU UUID:\s*\S+", f"GPU UUID: \t GPU-1ab0{minor:04d}-0000-0000-0000-000000000000", info)
        out[address] = info.replace("NVIDIA H200", "NVIDIA RTX PRO 6000 Blackwell Server Edition").rstrip()
    return out


def plant_replica_gpus(name: str) -> None:
    from lab.standins.nvidia_apt_repo import nvidia_smi

    smi = f"{nvidia_smi.STATE}/proc-driver-nvidia"
    lines = [f"[ -e {DCGM_STANDIN_GPUS}/gpus/{PVE_GPUS[-1]}/information ] && [ -L {smi} ] && exit 0"]
    for address, info in replica_gpu_information().items():
        folder = f"{DCGM_STANDIN_GPUS}/gpus/{address}"
        lines.append(f"mkdir -p {folder} && cat > {folder}/information <<'INFO'\n{info}\nINFO")
    lines.append(f"mkdir -p {nvidia_smi.STATE}/compute-apps && ln -sfn {DCGM_STANDIN_GPUS} {smi}")
    _docker("exec", name, "sh", "-c", "\n".join(lines))


def _pve_node_script(apt_url: str) -> str:
    """Shell run in the node container: what a freshly installed Proxmox VE 8 node has.

    Stand-ins for pct, qm, pvesh and proxmox-boot-tool, /etc/pve, a container template, the
    node's hardware (PCI list, the GPUs' information file the stand-in kernel reads), Proxmox's
    package repository (the stand-in, signed with its key), and the stand-in kernel's boot unit.
    No NVIDIA device node and no module: those come from the driver role and the reboot.
    """
    sample = GPU_INFORMATION_SAMPLE.read_text().split("\n", 1)[1]  # drop the "== path" line
    pci = [
        {
            "id": address,
            "class": "0x030200",
            "vendor": "0x10de",
            "device": "0x2bb5",
            "vendor_name": "NVIDIA Corporation",
            "device_name": "GB202GL [RTX PRO 6000 Blackwell Server Edition]",
            "subsystem_vendor": "0x10de",
            "subsystem_device": "0x204e",
            "iommugroup": PVE_IOMMU_GROUPS[address],
        }
        for address in PVE_GPUS
    ]
    lines = [
        "set -e",
        # A node has ssh-keygen (proxmox-ve needs openssh-server): pct create checks keys with it.
        (
            "command -v ssh-keygen >/dev/null || { apt-get update -q >/dev/null &&"
            " DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends openssh-client"
            " >/dev/null; }"
        ),
        f"ln -sfn {PVE_STANDIN_DIR}/pct /usr/sbin/pct",
        f"ln -sfn {PVE_STANDIN_DIR}/qm /usr/sbin/qm",
        f"ln -sfn {PVE_STANDIN_DIR}/pvesh /usr/bin/pvesh",
        f"ln -sfn {PVE_STANDIN_DIR}/proxmox-boot-tool /usr/sbin/proxmox-boot-tool",
        "node=$(hostname -s)",
        "mkdir -p /etc/pve/nodes/$node/lxc /etc/pve/nodes/$node/qemu-server /var/lib/vz/template/cache",
        "ln -sfn nodes/$node/lxc /etc/pve/lxc && ln -sfn nodes/$node/qemu-server /etc/pve/qemu-server",
        f"touch /var/lib/vz/template/cache/{PVE_TEMPLATE}",
        # A systemd-boot node (ZFS root): the role must find and use /etc/kernel/cmdline.
        (
            "[ -f /etc/kernel/proxmox-boot-uuids ] || { mkdir -p /etc/kernel;"
            " echo 'root=ZFS=rpool/ROOT/pve-1 boot=zfs' > /etc/kernel/cmdline;"
            " echo 4A13-ED6B > /etc/kernel/proxmox-boot-uuids; }"
        ),
        f"cat > /var/lib/pve-standin/pci.json <<'PCI'\n{json.dumps(pci)}\nPCI",
        f"cat > /var/lib/pve-standin/gpu-information.txt <<'INFO'\n{sample.rstrip()}\nINFO",
        # Proxmox VE's own repository, as the installer configures it (stand-in server and key).
        f"echo 'deb {apt_url}/proxmox/debian/pve bookworm pve-no-subscription'"
        " > /etc/apt/sources.list.d/pve-install-repo.list",
        # The stand-in kernel: at every boot, load what DKMS built (nothing until then).
        f"ln -sfn {PVE_STANDIN_DIR}/pve-standin-kernel.service /etc/systemd/system/pve-standin-kernel.service",
        "mkdir -p /etc/systemd/system/sysinit.target.wants",
        "ln -sfn /etc/systemd/system/pve-standin-kernel.service"
        " /etc/systemd/system/sysinit.target.wants/pve-standin-kernel.service",
        "systemctl daemon-reload",
        # Which Docker container is which CT (for pct exec / push; see LAB_DOCKER_SOCKET).
        f"echo '{json.dumps({str(GUEST_VMID): container_name('gpu')})}' > /var/lib/pve-standin/lab-containers.json",
    ]
    return "\n".join(lines) + "\n"


def prepare_pve_node(name: str) -> None:
    """Install the Proxmox stand-ins into the node container (lab only, never a role's job)."""
    from lab.standins.nvidia_apt_repo import repo as apt_standin

    script, key = _pve_node_script(apt_standin.url_for(PREFIX)), apt_standin.signing_key()
    stamp = "/var/lib/pve-standin/.lab-stamp"
    digest = _tree_digest(PVE_STANDINS, extra=script + key.decode("latin-1"))
    if _unchanged(name, stamp, digest, f"{PVE_STANDIN_DIR}/pct"):
        return
    _docker("exec", name, "mkdir", "-p", PVE_STANDIN_DIR, "/var/lib/pve-standin", "/etc/apt/trusted.gpg.d")
    _docker("cp", f"{PVE_STANDINS}/.", f"{name}:{PVE_STANDIN_DIR}/")
    _docker(
        "exec",
        "-i",
        name,
        "sh",
        "-c",
        "cat > /etc/apt/trusted.gpg.d/proxmox-release-bookworm.gpg",
        input=key.decode("latin-1"),
        encoding="latin-1",
    )
    _docker("exec", "-i", name, "bash", "-s", input=script)
    _stamp(name, stamp, digest)
