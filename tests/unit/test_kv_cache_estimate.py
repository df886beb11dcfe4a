"""The KV cache SGLang will have per GPU, estimated from the models' config.json copies
(roles/shared/kv_cache.py), and the speculative settings checked against it."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from roles.serving.command import server_arguments
from roles.shared import kv_cache
from roles.site import SiteError, load_site
from tests.unit.conftest import PROJECT_ROOT, gpu_node
from validation import ROLE_CHECKS  # the checks the inventories' hook runs

DATA = PROJECT_ROOT / "tests" / "unit" / "data" / "eagle3"
KIMI = json.loads((DATA / "kimi-k2.5-config.json").read_text())
DRAFTER = json.loads((DATA / "torchspec-kimi-k25-eagle3.json").read_text())
SPEC = {"draft_model_path": "/models/Kimi-K2.5-eagle3", "draft_config": "drafter.json", "target_config": "target.json"}


@pytest.fixture
def configs(inventory):
    shutil.copy(DATA / "kimi-k2.5-config.json", inventory.dir / "target.json")
    shutil.copy(DATA / "torchspec-kimi-k25-eagle3.json", inventory.dir / "drafter.json")
    inventory.edit_stack("active: sglang-0.5.9-cu128", "active: sglang-0.5.10-cu128")
    return inventory


def _site(inventory, **settings):
    # one file per variant: the site model reads an inventory file once
    name = (
        "site.py"
        if not settings
        else "site_" + "_".join(f"{k}_{v}" for k, v in settings.items()).replace(".", "") + ".py"
    )
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
    estimate = kv_cache.KvEstimate(pre, 0.92, target, drafter, "0.5.10")
    assert 71.5 < target.weights_per_gpu / kv_cache.GIB < 72.0
    assert kv_cache.gib(estimate.kv_bytes) == "14.3 GiB"
    assert estimate.kv_tokens == 218_348
    # KV: 64 heads / 8 GPUs x (128 + 128) x 2 B per token.
    assert drafter.kv_bytes_per_token == 8 * 256 * 2
    assert estimate.drafter_bytes < estimate.headroom_bytes


def test_a_card_without_a_known_nvidia_smi_total_is_taken_at_gpu_memory_gib():
    assert kv_cache.card_memory_bytes("NVIDIA H200", 141) == 141 * kv_cache.GIB
    assert kv_cache.card_memory_bytes("NVIDIA RTX PRO 6000 Blackwell Server Edition", 96) == 97887 * kv_cache.MIB


# 0.806: the largest fraction that leaves 0.5.10's own reserve with EAGLE (18,944 MiB of 97,887:
# test_serving_memory.py); 0.806 x 93.59 GiB - 71.82 GiB = 3.6 GiB = 55,319 tokens, 40,039 with
# the 1 GiB margin.
FITS = {"serving_mem_fraction_static": 0.806}


def test_default_context_with_48_requests_is_refused_with_what_would_fit(configs):
    (problem,) = _problems(configs, **FITS)
    assert problem.startswith(f"{configs.dir / 'site_serving_mem_fraction_static_0806.py'}: host gpu1: ")
    assert "\n" not in problem
    # each request's row: context + 4 + num_draft_tokens (extra_max_context_len)
    assert (
        "the model's context length 262144 (+ 4 + 4 draft tokens) x serving_max_running_requests 48 = 12583296"
        " tokens of KV cache on sglang 0.5.10"
    ) in problem
    assert (
        "0.806 x 93.6 GiB free before loading (97887 MiB card - 2 GiB CUDA context and NCCL) - 71.8 GiB"
        " of target weights per GPU = 3.6 GiB = 55319 tokens at 70272 B"
    ) in problem
    assert "1 GiB kept as margin: 40039 tokens" in problem
    # 40039 // 48 - 8 = 826
    assert "expected serving_max_running_requests <= 0 at that context, or serving_context_length <= 826" in problem


def test_a_context_that_fits_passes_and_both_numbers_are_on_the_command_line(configs):
    site = _site(configs, serving_context_length=826, **FITS)
    host = site.hosts["gpu1"]
    args = server_arguments(host, site.hosts, site.stack.active)
    assert args[args.index("--max-running-requests") + 1] == "48"  # SGLang's cap, said
    assert args[args.index("--context-length") + 1] == "826"
    (problem,) = _problems(configs, serving_context_length=827, **FITS)
    assert "serving_context_length 827 (+ 4 + 4 draft tokens) x serving_max_running_requests 48" in problem


def test_fewer_requests_at_a_longer_context(configs):
    _site(configs, serving_context_length=8192, serving_max_running_requests=4, **FITS)
    (problem,) = _problems(configs, serving_context_length=8192, serving_max_running_requests=5, **FITS)
    assert "expected serving_max_running_requests <= 4 at that context" in problem  # 40039 // 8200


def test_a_fraction_that_leaves_no_room_for_graphs_and_the_drafter_is_refused(configs):
    problems = _problems(configs, serving_context_length=512, serving_mem_fraction_static=0.99)
    assert len(problems) == 1 and "serving_mem_fraction_static 0.99 leaves 979 MiB of the 97887 MiB card" in problems[0]
    assert "4096 MiB for the EAGLE drafter" in problems[0] and "<= 0.806" in problems[0]


def test_without_a_drafter_nothing_is_added_to_the_command_line(inventory):
    site = load_site(inventory.groups(gpu_nodes=[gpu_node()]), ROLE_CHECKS)
    args = server_arguments(site.hosts["gpu1"], site.hosts, site.stack.active)
    assert "--max-running-requests" not in args and "--context-length" not in args
    site = load_site(
        inventory.groups("set.py", gpu_nodes=[gpu_node(serving_max_running_requests=64, serving_context_length=32768)]),
        ROLE_CHECKS,
    )
    args = server_arguments(site.hosts["gpu1"], site.hosts, site.stack.active)
    assert (
        args[args.index("--max-running-requests") + 1] == "64" and args[args.index("--context-length") + 1] == "32768"
    )


def test_weights_that_do_not_fit_the_gpus_are_said_first(configs):
    (problem,) = _problems(configs, gpu_count=4)
    assert "the weights alone, 140.7 GiB per GPU over tp 4, exceed serving_mem_fraction_static 0.8" in problem


def test_a_target_without_mla_is_not_estimated(inventory):
    from roles.serving.memory import host_memory

    lab = json.loads((PROJECT_ROOT / "tests/lab/data/eagle3/tiny-kimi-config.json").read_text())
    assert kv_cache.model_context_length(lab) == 2048  # SGLang's default without a length key
    assert kv_cache.model_facts(lab).mla is False
    shutil.copy(PROJECT_ROOT / "tests/lab/data/eagle3/tiny-kimi-config.json", inventory.dir / "tiny.json")
    site = load_site(inventory.groups(gpu_nodes=[gpu_node(serving_model_config_json="tiny.json")]), ROLE_CHECKS)
    memory = host_memory(site.hosts["gpu1"], site.hosts, site.stack, inventory.dir)
    assert memory is not None and memory.estimate is None and memory.facts.mla is False


def _release_method(version: str, name: str, stubs: dict):
    """A method of the release's ModelRunnerKVCacheMixin, compiled from the committed snapshot of
    its model_runner_kv_cache_mixin.py with the module's GPU-facing names replaced by stubs."""
    import ast

    from tests.unit.upstream_sources import release_text

    tree = ast.parse(release_text("sglang", version, "sglang/srt/model_executor/model_runner_kv_cache_mixin.py"))
    mixin = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ModelRunnerKVCacheMixin")
    method = next(n for n in mixin.body if isinstance(n, ast.FunctionDef) and n.name == name)
    method.args.args[0].annotation = None
    for arg in method.args.args[1:]:
        arg.annotation = None
    namespace = dict(stubs)
    exec(compile(ast.Module([method], []), f"sglang-{version}:{name}", "exec"), namespace)  # upstream's own code
    return namespace[name]


