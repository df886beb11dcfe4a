"""SGLang's own KV-cache allocation line, read from the engine's journal on the host, so the
figure SGLang computed can be reported beside the estimate (roles/shared/kv_cache.py).

Exact wording per release (srt/mem_cache/memory_pool.py, KVCache._finalize_allocation_log;
logged by every tensor-parallel rank, for the target's pool and then the drafter's, all with
the same #tokens: the drafter takes the target's draft_runner_cache_size):

- 0.5.9, 0.5.10:  "KV Cache is allocated. #tokens: {n}, KV size: {gb:.2f} GB"            (MLA)
                  "KV Cache is allocated. #tokens: {n}, K size: {gb:.2f} GB, V size: {gb:.2f} GB"
- 0.5.23:         "{label} KV Cache is allocated. dtype: {dtype}, #tokens: {n}, KV size: ..."
                  (the label only when the pool has an allocation_label; "VA upper bound"
                  instead of "is allocated" when the pool is resized after CUDA graph capture,
                  and then model_runner_components/kv_pool_runtime.py logs the final figure:
                  "Post-capture KV sizing: KV cache allocated. dtype: {dtype}, #tokens: {n},
                  KV size: {gb:.2f} GB, avail mem={gb:.2f} GB")

GB there is 2^30 bytes (memory_pool.py: GB = 1024 * 1024 * 1024).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ALLOCATION_RE = re.compile(
    r"(?:(?P<post>Post-capture KV sizing: KV cache allocated)|(?P<label>[A-Za-z][\w-]* )?KV Cache is allocated)\."
    r" (?:dtype: (?P<dtype>[\w.]+), )?#tokens: (?P<tokens>\d+),"
    r" (?:K size: (?P<k>[\d.]+) GB, V size: (?P<v>[\d.]+) GB|KV size: (?P<kv>[\d.]+) GB)"
)


@dataclass(frozen=True)
class KvAllocation:
    tokens: int
    size_gib: float  # K + V, or the single KV buffer (MLA)
    label: str  # "" for the target's pool; 0.5.23's allocation_label otherwise
    post_capture: bool


def allocations(journal: str) -> list[KvAllocation]:
    """Every allocation line in the text, in order."""
    found = []
    for match in ALLOCATION_RE.finditer(journal):
        size = float(match["kv"]) if match["kv"] else float(match["k"]) + float(match["v"])
        found.append(KvAllocation(int(match["tokens"]), size, (match["label"] or "").strip(), bool(match["post"])))
    return found


def target_allocation(journal: str) -> KvAllocation | None:
    """The target's pool in one run's journal: the post-capture figure when 0.5.23 resized the
    pool, else the first unlabelled line (the target's pool is allocated before the drafter's)."""
    lines = allocations(journal)
    resized = [a for a in lines if a.post_capture]
    if resized:
        return resized[-1]
    return next((a for a in lines if not a.label), None)
