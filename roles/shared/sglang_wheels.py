"""Real SGLang wheels from PyPI, downloaded once and cached on the control machine.

Used by the CLI capture and by the patch test; never by the deploy itself (hosts install
through uv). The cache lives in $XDG_CACHE_HOME/inference-host/wheels (default ~/.cache).
"""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path

SIMPLE_URL = "https://pypi.org/simple/sglang/"
# Releases from 0.5.10 on ship CPython-specific manylinux wheels; take this one.
PREFERRED_TAGS = ("py3-none-any", "cp311-cp311-manylinux_2_34_x86_64", "cp312-cp312-manylinux_2_34_x86_64")


def cache_dir() -> Path:
    root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    path = root / "inference-host" / "wheels"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _wheel_url(version: str) -> tuple[str, str]:
    request = urllib.request.Request(SIMPLE_URL, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        files = json.load(response)["files"]
    for tag in PREFERRED_TAGS:
        name = f"sglang-{version}-{tag}.whl"
        for entry in files:
            if entry["filename"] == name:
                return name, entry["url"]
    raise LookupError(f"PyPI has no sglang {version} wheel with one of the tags {', '.join(PREFERRED_TAGS)}")


def sglang_wheel(version: str) -> Path:
    """Path of the cached wheel of sglang==version (downloaded on first use)."""
    for tag in PREFERRED_TAGS:
        cached = cache_dir() / f"sglang-{version}-{tag}.whl"
        if cached.is_file():
            return cached
    name, url = _wheel_url(version)
    target = cache_dir() / name
    partial = target.with_suffix(".part")
    with urllib.request.urlopen(url, timeout=600) as response, open(partial, "wb") as out:
        while chunk := response.read(1 << 20):
            out.write(chunk)
    partial.rename(target)
    return target
