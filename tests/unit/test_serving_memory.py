"""GPU memory at start-up per SGLang release (roles/shared/kv_cache.py, roles/serving/memory.py):
SGLang's own reserve and default mem_fraction_static, the KV pool as each pinned release sizes
it, and the inventory check that refuses a fraction leaving less than the release's reserve."""

from __future__ import annotations

import ast
import functools
import json
import math
import re
import shutil
from types import SimpleNamespace

import pytest

from roles.shared import kv_cache
from roles.site import SiteError, load_site
from tests.unit.conftest import PROJECT_ROOT, gpu_node
from tests.unit.upstream_sources import release_text
from validation import ROLE_CHECKS

DATA = PROJECT_ROOT / "tests" / "unit" / "data"
KIMI = json.loads((DATA / "eagle3" / "kimi-k2.5-config.json").read_text())
DRAFTER = json.loads((DATA / "eagle3" / "torchspec-kimi-k25-eagle3.json").read_text())
CAPTURED = json.loads((DATA / "sglang-memory" / "rtx-pro-6000-kimi-k2.5-defaults.json").read_text())
CARD = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
SPEC = {"draft_model_path": "/models/Kimi-K2.5-eagle3", "draft_config": "drafter.json", "target_config": "target.json"}
# The captured cases (docs/serving-memory.md): the flags beyond --model-path, --tp-size 8,
# --attention-backend triton, --trust-remote-code.
CASES = {
    "plain": {},
    "plain_bs48": {"cuda_graph_max_bs": 48},
    "plain_chunk4096": {"chunked_prefill_size": 4096},
    "eagle3": {"speculative": True, "max_running_requests": 48},
    "eagle3_bs48": {"speculative": True, "max_running_requests": 48, "cuda_graph_max_bs": 48},
    "eagle3_nomrr": {"speculative": True},
}


@pytest.mark.parametrize("version", kv_cache.RELEASES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_sglangs_own_default_as_each_release_computed_it_in_its_environment(version, case):
    """Each pinned release's prepare_server_args (+ resolve_once on 0.5.23), run in its stack's
    full environment with the card's answers (97,887 MiB, 8 x 12.0) and Kimi-K2.5's config, gave
    these mem_fraction_static, cuda_graph_max_bs and chunked_prefill_size; the estimate's own
    arithmetic gives the same."""
    found = CAPTURED["releases"][version][case]
    facts = kv_cache.model_facts(KIMI)
    reserve = kv_cache.sglang_reserve(version, 97887, 8, model=facts, **CASES[case])
    assert (reserve.cuda_graph_max_bs, reserve.chunked_prefill_size) == (
        found["cuda_graph_max_bs"],
        found["chunked_prefill_size"],
    )
    assert kv_cache.sglang_default_fraction(reserve, facts) == pytest.approx(found["mem_fraction_static"], abs=1e-12)


def test_the_default_fractions_a_person_can_recompute():
    """docs/serving-memory.md's table: 0.5.9 keeps 512 + 8192 x 1.5 + 512 x 2 + 8 / 8 x 1024 =
    14,848 MiB of the 97,887 MiB card: round(83,039 / 97,887, 3) = 0.848, and Kimi-K2.5's vision
    tower (27 layers of 1152) cuts it by 0.95 x (1 - 0.1 x (27 x 1152^2 / (24 x 1024^2) - 1))."""
    facts = kv_cache.model_facts(KIMI)
    cut = 0.95 * (1 - 0.1 * (27 * 1152**2 / (24 * 1024**2) - 1))
    assert kv_cache.vlm_factor(facts) == pytest.approx(cut) and round(cut, 4) == 0.9097
    expected = {
        ("0.5.9", False): (14848, 0.848, 0.848),
        ("0.5.9", True): (14848 + 2048, 0.827, 0.827),
        ("0.5.10", False): (14848, 0.848, 0.848),
        ("0.5.10", True): (14848 + 4096, 0.806, 0.806),
        ("0.5.23", False): (14848 + 1536, 0.833, 0.832),  # MLA prefill graphs, 1.5 GiB
        ("0.5.23", True): (512 + 12288 + 96 + 1536 + 1024, 0.842, 0.842),  # decode graphs capped at 48 requests
    }
    for (version, spec), (mib, default, largest) in expected.items():
        reserve = kv_cache.sglang_reserve(
            version, 97887, 8, speculative=spec, max_running_requests=48 if spec else None, model=facts
        )
        assert reserve.total_mib == mib, (version, spec)
        assert round((97887 - mib) / 97887, 3) == default
        assert reserve.largest_fraction() == largest == math.floor((97887 - mib) / 97887 * 1000) / 1000
        assert kv_cache.sglang_default_fraction(reserve, facts) == pytest.approx(default * cut)


@functools.cache
def _server_args_functions(version: str, names: tuple[str, ...]) -> dict:
    """Methods of the release's ServerArgs, compiled from the committed snapshot of its
    server_args.py (upstream's own code), with the module's names they use stubbed."""
    tree = ast.parse(release_text("sglang", version, "sglang/srt/server_args.py"))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ServerArgs")
    methods = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name in names]
    for method in methods:
        method.decorator_list = []
        for arg in method.args.args:
            arg.annotation = None
    namespace = {"envs": SimpleNamespace(SGLANG_SYMM_MEM_PREALLOC_GB_SIZE=None), "logger": None}
    exec(compile(ast.Module(methods, []), f"sglang-{version}:server_args", "exec"), namespace)
    return {name: namespace[name] for name in names}


