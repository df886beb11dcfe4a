"""Plan inventory: a gpu node deployed by main before the engine-neutral names (commit 7c5257e):
its unit is sglang.service under /opt/sglang, with a uv cache there (roles/shared/legacy_layout.py)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _fake import fake_host, fb51e7b_account

from validation import require_valid_inventory

_site = {"stack_file": "../../../inventory/stack.yml"}
_old_host = {
    # roles/shared/legacy_layout.py's facts: where the old unit's link points, and whether its
    # root holds a uv cache the new root lacks.
    "readlink /etc/systemd/system/sglang.service": "/opt/sglang/current/serving/sglang.service",
    "if [ -e /opt/sglang/uv-cache ] && [ ! -e /opt/inference-host/uv-cache ]": "yes",
}

# Its service account is the one main kept up to commit fb51e7b (roles/shared/legacy_account.py).
_host = fake_host("ubuntu2404", **_old_host)
_host["fake_responses"] = {**fb51e7b_account(), **_host["fake_responses"]}

gpu_nodes = [("@fake/gpu-migrating", {**_site, **_host, "gpu_count": 8})]
builders = ["@fake/gpu-migrating"]

require_valid_inventory(__file__, globals())

# rename-script: keep (this file names the layout before the rename on purpose: /work/w24b-rename.sh skips it)
