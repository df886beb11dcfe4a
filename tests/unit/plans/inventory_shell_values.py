"""Plan inventory for the shell read-back test (tests/unit/test_shell_read_back.py): the production
shape on Ubuntu 24.04 with the settings in INFERENCE_HOST_SHELL_VALUES (a JSON object) on top."""

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _fake import fake_host

from validation import require_valid_inventory

_site = {"stack_file": "../../../inventory/stack.yml"}
_values = json.loads(os.environ.get("INFERENCE_HOST_SHELL_VALUES", "{}"))

gpu_nodes = [("@fake/gpu-shell", {**_site, **fake_host("ubuntu2404"), "gpu_count": 8, **_values})]

require_valid_inventory(__file__, globals())