@pytest.mark.parametrize("version", ["0.5.9", "0.5.10"])
@pytest.mark.parametrize("card_mib", [16 * 1024, 24 * 1024, 48 * 1024, 81559, 97887, 143771, 183359])
@pytest.mark.parametrize("spec", [False, True])
@pytest.mark.parametrize("mla, multimodal", [(True, True), (True, False), (False, False)])
def test_the_releases_own_gpu_memory_settings_give_the_same_on_other_cards(version, card_mib, spec, mla, multimodal):
    """0.5.9's and 0.5.10's own _handle_gpu_memory_settings and adjust_mem_fraction_for_vlm, run on
    a stand-in ServerArgs for cards of every memory bracket, tp 8 and tp 2, with and without a
    drafter, MLA or not, multimodal or not."""
    names = (
        "_handle_gpu_memory_settings",
        "_generate_cuda_graph_batch_sizes",
        "_generate_piecewise_cuda_graph_tokens",
        "adjust_mem_fraction_for_vlm",
    )
    own = _server_args_functions(version, names)
    vision = SimpleNamespace(num_hidden_layers=27, hidden_size=1152) if multimodal else None
    for tp in (8, 2):
        args = SimpleNamespace(
            chunked_prefill_size=None,
            cuda_graph_max_bs=None,
            cuda_graph_bs=None,
            tp_size=tp,
            pp_size=1,
            dp_size=1,
            device="cuda",
            enable_dp_attention=False,
            enable_piecewise_cuda_graph=False,  # 0.5.9's default
            # 0.5.10 _handle_piecewise_cuda_graph: off with a drafter or a multimodal model
            disable_piecewise_cuda_graph=spec or multimodal,
            piecewise_cuda_graph_max_tokens=None,
            piecewise_cuda_graph_tokens=None,
            max_total_tokens=None,
            max_prefill_tokens=16384,
            model_path="/models/m",
            mem_fraction_static=None,
            speculative_algorithm="EAGLE3" if spec else None,
            language_only=False,
            enable_symm_mem=False,
            disable_cuda_graph_padding=False,
        )
        args.use_mla_backend = lambda: mla
        args.get_model_config = lambda: SimpleNamespace(
            is_multimodal=multimodal, hf_config=SimpleNamespace(vision_config=vision)
        )
        for name in names[1:]:
            setattr(args, name, functools.partial(own[name], args))
        own["_handle_gpu_memory_settings"](args, card_mib)
        facts = kv_cache.ModelFacts(mla=mla, multimodal=multimodal, vision_layers=27, vision_hidden=1152)
        reserve = kv_cache.sglang_reserve(version, card_mib, tp, speculative=spec, model=facts)
        assert (reserve.chunked_prefill_size, reserve.cuda_graph_max_bs) == (
            args.chunked_prefill_size,
            args.cuda_graph_max_bs,
        )
        assert kv_cache.sglang_default_fraction(reserve, facts) == pytest.approx(args.mem_fraction_static, abs=1e-12)


