"""The KV cache SGLang will have per GPU, estimated from the models' config.json copies
(roles/serving/kv_cache.py), and the speculative settings checked against it."""

from __future__ import annotations

import json
import shutil

import pytest

from roles.serving import kv_cache
from roles.serving.command import server_arguments
from roles.site import SiteError, load_site
from tests.unit.conftest import PROJECT_ROOT, gpu_node
from validation import ROLE_CHECKS  # the checks the inventories' hook runs

DATA = PROJECT_ROOT / "tests" / "unit" / "data" / "eagle3"
KIMI = json.loads((DATA / "kimi-k2.5-config.json").read_text())
DRAFTER = json.loads((DATA / "torchspec-kimi-k25-eagle3.json").read_text())
SPEC = {"draft_model_path": "/models/Kimi-K2.5-eagle3", "draft_config": "drafter.json",
        "target_config": "target.json"}


@pytest.fixture
def configs(inventory):
    shutil.copy(DATA / "kimi-k2.5-config.json", inventory.dir / "target.json")
    shutil.copy(DATA / "torchspec-kimi-k25-eagle3.json", inventory.dir / "drafter.json")
    inventory.edit_stack("active: sglang-0.5.9-cu128", "active: sglang-0.5.10-cu128")
    return inventory


def _site(inventory, **settings):
    # one file per variant: the site model reads an inventory file once
    name = "site.py" if not settings else "site_" + "_".join(f"{k}_{v}" for k, v in settings.items()).replace(".", "") + ".py"
    return load_site(inventory.groups(name, gpu_nodes=[gpu_node(serving_speculative=SPEC, **settings)]), ROLE_CHECKS)


def _problems(inventory, **settings) -> list[str]:
    with pytest.raises(SiteError) as caught:
        _site(inventory, **settings)
    return caught.value.problems


def test_kimi_weights_from_its_config_match_the_checkpoint():
    """Counted from config.json alone (MLA attention, 1 dense + 60 MoE layers of 384 INT4 experts
    in group-32 pack-quantized form, bf16 everything compressed-tensors ignores, the vision
    tower): within 0.5 % of the 554.30 GiB the 64 safetensors files of moonshotai/Kimi-K2.5 hold
    (tests/unit/data/eagle3/README.md)."""
    whole = kv_cache.target_memory(KIMI, 1).weights_per_gpu
    assert abs(whole / kv_cache.GIB - 554.30) / 554.30 < 0.005, whole / kv_cache.GIB


def test_mla_kv_bytes_per_token_is_sglangs_cell_size():
    """model_runner_kv_cache_mixin.py get_cell_size_per_token (0.5.10), MLA: (kv_lora_rank +
    qk_rope_head_dim) * num_layers * element size; not divided by tensor parallelism."""
    for tp in (1, 8):
        assert kv_cache.target_memory(KIMI, tp).kv_bytes_per_token == (512 + 64) * 61 * 2 == 70272


def test_kimi_on_eight_rtx_pro_6000_leaves_218k_tokens():
    """Issue 36: the card is not 96 GiB (nvidia-smi: 97,887 MiB) and SGLang measures the free
    memory after the CUDA context and NCCL are taken (model_runner.py init_torch_distributed).
    rest = post - pre * (1 - 0.92) with pre = 97887 MiB - 2 GiB = 93.59 GiB, post = pre - 71.82
    GiB of weights: 14.29 GiB = 218,348 tokens of 70,272 B. The old estimate (0.92 x 96 GiB -
    weights) gave 16.5 GiB = 252,187 tokens, 15 % more than SGLang will have."""
    target, drafter = kv_cache.target_memory(KIMI, 8), kv_cache.drafter_memory(DRAFTER, 8)
    pre = kv_cache.before_load_bytes("NVIDIA RTX PRO 6000 Blackwell Server Edition", 96)
    assert pre == 97887 * kv_cache.MIB - 2 * kv_cache.GIB
    estimate = kv_cache.KvEstimate(pre, 0.92, target, drafter)
    assert 71.5 < target.weights_per_gpu / kv_cache.GIB < 72.0
    assert kv_cache.gib(estimate.kv_bytes) == "14.3 GiB"
    assert estimate.kv_tokens == 218_348
    # The drafter: one layer reading 2 x hidden, its fc (replicated) and full-vocabulary lm_head;
    # KV: 64 heads / 8 GPUs x (128 + 128) x 2 B per token.
    assert 0.70 < drafter.weights_per_gpu / kv_cache.GIB < 0.73
    assert drafter.kv_bytes_per_token == 8 * 256 * 2
    assert estimate.drafter_bytes < estimate.headroom_bytes


