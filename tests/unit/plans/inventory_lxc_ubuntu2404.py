"""Plan inventory: an LXC guest (userspace-only driver) whose node runs module 580.105.08.

The node's version deliberately differs from stack.yml's pin: the guest must follow the node.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _fake import fake_host

from validation import require_valid_inventory

_site = {"stack_file": "../../../inventory/stack.yml"}
_gpus = ["0000:01:00.0", "0000:21:00.0"]
_node_module = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.105.08  Release Build"
    "  (dvs-builder@U22-I3-AF03-09-1)  Thu Oct 30 22:25:23 UTC 2025"
)

proxmox_hosts = [
    (
        "@fake/pve",
        {
            **_site,
            **fake_host(
                "debian12",
                **{
                    "/proc/driver/nvidia/version": [_node_module, "GCC version: gcc 12.2.0"],
                    # The guest exists and runs (a guest its node has not made yet waits: tests elsewhere).
                    "pct status 201": ["status: running", "---", "hostname: lxc-ubuntu2404", "unprivileged: 1"],
                },
            ),
            "proxmox_gpu_addresses": _gpus,
        },
    )
]
lxc_guests = [
    (
        "@fake/lxc-ubuntu2404",
        {
            **_site,
            **fake_host("ubuntu2404"),
            "guest_vmid": 201,
            "guest_node": "@fake/pve",
            "guest_gpu_addresses": _gpus,
            "gpu_count": 2,
        },
    )
]
gpu_nodes = ["@fake/lxc-ubuntu2404"]

require_valid_inventory(__file__, globals())