def _estimate(version: str, fraction: float, drafter: bool) -> kv_cache.KvEstimate:
    return kv_cache.KvEstimate(
        kv_cache.before_load_bytes(CARD, 96),
        fraction,
        kv_cache.target_memory(KIMI, 8),
        kv_cache.drafter_memory(DRAFTER, 8) if drafter else None,
        version,
    )


def test_0523_with_eagle3_charges_the_drafter_before_the_pools():
    """0.5.23: the draft worker is built before init_memory_pools (managers/scheduler.py), so its
    weights are gone from the free memory _profile_available_bytes measures; 100 MiB of it is kept
    for multimodal inputs (mm_runtime_reservation_gb, SGLANG_VLM_CACHE_SIZE_MB); the cell grows by
    int(70,272 x 1 / 61) = 1,152 B for the draft's one layer (DefaultPoolConfigurator); the
    draft's own embedding and lm_head are still resident (init_lm_head runs in the draft's
    alloc_memory_pool, after). At 0.92: 198,456 tokens, 9 % below the 218,348 of 0.5.9 / 0.5.10's
    arithmetic."""
    old, new = _estimate("0.5.10", 0.92, True), _estimate("0.5.23", 0.92, True)
    assert (old.kv_tokens, old.cell_bytes) == (218_348, 70_272)
    assert new.cell_bytes == 70_272 + 70_272 * 1 // 61 == 71_424
    pre = (97887 - 2048) / 1024
    weights = (new.target.weights_per_gpu + new.drafter.weights_per_gpu) / kv_cache.GIB
    rest = pre - weights - pre * (1 - 0.92) - 100 / 1024
    assert new.drafter.weights_per_gpu == 1_064_361_984
    assert new.kv_tokens == int(rest * (1 << 30)) // 71_424 == 198_456
    assert new.drafter_bytes == 0 and old.drafter_bytes > 0  # 0.5.9 / 0.5.10: out of the left-over
    # without a drafter: the 100 MiB only
    assert _estimate("0.5.23", 0.92, False).kv_tokens == 216_855


def test_0523s_own_sources_say_what_the_estimate_follows():
    """The lines of the committed 0.5.23 snapshot each rule stands on."""
    configurator = release_text("sglang", "0.5.23", "sglang/srt/mem_cache/kv_cache_configurator.py")
    assert "rest_memory = available_gpu_memory - slack_gb - mm_reservation_gb" in configurator
    assert "slack_gb = pre_model_load_memory * (1 - get_schedule().mem_fraction_static)" in configurator
    pools = release_text("sglang", "0.5.23", "sglang/srt/model_executor/pool_configurator.py")
    assert re.search(r"draft_kv_size = int\(\s*self\._cell_size \* draft_num_layers / int\(num_layers\)\s*\)", pools)
    scheduler = release_text("sglang", "0.5.23", "sglang/srt/managers/scheduler.py")
    assert scheduler.index("self.draft_worker = DraftWorkerClass(") < scheduler.index("def init_memory_pools(")
    environ = release_text("sglang", "0.5.23", "sglang/srt/environ.py")
    assert "SGLANG_VLM_CACHE_SIZE_MB = EnvInt(100)" in environ
    assert kv_cache.MULTIMODAL_RESERVE_MIB["0.5.23"] == 100