def test_a_card_without_a_known_nvidia_smi_total_is_taken_at_gpu_memory_gib():
    assert kv_cache.card_memory_bytes("NVIDIA H200", 141) == 141 * kv_cache.GIB
    assert kv_cache.card_memory_bytes("NVIDIA RTX PRO 6000 Blackwell Server Edition", 96) == 97887 * kv_cache.MIB


def test_default_context_with_48_requests_is_refused_with_what_would_fit(configs):
    (problem,) = _problems(configs)
    assert problem.startswith(f"{configs.dir / 'site.py'}: host gpu1: serving_speculative (EAGLE3 on sglang 0.5.10): ")
    assert "\n" not in problem
    # each request's row: context + 4 + num_draft_tokens (extra_max_context_len)
    assert ("the model's context length 262144 (+ 4 + 4 draft tokens) x serving_max_running_requests 48"
            " = 12583296 tokens") in problem
    assert ("0.92 x 93.6 GiB free before loading (97887 MiB card - 2 GiB CUDA context and NCCL) - 71.8 GiB"
            " of target weights per GPU = 14.3 GiB = 218348 tokens at 70272 B") in problem
    # 218348 // 48 - 8 = 4540 (the old check said 5249: 252187 // 48 - 4)
    assert "expected serving_max_running_requests <= 0 at that context, or serving_context_length <= 4540" in problem


def test_a_context_that_fits_passes_and_both_numbers_are_on_the_command_line(configs):
    site = _site(configs, serving_context_length=4540)
    host = site.hosts["gpu1"]
    args = server_arguments(host, site.hosts, site.stack.active)
    assert args[args.index("--max-running-requests") + 1] == "48"  # SGLang's cap, said
    assert args[args.index("--context-length") + 1] == "4540"
    (problem,) = _problems(configs, serving_context_length=4541)
    assert "serving_context_length 4541 (+ 4 + 4 draft tokens) x serving_max_running_requests 48" in problem


def test_fewer_requests_at_a_longer_context(configs):
    _site(configs, serving_context_length=65536, serving_max_running_requests=3)
    (problem,) = _problems(configs, serving_context_length=65536, serving_max_running_requests=4)
    assert "expected serving_max_running_requests <= 3 at that context" in problem


def test_a_fraction_that_leaves_no_room_for_the_drafter_is_refused(configs):
    problems = _problems(configs, serving_context_length=4096, serving_mem_fraction_static=0.99)
    assert len(problems) == 1 and "the drafter needs 1.9 GiB per GPU" in problems[0]
    assert "1 - serving_mem_fraction_static leaves 0.9 GiB" in problems[0]


def test_without_a_drafter_nothing_is_added_to_the_command_line(inventory):
    site = load_site(inventory.groups(gpu_nodes=[gpu_node()]), ROLE_CHECKS)
    args = server_arguments(site.hosts["gpu1"], site.hosts, site.stack.active)
    assert "--max-running-requests" not in args and "--context-length" not in args
    site = load_site(inventory.groups("set.py", gpu_nodes=[gpu_node(serving_max_running_requests=64,
                                                                    serving_context_length=32768)]), ROLE_CHECKS)
    args = server_arguments(site.hosts["gpu1"], site.hosts, site.stack.active)
    assert args[args.index("--max-running-requests") + 1] == "64" and args[args.index("--context-length") + 1] == "32768"


def test_weights_that_do_not_fit_the_gpus_are_said_first(configs):
    (problem,) = _problems(configs, gpu_count=4)
    assert "the target's weights alone, 140.7 GiB per GPU over gpu_count 4 (from target.json), exceed" in problem


def test_a_target_without_mla_is_not_estimated():
    from roles.serving.speculative import kv_cache_problems

    lab = json.loads((PROJECT_ROOT / "tests/lab/data/eagle3/tiny-kimi-config.json").read_text())
    assert kv_cache.model_context_length(lab) == 2048  # SGLang's default without a length key
    assert kv_cache_problems(None, None, lab, DRAFTER) == []
