"""roles/proxmox_host: the bare-metal node (proxmox_*)."""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import AfterValidator, Field
from pydantic_core import PydanticCustomError

from roles.site.fields import (
    PCI_ADDRESS_RE,
    AbsolutePath,
    DriverVersion,
    PciAddresses,
    Section,
    one_of,
    pci_address,
    positive,
)

# An IOMMU group's number is the kernel's id of it, never negative (drivers/iommu/iommu.c
# iommu_group_alloc takes it from ida_alloc, an int), and the name of its folder under
# /sys/kernel/iommu_groups: -1 or 10**30 names no group.
MAX_IOMMU_GROUP = 2**31 - 1


def _pci_groups(value: dict[str, int]) -> dict[str, int]:
    if not all(PCI_ADDRESS_RE.match(k) for k in value):
        raise PydanticCustomError("inference_host", "{valid}", {"valid": "{PCI address: group number}"})
    if not all(0 <= group <= MAX_IOMMU_GROUP for group in value.values()):
        raise PydanticCustomError(
            "inference_host",
            "{valid}",
            {"valid": f"{{PCI address: group number}} with group numbers from 0 to {MAX_IOMMU_GROUP}"},
        )
    groups = {pci_address(k): group for k, group in value.items()}
    if len(groups) != len(value):
        raise PydanticCustomError(
            "inference_host", "{valid}", {"valid": "each GPU once (01:00.0 and 0000:01:00.0 are one GPU)"}
        )
    return groups


class ProxmoxSettings(Section):
    """roles/proxmox_host: the bare-metal node."""

    PREFIX: ClassVar[str] = "proxmox_"

    gpu_addresses: PciAddresses = Field(
        [], description=("The node's NVIDIA GPUs by PCI address (lspci -D -d 10de:), checked through the Proxmox API.")
    )
    boot_loader: Annotated[str, one_of("auto", "grub", "systemd-boot")] = Field(
        "auto",
        description=("Where the IOMMU kernel arguments go: auto (proxmox-boot-tool status), grub or systemd-boot."),
    )
    cpu_vendor: Annotated[str, one_of("auto", "intel", "amd")] = Field(
        "auto", description=("intel_iommu or amd_iommu: auto reads /proc/cpuinfo.")
    )
    iommu_groups: Annotated[dict[str, int], AfterValidator(_pci_groups)] = Field(
        {},
        description=(
            "IOMMU group of each GPU (find /sys/kernel/iommu_groups/ -type l); Proxmox hands a whole "
            "group to vfio-pci, so one group goes to one guest."
        ),
    )
    driver_version: DriverVersion | None = Field(
        None, description=("The node's NVIDIA kernel module version; None: the stack's driver.")
    )
    host_driver: bool = Field(
        True,
        description=(
            "Install the NVIDIA driver on the node when an LXC guest has GPUs; False: the driver, "
            "nvidia-uvm nodes and persistenced are yours to install."
        ),
    )
    nvidia_proc_dir: AbsolutePath = Field(
        "/proc/driver/nvidia",
        description=("Where the driver lists its GPUs (<dir>/gpus/<address>/information); only the lab moves it."),
    )
    allow_reboot: bool = Field(
        False,
        description=(
            "Let the deploy reboot the node when its kernel arguments, modules or NVIDIA module need "
            "it; False: the deploy stops there and says to reboot."
        ),
    )
    reboot_timeout: Annotated[int, positive] = Field(
        900, description=("Seconds to wait for the node to be back and done booting after that reboot.")
    )
