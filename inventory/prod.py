"""The real machine: one Proxmox VE 8 node with 8 RTX PRO 6000 Blackwell GPUs and two guests.

Replace the placeholders (addresses, host names, VMIDs, the SSH key) with your own, then check
the file without touching any host:

    uv run inference-host validate inventory/prod.py

From a freshly installed node, one run of `uv run pyinfra inventory/prod.py deploy.py` ends
with the health checks: it runs itself again as a child pass while a guest waits or the node
reboots, at most three passes (node prepared and rebooted; guests created; deploy inside them):
docs/guests-and-gpus.md, "First deploy of a new guest".

Each group below is a list of (host, data) pairs. A host may be in several groups; keys are
the settings listed in docs/settings.md (a typo is an error, not ignored). Helper names start
with `_`, or pyinfra takes them for groups (docs/inventory.md).
"""

from validation import require_valid_inventory

# The stack file beside this one holds every version pin; the vault holds the secrets.
# Secret values are decrypted at deploy time with the password in the file named by
# INFERENCE_HOST_VAULT_PASSWORD_FILE (default ~/.config/inference-host/vault-password).
_site = {
    "stack_file": "stack.yml",
    "secrets_file": "secrets.vault.yml",
    # Serve with another stack of stack.yml than its `active` (EAGLE-3 needs 0.5.10):
    # "stack": "sglang-0.5.10-cu128",
}

# The 8 GPUs as the Proxmox node sees them (`lspci -D -d 10de: | grep -i 'VGA\|3D'`).
# Two NUMA nodes: the first four hang off socket 0, the last four off socket 1.
_gpus = [
    "0000:01:00.0",
    "0000:21:00.0",
    "0000:41:00.0",
    "0000:61:00.0",  # socket 0
    "0000:81:00.0",
    "0000:a1:00.0",
    "0000:c1:00.0",
    "0000:e1:00.0",  # socket 1
]

# The public key of the machine you deploy from (~/.ssh/id_ed25519.pub): new guests get it, so
# that the deploy can continue inside them over SSH.
_deploy_keys = ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHh0bWJ2ZXhhbXBsZWtleWZvcnRlc3RzMDAwMDAw you@control"]

proxmox_hosts = [
    (
        "pve.example.internal",
        {
            **_site,
            "ssh_user": "root",  # devN / hostpci / args need root@pam
            "proxmox_gpu_addresses": _gpus,
            "proxmox_boot_loader": "auto",  # detects GRUB vs proxmox-boot-tool
            # Let the deploy reboot the node when IOMMU arguments, modules or the NVIDIA module
            # need it (False: the deploy stops and asks you to reboot it).
            "proxmox_allow_reboot": True,
            # Optional: each GPU's IOMMU group (find /sys/kernel/iommu_groups/ -type l); checked
            # against the node, and no two guests may share a group.
            "proxmox_iommu_groups": {},
        },
    ),
]

# The LXC container gets all 8 GPUs through the host's driver (/dev/nvidia* nodes), so its
# userspace driver must equal the host's kernel module exactly (stack.yml nvidia_driver).
lxc_guests = [
    (
        "gpu-lxc.example.internal",
        {
            **_site,
            "ssh_user": "root",
            "guest_vmid": 201,
            "guest_node": "pve.example.internal",
            "guest_gpu_addresses": _gpus,
            "guest_cores": 96,
            "guest_memory_mib": 768 * 1024,
            "guest_disk_gib": 2000,  # ~600 GB of INT4 weights plus environments
            "guest_template": "local:vztmpl/ubuntu-24.04-standard_24.04-2_amd64.tar.zst",  # pveam download local ...
            "guest_bridge": "vmbr0",
            "guest_ip": "dhcp",
            "guest_unprivileged": True,  # always explicit: the default changed in PVE 9
            "guest_features": ["nesting", "keyctl"],  # systemd and Docker inside the container
            "guest_ssh_public_keys": _deploy_keys,  # root's authorized_keys (pct create only)
            # The node's model storage at /models: one copy of the weights for every guest that
            # mounts it. It is mounted read-only (ro=1) once weights_repo below names the model
            # kept there: roles/weights then downloads it on the node, and the guest only reads.
            "guest_mount_points": {"/tank/models": "/models"},
            "gpu_count": 8,
        },
    ),
]