def test_a_release_between_the_pinned_ones_is_read_with_the_older_rules():
    assert [kv_cache.release_rules(v) for v in ("0.5.9", "0.5.10", "0.5.14", "0.5.23", "0.6.0")] == [
        "0.5.9",
        "0.5.10",
        "0.5.10",
        "0.5.23",
        "0.5.23",
    ]


# --- the inventory check ------------------------------------------------------------------


def _load(inventory, name="site.py", stack="sglang-0.5.9-cu128", **settings):
    stack_file = inventory.dir / "stack.yml"
    text = stack_file.read_text()
    stack_file.write_text(re.sub(r"(?m)^active: \S+", f"active: {stack}", text, count=1))
    return load_site(inventory.groups(name, gpu_nodes=[gpu_node(**settings)]), ROLE_CHECKS)


def _refused(inventory, name="site.py", **settings) -> list[str]:
    """name: one file per variant, the site model reads an inventory file once."""
    with pytest.raises(SiteError) as caught:
        _load(inventory, name, **settings)
    return caught.value.problems


def test_092_is_refused_in_one_line_with_the_fraction_that_fits(inventory):
    (problem,) = _refused(inventory, serving_mem_fraction_static=0.92)
    assert problem.startswith(f"{inventory.dir / 'site.py'}: host gpu1: serving_mem_fraction_static 0.92 leaves")
    assert "\n" not in problem
    assert "leaves 7831 MiB of the 97887 MiB card" in problem  # 0.08 x 97,887
    assert "sglang 0.5.9 keeps 14848 MiB for activations and CUDA graphs at cuda_graph_max_bs 512" in problem
    assert "server_args.py _handle_gpu_memory_settings" in problem
    assert "expected serving_mem_fraction_static <= 0.848" in problem


def test_the_largest_fraction_that_fits_passes(inventory):
    _load(inventory, "fits.py", serving_mem_fraction_static=0.848)
    (problem,) = _refused(inventory, "over.py", serving_mem_fraction_static=0.849)
    assert "<= 0.848" in problem


def test_the_configured_cuda_graph_max_bs_and_prefill_chunk_are_what_is_reserved(inventory):
    """512 - 48 graphs x 2 MiB = 928 MiB less: 0.857 fits with cuda_graph_max_bs 48; a 4096-token
    prefill chunk falls to 0.5.9's 10 GiB floor for a card over 60 GiB: 0.895."""
    _load(inventory, "bs.py", serving_mem_fraction_static=0.857, serving_cuda_graph_max_bs=48)
    _load(inventory, "chunk.py", serving_mem_fraction_static=0.895, serving_chunked_prefill_size=4096)
    (problem,) = _refused(inventory, serving_mem_fraction_static=0.896, serving_chunked_prefill_size=4096)
    assert "at least 10240 MiB on a card over 60 GiB" in problem and "<= 0.895" in problem


def test_each_release_is_held_to_its_own_reserve(inventory):
    """0.5.23 keeps 1.5 GiB more for MLA's prefill graphs: 0.848 passes 0.5.9, not 0.5.23."""
    (problem,) = _refused(inventory, stack="sglang-0.5.23-cu130", serving_mem_fraction_static=0.848)
    assert "sglang 0.5.23 keeps 16384 MiB" in problem and "memory_hook.py" in problem and "<= 0.832" in problem


@pytest.fixture
def configs(inventory):
    shutil.copy(DATA / "eagle3" / "kimi-k2.5-config.json", inventory.dir / "target.json")
    shutil.copy(DATA / "eagle3" / "torchspec-kimi-k25-eagle3.json", inventory.dir / "drafter.json")
    return inventory


def test_with_a_drafter_on_0510_the_eagle_reserve_counts(configs):
    """0.5.10 keeps 4 GiB more with EAGLE: 18,944 MiB, at most 0.806."""
    settings = {"serving_speculative": SPEC, "serving_context_length": 512}
    _load(configs, "ok.py", stack="sglang-0.5.10-cu128", serving_mem_fraction_static=0.806, **settings)
    problems = _refused(configs, stack="sglang-0.5.10-cu128", serving_mem_fraction_static=0.83, **settings)
    assert any("18944 MiB" in p and "for the EAGLE drafter" in p and "<= 0.806" in p for p in problems), problems


