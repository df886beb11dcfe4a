"""Plan inventory: a bare-metal gpu node still running module 580.82.07, reboots allowed."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _fake import fake_host

from validation import require_valid_inventory

_site = {"stack_file": "../../../inventory/stack.yml"}
_old_module = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.82.07  Release Build"
    "  (dvs-builder@U22-I3-AF03-09-1)  Wed Aug 27 23:40:43 UTC 2025"
)

gpu_nodes = [
    (
        "@fake/gpu-reboot",
        {
            **_site,
            **fake_host(
                "ubuntu2404",
                **{
                    "/proc/driver/nvidia/version": [_old_module, "GCC version: gcc 13.3.0"],
                    "/proc/uptime": "86400",  # pyinfra's reboot waits for a smaller uptime; fake facts stay put
                },
            ),
            "gpu_count": 8,
            "nvidia_driver_allow_reboot": True,
            "nvidia_driver_reboot_timeout": 600,
            "nvidia_driver_dcgm": True,  # DCGM 4 from the CUDA repository (tests/unit/test_gpu_stack_plans.py)
        },
    )
]

require_valid_inventory(__file__, globals())
