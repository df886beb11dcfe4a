"""Plan inventory: a gpu node deployed by main up to commit fb51e7b, whose engine runs as the
former default service user (roles/shared/legacy_account.py)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _fake import fake_host, fb51e7b_account

from validation import require_valid_inventory

_site = {"stack_file": "../../../inventory/stack.yml"}
_host = fake_host("ubuntu2404")
_host["fake_responses"] = {**fb51e7b_account(), **_host["fake_responses"]}  # its answers first

gpu_nodes = [("@fake/gpu-account", {**_site, **_host, "gpu_count": 8})]
builders = ["@fake/gpu-account"]

require_valid_inventory(__file__, globals())
