"""Plan inventory: the production shape on Ubuntu 24.04 (bare-metal/KVM gpu node, full driver)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _fake import fake_host

from validation import require_valid_inventory

_site = {"stack_file": "../../../inventory/stack.yml"}

gpu_nodes = [("@fake/gpu-ubuntu2404", {**_site, **fake_host("ubuntu2404"), "gpu_count": 8})]
builders = ["@fake/gpu-ubuntu2404"]

require_valid_inventory(__file__, globals())
