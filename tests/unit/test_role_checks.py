"""The role checks are a list passed to the validation, not a registry filled at import: a load
runs the checks it is given, or those its inventory file's own hook names, and nothing else."""

from __future__ import annotations

import subprocess
import sys

import pytest

from roles.site import SiteError, load_site
from tests.unit.conftest import PROJECT_ROOT, gpu_node
from validation import ROLE_CHECKS

# A problem only roles/serving's command check finds: sglang 0.5.10 has no PCIe all-reduce
# (0.5.9 has it through patch 0001, 0.5.21+ upstream).
PCIE = {"serving_custom_all_reduce_pcie": True, "stack": "sglang-0.5.10-cu128"}
NO_PCIE = "has no PCIe all-reduce"
HOOK = "\nfrom validation import require_valid_inventory\n\nrequire_valid_inventory(__file__, globals())\n"


def test_a_load_runs_only_the_checks_it_is_given(inventory):
    # validation is imported above: importing it registered nothing with the model.
    path = inventory.groups(gpu_nodes=[gpu_node(**PCIE)])
    assert load_site(path).hosts["gpu1"].serving.custom_all_reduce_pcie  # the model's rules only
    with pytest.raises(SiteError) as caught:
        load_site(path, ROLE_CHECKS)
    assert [p for p in caught.value.problems if NO_PCIE in p] == [
        f"{path}: host gpu1: stack sglang-0.5.10-cu128: serving_custom_all_reduce_pcie = True, but sglang"
        " 0.5.10 has no PCIe all-reduce; expected False, or sglang 0.5.9 (patch 0001) or 0.5.21+"
    ]


def test_an_inventory_with_the_hook_is_loaded_with_the_checks_it_names(inventory):
    path = inventory.write(f"gpu_nodes = {[gpu_node(**PCIE)]!r}\n" + HOOK)
    with pytest.raises(SiteError) as caught:
        load_site(path)
    assert any(NO_PCIE in p for p in caught.value.problems)
    # The model's own command line has no role import of its own: it runs what the file names.
    result = subprocess.run(
        [sys.executable, "-m", "validation", str(path)], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2 and NO_PCIE in result.stderr, result.stderr


def test_the_hook_without_the_files_globals_is_refused_in_one_line(inventory):
    # The one-argument hook of earlier versions read its caller's frame; now the file hands its
    # groups over, and the old form says what to write instead of validating nothing.
    path = inventory.write(
        f"gpu_nodes = {[gpu_node()]!r}\n"
        "\nfrom validation import require_valid_inventory\n\nrequire_valid_inventory(__file__)\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "validation", str(path)], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert (
        "require_valid_inventory(__file__) is given no groups; write require_valid_inventory(__file__, globals())"
        in result.stderr
    )
    assert "Traceback" not in result.stderr
