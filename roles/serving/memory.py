"""GPU memory at start-up, from the pinned SGLang release's own arithmetic (roles/shared/kv_cache.py),
checked on every gpu node while the inventory is validated, before any host is touched.

1. serving_mem_fraction_static against what the release itself keeps outside weights and KV cache
   for activations and CUDA graphs at the configured cuda_graph_max_bs and chunked_prefill_size
   (0.5.9 / 0.5.10 server_args.py, 0.5.23 arg_groups/memory_hook.py: the reserve its own default
   fraction is computed from), plus what the EAGLE drafter takes of the same left-over beyond the
   release's own drafter reserve: on 0.5.9 / 0.5.10 its weights and KV pool, on 0.5.23 the KV its
   pool allocates beyond what the target's cell charges for it (the drafter KV margin), on every
   release its CUDA graphs (kv_cache.drafter_graph_reserve). A larger fraction is refused with the
   largest that fits: on the target a CUDA graph capture that does not fit is an out-of-memory at
   start-up, after the model's long load. Needs no config.json; without one the larger reserve
   is taken (an MLA model's prefill graphs).
2. With the served model's config.json copy (serving_model_config_json, else serving_speculative's
   target_config): the KV pool the
   release will size and, with a drafter or with serving_context_length / serving_max_running_requests
   set, the configured requests x context against it, kv_cache.KV_MARGIN_GIB kept as a margin.
   Without a drafter and with neither set, SGLang derives both from the pool (0.5.9 tp_worker.py:
   max_req_len = min(context_len - 1, max_token_pool_size - 1)): nothing to refuse.

memory_lines(): the inventory's fraction beside SGLang's own default for the card, for
`inference-host validate`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from roles.serving.command import node_topology
from roles.serving.speculative import effective_max_running_requests
from roles.shared import eagle3, kv_cache
from roles.site import HostSettings, Stack

SOURCE = {
    "0.5.9": "server_args.py _handle_gpu_memory_settings",
    "0.5.10": "server_args.py _handle_gpu_memory_settings",
    "0.5.23": "srt/arg_groups/memory_hook.py handle_gpu_memory_settings",
}


class MemoryConfigError(Exception):
    """serving_model_config_json names no readable config.json."""


@dataclass(frozen=True)
class Memory:
    version: str
    card_mib: int
    tp_size: int
    reserve: kv_cache.Reserve
    facts: kv_cache.ModelFacts
    estimate: kv_cache.KvEstimate | None  # None without the target's config.json copy
    target: dict | None


def host_memory(host: HostSettings, hosts: dict[str, HostSettings], stack: Stack, inventory_dir: Path) -> Memory | None:
    """The release's accounting for this gpu node; None on a vLLM stack (its own setting)."""
    active = stack.active
    if active.engine != "sglang":
        return None
    version = active.sglang or ""
    serving, spec = host.serving, host.speculative
    tp_size = node_topology(host, hosts)[0]
    target = drafter = None
    target_file = serving.model_config_json or (spec.target_config if spec is not None else None)
    try:
        if target_file:
            target = eagle3.read_config(inventory_dir / target_file)
        if spec is not None and spec.draft_config:
            drafter = eagle3.read_config(inventory_dir / spec.draft_config)
    except eagle3.ConfigError as error:
        if serving.model_config_json and target is None:
            # the reason without the path, which is shown once, escaped
            reason = str(error).removeprefix(f"{inventory_dir / serving.model_config_json}: ")
            raise MemoryConfigError(f"serving_model_config_json = {serving.model_config_json!r}: {reason}") from None
        target = drafter = None  # the speculative check names the file
    facts = kv_cache.model_facts(target)
    card = kv_cache.card_mib(host.gpu.model, host.gpu.memory_gib)
    reserve = kv_cache.sglang_reserve(
        version,
        card,
        tp_size,
        chunked_prefill_size=serving.chunked_prefill_size,
        cuda_graph_max_bs=serving.cuda_graph_max_bs,
        max_running_requests=effective_max_running_requests(serving.max_running_requests, serving.speculative),
        speculative=spec is not None,
        model=facts,
    )
    estimate = None
    if target is not None and facts.mla:
        try:
            estimate = kv_cache.KvEstimate(
                kv_cache.before_load_bytes(host.gpu.model, host.gpu.memory_gib),
                serving.mem_fraction_static,
                kv_cache.target_memory(target, tp_size),
                kv_cache.drafter_memory(drafter, tp_size) if drafter is not None else None,
                version,
            )
        except (KeyError, TypeError, ZeroDivisionError):
            estimate = None
    return Memory(version, card, tp_size, reserve, facts, estimate, target)


