"""Plan inventory: the production gpu node on Ubuntu 24.04 with the EAGLE-3 training job."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _fake import fake_host

from validation import require_valid_inventory

_site = {"stack_file": "../../../inventory/stack.yml"}

gpu_nodes = [
    ("@fake/gpu-eagle3", {**_site, **fake_host("ubuntu2404"), "gpu_count": 8, "eagle3_training_enabled": True})
]
builders = ["@fake/gpu-eagle3"]

require_valid_inventory(__file__, globals())
