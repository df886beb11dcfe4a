"""Engine-neutral names (docs/upgrades.md#engine-neutral-setting-names): an old setting key in an
inventory (plain text) is refused in one line naming the key to write, before any host is
contacted; the new keys are read."""

from __future__ import annotations

import pytest

from roles.shared.uv import uv_environment
from roles.site import load_site
from roles.site.errors import display
from roles.site.schema import RENAMED_KEYS
from tests.unit.conftest import gpu_node
from tests.unit.test_site import only_problem

OLD_SETTINGS = [
    ("sglang_python", "/usr/bin/python3", "engine_python"),
    ("sglang_keep_environments", 4, "engine_keep_environments"),
    ("sglang_python_install_mirror", "https://mirror.example/pbs", "base_python_install_mirror"),
]


@pytest.mark.parametrize(("old", "value", "new"), OLD_SETTINGS, ids=[old for old, _, _ in OLD_SETTINGS])
def test_an_old_setting_key_is_refused_in_one_line_naming_the_new_one(inventory, old, value, new):
    path = inventory.groups(gpu_nodes=[gpu_node(**{old: value})])
    assert only_problem(path) == (
        f"{display(path)}: host gpu1: {old} was renamed {new}; write {new} = {value!r} instead"
        " (docs/upgrades.md#engine-neutral-setting-names)"
    )


def test_every_renamed_key_is_tested():
    assert {old: new for old, _, new in OLD_SETTINGS} == RENAMED_KEYS


def test_the_new_keys_are_read(inventory):
    path = inventory.groups(
        gpu_nodes=[
            gpu_node(
                engine_python="/usr/bin/python3",
                engine_keep_environments=4,
                base_python_install_mirror="https://mirror.example/pbs",
            )
        ]
    )
    host = load_site(path).hosts["gpu1"]
    assert (host.engine.python, host.engine.keep_environments) == ("/usr/bin/python3", 4)
    assert uv_environment(host)["UV_PYTHON_INSTALL_MIRROR"] == "https://mirror.example/pbs"
