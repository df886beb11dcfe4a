"""Lab inventory for the EAGLE-3 test: the embedded lab (inventory/lab.py, run as it is) with a
drafter served on the stack that has Kimi-K2.5's capture hook, and the training job laid down.

The tiny Kimi-shaped target and drafter configs (tests/lab/data/eagle3) are the copies the site
model checks against each other; the test puts the same files under /srv/eagle3-models on the lab's gpu
guest, as weights would be. Set by tests/lab/test_eagle3.py:
  EAGLE3_LAB_STACK_FILE      (optional) another stack file; the inventory's `stack` setting
                             picks the 0.5.10 stack of it (default: inventory/stack.yml)
  EAGLE3_LAB_SPECFORGE_REPO  the stand-in SpecForge repository in the guest, and its commit:
  EAGLE3_LAB_SPECFORGE_COMMIT
  EAGLE3_LAB_DATASET_SHA256  sha256 of the prompts file put at /srv/eagle3/prompts.jsonl
  EAGLE3_LAB_DRAFTER         the drafter directory served (default /srv/eagle3-models/tiny-kimi-eagle3)
"""

import os
import runpy
from pathlib import Path

import validation
from validation import require_valid_inventory

_HERE = Path(__file__).resolve().parent
_ROOT = _HERE.parents[2]
# lab.py as it is (its @lab hosts, brought up by the lab connector), minus its own validation call: this
# file is the inventory pyinfra loads, and the one validated (below).
validation.require_valid_inventory = lambda inventory_file, groups=None: None
try:
    _lab = runpy.run_path(str(_ROOT / "inventory" / "lab.py"), run_name="lab_inventory")
finally:
    validation.require_valid_inventory = require_valid_inventory


def _relative(path) -> str:
    return os.path.relpath(Path(path).resolve(), _HERE)


_site = {
    "stack_file": _relative(os.environ.get("EAGLE3_LAB_STACK_FILE", _ROOT / "inventory" / "stack.yml")),
    # The stack with Kimi-K2.5's EAGLE-3 capture hook, while stack.yml's `active` stays on 0.5.9.
    "stack": "sglang-0.5.10-cu128",
    "secrets_file": _relative(_ROOT / "inventory" / _lab["_site"]["secrets_file"]),
}
_DATA = _HERE.parent / "data" / "eagle3"


def _with_site(hosts, **extra):
    return [(name, {**data, **_site, **extra}) for name, data in hosts]


proxmox_hosts = _with_site(_lab["proxmox_hosts"])
lxc_guests = _lab["lxc_guests"]
builders = _lab["builders"]
gpu_nodes = _with_site(
    _lab["gpu_nodes"],
    # The guest's /models is the node's read-only storage, where the lab's weights stay
    # (weights_local_dir keeps them there); the Kimi-shaped configs sit in a folder of the guest's.
    serving_model_path="/srv/eagle3-models/tiny-kimi",
    weights_local_dir="/models/tiny-moe",
    serving_speculative={
        "draft_model_path": os.environ.get("EAGLE3_LAB_DRAFTER", "/srv/eagle3-models/tiny-kimi-eagle3"),
        "algorithm": "EAGLE3",
        "num_steps": 3,
        "eagle_topk": 1,
        "num_draft_tokens": 4,
        "draft_config": _relative(_DATA / "tiny-kimi-eagle3.json"),
        "target_config": _relative(_DATA / "tiny-kimi-config.json"),
    },
    eagle3_training_enabled=True,
    eagle3_training_env_mode="no-gpu-deps",
    eagle3_training_work_dir="/srv/eagle3/work",
    eagle3_training_export_dir="/srv/eagle3-models/tiny-kimi-eagle3-trained",
    eagle3_training_specforge_repo=os.environ.get("EAGLE3_LAB_SPECFORGE_REPO", "/srv/eagle3/specforge.git"),
    eagle3_training_specforge_commit=os.environ.get("EAGLE3_LAB_SPECFORGE_COMMIT", "0" * 40),
    eagle3_training_dataset={
        "path": "/srv/eagle3/prompts.jsonl",
        "sha256": os.environ.get("EAGLE3_LAB_DATASET_SHA256", "0" * 64),
    },
    eagle3_training_samples=4,
    eagle3_training_max_length=64,
    eagle3_training_regenerate_max_tokens=24,
)

require_valid_inventory(__file__, globals())