# A KVM guest on the same node, defined but given no GPUs: a GPU belongs to one guest only,
# and never to an LXC guest (host driver) and a VM (vfio) at once. Move addresses from the
# LXC guest's list to this one to serve from the VM instead.
kvm_guests = [
    (
        "gpu-vm.example.internal",
        {
            **_site,
            "ssh_user": "root",
            "guest_vmid": 202,
            "guest_node": "pve.example.internal",
            "guest_gpu_addresses": [],
            "guest_cores": 32,
            "guest_memory_mib": 128 * 1024,
            "guest_disk_gib": 200,
            # An OS from Ubuntu's cloud image (download noble-server-cloudimg-amd64.img to the node
            # first; an absolute path needs root@pam), with cloud-init user, keys and network.
            # None: the VM is created empty and you install its OS.
            "guest_cloud_image": "/var/lib/vz/template/cloud/noble-server-cloudimg-amd64.img",
            "guest_ciuser": "root",
            "guest_ssh_public_keys": _deploy_keys,
            # With GPUs: q35 + OVMF + cpu host are the defaults (large BARs); raise OVMF's 64-bit
            # MMIO window only if the guest's kernel reports BARs it could not map.
            "guest_mmio_window_mb": None,
        },
    ),
]

# Where the engine runs. Several hosts here make a multi-node deployment; --nnodes,
# --node-rank and --dist-init-addr are derived from this list (the first is rank 0).
gpu_nodes = [
    (
        "gpu-lxc.example.internal",
        {
            "gpu_arch": "sm120",  # compute capability 12.0
            "gpu_model": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
            "gpu_memory_gib": 96,
            "serving_model_path": "/models/Kimi-K2.5",
            "serving_served_model_name": "kimi-k2.5",
            "serving_host": "0.0.0.0",  # reachable from the LAN: requires the API key
            # The host firewall (roles/firewall; who reaches what: docs/security.md, "The network"):
            # inbound dropped but for SSH from the networks below, the engine from
            # firewall_serving_allowed_sources (default: everyone, behind the API key) and the
            # exporters, here on the loopback (this guest is its own monitor). Give your desk's and
            # the control machine's networks: a deploy whose own SSH would be cut is refused.
            # "firewall_enabled": True,
            # "firewall_ssh_allowed_sources": ["192.0.2.0/24"],
            # ...and, since SGLang 0.5.9 (the active stack) has no TLS option, a reason the LAN may see
            # the key and the prompts in clear (docs/security.md#tls). Replace it with your own reason,
            # bind 127.0.0.1 and reach the engine through an SSH tunnel or a TLS proxy of your own, or,
            # on sglang 0.5.10+ or vLLM, name the certificate and key in the vault instead:
            # "serving_tls_cert_secret": "engine_tls_cert", "serving_tls_key_secret": "engine_tls_key",
            # "serving_tls_ca_file": "/path/to/site-ca.pem" (a local file: the CA the checks verify with).
            "serving_plaintext_acknowledged": "a private inference LAN of trusted machines only",
            "serving_port": 30000,
            "serving_api_key_secret": "engine_api_key",  # the clients' key (the data plane only)
            # SGLang's admin routes (/flush_cache, /update_weights_from_disk, ...) take this key and
            # no longer the clients' (docs/security.md#keys-and-their-roles).
            "serving_admin_api_key_secret": "engine_admin_api_key",
            "serving_hf_token_secret": "hf_token",
            # The share of each GPU for weights and KV cache. SGLang keeps the rest for activations and
            # CUDA graphs, and a capture that does not fit is an out-of-memory after the model's long
            # load: on this 97,887 MiB card it keeps 14,848 MiB (0.5.9, 0.5.10) or 16,384 MiB (0.5.23)
            # at its default cuda_graph_max_bs 512 and chunked_prefill_size 8192, so at most 0.848 /
            # 0.832; 0.83 fits all three pinned releases (0.92 did not; docs/serving-memory.md).
            # With EAGLE-3 on 0.5.10 it keeps 4 GiB more: 0.806 at those defaults.
            "serving_mem_fraction_static": 0.83,
            # A copy of the model's config.json (moonshotai/Kimi-K2.5's): `inference-host validate` prints
            # the KV cache SGLang will have and its own fraction for this card from it.
            "serving_model_config_json": "models/Kimi-K2.5.config.json",
            # The weights, downloaded by the node into /tank/models/Kimi-K2.5 and verified before
            # the service may start; the acceptance report's "weights at the pinned revision" line
            # judges the manifest against this pin (without a pin that line is UNREACHED and the
            # report INCOMPLETE). Pin the exact commit you tested, never a branch or tag (refused).
            # How to choose it: the 40-character hash at the top of the model's "Files and
            # versions" tab on huggingface.co, or the "sha" of
            # https://huggingface.co/api/models/moonshotai/Kimi-K2.5/revision/main (the newest);
            # `git ls-remote https://huggingface.co/moonshotai/Kimi-K2.5 main` prints it too.
            # The commit below is one a public project pins for this repository (not downloaded by
            # this project): thinking-machines-lab/tinker-cookbook, tinker_cookbook/
            # image_processing_utils.py, `revision=` of moonshotai/Kimi-K2.5 since its commit
            # 57cfa191 (2026-02-10), unchanged at 9dfcc3a2 (2026-08-19); the same project pins the
            # tokenizer at 2426b45b6af0da48d0dcce71bbce6225e5c73adc (tokenizer_utils.py). Check it
            # on the Hub's commit list, then replace it with the commit you served and measured.
            "weights_repo": "moonshotai/Kimi-K2.5",
            "weights_revision": "3367c8d1c68584429fab7faf845a32d5195b6ac1",
            # DCGM 4 with its diagnostics and host engine (roles/nvidia_driver): the gpu suite runs
            # `dcgmi diag -r 1`, the acceptance report level 2; the monitor's DCGM exporter adds
            # DCGM's profiling module for its DCGM_FI_PROF_* rows (roles/monitoring). Off by
            # default in the site model, which also reaches the Proxmox node's driver role.
            "nvidia_driver_dcgm": True,
        },
    ),
]

