"""Plan inventory: a gpu node on Ubuntu 24.04 that is its own builder (Docker-CE with buildx, no
cuobjdump: it is installed from PyPI) and keeps its own model weights (the weights tool is
installed), so that every pip install the roles render is in one plan (tests/unit/test_tool_locks.py)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _fake import fake_host

from validation import require_valid_inventory

_site = {"stack_file": "../../../inventory/stack.yml"}

gpu_nodes = [
    (
        "@fake/gpu-pins",
        {
            **_site,
            **fake_host(
                "ubuntu2404",
                **{
                    "buildx version": ["client /usr/bin/docker 27.3.1", "server 27.3.1", "buildx yes"],
                    "cat /proc/meminfo": ["cores 16", "MemTotal: 134217728 kB", "MemAvailable: 125829120 kB"],
                    # a fresh host: the weights tool is not installed yet
                    "/usr/local/bin/inference-host-weights check": ['{"state": "no-tool"}'],
                    # what the tool's status says once the unit is done (roles/weights follows it)
                    "/usr/local/bin/inference-host-weights status --json": [
                        '[{"status": {"updated": 2e9, "phase": "done"}, "unit_state": "inactive",'
                        ' "manifest": {"state": "verified"}, "line": "done"}]'
                    ],
                },
            ),
            "build_kernel_wheels": True,
            "gpu_count": 8,
            "serving_model_path": "/data/k2",
            "weights_repo": "moonshotai/Kimi-K2.5",
            "weights_revision": "0123456789abcdef0123456789abcdef01234567",
        },
    )
]
builders = ["@fake/gpu-pins"]

require_valid_inventory(__file__, globals())