@pytest.mark.parametrize("version", ["0.5.9", "0.5.10"])
def test_the_releases_own_profile_gives_the_estimates_tokens(version):
    """Runs the pinned release's own get_cell_size_per_token and profile_max_num_token on Kimi-K2.5's
    figures, with the GPU's answers substituted: get_available_gpu_memory answers `post` (GiB
    free after the weights: pre - 71.82 GiB), the min-over-ranks `pre` is passed in as
    init_torch_distributed returns it (97,887 MiB - 2 GiB), torch's element size of bfloat16 is 2,
    world size 8, no FP4 KV cache, not an NSA model, not a draft worker, no Mamba layers."""
    from types import SimpleNamespace

    target = kv_cache.target_memory(KIMI, 8)
    pre = kv_cache.before_load_bytes("NVIDIA RTX PRO 6000 Blackwell Server Edition", 96)
    post_gib = (pre - target.weights_per_gpu) / kv_cache.GIB
    stubs = {
        "torch": SimpleNamespace(_utils=SimpleNamespace(_element_size=lambda dtype: 2)),
        "is_float4_e2m1fn_x2": lambda dtype: False,
        "is_deepseek_nsa": lambda config: False,
        "get_available_gpu_memory": lambda *args, **kwargs: post_gib,
        "get_world_group": lambda: SimpleNamespace(world_size=8, cpu_group=None),
    }
    runner = SimpleNamespace(
        kv_cache_dtype="bfloat16",
        use_mla_backend=True,
        is_draft_worker=False,
        mambaish_config=None,
        num_effective_layers=61,
        device="cuda",
        gpu_id=0,
        mem_fraction_static=0.92,
        model_config=SimpleNamespace(kv_lora_rank=512, qk_rope_head_dim=64, hf_config={}),
    )
    cell = _release_method(version, "get_cell_size_per_token", stubs)
    runner.get_cell_size_per_token = lambda layers: cell(runner, layers)
    assert runner.get_cell_size_per_token(61) == target.kv_bytes_per_token
    profile = _release_method(version, "profile_max_num_token", stubs)
    estimate = kv_cache.KvEstimate(pre, 0.92, target, None)
    assert profile(runner, pre / kv_cache.GIB) == estimate.kv_tokens == 218_348