def test_without_a_drafter_a_configured_context_must_fit_the_pool(configs):
    """serving_model_config_json: the served model's config without a drafter; 0.83 on 0.5.9
    leaves 0.83 x 93.59 GiB - 71.82 GiB of weights = 5.86 GiB = 89,641 tokens, 74,361 with the
    1 GiB margin; one request of 74,000 tokens (+ 4) fits, one of 75,000 does not."""
    settings = {"serving_model_config_json": "target.json", "serving_mem_fraction_static": 0.83}
    _load(configs, "fits.py", serving_context_length=74000, **settings)
    (problem,) = _refused(configs, serving_context_length=75000, **settings)
    assert "serving_context_length 75000 (+ 4) x serving_max_running_requests 1 = 75004 tokens" in problem
    assert "= 89641 tokens at 70272 B" in problem and "1 GiB kept as margin: 74361 tokens" in problem
    assert "serving_context_length <= 74357 for 1 requests" in problem


def test_without_a_drafter_and_nothing_set_sglang_sizes_both_from_the_pool(configs):
    _load(configs, serving_model_config_json="target.json", serving_mem_fraction_static=0.83)


def test_a_missing_model_config_is_named_in_one_line(configs):
    (problem,) = _refused(configs, serving_model_config_json="nowhere.json")
    assert "serving_model_config_json = 'nowhere.json': no such file; expected the path" in problem
    (problem,) = _refused(configs, "hostile.py", serving_model_config_json="a\nb.json")
    assert "has the control character" in problem and "\n" not in problem  # the model's own rule, first


def test_python_m_roles_site_shows_the_fraction_beside_sglangs_own(capsys):
    from validation import main

    assert main([str(PROJECT_ROOT / "inventory" / "prod.py")]) == 0
    out = capsys.readouterr().out
    assert (
        "mem_fraction_static 0.83; sglang 0.5.9 would choose 0.771 (0.848 x 0.910 for the vision tower)"
        " on this 97887 MiB card; at most 0.848 leaves its 14848 MiB for activations and CUDA graphs"
    ) in out
    assert "KV cache per GPU on sglang 0.5.9: 89641 tokens" in out
    assert main([str(PROJECT_ROOT / "inventory" / "prod.py"), "--json"]) == 0
    memory = json.loads(capsys.readouterr().out)["hosts"]["gpu-lxc.example.internal"]["memory"]
    assert memory[0].startswith("mem_fraction_static 0.83; sglang 0.5.9 would choose 0.771")


# --- the drafter's memory as allocated, not as charged (issue 55) --------------------------


