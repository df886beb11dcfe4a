"""The acceptance report's lines about the Proxmox node: the kernel's command line (IOMMU, the
GPUs kept from the host), nouveau kept out, each GPU bound to vfio-pci where a KVM guest takes it.
"""

from __future__ import annotations

import re

from checks.acceptance_line import FAIL, NOT_APPLICABLE, PASS, TARGET, UNREACHED, Line, standin
from roles.shared.shell import sh

# The lab's node kernel: a container has no kernel of its own, so lab/standins/proxmox's
# pve-standin-kernel writes, at each boot of the node container, the command line the ESP's
# loader entry would have booted with.
STANDIN_KERNEL = "/usr/local/lib/pve-standin/pve-standin-kernel"
STANDIN_CMDLINE = "/run/pve-standin/cmdline"


def expected_iommu_args(cpu_vendor: str) -> list[str]:
    # roles/proxmox_host writes these (iommu_kernel_args): passthrough on, and the host's own
    # DMA on the identity map (iommu=pt) so host-driver GPUs keep the fast path.
    return [f"{cpu_vendor}_iommu=on", "iommu=pt"]


def cpu_vendor(cpuinfo: str) -> str | None:
    found = re.search(r"^vendor_id\s*:\s*(\S+)", cpuinfo, re.M)
    return {"GenuineIntel": "intel", "AuthenticAMD": "amd"}.get(found.group(1)) if found else None


def judge_kernel_args(name: str, cmdline: str | None, vendor: str | None, source: str) -> Line:
    if cmdline is None:
        return Line(
            "node kernel arguments",
            name,
            "IOMMU on, iommu=pt",
            "could not read the kernel command line",
            UNREACHED,
            source,
        )
    if vendor is None:
        return Line(
            "node kernel arguments",
            name,
            "IOMMU on, iommu=pt",
            "CPU vendor not recognised in /proc/cpuinfo",
            UNREACHED,
            source,
        )
    wanted = expected_iommu_args(vendor)
    words = cmdline.split()
    missing = [arg for arg in wanted if arg not in words]
    return Line(
        "node kernel arguments",
        name,
        " ".join(wanted),
        cmdline.strip(),
        FAIL if missing else PASS,
        source,
        details=[f"missing: {' '.join(missing)} (the deploy writes them; the node must reboot for them to take effect)"]
        if missing
        else [],
    )


def node_lines(node, host) -> list[Line]:
    name = node.name
    if standin(host, STANDIN_KERNEL):
        cmdline_file, source = STANDIN_CMDLINE, "stand-in: pve-standin-kernel (the ESP's command line at its last boot)"
    else:
        cmdline_file, source = "/proc/cmdline", TARGET
    read = host.run(sh("cat {file}", file=cmdline_file))
    lines = [
        judge_kernel_args(
            name, read.stdout if read.rc == 0 else None, cpu_vendor(host.run("cat /proc/cpuinfo").stdout), source
        )
    ]
    lines.append(nouveau_line(name, host, source != TARGET))
    lines.extend(vfio_lines(node, host, source != TARGET))
    return lines


def nouveau_line(name: str, host, in_lab: bool) -> Line:
    loaded = host.run("test -d /sys/module/nouveau").rc == 0
    blacklisted = host.run("grep -rqsE '^\\s*blacklist\\s+nouveau' /etc/modprobe.d /usr/lib/modprobe.d").rc == 0
    observed = f"{'loaded' if loaded else 'not loaded'}; {'blacklisted' if blacklisted else 'not blacklisted'}"
    source = "stand-in: the lab machine's own kernel (a container has none)" if in_lab else TARGET
    return Line(
        "nouveau", name, "not loaded, blacklisted", observed, PASS if not loaded and blacklisted else FAIL, source
    )


def vfio_lines(node, host, in_lab: bool) -> list[Line]:
    addresses = [address for guest in node_kvm_guests(node) for address in guest]
    if not addresses:
        return [
            Line(
                "vfio binding",
                node.name,
                "each KVM guest's GPU bound to vfio-pci",
                "no KVM guest with GPUs on this node",
                NOT_APPLICABLE,
            )
        ]
    found = {}
    for address in addresses:
        link = host.run(sh("readlink /sys/bus/pci/devices/{address}/driver", address=address))
        found[address] = link.stdout.strip().rsplit("/", 1)[-1] if link.rc == 0 else "(no driver)"
    wrong = {a: d for a, d in found.items() if d != "vfio-pci"}
    return [
        Line(
            "vfio binding",
            node.name,
            "vfio-pci for " + ", ".join(addresses),
            ", ".join(f"{a}: {d}" for a, d in found.items()),
            FAIL if wrong else PASS,
            "stand-in: the lab's sysfs" if in_lab else TARGET,
        )
    ]


_KVM_GPUS: dict[str, list[list[str]]] = {}


def node_kvm_guests(node) -> list[list[str]]:
    return _KVM_GPUS.get(node.name, [])
