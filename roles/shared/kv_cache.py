"""How many tokens of KV cache SGLang will have per GPU, estimated from the models' config.json
files before any host is touched, and whether the configured context and running requests fit.

SGLang 0.5.9 and 0.5.10 size the target's KV pool alike, once its weights are loaded
(srt/model_executor/model_runner_kv_cache_mixin.py profile_max_num_token; model_runner.py
init_torch_distributed returns `pre`):

    pre           = free GPU memory (GiB) measured after distributed init: the card's total
                    less the CUDA context and NCCL's buffers, already taken (min over ranks)
    post          = free GPU memory after the target's weights are loaded ~ pre - weights
    rest_memory   = post - pre * (1 - mem_fraction_static)
    max_tokens    = int(rest_memory * 2^30) // cell_size
    cell_size     = (kv_lora_rank + qk_rope_head_dim) * num_layers * kv_dtype_bytes     (MLA)
                  = kv_heads_per_gpu * (head_dim + v_head_dim) * num_layers * bytes  (MHA)

(`get_cell_size_per_token`, `profile_max_num_token`; the MLA pool is one buffer per layer of
shape (size + page_size, 1, kv_lora_rank + qk_rope_head_dim), srt/mem_cache/memory_pool.py
MLATokenToKVPool, the same on every GPU: MLA's latent is not split by tensor parallelism.)
`pre` is what the card has left, not the card: nvidia-smi reports 97,887 MiB for the RTX PRO 6000
Blackwell Server Edition (95.6 GiB, not 96), and the driver's reserve, the CUDA context and NCCL
are gone before SGLang measures (CONTEXT_AND_NCCL_GIB: 2 GiB; the deploy's health check prints
SGLang's own "KV Cache is allocated" line beside the estimate, roles/shared/sglang_kv_log.py).
Every request's row in the req-to-token pool holds context_length + 4 + num_draft_tokens
(`extra_max_context_len`, init_memory_pool; 0.5.23: mem_cache/allocation_sizing.py).
The EAGLE drafter is loaded afterwards (srt/speculative/eagle_worker.py passes the target's
memory_pool_config / allocator to the draft ModelRunner): its weights and its own KV pool of
the same token count come out of the pre * (1 - mem_fraction_static) left over, beside CUDA
graphs and activations. SGLang's own default fraction (used only without
--mem-fraction-static, which the project always renders) reserves EAGLE_RESERVE_MIB more for
"eagle draft models and cuda graphs" (server_args.py _handle_gpu_memory_settings): 2 GiB in
0.5.9, 4 GiB in 0.5.10, nothing fixed in 0.5.23 (srt/arg_groups/memory_hook.py).
0.5.23 sizes its pools differently (srt/model_executor/pool_configurator.py charges an EAGLE
draft's layers on the target's cell, at the target's per-layer size: 1,152 B a token for
Kimi-K2.5, where the Llama drafter's own MHA pool allocates 4,096 B; the difference is kept as
the drafter KV margin, KvEstimate.drafter_kv_margin_bytes; srt/mem_cache/kv_cache_configurator.py
may resize after CUDA graph capture); KvEstimate follows its own arithmetic (docs/serving-memory.md).

Weights are counted from config.json: parameter shapes of the DeepSeek-V3 layout (MLA
attention, dense and MoE MLPs, embeddings, lm_head, a vision tower when there is one) at the
checkpoint's dtype, and compressed-tensors' pack-quantized modules at num_bits plus one bf16
scale per group. What SGLang replicates on every GPU (MLA's q_a/kv_a projections, the MoE
router, the vision tower) is counted whole, the rest divided by the tensor-parallel size.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

GIB = 1 << 30
MIB = 1 << 20

# What nvidia-smi reports as memory.total, per card model (the sales figure is in GB of 10^9, the
# card's memory is less than as many GiB). The RTX PRO 6000 Blackwell Server Edition's figure is
# from issue 36's reading of an nvidia-smi capture; the acceptance report confirms it on the target
# (`nvidia-smi --query-gpu=memory.total --format=csv`). Other models fall back to gpu_memory_gib.
CARD_MEMORY_MIB = {"NVIDIA RTX PRO 6000 Blackwell Server Edition": 97887}
# Gone before SGLang measures `pre` (model_runner.py init_torch_distributed: torch.cuda.set_device,
# then init_distributed_environment / initialize_model_parallel: NCCL communicators, custom
# all-reduce buffers), with the driver's reserve that cudaMemGetInfo never reports. Measured: 1.75
# GiB below nvidia-smi's total on one H200 with one NCCL rank. For eight ranks an estimate, not a
# measurement: NCCL's per-peer connection buffers (about 9.2 MiB a connection and channel, NVIDIA/nccl
# src/init.cc DEFAULT_*BUFFSIZE) for up to two communicators, and the custom all-reduce's 8 MiB
# buffers, on top of the one-rank figure (docs/serving-memory.md, "The card and what is gone").
CONTEXT_AND_NCCL_GIB = 2.0
# Rows of the req-to-token pool beyond the context: 4 + speculative_num_draft_tokens in 0.5.9,
# 0.5.10 (model_runner_kv_cache_mixin.py init_memory_pool) and 0.5.23 (allocation_sizing.py).
EXTRA_CONTEXT_TOKENS = 4
# SGLang's own default --mem-fraction-static reserves this much more with EAGLE/EAGLE3
# (server_args.py _handle_gpu_memory_settings); 0.5.23's memory_hook.py has no fixed reserve.
EAGLE_RESERVE_MIB = {"0.5.9": 2048, "0.5.10": 4096, "0.5.23": 0}
# The EAGLE draft worker's CUDA graphs, which no pinned release sizes: 0.5.9 and 0.5.10 fold them
# into EAGLE_RESERVE_MIB ("eagle draft models and cuda graphs"), 0.5.23 only logs what the capture
# took ("Capture draft decode / extend CUDA graph end. ... mem usage", speculative/eagle_worker_v2.py
# _capture_cuda_graphs). Kept per captured set at SGLang's own figure for a decode graph set,
# max_bs x 2 MiB ("For cuda graphs", the same rule as Reserve's), plus the index buffers the
# draft's attention backend allocates for capture (drafter_graph_reserve).
GRAPH_MIB_PER_BS = 2
KV_INDEX_BYTES = 8  # int64 cuda_graph_kv_indices (layers/attention/triton_backend.py)
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "fp8_e4m3": 1, "fp8_e5m2": 1}


@dataclass(frozen=True)
class ModelMemory:
    weights_per_gpu: int  # bytes
    kv_bytes_per_token: int  # per GPU
    layers: int = 0  # decoder layers: 0.5.23 grows the target's cell by draft layers / target layers
    multimodal: bool = False  # a vision tower: 0.5.23 keeps 100 MiB of the KV budget for it


def _text(config: dict) -> dict:
    return config.get("text_config") or config


def _dtype_bytes(config: dict) -> int:
    dtype = (
        _text(config).get("dtype")
        or _text(config).get("torch_dtype")
        or config.get("dtype")
        or config.get("torch_dtype")
        or "bfloat16"
    )
    return DTYPE_BYTES.get(str(dtype), 2)


def _quantized_bytes_per_param(config: dict, module: str) -> float | None:
    """compressed-tensors pack-quantized: num_bits per weight plus a bf16 scale per group
    (symmetric: no zero point); None when the module is in `ignore` or nothing is quantized."""
    quant = config.get("quantization_config") or _text(config).get("quantization_config")
    if not quant or quant.get("quant_method") != "compressed-tensors":
        return None
    for pattern in quant.get("ignore") or []:
        if (pattern.startswith("re:") and re.match(pattern[3:], module)) or pattern == module:
            return None
    for group in (quant.get("config_groups") or {}).values():
        weights = group.get("weights") or {}
        if "Linear" in (group.get("targets") or []) and weights.get("num_bits"):
            scale = 0 if not weights.get("group_size") else 2 / weights["group_size"]
            zero = 0 if weights.get("symmetric", True) else scale
            return weights["num_bits"] / 8 + scale + zero
    return None


def _linear(config: dict, module: str, params: int) -> float:
    per_param = _quantized_bytes_per_param(config, module)
    return params * (per_param if per_param is not None else _dtype_bytes(config))


def _vision_params(config: dict) -> int:
    """MoonViT-style tower (Kimi-K2.5's vision_config): layers of attention (4 h^2) and MLP
    (2 h i), and the patch-merger projector into the text model."""
    vision = config.get("vision_config")
    if not vision:
        return 0
    h = vision.get("vt_hidden_size") or vision.get("hidden_size") or 0
    inter = vision.get("vt_intermediate_size") or vision.get("intermediate_size") or 0
    layers = vision.get("vt_num_hidden_layers") or vision.get("num_hidden_layers") or 0
    merge = 1
    for side in vision.get("merge_kernel_size") or [1]:
        merge *= side
    text_h = vision.get("text_hidden_size") or _text(config).get("hidden_size", 0)
    return layers * (4 * h * h + 2 * h * inter) + (h * merge) ** 2 + h * merge * text_h


def target_memory(config: dict, tp_size: int) -> ModelMemory:
    """A DeepSeek-V3-layout target (DeepseekV3ForCausalLM, or wrapped as Kimi-K2.5's
    text_config): weights per GPU and MLA KV bytes per token (the same on every GPU)."""
    t = _text(config)
    h, layers, vocab = t["hidden_size"], t["num_hidden_layers"], t["vocab_size"]
    heads, nope, rope, v = t["num_attention_heads"], t["qk_nope_head_dim"], t["qk_rope_head_dim"], t["v_head_dim"]
    q_lora, kv_lora = t.get("q_lora_rank"), t["kv_lora_rank"]
    prefix = "language_model.model.layers" if config.get("text_config") else "model.layers"
    dtype = _dtype_bytes(config)

    def attn(name: str, params: int) -> float:
        return _linear(config, f"{prefix}.1.self_attn.{name}", params)

    # SGLang's DeepseekV2AttentionMLA: fused_qkv_a_proj_with_mqa is a ReplicatedLinear.
    replicated = attn("kv_a_proj_with_mqa", h * (kv_lora + rope)) * layers
    if q_lora:
        replicated += attn("q_a_proj", h * q_lora) * layers
        sharded = attn("q_b_proj", q_lora * heads * (nope + rope)) * layers
    else:
        sharded = attn("q_proj", h * heads * (nope + rope)) * layers
    sharded += (attn("kv_b_proj", kv_lora * heads * (nope + v)) + attn("o_proj", heads * v * h)) * layers
    dense = min(t.get("first_k_dense_replace", layers), layers)
    sharded += dense * _linear(config, f"{prefix}.0.mlp.gate_proj", 3 * h * t["intermediate_size"])
    moe_layers = layers - dense
    if moe_layers and t.get("n_routed_experts"):
        moe = t["moe_intermediate_size"]
        experts = _linear(config, f"{prefix}.1.mlp.experts.0.gate_proj", 3 * h * moe) * t["n_routed_experts"]
        shared = _linear(config, f"{prefix}.1.mlp.shared_experts.gate_proj", 3 * h * moe) * t.get("n_shared_experts", 0)
        sharded += (experts + shared) * moe_layers
        replicated += t["n_routed_experts"] * h * dtype * moe_layers  # the router (MoEGate)
    sharded += vocab * h * dtype  # VocabParallelEmbedding
    sharded += _linear(config, "lm_head", vocab * h) if not t.get("tie_word_embeddings") else 0
    replicated += _vision_params(config) * dtype
    weights = int(replicated + sharded / tp_size)
    return ModelMemory(weights, (kv_lora + rope) * layers * dtype, layers, bool(config.get("vision_config")))


def drafter_memory(config: dict, tp_size: int) -> ModelMemory:
    """An EAGLE-3 drafter (LlamaForCausalLMEagle3) as resident when the pools are sized: its
    decoder layer(s) reading 2 * hidden, the fc joining the target's three captured hidden states
    (replicated), its RMSNorms, and the embedding (vocab_size) and lm_head (draft_vocab_size, else
    vocab_size) that models/llama_eagle3.py allocates at construction. Both are swapped for the
    target's only after the pools: 0.5.9 / 0.5.10 speculative/eagle_worker.py set_embed(_and_head)
    after the draft ModelRunner's init_memory_pool; 0.5.23 eagle_worker_v2.py alloc_memory_pool ->
    init_lm_head, after the target's pool is sized (managers/scheduler.py init_memory_pools).
    KV: an MHA pool of the drafter's layers with its KV heads split by tensor parallelism."""
    h, inter = config["hidden_size"], config["intermediate_size"]
    heads, kv_heads = config["num_attention_heads"], config.get("num_key_value_heads", config["num_attention_heads"])
    head_dim = config.get("head_dim") or h // heads
    layers = config.get("num_hidden_layers", 1)
    vocab = config.get("draft_vocab_size") or config["vocab_size"]
    dtype = _dtype_bytes(config)
    layer = 2 * h * heads * head_dim + 2 * (2 * h * kv_heads * head_dim) + heads * head_dim * h + 3 * h * inter
    sharded = (layers * layer + (config["vocab_size"] + vocab) * h) * dtype  # + embedding, lm_head
    # fc; RMSNorms: input_layernorm, hidden_norm, post_attention_layernorm per layer, the final norm
    replicated = (3 * h * h + (3 * layers + 1) * h) * dtype
    kv_per_gpu = max(kv_heads // tp_size, 1)
    return ModelMemory(int(replicated + sharded / tp_size), kv_per_gpu * 2 * head_dim * layers * dtype, layers)


# srt/utils/hf_transformers_utils.py get_context_length (0.5.10): the first of these keys, times
# a rope_scaling factor unless the scaling names its original length (or is llama3); else 2048.
CONTEXT_LENGTH_KEYS = (
    "max_sequence_length",
    "seq_length",
    "max_seq_len",
    "model_max_length",
    "max_position_embeddings",
)


def model_context_length(config: dict) -> int:
    """The context SGLang serves the model at without --context-length."""
    text = _text(config)
    scaling = text.get("rope_scaling") or {}
    factor = scaling.get("factor", 1) if scaling else 1
    if "original_max_position_embeddings" in scaling or scaling.get("rope_type") == "llama3":
        factor = 1
    for key in CONTEXT_LENGTH_KEYS:
        if text.get(key) is not None:
            return int(factor * text[key])
    return 2048


def card_memory_bytes(model: str, memory_gib: int) -> int:
    """The card's memory as nvidia-smi reports it (CARD_MEMORY_MIB), else gpu_memory_gib."""
    mib = CARD_MEMORY_MIB.get(model)
    return mib * MIB if mib else memory_gib * GIB


def before_load_bytes(model: str, memory_gib: int) -> int:
    """What SGLang measures as free before loading: the card less the CUDA context and NCCL."""
    return card_memory_bytes(model, memory_gib) - int(CONTEXT_AND_NCCL_GIB * GIB)


def profile_max_num_token(pre_gib: float, post_gib: float, mem_fraction_static: float, cell_size: int) -> int:
    """model_runner_kv_cache_mixin.py profile_max_num_token (0.5.9, 0.5.10), its arithmetic
    verbatim: GiB floats as get_available_gpu_memory returns them."""
    rest_memory = post_gib - pre_gib * (1 - mem_fraction_static)
    return int(rest_memory * (1 << 30)) // cell_size


# The pinned releases whose accounting this module reproduces; another release is read with the
# rules of the newest pinned one not after it (release_rules).
RELEASES = ("0.5.9", "0.5.10", "0.5.23")
# 0.5.23 mem_cache/kv_cache_configurator.py mm_runtime_reservation_gb: SGLANG_VLM_CACHE_SIZE_MB
# (srt/environ.py, default 100) out of the KV budget of a multimodal model (the feature-transport
# pool's 1 GiB only with --mm-feature-transport cuda_ipc/cuda_vmm, which the project never renders).
MULTIMODAL_RESERVE_MIB = {"0.5.9": 0, "0.5.10": 0, "0.5.23": 100}
# Kept below the release's figure when checking a fit: the weights are counted from config.json
# to within 0.5 % (0.36 GiB per GPU for Kimi-K2.5 at TP 8) and CONTEXT_AND_NCCL_GIB is measured
# on one rank (1.75 GiB) and estimated for eight. The KV fit asks for its tokens with this much less
# memory. (The drafter's under-charged KV is kept apart: KvEstimate.drafter_kv_margin_bytes.)
KV_MARGIN_GIB = 1.0


def release_rules(version: str | None) -> str:
    """The pinned release whose accounting applies to version: 0.5.9's before 0.5.10, 0.5.10's
    before 0.5.23, 0.5.23's from there on."""
    found = tuple(int(part) for part in re.findall(r"\d+", version or "")[:3]) or (0, 5, 9)
    return "0.5.9" if found < (0, 5, 10) else "0.5.10" if found < (0, 5, 23) else "0.5.23"


@dataclass(frozen=True)
class ModelFacts:
    """What SGLang's default fraction reads of the model; None where no config.json copy says
    (the larger reserve is taken then)."""

    mla: bool | None = None
    multimodal: bool | None = None
    vision_layers: int = 24  # getattr(vision_config, "num_hidden_layers", 24)
    vision_hidden: int = 1024


def model_facts(config: dict | None) -> ModelFacts:
    if not config:
        return ModelFacts()
    vision = config.get("vision_config") or {}
    # SGLang's KimiK25VisionConfig defaults num_hidden_layers 27 / hidden_size 1152, the values
    # of the checkpoint's vt_num_hidden_layers / vt_hidden_size (srt/configs/kimi_k25.py).
    return ModelFacts(
        mla="kv_lora_rank" in _text(config),
        multimodal=bool(vision),
        vision_layers=int(vision.get("num_hidden_layers") or vision.get("vt_num_hidden_layers") or 24),
        vision_hidden=int(vision.get("hidden_size") or vision.get("vt_hidden_size") or 1024),
    )


def _capacity_defaults(release: str, card_mib: int, tp_size: int) -> tuple[int, int]:
    """(chunked_prefill_size, cuda_graph_max_bs) SGLang picks for the card's memory: 0.5.9 and
    0.5.10 server_args.py _handle_gpu_memory_settings, 0.5.23 arg_groups/memory_hook.py
    handle_gpu_memory_settings (the same brackets but 20-35 GB)."""
    small = tp_size < 4
    if card_mib < 20 * 1024:
        return 2048, 8
    if card_mib < 35 * 1024:
        return (4096, 48 if small else 160) if release == "0.5.23" else (2048, 24 if small else 80)
    if card_mib < 60 * 1024:
        return 4096, 32 if small else 160
    if card_mib < 160 * 1024:
        return 8192, 256 if small else 512
    return 16384, 512


def _prefill_graph_tokens(max_tokens: int) -> int:
    """How many prefill shapes are captured: 0.5.10 _generate_piecewise_cuda_graph_tokens,
    0.5.23 cuda_graph_hook.py generate_prefill_cuda_graph_batch_sizes (the same list)."""
    sizes = (
        list(range(4, 33, 4))
        + list(range(48, 257, 16))
        + list(range(288, 513, 32))
        + list(range(576, 1025, 64))
        + list(range(1280, 4097, 256))
        + list(range(4608, max_tokens + 1, 512))
    )
    return len([size for size in sizes if size <= max_tokens])


@dataclass(frozen=True)
class Reserve:
    """What a release keeps outside weights and KV cache for activations and CUDA graphs, in
    MiB of the card's total (nvidia-smi's, `get_device_memory_capacity`), as its own default
    --mem-fraction-static computes it: (card - reserved) / card."""

    release: str
    card_mib: int
    chunked_prefill_size: int
    cuda_graph_max_bs: int
    parts: tuple[tuple[str, float], ...]  # (what, MiB), summed before the floor
    floor_mib: float  # at least this much on a card over 60 GiB
    speculative_mib: float  # 0.5.9 / 0.5.10: "eagle draft models and cuda graphs", after the floor

    @property
    def activations_and_graphs_mib(self) -> float:
        return max(sum(mib for _, mib in self.parts), self.floor_mib)

    @property
    def total_mib(self) -> float:
        return self.activations_and_graphs_mib + self.speculative_mib

    def largest_fraction(self, extra_mib: float = 0.0) -> float:
        """The largest --mem-fraction-static (three decimals) that leaves the reserve."""
        return math.floor((self.card_mib - self.total_mib - extra_mib) / self.card_mib * 1000) / 1000

    def explain(self) -> str:
        parts = " + ".join(f"{mib:g} MiB {what}" for what, mib in self.parts)
        text = f"{parts} = {sum(mib for _, mib in self.parts):g} MiB"
        if self.floor_mib:
            text += f" (at least {self.floor_mib:g} MiB on a card over 60 GiB)"
        if self.speculative_mib:
            text += f" + {self.speculative_mib:g} MiB for the EAGLE drafter"
        return text


def sglang_reserve(
    version: str | None,
    card_mib: int,
    tp_size: int,
    *,
    chunked_prefill_size: int | None = None,
    cuda_graph_max_bs: int | None = None,
    max_running_requests: int | None = None,
    speculative: bool = False,
    model: ModelFacts = ModelFacts(),
) -> Reserve:
    """The release's reserved_mem for the rendered command line (no pipeline or data-parallel
    attention, no DeepEP, no --cuda-graph-bs list: the project renders none of them)."""
    release = release_rules(version)
    chunk_default, bs_default = _capacity_defaults(release, card_mib, tp_size)
    chunk = chunked_prefill_size or chunk_default
    max_bs = cuda_graph_max_bs or bs_default
    if release == "0.5.23" and cuda_graph_max_bs is None and max_running_requests is not None:
        max_bs = min(max_bs, max_running_requests)  # memory_hook.py: a default max_bs above the cap
    parts: list[tuple[str, float]] = [
        ("metadata", 512),
        (f"activations (chunked_prefill_size {chunk} x 1.5)", max(chunk, 2048) * 1.5),
    ]
    graphs = max_bs * 2.0
    # MLA's prefill graphs: 1.5 GiB ("much higher than expected"); else 8 MiB per captured shape.
    # Unknown model: the larger, MLA's.
    prefill = 1.5 * 1024 if model.mla is not False else _prefill_graph_tokens(chunk) * 8.0
    if release == "0.5.10" and not speculative and model.multimodal is not True:
        graphs += prefill  # piecewise CUDA graphs: off with a drafter or a multimodal model
    if release == "0.5.23":
        graphs += prefill  # the prefill graph is on by default
    parts.append(
        (f"CUDA graphs (cuda_graph_max_bs {max_bs} x 2{' + prefill graphs' if graphs > max_bs * 2 else ''})", graphs)
    )
    parts.append((f"for tp {tp_size}", tp_size / 8 * 1024))
    floor = 10 * 1024 if card_mib > 60 * 1024 else 0
    spec = {"0.5.9": 2048, "0.5.10": 4096, "0.5.23": 0}[release] if speculative else 0
    return Reserve(release, card_mib, chunk, max_bs, tuple(parts), floor, spec)


@dataclass(frozen=True)
class DrafterGraphs:
    """What the EAGLE draft worker's CUDA graphs take beyond the target's, in MiB per GPU: the
    draft-decode set (captured only with num_steps > 1) and the draft-extend set, each at
    GRAPH_MIB_PER_BS per batch size, and the index buffers their triton backends allocate at
    capture (the project's default backend; taken for any backend):

    - draft decode, TritonMultiStepDraftBackend.init_cuda_graph_state: (num_steps, max_bs x topk
      x context) int64 (0.5.23: spec_utils.py draft_kv_indices_buffer_width);
    - draft extend, TritonAttnBackend.init_cuda_graph_state: max_bs x width x context int64, width
      num_steps + 1 (0.5.9 / 0.5.10 eagle_draft_extend_cuda_graph_runner.py num_tokens_per_bs) or
      num_draft_tokens (0.5.23 resolve_num_tokens_per_req("draft_extend")).

    max_bs: the decode graphs' cuda_graph_max_bs clamped to the running requests
    (get_batch_sizes_to_capture: capture_bs <= req_to_token_pool.size, which is max_num_reqs);
    context: the target's context length, which the draft worker is built with (0.5.9 / 0.5.10
    speculative/eagle_worker.py, 0.5.23 draft_worker_common.py)."""

    max_bs: int
    context: int
    parts: tuple[tuple[str, float], ...]

    @property
    def total_mib(self) -> float:
        return sum(mib for _, mib in self.parts)

    def explain(self) -> str:
        return " + ".join(f"{mib:.1f} MiB {what}" for what, mib in self.parts)


def drafter_graph_reserve(
    version: str | None, max_bs: int, context: int, num_steps: int, topk: int, num_draft_tokens: int
) -> DrafterGraphs:
    release = release_rules(version)
    parts: list[tuple[str, float]] = []
    if num_steps > 1:
        parts.append((f"draft decode graphs ({max_bs} x {GRAPH_MIB_PER_BS})", max_bs * GRAPH_MIB_PER_BS))
        indices = num_steps * max_bs * topk * context * KV_INDEX_BYTES / MIB
        parts.append((f"draft decode kv indices ({num_steps} x {max_bs} x {topk} x {context} x 8 B)", indices))
    width = num_draft_tokens if release == "0.5.23" else num_steps + 1
    parts.append((f"draft extend graphs ({max_bs} x {GRAPH_MIB_PER_BS})", max_bs * GRAPH_MIB_PER_BS))
    indices = max_bs * width * context * KV_INDEX_BYTES / MIB
    parts.append((f"draft extend kv indices ({max_bs} x {width} x {context} x 8 B)", indices))
    return DrafterGraphs(max_bs, context, tuple(parts))


def vlm_factor(model: ModelFacts) -> float:
    """adjust_mem_fraction_for_vlm (0.5.9, 0.5.10 server_args.py; 0.5.23 memory_hook.py): SGLang's
    own default is cut for a multimodal model by 0.95 x a factor of the vision tower's size."""
    if not model.multimodal:
        return 1.0
    ratio = model.vision_layers * model.vision_hidden**2 / (24 * 1024**2)
    return 0.95 * max(0.8, min(1.05, 1.0 - 0.1 * (ratio - 1.0)))


def sglang_default_fraction(reserve: Reserve, model: ModelFacts) -> float:
    """What the release picks without --mem-fraction-static: round((card - reserved) / card, 3),
    times vlm_factor for a multimodal model."""
    return round((reserve.card_mib - reserve.total_mib) / reserve.card_mib, 3) * vlm_factor(model)


@dataclass(frozen=True)
class KvEstimate:
    """The target's KV pool per GPU as the release sizes it.

    0.5.9, 0.5.10 (model_runner_kv_cache_mixin.py profile_max_num_token): after the target's
    weights, before the drafter is built: rest = (pre - target weights) - pre * (1 - fraction);
    the drafter's weights and its own KV pool then come out of pre * (1 - fraction).
    0.5.23 (managers/scheduler.py: the draft worker is built before init_memory_pools;
    mem_cache/kv_cache_configurator.py _profile_available_bytes): rest = (pre - target weights -
    draft weights) - pre * (1 - fraction) - 100 MiB for a multimodal model, and the cell grows by
    int(cell x draft layers / target layers) (model_executor/pool_configurator.py
    DefaultPoolConfigurator: the draft's pool lives in the same budget)."""

    before_load_bytes: int  # free memory SGLang measures before loading (before_load_bytes())
    mem_fraction_static: float
    target: ModelMemory
    drafter: ModelMemory | None
    release: str = "0.5.10"

    @property
    def rules(self) -> str:
        return release_rules(self.release)

    @property
    def loaded_before_pool_bytes(self) -> int:
        """Weights resident when the target's pool is sized."""
        draft = self.drafter.weights_per_gpu if self.drafter is not None and self.rules == "0.5.23" else 0
        return self.target.weights_per_gpu + draft

    @property
    def multimodal_reserve_bytes(self) -> int:
        return MULTIMODAL_RESERVE_MIB[self.rules] * MIB if self.target.multimodal else 0

    def _rest_gib(self) -> float:
        pre = self.before_load_bytes / GIB
        post = (self.before_load_bytes - self.loaded_before_pool_bytes) / GIB
        return post - pre * (1 - self.mem_fraction_static) - self.multimodal_reserve_bytes / GIB

    @property
    def cell_bytes(self) -> int:
        """Bytes of the pool per token: the target's, and on 0.5.23 the draft's layers on it."""
        cell = self.target.kv_bytes_per_token
        if self.rules == "0.5.23" and self.drafter is not None and self.target.layers:
            cell += int(cell * self.drafter.layers / self.target.layers)
        return cell

    @property
    def kv_bytes(self) -> int:
        """Memory SGLang gives the KV pool on each GPU: rest_memory."""
        return int(self._rest_gib() * GIB)

    @property
    def kv_tokens(self) -> int:
        return max(int(self._rest_gib() * (1 << 30)) // self.cell_bytes, 0)

    @property
    def kv_tokens_with_margin(self) -> int:
        """The tokens with KV_MARGIN_GIB less memory: what a configured fit is held to."""
        return max(int((self._rest_gib() - KV_MARGIN_GIB) * (1 << 30)) // self.cell_bytes, 0)

    @property
    def headroom_bytes(self) -> int:
        """What is left after the static part, pre * (1 - mem_fraction_static): CUDA graphs,
        activations, and on 0.5.9 / 0.5.10 the drafter's weights and KV pool."""
        return int(self.before_load_bytes * (1 - self.mem_fraction_static))

    @property
    def drafter_bytes(self) -> int:
        """The drafter's share of the left-over on 0.5.9 / 0.5.10 (its weights and its whole KV
        pool: they charge the target's pool nothing for it). 0.5.23 charges its weights before
        the pools and its KV on the target's cell: what that under-charges is
        drafter_kv_margin_bytes."""
        if self.drafter is None or self.rules == "0.5.23":
            return 0
        return self.drafter.weights_per_gpu + self.kv_tokens * self.drafter.kv_bytes_per_token

    @property
    def drafter_kv_charged_per_token(self) -> int:
        """What the release charges the target's pool per token for the draft's KV: 0.5.23
        int(target cell x draft layers / target layers) (pool_configurator.py
        DefaultPoolConfigurator, "assumes the draft shares the target's per-layer KV size"):
        1,152 B for Kimi-K2.5's 70,272 B over 61 layers; 0.5.9 / 0.5.10 nothing."""
        return self.cell_bytes - self.target.kv_bytes_per_token

    @property
    def drafter_kv_margin_bytes(self) -> int:
        """What the draft's own pool allocates beyond its charge, kept outside the KV budget:
        tokens x (allocated - charged) per token on a release that under-charges (0.5.23: the
        draft worker's MHATokenToKVPool of the target's max_total_num_tokens, kv_cache_configurator.py
        configure -> _build_mha_kv_pool: kv heads per GPU x (head_dim + v_head_dim) x layers x
        dtype bytes, 4,096 B for the Llama drafter at TP 8). Nothing on 0.5.9 / 0.5.10, whose
        drafter_bytes already counts the whole pool against their EAGLE reserve."""
        if self.drafter is None or self.rules != "0.5.23":
            return 0
        return self.kv_tokens * max(self.drafter.kv_bytes_per_token - self.drafter_kv_charged_per_token, 0)


def gib(value: float) -> str:
    return f"{value / GIB:.1f} GiB"


def card_mib(model: str, memory_gib: int) -> int:
    return card_memory_bytes(model, memory_gib) // MIB


def site_estimate(host, inventory_dir, version: str | None = None) -> KvEstimate | None:
    """The estimate for a gpu node of the site model, from the target's and the drafter's
    config.json beside the inventory (serving_speculative); None without both, or for a
    target the estimate does not know. The deploy's note and the acceptance report share it."""
    from pathlib import Path

    from roles.shared import eagle3

    spec = host.speculative
    if spec is None or not (spec.draft_config and spec.target_config):
        return None
    try:
        target = eagle3.read_config(Path(inventory_dir) / spec.target_config)
        drafter = eagle3.read_config(Path(inventory_dir) / spec.draft_config)
        return KvEstimate(
            before_load_bytes(host.gpu.model, host.gpu.memory_gib),
            host.serving.mem_fraction_static,
            target_memory(target, host.gpu.count),
            drafter_memory(drafter, host.gpu.count),
            version or "0.5.10",
        )
    except (eagle3.ConfigError, KeyError, TypeError, ZeroDivisionError):
        return None
