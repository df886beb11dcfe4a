"""roles/nvidia_driver (nvidia_driver_*)."""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import Field

from roles.site.fields import (
    Section,
    positive,
)


class NvidiaDriverSettings(Section):
    """roles/nvidia_driver. Its mode follows the groups: userspace-only in lxc_guests, else full."""

    PREFIX: ClassVar[str] = "nvidia_driver_"

    allow_reboot: bool = Field(
        False,
        description=(
            "Reboot the host and wait when the loaded kernel module differs from the installed driver;"
            " False: report 'reboot required'. A Proxmox node uses proxmox_allow_reboot."
        ),
    )
    reboot_timeout: Annotated[int, positive] = Field(
        900, description=("Seconds to wait for the host to come back after that reboot.")
    )
    dcgm: bool = Field(
        False,
        description=(
            "Install NVIDIA DCGM 4 and run its host engine; the gpu suite then runs dcgmi diag -r 1 -j, the"
            " acceptance report level 2 (without it that line is UNREACHED). inventory/prod.py turns it on for"
            " its gpu node."
        ),
    )