# Kernel wheels (flash-attn, sgl-kernel) are compiled on the gpu node itself, in Docker.
builders = ["gpu-lxc.example.internal"]

# The monitor (docs/monitoring.md): Prometheus and Alertmanager, here on the GPU guest itself,
# listening on its loopback only (monitoring_listen_address, default 127.0.0.1; from your desk:
# `ssh -L 9090:127.0.0.1:9090 root@gpu-lxc.example.internal`), behind basic auth with the
# vault's monitoring_web_password. Every gpu node then gets node_exporter, NVIDIA's DCGM exporter
# and the checks' timer. What fires now: `ssh root@gpu-lxc.example.internal amtool alert query`.
# A monitor here dies with the guest: put another machine's name on the line below (the Proxmox
# node, or a small machine that reaches this one) and the guest's death is an alert of its own.
monitors = [
    (
        "gpu-lxc.example.internal",
        {  # a separate monitor: its host name here instead
            **_site,
            "ssh_user": "root",
            "monitoring_web_password_secret": "monitoring_web_password",
            # A receiver whose URL carries no credential; one with a token (Slack, PagerDuty, a
            # signed URL) goes in the vault: monitoring_webhook_url_secret, monitoring_slack_api_url_secret,
            # monitoring_pagerduty_routing_key_secret. Or e-mail: "monitoring_email_to", "_from", "_smarthost".
            "monitoring_webhook_url": "https://alerts.example.internal/inference-host",
            # The dead man's switch (strongly advised): your Healthchecks.io / Dead Man's Snitch / Cronitor
            # URL in the vault (`uv run inference-host vault set inventory/secrets.vault.yml monitoring_heartbeat_url`),
            # then uncomment: the always-firing Watchdog reaches it every minute, and it pages when that stops.
            # "monitoring_heartbeat_url_secret": "monitoring_heartbeat_url",
        },
    ),
]

require_valid_inventory(__file__, globals())
