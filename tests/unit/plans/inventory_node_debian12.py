"""Plan inventory: a Proxmox VE 8 node that installs its own NVIDIA driver (full mode), with
one LXC guest that has GPUs, reboots allowed. PLAN_NODE_STATE picks what the node answers:

- "bare" (default): a freshly installed node, nothing of ours on it;
- "converged": what the walk leaves (driver built and loaded, files in place, services on,
  the guest created and running), so that the next plan must change nothing;
- "converged-new-key": the same node, with guest_ssh_public_keys changed since the guest was
  created (another key in the inventory than in the guest and the node's copy).
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _fake import fake_host
from _node_converged import converged_node_responses

from validation import require_valid_inventory

_site = {"stack_file": "../../../inventory/stack.yml"}
_gpus = ["0000:01:00.0", "0000:21:00.0"]
_key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHh0bWJ2ZXhhbXBsZWtleWZvcnRlc3RzMDAwMDAw deploy@control"
_pci = (
    '[{"id": "0000:01:00.0", "vendor": "0x10de", "iommugroup": 20},'
    ' {"id": "0000:21:00.0", "vendor": "0x10de", "iommugroup": 21}]'
)

_new_key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIG5ld2tleWZvcnRlc3RzMDAwMDAwMDAwMDAwMDAw deploy@new"

_state = os.environ.get("PLAN_NODE_STATE", "bare")
_responses = {
    "/hardware/pci": _pci,
    "vendor_id": "vendor_id\t: AuthenticAMD",
    "systemctl is-system-running": "running",
}
if _state.startswith("converged"):
    _responses = {**converged_node_responses(_gpus, [_key]), **_responses}

proxmox_hosts = [
    (
        "@fake/pve-node",
        {
            **_site,
            **fake_host("debian12", **_responses),
            "proxmox_gpu_addresses": _gpus,
            "proxmox_boot_loader": "grub",
            "proxmox_allow_reboot": True,
        },
    )
]
lxc_guests = [
    (
        "@fake/lxc-on-node",
        {
            **_site,
            **fake_host("ubuntu2404"),
            "guest_vmid": 201,
            "guest_node": "@fake/pve-node",
            "guest_gpu_addresses": _gpus,
            "gpu_count": 2,
            "guest_ssh_public_keys": [_new_key if _state == "converged-new-key" else _key],
        },
    )
]
gpu_nodes = ["@fake/lxc-on-node"]

require_valid_inventory(__file__, globals())