def memory_problems(host: HostSettings, hosts: dict[str, HostSettings], stack: Stack, inventory_dir: Path) -> list[str]:
    """Registered with the site model's rules by validation.py (RoleChecks.memory)."""
    try:
        memory = host_memory(host, hosts, stack, inventory_dir)
    except MemoryConfigError as error:
        return [f"{error}; expected the path (relative to the inventory) of a copy of the served model's config.json"]
    if memory is None:
        return []
    problems = _fraction_problems(host, memory)
    if memory.estimate is not None:
        problems += _kv_problems(host, memory, memory.estimate)
    return problems


@dataclass(frozen=True)
class Drafter:
    """What the EAGLE drafter takes of the left-over, pre * (1 - mem_fraction_static), beside the
    release's reserve: on 0.5.9 / 0.5.10 its weights and whole KV pool (the release charges the
    target's pool nothing for it), on 0.5.23 the KV its pool allocates beyond what the target's
    cell charges for it (the margin); on every release its CUDA graphs. beyond_mib: what of that
    the release's own drafter reserve (2 / 4 / 0 GiB) does not hold."""

    resident_mib: float  # 0.5.9 / 0.5.10: weights + its KV pool
    kv_margin_mib: float  # 0.5.23: tokens x (allocated - charged)
    graphs: kv_cache.DrafterGraphs
    reserve_mib: float

    @property
    def total_mib(self) -> float:
        return self.resident_mib + self.kv_margin_mib + self.graphs.total_mib

    @property
    def beyond_mib(self) -> float:
        return max(self.total_mib - self.reserve_mib, 0.0)


def _drafter(host: HostSettings, memory: Memory) -> Drafter | None:
    """The drafter's share; None without serving_speculative or without both config.json copies."""
    estimate, spec = memory.estimate, host.speculative
    if estimate is None or estimate.drafter is None or spec is None or memory.target is None:
        return None
    running = effective_max_running_requests(host.serving.max_running_requests, host.serving.speculative)
    max_bs = min(memory.reserve.cuda_graph_max_bs, running) if running else memory.reserve.cuda_graph_max_bs
    context = host.serving.context_length or kv_cache.model_context_length(memory.target)
    graphs = kv_cache.drafter_graph_reserve(
        memory.version, max_bs, context, spec.num_steps, spec.eagle_topk, spec.num_draft_tokens
    )
    return Drafter(
        estimate.drafter_bytes / kv_cache.MIB,
        estimate.drafter_kv_margin_bytes / kv_cache.MIB,
        graphs,
        memory.reserve.speculative_mib,
    )


def _drafter_beyond_reserve_mib(host: HostSettings, memory: Memory) -> float:
    drafter = _drafter(host, memory)
    return drafter.beyond_mib if drafter is not None else 0.0


