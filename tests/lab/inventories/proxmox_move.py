"""Lab inventory for the _GPU-move test: the lab's Proxmox node with two LXC and two KVM guests.

The guests are never connected to: the test deploys with `--limit` on the node, which is all
that creating and converging guests needs. The node is the lab's (`@lab/pve`: the lab connector
brings it up as pyinfra connects). PROXMOX_MOVE_STEP picks the GPU assignment:
  "before": A has GPUs 0-3, B has 4, C (VM) has 5-6, D (VM) has 7
  "after":  _GPU 3 moved from A to B, _GPU 6 moved from C to D
  "invalid": _GPU 0 given to the LXC guest A and the VM C at once (must be refused)
"""

import os

import lab
from validation import require_valid_inventory

_STEP = os.environ.get("PROXMOX_MOVE_STEP", "before")
_GPU = lab.PVE_GPUS
_ASSIGNMENT = {
    "before": {"a": _GPU[0:4], "b": _GPU[4:5], "c": _GPU[5:7], "d": _GPU[7:8]},
    "after": {"a": _GPU[0:3], "b": [_GPU[3], _GPU[4]], "c": _GPU[5:6], "d": [_GPU[6], _GPU[7]]},
    "invalid": {"a": _GPU[0:4], "b": _GPU[4:5], "c": [_GPU[0], _GPU[5]], "d": _GPU[7:8]},
}[_STEP]

_site = {"stack_file": "../../../inventory/stack.yml"}
_NODE = lab.pyinfra_name("pve")  # the name @lab/pve expands to: the guests' guest_node


def _guest(name: str, vmid: int, **data):
    return (
        f"lab-move-{name}",
        {
            **_site,
            "guest_vmid": vmid,
            "guest_node": _NODE,
            "guest_gpu_addresses": _ASSIGNMENT[name],
            "guest_cores": 8,
            "guest_memory_mib": 16384,
            "guest_disk_gib": 32,
            **data,
        },
    )


proxmox_hosts = [
    (
        "@lab/pve",
        {
            **_site,
            "proxmox_gpu_addresses": _GPU,
            "proxmox_iommu_groups": lab.PVE_IOMMU_GROUPS,
            "proxmox_host_driver": False,
            "proxmox_nvidia_proc_dir": lab.PVE_PROC_DIR,
        },
    ),
]
lxc_guests = [
    # A mounts the node's model storage (the main lab's weights): the teardown test destroys A and
    # checks that the folder and its files are still there.
    _guest(
        "a",
        201,
        guest_template=f"local:vztmpl/{lab.PVE_TEMPLATE}",
        guest_mount_points={lab.MODELS_HOST_PATH: lab.MODELS_GUEST_PATH},
    ),
    _guest("b", 202, guest_template=f"local:vztmpl/{lab.PVE_TEMPLATE}"),
]
kvm_guests = [_guest("c", 203, guest_mmio_window_mb=262144), _guest("d", 204)]

require_valid_inventory(__file__, globals())