@pytest.mark.parametrize(
    "version, path",
    [
        ("0.5.9", "sglang/srt/model_executor/model_runner_kv_cache_mixin.py"),
        ("0.5.10", "sglang/srt/model_executor/model_runner_kv_cache_mixin.py"),
        ("0.5.23", "sglang/srt/mem_cache/allocation_sizing.py"),
    ],
)
def test_each_request_row_holds_four_plus_the_draft_tokens(version, path):
    """extra_max_context_len: 4, plus speculative_num_draft_tokens (the FIXME in each release)."""
    from tests.unit.upstream_sources import release_text

    source = release_text("sglang", version, path)
    assert re.search(r"extra(?:_max_context_len)? = 4\b", source) and "speculative_num_draft_tokens" in source
    assert kv_cache.EXTRA_CONTEXT_TOKENS == 4


@pytest.mark.parametrize("version", ["0.5.9", "0.5.10", "0.5.23"])
def test_the_eagle_reserve_of_sglangs_default_fraction_per_release(version):
    """server_args.py _handle_gpu_memory_settings: "eagle draft models and cuda graphs" adds 2 GiB in
    0.5.9 and 4 GiB in 0.5.10; 0.5.23's srt/arg_groups/memory_hook.py has no fixed reserve."""
    from tests.unit.upstream_sources import release_files, release_text

    if "sglang/srt/arg_groups/memory_hook.py" in release_files("sglang", version):
        source = release_text("sglang", version, "sglang/srt/arg_groups/memory_hook.py")
        assert "eagle draft models" not in source
        found = 0
    else:
        source = release_text("sglang", version, "sglang/srt/server_args.py")
        found = (
            int(re.search(r"# eagle draft models and cuda graphs\s+reserved_mem \+= (\d+) \* 1024", source)[1]) * 1024
        )
    assert kv_cache.EAGLE_RESERVE_MIB[version] == found


def test_the_deploy_prints_the_estimate_beside_sglangs_own_figure(configs):
    from roles.serving.speculative import kv_estimate_note

    site = _site(configs, serving_context_length=512, **FITS)
    line = kv_estimate_note(site.hosts["gpu1"], "0.5.10", configs.dir)
    assert line == (
        "KV cache estimate for sglang 0.5.10: 55319 tokens, 3.6 GiB per GPU (0.806 x 93.6 GiB free"
        " before loading - 71.8 GiB of weights); SGLang's own figure: the health check 'kv cache"
        " allocated' (docs/serving-memory.md)"
    )
    # 0.5.23: the drafter's weights are charged before the pool, the cell grows by its layer
    line = kv_estimate_note(site.hosts["gpu1"], "0.5.23", configs.dir)
    assert line.startswith("KV cache estimate for sglang 0.5.23: ") and "- 72.8 GiB of weights" in line


def test_the_drafter_counts_its_own_embedding_and_lm_head_until_the_pools_are_sized():
    """LlamaForCausalLMEagle3 (models/llama_eagle3.py, 0.5.9 and 0.5.23) allocates a
    VocabParallelEmbedding(vocab_size) and, with no draft_vocab_size, a ParallelLMHead(vocab_size);
    the target's replace them only after the pools (0.5.9 eagle_worker.py: after the draft
    ModelRunner's init_memory_pool; 0.5.23 eagle_worker_v2.py alloc_memory_pool -> init_lm_head,
    after the target's pool is sized). TorchSpec's Kimi-K2.5 drafter per GPU at TP 8, bf16:"""
    drafter = kv_cache.drafter_memory(DRAFTER, 8)
    h, tp = 7168, 8
    qkv = (64 + 2 * 64) * 128 * 2 * h  # QKVParallelLinear(2 * hidden, ...)
    o, gate_up, down = 64 * 128 * h, 2 * 12288 * h, 12288 * h
    embedding = lm_head = 163_840 * h
    fc, norms = 3 * h * h, 4 * h  # replicated: torch.nn.Linear, RMSNorm
    params = (qkv + o + gate_up + down + embedding + lm_head) // tp + fc + norms
    assert drafter.weights_per_gpu == params * 2 == 1_064_361_984  # 0.9913 GiB