def test_the_drafters_pool_allocates_4096_b_a_token_derived_from_its_config():
    """The Llama drafter's own KV pool, from its config.json: num_hidden_layers 1 x
    num_key_value_heads 64 / tp 8 = 8 heads per GPU x head_dim 128 x 2 (K and V) x 2 B (bf16)
    = 4,096 B a token per GPU. 0.5.23 builds it as an MHATokenToKVPool of the draft's own model
    config (kv_cache_configurator.py _build_mha_kv_pool: head_num = get_num_kv_heads(attn_tp_size),
    head_dim, v_head_dim, layer_num), one (size + page_size, head_num, head_dim) buffer for K and
    one for V per layer (memory_pool.py _kv_buffer_shapes)."""
    layers, kv_heads, head_dim = DRAFTER["num_hidden_layers"], DRAFTER["num_key_value_heads"], DRAFTER["head_dim"]
    dtype_bytes = {"bfloat16": 2}[DRAFTER["torch_dtype"]]
    allocated = layers * (kv_heads // 8) * head_dim * 2 * dtype_bytes
    assert (layers, kv_heads, head_dim, dtype_bytes) == (1, 64, 128, 2) and allocated == 4096
    assert kv_cache.drafter_memory(DRAFTER, 8).kv_bytes_per_token == allocated
    configurator = release_text("sglang", "0.5.23", "sglang/srt/mem_cache/kv_cache_configurator.py")
    build = configurator[configurator.index("def _build_mha_kv_pool(") :]
    build = build[: build.index("return token_to_kv_pool")]
    for line in (
        "head_num=self.model_config.get_num_kv_heads(",
        "head_dim=self.model_config.head_dim,",
        "v_head_dim=self.model_config.v_head_dim,",
        "layer_num=self.layer_info.num_effective_layers,",
    ):
        assert line in build, line
    # the draft worker takes the target's token count (memory_pool_config), not a profile of its own
    assert re.search(r"if not self\.spec_algorithm\.is_none\(\) and self\.is_draft_worker:\s+assert", configurator)
    assert "config = self.memory_pool_config" in configurator
    pool = release_text("sglang", "0.5.23", "sglang/srt/mem_cache/memory_pool.py")
    assert re.search(
        r"rows = self\.size \+ self\.page_size\s+return \(\s+\(rows, self\.head_num, self\.head_dim\),"
        r"\s+\(rows, self\.head_num, self\.v_head_dim\),",
        pool,
    )


@pytest.mark.parametrize(("fraction", "tokens"), [(0.92, 198_456), (0.83, 71_825), (0.8, 29_614)])
def test_0523_keeps_what_it_under_charges_for_the_drafters_kv_as_margin(fraction, tokens):
    """0.5.23 charges the draft's layer at the target's per-layer size, int(70,272 x 1 / 61) =
    1,152 B a token, while the draft's pool allocates 4,096 B: tokens x 2,944 B come out of the
    left-over unseen (0.2 GiB at 0.83, 0.54 GiB at 0.92). The margin is held to the allocator's
    per-token size, not to the charge."""
    estimate = _estimate("0.5.23", fraction, True)
    assert estimate.kv_tokens == tokens
    assert estimate.drafter_kv_charged_per_token == 70_272 * 1 // 61 == 1_152
    assert estimate.drafter_kv_margin_bytes == tokens * (4096 - 1152)
    assert estimate.drafter_kv_margin_bytes == tokens * (estimate.drafter.kv_bytes_per_token - 1152)
    pools = release_text("sglang", "0.5.23", "sglang/srt/model_executor/pool_configurator.py")
    assert "assumes the draft shares the target's per-layer KV size" in pools


@pytest.mark.parametrize("version", ["0.5.9", "0.5.10"])
def test_0509_and_0510_charge_the_pool_nothing_and_count_the_whole_drafter_pool_instead(version):
    """0.5.9 / 0.5.10 size the target's pool on the target's layers alone (profile_max_num_token:
    num_layers = num_effective_layers; the draft worker's own num_nextn_predict_layers branch
    only when it is the draft) and the drafter's pool of as many tokens comes out of the
    left-over, which their EAGLE reserve (2 / 4 GiB) is for: no under-charge to keep as a
    margin; its weights and whole pool at 4,096 B a token count against that reserve."""
    estimate = _estimate(version, 0.83, True)
    assert estimate.drafter_kv_charged_per_token == 0 and estimate.drafter_kv_margin_bytes == 0
    assert estimate.drafter_bytes == estimate.drafter.weights_per_gpu + estimate.kv_tokens * 4096
    mixin = release_text("sglang", version, "sglang/srt/model_executor/model_runner_kv_cache_mixin.py")
    profile = mixin[mixin.index("def profile_max_num_token(") :]
    profile = profile[: profile.index("return int(rest_memory")]
    assert "num_layers = self.num_effective_layers" in profile and "draft" not in profile.replace(
        "if self.is_draft_worker:", ""
    )


def test_the_drafters_cuda_graphs_are_reserved_per_captured_set():
    """Two captured sets (draft decode with num_steps > 1, draft extend) at SGLang's 2 MiB per
    batch size, and the triton backends' int64 index buffers of the context: for 48 requests of
    4,096 tokens, 3 steps, topk 1, 4 draft tokens: 96 + 4.5 + 96 + 6 = 202.5 MiB."""
    graphs = kv_cache.drafter_graph_reserve("0.5.23", 48, 4096, 3, 1, 4)
    assert graphs.total_mib == 48 * 2 + 3 * 48 * 4096 * 8 / 2**20 + 48 * 2 + 48 * 4 * 4096 * 8 / 2**20 == 202.5
    one_step = kv_cache.drafter_graph_reserve("0.5.9", 48, 4096, 1, 1, 2)
    assert one_step.total_mib == 48 * 2 + 48 * 2 * 4096 * 8 / 2**20  # no draft decode graphs
    # the model's own context when none is set: Kimi-K2.5's 262,144 tokens of indices
    assert kv_cache.drafter_graph_reserve("0.5.23", 48, 262_144, 3, 1, 4).total_mib == 96 + 288 + 96 + 384


def test_memory_lines_for_0523_with_eagle3_show_the_drafter_margin(configs):
    """At 0.83 with 48 requests of 1,024 tokens: the margin at 71,825 tokens, the graphs at 48
    batch sizes (the running requests clamp cuda_graph_max_bs), both kept beside 0.5.23's reserve
    (it has no drafter term): the largest fraction falls from 0.842 to 0.838."""
    from roles.serving.memory import memory_lines

    settings = {"serving_speculative": SPEC, "serving_context_length": 1024, "serving_mem_fraction_static": 0.83}
    site = _load(configs, "lines.py", stack="sglang-0.5.23-cu130", **settings)
    lines = memory_lines(site.hosts["gpu1"], site.hosts, site.stack, configs.dir)
    (drafter,) = [line for line in lines if line.startswith("drafter")]
    assert "drafter KV margin 71825 tokens x (4096 B allocated - 1152 B charged) = 201.7 MiB" in drafter
    assert "drafter CUDA graphs 194.6 MiB (96.0 MiB draft decode graphs (48 x 2)" in drafter
    assert "396.3 MiB kept beside the release's reserve, which keeps none for the drafter" in drafter
    assert "at most 0.838 leaves its 15456 MiB for activations and CUDA graphs and 396 MiB for the drafter" in lines[0]


def test_memory_lines_for_0510_count_the_drafter_against_its_eagle_reserve(configs):
    from roles.serving.memory import memory_lines

    settings = {"serving_speculative": SPEC, "serving_context_length": 512, "serving_mem_fraction_static": 0.806}
    site = _load(configs, "old.py", stack="sglang-0.5.10-cu128", **settings)
    lines = memory_lines(site.hosts["gpu1"], site.hosts, site.stack, configs.dir)
    (drafter,) = [line for line in lines if line.startswith("drafter")]
    assert "drafter KV margin" not in drafter and "(55319 tokens x 4096 B, not charged to the KV budget)" in drafter
    assert "1424.5 MiB of the release's 4096 MiB EAGLE reserve, 0.0 MiB beyond it" in drafter


def test_0523_refuses_a_fraction_that_leaves_no_room_for_the_drafters_margin(configs):
    """0.842 left the reserve on 0.5.23 with EAGLE-3; with the drafter's KV margin (88,709 tokens
    x 2,944 B = 249.1 MiB at 0.842) and its graphs (194.6 MiB) kept too, it does not."""
    settings = {"serving_speculative": SPEC, "serving_context_length": 1024}
    _load(configs, "fits.py", stack="sglang-0.5.23-cu130", serving_mem_fraction_static=0.837, **settings)
    problems = _refused(configs, stack="sglang-0.5.23-cu130", serving_mem_fraction_static=0.842, **settings)
    assert any("+ 444 MiB the drafter needs beyond that" in p and "<= 0.837" in p for p in problems), problems
