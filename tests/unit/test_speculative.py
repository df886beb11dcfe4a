"""serving_speculative through the site model: checked per SGLang release (captured from the real
wheels) and the drafter's config against the target's, before any host is contacted."""

from __future__ import annotations

import shutil

import pytest

from roles import serving
from roles.serving.command import server_arguments
from roles.site import SiteError, load_site
from tests.unit.conftest import PROJECT_ROOT, gpu_node
from validation import ROLE_CHECKS  # the checks the inventories' hook runs

DATA = PROJECT_ROOT / "tests" / "unit" / "data" / "eagle3"
DRAFTER = {
    "draft_model_path": "/models/Kimi-K2.5-eagle3",
    "draft_config": "drafter.json",
    "target_config": "target.json",
}


@pytest.fixture
def configs(inventory):
    shutil.copy(DATA / "kimi-k2.5-config.json", inventory.dir / "target.json")
    shutil.copy(DATA / "torchspec-kimi-k25-eagle3.json", inventory.dir / "drafter.json")
    return inventory


# Kimi-K2.5 at its 262,144-token context and SGLang's 48 requests cannot fit its KV cache; at the
# default fraction 0.8 on 0.5.10 48 x (512 + 8) do (test_serving_memory.py): the drafter tests serve that.
FITTING = {"serving_context_length": 512}


def site_on(inventory, active: str, host: dict | None = None, **speculative):
    inventory.edit_stack("active: sglang-0.5.9-cu128", f"active: {active}")
    settings = FITTING if host is None else host
    return load_site(
        inventory.groups(gpu_nodes=[gpu_node(serving_speculative={**DRAFTER, **speculative}, **settings)]), ROLE_CHECKS
    )


def problems_on(inventory, active: str, host: dict | None = None, **speculative) -> list[str]:
    with pytest.raises(SiteError) as caught:
        site_on(inventory, active, host, **speculative)
    return caught.value.problems


def test_kimi_drafter_on_0_5_10_renders_the_flags(configs):
    site = site_on(configs, "sglang-0.5.10-cu128")
    host = site.hosts["gpu1"]
    args = server_arguments(host, site.hosts, site.stack.active)
    assert args[args.index("--speculative-algorithm") + 1] == "EAGLE3"
    assert args[args.index("--speculative-draft-model-path") + 1] == "/models/Kimi-K2.5-eagle3"
    assert args[args.index("--speculative-num-draft-tokens") + 1] == "4"
    env = serving.env_file_kwargs(host, site.stack.active)["extra_env"]
    assert env["SGLANG_ENABLE_SPEC_V2"] == "SGLANG_ENABLE_SPEC_V2=0"  # stated: 0.5.10 has the switch, default off


def test_kimi_on_0_5_9_is_refused_for_the_missing_capture_hook(configs):
    problems = problems_on(configs, "sglang-0.5.9-cu128")
    assert len(problems) == 1
    assert "KimiK25ForConditionalGeneration has no set_eagle3_layers_to_capture in sglang 0.5.9" in problems[0]
    assert "sglang-0.5.10-cu128" in problems[0]  # the stack that has it


def test_drafter_with_another_vocabulary_is_refused(configs):
    shutil.copy(DATA / "specforge-deepseek-v3-671b-eagle3.json", configs.dir / "drafter.json")
    (problem,) = problems_on(configs, "sglang-0.5.10-cu128")
    assert "drafter drafter.json against target target.json: vocab_size 129280" in problem


def test_configs_are_required_for_eagle3(inventory):
    (problem,) = problems_on(inventory, "sglang-0.5.10-cu128", draft_config=None, target_config=None)
    assert "draft_config and target_config missing" in problem


@pytest.mark.parametrize(
    "change, words",
    [
        ({"num_draft_tokens": 6}, "replaces it with num_steps + 1 = 4"),
        ({"spec_v2": True, "eagle_topk": 4, "num_draft_tokens": 8}, "spec v2 supports topk 1 only"),
        ({"num_steps": 0}, "num_steps = 0; expected an integer >= 1"),
        ({"draft_model_path": "models/d"}, "not an absolute path"),
    ],
)
def test_bad_speculative_settings_name_the_release(configs, change, words):
    problems = problems_on(configs, "sglang-0.5.10-cu128", **change)
    assert any(words in p for p in problems), problems
    assert all("serving_speculative" in p and "sglang 0.5.10" in p for p in problems)


def test_an_algorithm_without_a_drafter_is_refused(configs):
    problems = problems_on(configs, "sglang-0.5.10-cu128", algorithm="NGRAM")
    assert len(problems) == 1 and "algorithm 'NGRAM'" in problems[0], problems


def test_spec_v2_on_a_release_without_the_switch(configs):
    problems = problems_on(configs, "sglang-0.5.23-cu130", spec_v2=True)
    assert any("has no SGLANG_ENABLE_SPEC_V2 switch" in p for p in problems), problems


def test_spec_v2_switch_is_rendered(configs):
    site = site_on(configs, "sglang-0.5.10-cu128", spec_v2=True)
    env = serving.env_file_kwargs(site.hosts["gpu1"], site.stack.active)["extra_env"]
    assert env["SGLANG_ENABLE_SPEC_V2"] == "SGLANG_ENABLE_SPEC_V2=1"


def test_the_wheels_say_where_the_kimi_hook_is():
    from roles.serving.command import cli_options

    assert "KimiK25ForConditionalGeneration" not in cli_options("0.5.9")["eagle3_capture_architectures"]
    assert "KimiK25ForConditionalGeneration" in cli_options("0.5.10")["eagle3_capture_architectures"]
    assert "DeepseekV3ForCausalLM" in cli_options("0.5.9")["eagle3_capture_architectures"]
    assert (cli_options("0.5.9")["spec_v2_default"], cli_options("0.5.10")["spec_v2_default"]) == (False, False)
