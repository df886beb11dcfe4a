"""Plan inventory: the lab's distro, Debian 12, with Docker from Docker's repository."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _fake import fake_host

from validation import require_valid_inventory

_site = {"stack_file": "../../../inventory/stack.yml"}

gpu_nodes = [("@fake/gpu-debian12", {**_site, **fake_host("debian12"), "gpu_count": 8})]
builders = ["@fake/gpu-debian12"]

require_valid_inventory(__file__, globals())
