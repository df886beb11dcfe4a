"""The real machine: one Proxmox VE 8 node with 8 RTX PRO 6000 Blackwell GPUs and two guests.

Replace the placeholders (addresses, host names, VMIDs) with your own, then check the file
without touching any host:

    uv run python -m roles.site inventory/prod.py

Each group below is a list of (host, data) pairs. A host may be in several groups; keys are
the settings listed in README.md under "Settings" (a typo is an error, not ignored).
"""

from validation import require_valid_inventory

# The stack file beside this one holds every version pin; the vault holds the secrets.
# Secret values are decrypted at deploy time with the password in the file named by
# INFERENCE_HOST_VAULT_PASSWORD_FILE (default ~/.config/inference-host/vault-password).
_site = {
    "stack_file": "stack.yml",
    "secrets_file": "secrets.vault.yml",
}

# The 8 GPUs as the Proxmox node sees them (`lspci -D -d 10de: | grep -i 'VGA\|3D'`).
# Two NUMA nodes: the first four hang off socket 0, the last four off socket 1.
_gpus = [
    "0000:01:00.0", "0000:21:00.0", "0000:41:00.0", "0000:61:00.0",   # socket 0
    "0000:81:00.0", "0000:a1:00.0", "0000:c1:00.0", "0000:e1:00.0",   # socket 1
]

proxmox_hosts = [
    ("pve.example.internal", {
        **_site,
        "ssh_user": "root",                     # devN / hostpci / args need root@pam
        "proxmox_gpu_addresses": _gpus,
        "proxmox_boot_loader": "auto",          # detects GRUB vs proxmox-boot-tool
        # Optional: each GPU's IOMMU group (find /sys/kernel/iommu_groups/ -type l); checked
        # against the node, and no two guests may share a group.
        "proxmox_iommu_groups": {},
    }),
]

# The LXC container gets all 8 GPUs through the host's driver (/dev/nvidia* nodes), so its
# userspace driver must equal the host's kernel module exactly (stack.yml nvidia_driver).
lxc_guests = [
    ("sglang-lxc.example.internal", {
        **_site,
        "ssh_user": "root",
        "guest_vmid": 201,
        "guest_node": "pve.example.internal",
        "guest_gpu_addresses": _gpus,
        "guest_cores": 96,
        "guest_memory_mib": 768 * 1024,
        "guest_disk_gib": 2000,                 # ~600 GB of INT4 weights plus environments
        "guest_template": "local:vztmpl/ubuntu-24.04-standard_24.04-2_amd64.tar.zst",  # pveam download local ...
        "guest_bridge": "vmbr0",
        "guest_ip": "dhcp",
        "guest_unprivileged": True,             # always explicit: the default changed in PVE 9
        "guest_features": ["nesting", "keyctl"],  # systemd and Docker inside the container
        "gpu_count": 8,
    }),
]

# A KVM guest on the same node, defined but given no GPUs: a GPU belongs to one guest only,
# and never to an LXC guest (host driver) and a VM (vfio) at once. Move addresses from the
# LXC guest's list to this one to serve from the VM instead.
kvm_guests = [
    ("sglang-vm.example.internal", {
        **_site,
        "ssh_user": "root",
        "guest_vmid": 202,
        "guest_node": "pve.example.internal",
        "guest_gpu_addresses": [],
        "guest_cores": 32,
        "guest_memory_mib": 128 * 1024,
        "guest_disk_gib": 200,
        # With GPUs: q35 + OVMF + cpu host are the defaults (large BARs); raise OVMF's 64-bit
        # MMIO window only if the guest's kernel reports BARs it could not map.
        "guest_mmio_window_mb": None,
    }),
]

# Where the engine runs. Several hosts here make a multi-node deployment; --nnodes,
# --node-rank and --dist-init-addr are derived from this list (the first is rank 0).
gpu_nodes = [
    ("sglang-lxc.example.internal", {
        "gpu_arch": "sm120",                    # compute capability 12.0
        "gpu_model": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
        "gpu_memory_gib": 96,
        "serving_model_path": "/models/Kimi-K2.5",
        "serving_served_model_name": "kimi-k2.5",
        "serving_host": "0.0.0.0",              # reachable from the LAN: requires the API key
        "serving_port": 30000,
        "serving_api_key_secret": "sglang_api_key",
        "serving_hf_token_secret": "hf_token",
        "serving_mem_fraction_static": 0.92,    # measured on 96 GB cards with Kimi-K2.5
    }),
]

# Kernel wheels (flash-attn, sgl-kernel) are compiled on the gpu node itself, in Docker.
builders = ["sglang-lxc.example.internal"]

require_valid_inventory(__file__)
