"""Plan inventory: as inventory_monitoring.py, but the gpu node's dpkg
reports the DCGM exporter at 1:4.8.2-1 (the epoch the lab's apt stand-in gives it) and DCGM's core at
1:4.5.3-1, the release it is built against, with its profiling module (-proprietary) at the same."""

import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _fake import fake_host

from roles.site import vault
from validation import require_valid_inventory

_dir = Path(tempfile.mkdtemp(prefix="plan-monitoring-"))
(_dir / "password").write_text("plan-password")
for name, value in (
    ("engine_api_key", "plan-key-of-the-monitoring-plan-0123"),
    ("engine_admin_api_key", "plan-admin-key-of-the-monitoring-plan"),
    ("prometheus_web", "plan-web-password"),
):
    vault.set_secret(_dir / "secrets.vault.yml", name, value, b"plan-password")
os.environ["INFERENCE_HOST_VAULT_PASSWORD_FILE"] = str(_dir / "password")

_site = {
    "stack_file": "../../../inventory/stack.yml",
    "secrets_file": os.path.relpath(_dir / "secrets.vault.yml", Path(__file__).parent),
}
# pyinfra's DebPackages fact runs `dpkg -l` and reads "ii  <name>  <version> ..." lines
_installed = {
    "dpkg -l": [
        "ii  datacenter-gpu-manager-exporter  1:4.8.2-1  amd64  NVIDIA DCGM exporter",
        "ii  datacenter-gpu-manager-4-core  1:4.5.3-1  amd64  NVIDIA DCGM core",
        "ii  datacenter-gpu-manager-4-proprietary  1:4.5.3-1  amd64  NVIDIA DCGM proprietary modules",
    ]
}
gpu_nodes = [
    (
        "@fake/gpu-watched",
        {
            **_site,
            **fake_host("ubuntu2404", **_installed),
            "gpu_count": 8,
            "serving_host": "10.0.0.5",
            "serving_plaintext_acknowledged": "unit test: a private network",
            "ssh_hostname": "10.0.0.5",
            "serving_api_key_secret": "engine_api_key",
            "serving_admin_api_key_secret": "engine_admin_api_key",
            "monitoring_check_interval": "2m",
            "monitoring_check_timeout_s": 90,
        },
    )
]
monitors = [
    (
        "@fake/mon-debian12",
        {
            **_site,
            **fake_host("debian12"),
            "ssh_hostname": "10.0.0.9",
            "monitoring_listen_address": "10.0.0.9",
            "monitoring_web_password_secret": "prometheus_web",
            "monitoring_webhook_url": "http://10.0.0.9:9099/alerts",
        },
    )
]

require_valid_inventory(__file__, globals())
