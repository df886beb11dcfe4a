"""The stack check: do the pins of a stack agree with the pinned engine release's metadata?

Runs on the control machine while pyinfra loads the inventory, before it connects to any
host: `uv pip compile` resolves sglang==X (or vllm==X) together with the stack's torch, kernel
package and flashinfer pins for the target platform (CPython <python> on x86_64 Linux, glibc 2.39 =
Ubuntu 24.04), reading every release's real Requires-Dist from PyPI. A conflict stops the
deploy with uv's explanation, which names the pins that disagree.

flash-attn is not part of the resolution: PyPI has only its sdist, whose metadata needs torch
to build; it is built for the stack by the builders (its only requirement is torch itself).

A successful resolution is cached under $XDG_CACHE_HOME/inference-host/stack-check/ keyed by
the pins, so a no-change redeploy costs nothing and works offline once cached.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from roles.site import EngineStack, SiteError

TARGET_PLATFORM = "x86_64-manylinux_2_39"
CHECK_TIMEOUT_S = 300


def requirements(stack: EngineStack) -> list[str]:
    """The pins of a stack as requirement lines (what the stack file promises). vllm 0.16.0's
    METADATA: Requires-Dist torch==2.9.1, flashinfer-python==0.6.3 (its kernels are in its own
    wheel, so a vLLM stack pins no kernel package)."""
    if stack.engine == "vllm":
        return [f"vllm=={stack.vllm}", f"torch=={stack.torch}", f"flashinfer-python=={stack.flashinfer}"]
    return [
        f"sglang=={stack.sglang}",
        f"torch=={stack.torch}",
        f"{stack.kernel.package}=={stack.kernel.version}",
        f"flashinfer-python=={stack.flashinfer}",
    ]


def _cache_file(stack: EngineStack) -> Path:
    key = "\n".join([*requirements(stack), stack.python, TARGET_PLATFORM])
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return root / "inference-host" / "stack-check" / f"{stack.id}-{digest}.txt"


def _uv() -> str:
    found = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
    if not Path(found).exists():
        raise SiteError(["the stack check needs uv on the control machine (README: Prerequisites)"])
    return found


def resolve(stack: EngineStack) -> str:
    """The resolved set of the stack's pins (uv's lock-style output); raises SiteError."""
    cached = _cache_file(stack)
    if cached.is_file():
        return cached.read_text()
    command = [
        _uv(), "pip", "compile", "-", "--quiet", "--no-header", "--no-annotate",
        "--python-version", stack.python, "--python-platform", TARGET_PLATFORM,
    ]
    try:
        result = subprocess.run(
            command, input="\n".join(requirements(stack)) + "\n", text=True,
            capture_output=True, timeout=CHECK_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        raise SiteError([f"stack {stack.id}: uv pip compile did not finish in {CHECK_TIMEOUT_S}s"
                         " (is PyPI reachable?)"]) from None
    if result.returncode != 0:
        raise SiteError([
            f"stack {stack.id}: the pins {', '.join(requirements(stack))} do not resolve together"
            f" for Python {stack.python} on {TARGET_PLATFORM}; uv says:\n"
            + _indent(result.stderr.strip())
            + f"\n    fix the pins in the stack file to match {stack.engine}'s Requires-Dist"
        ])
    cached.parent.mkdir(parents=True, exist_ok=True)
    cached.write_text(result.stdout)
    return result.stdout


def _indent(text: str) -> str:
    return "\n".join("      " + line for line in text.splitlines())


def require_consistent_stack(stack: EngineStack) -> None:
    resolve(stack)
