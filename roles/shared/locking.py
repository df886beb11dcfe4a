"""Making a hashed lock: the one place that asks uv to resolve (the lock commands of
roles/sglang for the engine stacks and of roles/eagle3_training for the training job).

`uv pip compile --generate-hashes` resolves the requirements for the target — CPython <python>
on x86_64 manylinux_2_39 (Ubuntu 24.04) — reading every release's real Requires-Dist from the
index (PyPI, or --index-url / the UV_INDEX_URL uv itself reads), and writes every package with
its exact version, the sha256 of each of its files and the `# via` lines naming what requires
it. Hosts install the result with `uv pip sync --require-hashes` (roles/shared/engine_env.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from roles.site import SiteError
from roles.site import lock as site_lock

COMPILE_TIMEOUT_S = 600


def _uv() -> str:
    found = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
    if not Path(found).exists():
        raise SiteError(["the lock command needs uv on the control machine (README: Prerequisites)"])
    return found


def compile_command(python: str, no_emit: list[str] = (), index_url: str | None = None) -> list[str]:
    command = [
        _uv(), "pip", "compile", "-", "--quiet", "--no-header", "--generate-hashes",
        "--python-version", python, "--python-platform", site_lock.TARGET_PLATFORM,
    ]
    for package in no_emit:
        command += ["--no-emit-package", package]
    if index_url:
        command += ["--index-url", index_url]
    return command


def resolve(what: str, requirements: list[str], python: str, no_emit: list[str] = (),
            index_url: str | None = None, fix: str = "fix the requirements") -> str:
    """uv's hashed resolution of the requirements (a lock's body); raises SiteError naming
    `what` with uv's own explanation of a conflict."""
    try:
        result = subprocess.run(
            compile_command(python, no_emit, index_url), input="\n".join(requirements) + "\n", text=True,
            capture_output=True, timeout=COMPILE_TIMEOUT_S, env={**os.environ, "UV_NO_PROGRESS": "1"},
        )
    except subprocess.TimeoutExpired:
        raise SiteError([f"{what}: uv pip compile did not finish in {COMPILE_TIMEOUT_S}s"
                         " (is the index reachable? --index-url sets a mirror)"]) from None
    if result.returncode != 0:
        raise SiteError([
            f"{what}: the pins {', '.join(requirements)} do not resolve together"
            f" for Python {python} on {site_lock.TARGET_PLATFORM}; uv says:\n"
            + "\n".join("      " + line for line in result.stderr.strip().splitlines())
            + f"\n    {fix}"
        ])
    return result.stdout
