"""STAND-IN for SGLang's srt/utils/auth.py (lab only; lab/standins/sglang_server/server.py uses it):
0.5.9's decide_request_auth on 0.5.9's route table, with the project's tenant-keys patch
(roles/engine_envs/patches/sglang/<version>/*-tenant-api-keys.patch) applied."""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

# The variable the patch reads the tenants' file from (roles/serving/keys.py sets it).
TENANT_KEYS_ENV = "INFERENCE_HOST_TENANT_API_KEYS_FILE"
_tenant_keys_read: dict[str, tuple[str, ...]] = {}


# The routes 0.5.9's http_server.py marks @auth_level(AuthLevel.ADMIN_OPTIONAL) (every method
# they are declared with), read from the wheel sglang-0.5.9-py3-none-any.whl.
ADMIN_ROUTES = frozenset(
    (
        "/set_internal_state /flush_cache /clear_hicache_storage_backend /hicache/storage-backend/clear"
        " /hicache/storage-backend /start_profile /stop_profile /freeze_gc /start_expert_distribution_record"
        " /stop_expert_distribution_record /dump_expert_distribution_record /update_weights_from_disk"
        " /init_weights_send_group_for_remote_instance /send_weights_to_remote_instance"
        " /get_remote_instance_transfer_engine_info /init_weights_update_group /destroy_weights_update_group"
        " /update_weights_from_tensor /update_weights_from_distributed /update_weights_from_ipc"
        " /update_weight_version /get_weights_by_name /release_memory_occupation /resume_memory_occupation"
        " /weights_checker /slow_down /load_lora_adapter /unload_lora_adapter /configure_logging /abort_request"
        " /pause_generation /continue_generation"
    ).split()
)


def _bearer_matches(authorization: str | None, expected: str) -> bool:
    """auth.py _check_bearer_token (0.5.9): `Bearer <key>`, the scheme in any case, compared in
    constant time."""
    parts = (authorization or "").split(" ", 1)
    return len(parts) == 2 and parts[0].lower() == "bearer" and secrets.compare_digest(parts[1], expected)


def tenant_api_keys() -> tuple[str, ...]:
    """The tenants' keys as the patched auth.py reads them (_tenant_api_keys): the JSON {tenant: key}
    of the file $INFERENCE_HOST_TENANT_API_KEYS_FILE names, read once; none without the variable;
    an unreadable file raises (the server's start fails, as the patched middleware's does)."""
    path = os.environ.get(TENANT_KEYS_ENV, "")
    if not path:
        return ()
    if path not in _tenant_keys_read:
        keys = json.loads(Path(path).read_text(encoding="utf-8"))
        _tenant_keys_read[path] = tuple(str(key) for key in keys.values() if str(key).strip())
    return _tenant_keys_read[path]


def auth_allowed(
    method: str, path: str, authorization: str | None, api_key: str | None, admin_api_key: str | None
) -> bool:
    """auth.py decide_request_auth (0.5.9, with the project's tenant-keys patch) for the NORMAL and
    ADMIN_OPTIONAL levels (0.5.9 marks no route ADMIN_FORCE): a NORMAL route takes the client key
    or a tenant's, every key compared; an admin route never a tenant's."""
    if method == "OPTIONS" or path.startswith("/health") or path.startswith("/metrics"):
        return True
    if path in ADMIN_ROUTES:
        if admin_api_key:
            return _bearer_matches(authorization, admin_api_key)
        return _bearer_matches(authorization, api_key) if api_key else True
    if not api_key:
        return True
    return any([_bearer_matches(authorization, key) for key in (api_key, *tenant_api_keys())])
