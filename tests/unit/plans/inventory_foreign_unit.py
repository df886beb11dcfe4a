"""Plan inventory: a gpu node whose host already has a packaged unit named like the configured
engine unit (serving_unit_name = "model-server"), which the deploy must refuse before any change."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _fake import fake_host

from validation import require_valid_inventory

_site = {"stack_file": "../../../inventory/stack.yml"}

# The host's answer: systemctl's list (a vendor's model-server.service, enabled) and no
# inference-host line in /etc/systemd/system/model-server.service.
_units = {
    "systemctl list-unit-files": ["model-server.service enabled enabled", "ssh.service enabled enabled", "list-rc 0"]
}

gpu_nodes = [
    (
        "@fake/gpu-foreign-unit",
        {**_site, **fake_host("ubuntu2404", **_units), "gpu_count": 8, "serving_unit_name": "model-server"},
    )
]

require_valid_inventory(__file__, globals())
