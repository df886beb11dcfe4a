"""Plan inventory: the host of inventory_account_ubuntu2404.py, whose site set the former service
account names itself: it keeps them, nothing migrates (roles/shared/legacy_account.py)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _fake import fake_host, fb51e7b_account

from validation import require_valid_inventory

_site = {"stack_file": "../../../inventory/stack.yml"}
_host = fake_host("ubuntu2404")
_host["fake_responses"] = {**fb51e7b_account(moved=False), **_host["fake_responses"]}  # its answers first
# rename-script: keep (the former names, set on purpose)
_own_names = {
    "base_service_user": "sglang",
    "base_service_group": "sglang",
    "base_data_dir": "/var/lib/sglang",
    "base_log_dir": "/var/log/sglang",
}

gpu_nodes = [
    (
        "@fake/gpu-account-kept",
        {**_site, **_host, "gpu_count": 8, **_own_names},
    )
]
builders = ["@fake/gpu-account-kept"]

require_valid_inventory(__file__, globals())
