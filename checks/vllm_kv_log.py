"""vLLM's own KV-cache size line, read from the engine's journal on the host, as SGLang's is
(roles/shared/sglang_kv_log.py): the figure vLLM computed, in tokens.

vLLM 0.16.0, vllm/v1/core/kv_cache_utils.py, _report_kv_cache_config: once per engine-core
process, after the KV cache is sized (the CPU build logs it too: the function is shared):

    logger.info_once("GPU KV cache size: %s tokens", f"{num_tokens:,}", scope="local")

num_tokens is the blocks per KV-cache group times the smallest block size (times the context-
parallel world size, said in a line before it). A journal line carries vLLM's own prefix, e.g.
"(EngineCore_DP0 pid=2412130) INFO 12-11 00:06:53 [kv_cache_utils.py:1286] GPU KV cache size:
686,320 tokens". The memory behind it is logged per worker by vllm/v1/worker/gpu_worker.py:
"Available KV cache memory: %s GiB" (not by the CPU worker).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SIZE_RE = re.compile(r"GPU KV cache size: (?P<tokens>[\d,]+) tokens")
MEMORY_RE = re.compile(r"Available KV cache memory: (?P<gib>[\d.]+) GiB")


@dataclass(frozen=True)
class KvSize:
    tokens: int
    memory_gib: float | None  # one worker's, when logged


def kv_size(journal: str) -> KvSize | None:
    """The first size line of one run's journal (one engine core: the deploy runs no data
    parallelism), with the first worker's memory line when there is one."""
    size = SIZE_RE.search(journal)
    if size is None:
        return None
    memory = MEMORY_RE.search(journal)
    return KvSize(int(size["tokens"].replace(",", "")), float(memory["gib"]) if memory else None)
