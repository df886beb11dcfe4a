"""SGLang's KV-cache allocation line (roles/shared/sglang_kv_log.py), parsed from lines the pinned
releases' own code writes: KVCache._finalize_allocation_log of each release's
srt/mem_cache/memory_pool.py, run from the committed snapshot with its logger captured."""

from __future__ import annotations

import ast
from types import SimpleNamespace

import pytest

from roles.shared import sglang_kv_log
from tests.unit.upstream_sources import release_text

GB = 1 << 30


def _release_log_line(version: str, kv_size, *, label=None, dtype="torch.bfloat16", tokens=218348) -> str:
    """What the release's own _finalize_allocation_log logs for a pool of `tokens` whose
    get_kv_size_bytes() answers kv_size (bytes, or a (K, V) tuple)."""
    tree = ast.parse(release_text("sglang", version, "sglang/srt/mem_cache/memory_pool.py"))
    kvcache = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "KVCache")
    method = next(n for n in kvcache.body if isinstance(n, ast.FunctionDef) and n.name == "_finalize_allocation_log")
    for arg in method.args.args:
        arg.annotation = None
    logged: list[str] = []
    namespace = {"GB": GB, "logger": SimpleNamespace(info=logged.append)}
    exec(compile(ast.Module([method], []), f"sglang-{version}:memory_pool.py", "exec"), namespace)
    pool = SimpleNamespace(
        get_kv_size_bytes=lambda: kv_size, allocation_label=label, post_capture_active=False, dtype=dtype
    )
    namespace["_finalize_allocation_log"](pool, tokens)
    (line,) = logged
    return line


@pytest.mark.parametrize("version", ["0.5.9", "0.5.10", "0.5.23"])
def test_the_mla_target_pool_line_of_each_release(version):
    """Kimi-K2.5's MLA pool: one buffer, "KV size" (218,348 tokens x 70,272 B = 14.29 GiB)."""
    line = _release_log_line(version, 218348 * 70272)
    assert "#tokens: 218348" in line and "KV size: 14.29 GB" in line
    journal = f"[2026-12-04 03:00:00 TP0] {line}\n"
    assert sglang_kv_log.target_allocation(journal) == sglang_kv_log.KvAllocation(218348, 14.29, "", False)


@pytest.mark.parametrize("version", ["0.5.9", "0.5.10", "0.5.23"])
def test_the_drafters_k_and_v_pool_after_the_target(version):
    """The EAGLE drafter's MHA pool logs K and V sizes after the target's line, with the same
    #tokens; every TP rank logs both. The target's is the first unlabelled one."""
    target = _release_log_line(version, 218348 * 70272)
    drafter = _release_log_line(version, (218348 * 2048, 218348 * 2048))
    journal = "\n".join(
        f"[2026-12-04 03:00:0{rank} TP{rank}] {line}" for line in (target, drafter) for rank in range(8)
    )
    found = sglang_kv_log.allocations(journal)
    assert len(found) == 16 and {a.tokens for a in found} == {218348}
    assert found[8].size_gib == pytest.approx(0.42 + 0.42)  # 218,348 x 2,048 B each
    assert sglang_kv_log.target_allocation(journal).size_gib == 14.29


def test_a_labelled_pool_of_0_5_23_is_not_taken_for_the_target():
    labelled = _release_log_line("0.5.23", 1000 * 70272, label="draft", tokens=1000)
    assert labelled.startswith("draft KV Cache is allocated. dtype: torch.bfloat16, #tokens: 1000,")
    target = _release_log_line("0.5.23", 218348 * 70272)
    assert sglang_kv_log.target_allocation(labelled + "\n" + target).tokens == 218348


def test_0_5_23_post_capture_resize_supersedes_the_first_figure():
    """model_runner_components/kv_pool_runtime.py (0.5.23) compute_post_capture_kv_resize logs
    the resized pool with %-formatting; this line is that format string filled in."""
    first = _release_log_line("0.5.23", 218348 * 70272)
    upstream = "Post-capture KV sizing: KV cache allocated. dtype: %s, #tokens: %d, KV size: %.2f GB, avail mem=%.2f GB"
    resized = upstream % ("torch.bfloat16", 230000, 230000 * 70272 / GB, 1.25)
    assert sglang_kv_log.target_allocation(f"{first}\n{resized}") == sglang_kv_log.KvAllocation(230000, 15.05, "", True)


def test_no_line_is_none():
    assert sglang_kv_log.target_allocation("Load weight end. avail mem=21.70 GB\n") is None


@pytest.mark.parametrize("version", ["0.5.9", "0.5.10", "0.5.23"])
def test_the_lab_standin_logs_the_releases_own_allocation_line(version, tmp_path):
    """lab/standins/sglang_server/startup_log.py runs the installed release's own
    _finalize_allocation_log (here: the committed snapshot on PYTHONPATH), so the lab's journal
    carries the wording the parser reads on the target."""
    import os
    import subprocess
    import sys

    from roles.site import PROJECT_ROOT
    from tests.unit import upstream_sources as upstream

    release = upstream.copy_release("sglang", version, tmp_path)
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); from startup_log import configure_logger, log_kv_allocation;"
        " configure_logger(None); log_kv_allocation({'max_total_tokens': '4096'})"
    )  # as argparse gives it
    result = subprocess.run(
        [sys.executable, "-c", code, str(PROJECT_ROOT / "lab/standins/sglang_server")],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(release)},
        check=True,
    )
    assert result.stderr.count("KV Cache is allocated.") == 1, result.stderr
    found = sglang_kv_log.target_allocation(result.stderr)
    assert found is not None and found.tokens == 4096 and found.size_gib == round(4096 * 70272 / GB, 2)
