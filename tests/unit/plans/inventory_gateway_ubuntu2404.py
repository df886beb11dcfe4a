"""Plan inventory: two replicas behind SGLang's model gateway, the gateway host on Ubuntu 24.04."""

import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _fake import fake_host, fb51e7b_account

from roles.site import vault
from validation import require_valid_inventory

# A throwaway vault with the key the gateway checks (the replicas bind beyond loopback).
_dir = Path(tempfile.mkdtemp(prefix="plan-gateway-"))
(_dir / "password").write_text("plan-password")
for _name in ("engine_api_key", "engine_admin_api_key", "gateway_control_plane_api_key"):
    vault.set_secret(_dir / "secrets.vault.yml", _name, f"plan-{_name}-0123456789abcdef", b"plan-password")
os.environ["INFERENCE_HOST_VAULT_PASSWORD_FILE"] = str(_dir / "password")

_site = {
    "stack_file": "../../../inventory/stack.yml",
    "secrets_file": os.path.relpath(_dir / "secrets.vault.yml", Path(__file__).parent),
}
_node = {
    **_site,
    **fake_host("ubuntu2404"),
    "gpu_count": 8,
    "serving_host": "0.0.0.0",
    "serving_plaintext_acknowledged": "unit test: a private network",
    "serving_api_key_secret": "engine_api_key",
    "serving_admin_api_key_secret": "engine_admin_api_key",
}

gpu_nodes = [
    ("@fake/rep-a", {**_node, "ssh_hostname": "10.0.0.1"}),
    ("@fake/rep-b", {**_node, "ssh_hostname": "10.0.0.2"}),
]
# The gateway's host was deployed by main up to commit fb51e7b (its roles/base made the service
# account under the former names): it migrates in roles/base alone (roles/shared/legacy_account.py).
_gateway = fake_host("ubuntu2404")
_gateway["fake_responses"] = {**fb51e7b_account(), **_gateway["fake_responses"]}
_gateway["gateway_control_plane_api_key_secret"] = "gateway_control_plane_api_key"
gateways = [
    ("@fake/gw-ubuntu2404", {**_site, **_gateway, "gateway_plaintext_acknowledged": "unit test: a private network"})
]

require_valid_inventory(__file__, globals())
