"""The embedded lab: the same deploy, rehearsed on local systemd containers.

    uv run pyinfra -y inventory/lab.py deploy.py

Loading this file under pyinfra brings the lab up by itself (lab/__init__.py): a Debian 12
base image made with debootstrap when no registry answers, a systemd image on top, and one
container per rehearsal host, reached through pyinfra's @docker connector. No GPU exists
here: the gpu settings describe what the production guest has, and roles that need a GPU
are proven on real hardware (README: "What is verified where").
"""

import os

import pyinfra

import lab
from roles.site import require_valid_inventory

# A throwaway vault (random values, random password under .lab/), made on first use.
_vault, _password_file = lab.throwaway_vault()
os.environ.setdefault("INFERENCE_HOST_VAULT_PASSWORD_FILE", _password_file)

# This machine reaches PyPI only through a TLS-inspecting proxy: the container must trust
# the same CA bundle (the setting a site behind such a proxy uses too).
_ca_bundle = os.environ.get("SSL_CERT_FILE", "/etc/ssl/certs/ca-certificates.crt")

_site = {
    "stack_file": "stack.yml",
    "secrets_file": os.path.relpath(_vault, os.path.dirname(os.path.abspath(__file__))),
}

# The Proxmox node: a Debian 12 container with stand-ins for pct, qm, pvesh and
# proxmox-boot-tool (tests/standins/proxmox, installed by lab.up), set up as a systemd-boot node.
proxmox_hosts = [
    (lab.pyinfra_name("pve"), {
        **_site,
        "proxmox_gpu_addresses": lab.PVE_GPUS,
        "proxmox_iommu_groups": lab.PVE_IOMMU_GROUPS,
        "proxmox_boot_loader": "auto",             # detected: systemd-boot via proxmox-boot-tool
        "proxmox_host_driver": False,              # no NVIDIA driver can be installed here
        "proxmox_nvidia_proc_dir": lab.PVE_PROC_DIR,  # /proc cannot be faked in a container
    }),
]

# The gpu container is the node's LXC guest: the node creates it as CT 101 with all 8 GPUs
# (devN entries for the node's /dev/nvidia* character devices), then the rest of the deploy
# continues inside it.
lxc_guests = [
    (lab.pyinfra_name("gpu"), {
        "guest_vmid": 101,
        "guest_node": lab.pyinfra_name("pve"),
        "guest_gpu_addresses": lab.PVE_GPUS,
        "guest_template": f"local:vztmpl/{lab.PVE_TEMPLATE}",
        "guest_cores": 96,
        "guest_memory_mib": 768 * 1024,
        "guest_disk_gib": 2000,
        "guest_unprivileged": True,
        "guest_features": ["nesting", "keyctl"],
    }),
]

gpu_nodes = [
    (lab.pyinfra_name("gpu"), {
        **_site,
        "base_extra_ca_certificates": [_ca_bundle] if os.path.exists(_ca_bundle) else [],
        "gpu_count": 8,                          # what the production guest has
        "gpu_arch": "sm120",
        "serving_served_model_name": "kimi-k2.5",
        "serving_api_key_secret": "sglang_api_key",
        "serving_hf_token_secret": "hf_token",
        # No GPU here: only the service and server suites can judge the lab, and only once
        # roles/serving runs the stand-in server; until then the hook is off (README: health).
        "health_after_deploy": [],
    }),
]

builders = [lab.pyinfra_name("gpu")]

require_valid_inventory(__file__)

if pyinfra.is_cli:  # `python -m roles.site inventory/lab.py` validates without starting anything
    lab.up()