def _fraction_problems(host: HostSettings, memory: Memory) -> list[str]:
    fraction, reserve = host.serving.mem_fraction_static, memory.reserve
    extra = _drafter_beyond_reserve_mib(host, memory)
    fits = reserve.largest_fraction(extra)
    if fraction <= fits:
        return []
    drafter = (
        f" + {extra:.0f} MiB the drafter needs beyond that (weights and KV pool not charged to the"
        " KV budget, CUDA graphs)"
        if extra
        else ""
    )
    return [
        f"serving_mem_fraction_static {fraction:g} leaves {(1 - fraction) * memory.card_mib:.0f} MiB of the"
        f" {memory.card_mib} MiB card outside weights and KV cache; sglang {memory.version} keeps"
        f" {reserve.total_mib + extra:.0f} MiB for activations and CUDA graphs at cuda_graph_max_bs"
        f" {reserve.cuda_graph_max_bs} and chunked_prefill_size {reserve.chunked_prefill_size}"
        f" ({reserve.explain()}{drafter}; {SOURCE[reserve.release]});"
        f" expected serving_mem_fraction_static <= {fits:g}, or a smaller serving_cuda_graph_max_bs or"
        " serving_chunked_prefill_size (docs/serving-memory.md)"
    ]


def _how(host: HostSettings, memory: Memory, estimate: kv_cache.KvEstimate) -> str:
    text = kv_cache._text(memory.target or {})
    loaded = (
        "target weights"
        if estimate.loaded_before_pool_bytes == estimate.target.weights_per_gpu
        else "target and draft weights"
    )
    multimodal = (
        f" - {kv_cache.MULTIMODAL_RESERVE_MIB[estimate.rules]} MiB for multimodal inputs"
        if estimate.multimodal_reserve_bytes
        else ""
    )
    cell = (
        f"(kv_lora_rank {text['kv_lora_rank']} + qk_rope_head_dim {text['qk_rope_head_dim']})"
        f" x {text['num_hidden_layers']} layers x 2 B"
    )
    if estimate.cell_bytes != estimate.target.kv_bytes_per_token:
        layers = estimate.drafter.layers if estimate.drafter else 0
        cell += f" + the draft's {layers} layer(s) at the target's per-layer size"
    return (
        f"{host.serving.mem_fraction_static:g} x {kv_cache.gib(estimate.before_load_bytes)} free before loading"
        f" ({memory.card_mib} MiB card - {kv_cache.CONTEXT_AND_NCCL_GIB:g} GiB CUDA context and NCCL)"
        f" - {kv_cache.gib(estimate.loaded_before_pool_bytes)} of {loaded} per GPU{multimodal}"
        f" = {kv_cache.gib(estimate.kv_bytes)} = {estimate.kv_tokens} tokens at {estimate.cell_bytes} B ({cell});"
        f" {kv_cache.KV_MARGIN_GIB:g} GiB kept as margin: {estimate.kv_tokens_with_margin} tokens"
    )


def _kv_problems(host: HostSettings, memory: Memory, estimate: kv_cache.KvEstimate) -> list[str]:
    serving, spec = host.serving, host.speculative
    pre = kv_cache.gib(estimate.before_load_bytes)
    if estimate.kv_bytes <= 0:
        return [
            f"the weights alone, {kv_cache.gib(estimate.loaded_before_pool_bytes)} per GPU over tp"
            f" {memory.tp_size}, exceed serving_mem_fraction_static {serving.mem_fraction_static:g}"
            f" x the {pre} free before loading on sglang {memory.version}; expected more GPUs or larger ones"
            " (docs/serving-memory.md)"
        ]
    if spec is None and serving.context_length is None and serving.max_running_requests is None:
        return []  # SGLang sizes both from the pool
    assert memory.target is not None  # an estimate is made from it
    context = serving.context_length or kv_cache.model_context_length(memory.target)
    running = effective_max_running_requests(serving.max_running_requests, serving.speculative) or 1
    draft = spec.num_draft_tokens if spec is not None else 0
    extra = kv_cache.EXTRA_CONTEXT_TOKENS + draft  # each request's row: 4 + the draft tokens beyond its context
    tokens = estimate.kv_tokens_with_margin
    if (context + extra) * running <= tokens:
        return []
    source = "serving_context_length" if serving.context_length else "the model's context length"
    drafted = f" + {draft} draft tokens" if spec is not None else ""
    return [
        f"{source} {context} (+ 4{drafted}) x serving_max_running_requests {running} ="
        f" {(context + extra) * running} tokens of KV cache on sglang {memory.version}; the estimate"
        f" leaves {_how(host, memory, estimate)}; expected serving_max_running_requests <="
        f" {tokens // (context + extra)} at that context, or serving_context_length <="
        f" {max(tokens // running - extra, 0)} for {running} requests, or a larger"
        " serving_mem_fraction_static within the release's reserve (docs/serving-memory.md)"
    ]


def memory_lines(host: HostSettings, hosts: dict[str, HostSettings], stack: Stack, inventory_dir: Path) -> list[str]:
    """The inventory's fraction beside the one the release would choose for this card, the
    largest that leaves the release's reserve, and the KV estimate when the config is here."""
    try:
        memory = host_memory(host, hosts, stack, inventory_dir)
    except MemoryConfigError:
        return []  # the inventory's check said it
    if memory is None:
        return []
    reserve, facts = memory.reserve, memory.facts
    own = kv_cache.sglang_default_fraction(reserve, facts)
    if facts.multimodal is None:
        chosen = f"{own:.3f} before its cut for a multimodal model (no config.json copy to tell)"
    elif facts.multimodal:
        cut = kv_cache.vlm_factor(facts)
        chosen = f"{own:.3f} ({own / cut:.3f} x {cut:.3f} for the vision tower)"
    else:
        chosen = f"{own:.3f}"
    drafter = _drafter(host, memory)
    beyond = drafter.beyond_mib if drafter is not None else 0.0
    largest = reserve.largest_fraction(beyond)
    also = f" and {beyond:.0f} MiB for the drafter" if beyond else ""
    lines = [
        f"mem_fraction_static {host.serving.mem_fraction_static:g}; sglang {memory.version} would choose {chosen}"
        f" on this {memory.card_mib} MiB card; at most {largest:g}"
        f" leaves its {reserve.total_mib:.0f} MiB for activations and CUDA graphs{also} (cuda_graph_max_bs"
        f" {reserve.cuda_graph_max_bs}, chunked_prefill_size {reserve.chunked_prefill_size})"
    ]
    if memory.estimate is not None:
        estimate = memory.estimate
        lines.append(
            f"KV cache per GPU on sglang {memory.version}: {estimate.kv_tokens} tokens,"
            f" {kv_cache.gib(estimate.kv_bytes)}"
            f" ({estimate.kv_tokens_with_margin} with the {kv_cache.KV_MARGIN_GIB:g} GiB margin)"
        )
    if drafter is not None:
        lines.append(_drafter_line(memory, drafter))
    return lines


def _drafter_line(memory: Memory, drafter: Drafter) -> str:
    """Where the drafter's memory comes from: the margin kept where the release under-charges its
    KV pool (0.5.23), the share of the release's own drafter reserve (0.5.9, 0.5.10)."""
    estimate = memory.estimate
    assert estimate is not None and estimate.drafter is not None  # _drafter needs both
    allocated, charged = estimate.drafter.kv_bytes_per_token, estimate.drafter_kv_charged_per_token
    if drafter.kv_margin_mib:
        kv = (
            f"drafter KV margin {estimate.kv_tokens} tokens x ({allocated} B allocated - {charged} B charged)"
            f" = {drafter.kv_margin_mib:.1f} MiB"
        )
    elif charged:
        kv = f"drafter KV charged at {charged} B a token, its pool allocates {allocated} B: no margin"
    else:
        kv = (
            f"drafter weights and KV pool ({estimate.kv_tokens} tokens x {allocated} B, not charged to the"
            f" KV budget) {drafter.resident_mib:.1f} MiB"
        )
    held = (
        f"of the release's {drafter.reserve_mib:.0f} MiB EAGLE reserve, {drafter.beyond_mib:.1f} MiB beyond it"
        if drafter.reserve_mib
        else "kept beside the release's reserve, which keeps none for the drafter"
    )
    return (
        f"{kv}; drafter CUDA graphs {drafter.graphs.total_mib:.1f} MiB ({drafter.graphs.explain()});"
        f" {drafter.total_mib:.1f} MiB {held}"
    )
