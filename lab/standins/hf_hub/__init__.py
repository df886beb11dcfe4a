"""STAND-IN for the Hugging Face Hub (server.py), served to the lab containers.

`serve(prefix)` starts lab/standins/hf_hub/server.py on the Docker bridge for as long as the
calling process lives (or reuses one already answering on the prefix's port), so that
inventory/lab.py can point weights_endpoint at it. It serves with `--xet`, like the real Hub: the
large files are offered over Xet too (X-Xet-Hash), so the lab's download unit, which sets
HF_HUB_DISABLE_XET=1 by default, is held to ignoring that offer. `commit_of(repo_id)` is the commit the
generated repository has: the inventory pins it as weights_revision like a user would.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import subprocess
import sys
import time
import urllib.request
from functools import cache
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[3]
STATE_ROOT = PROJECT_ROOT / ".lab" / "hf_hub"  # git-ignored
MODEL_REPO = "inference-host-lab/tiny-moe"
DRAFTER_REPO = "inference-host-lab/tiny-eagle3"


@cache
def commit_of(repo_id: str) -> str:
    from lab.standins.hf_hub import server as hub_server

    return hub_server.generate(repo_id, hub_server.LAB_REPOS[repo_id]).commit


def state_dir(prefix: str) -> Path:
    return STATE_ROOT / prefix


def port_for(prefix: str) -> int:
    """Stable per lab prefix (the endpoint is in the unit file: it must not change), away from
    the apt stand-in's range (20000-39999)."""
    return 40000 + int(hashlib.sha256(prefix.encode()).hexdigest(), 16) % 10000


def url_for(prefix: str) -> str:
    from lab.standins.nvidia_apt_repo.repo import bridge_gateway

    try:
        address = bridge_gateway()
    except (RuntimeError, OSError):
        address = "172.17.0.1"  # validation must work without an engine
    return f"http://{address}:{port_for(prefix)}"


def set_rate(prefix: str, bytes_per_second: int | None) -> None:
    """Throttle each download connection (None: full speed); read by the server per request."""
    folder = state_dir(prefix)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "rate").write_text(str(bytes_per_second or 0))


def log_path(prefix: str) -> Path:
    return state_dir(prefix) / "requests.log"


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/ready", timeout=2) as response:
            return response.read().decode().strip() == "standin-hub"
    except OSError:
        return False


def serve(prefix: str, token: str | None = None) -> str:
    """Serve the lab's repositories for as long as this process lives; returns the endpoint."""
    from lab.standins.nvidia_apt_repo.repo import bridge_gateway

    url = url_for(prefix)
    if _answers(url):
        return url  # already served (a test or another deploy of the same lab)
    folder = state_dir(prefix)
    folder.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "lab.standins.hf_hub.server",
        "--state",
        str(folder),
        "--bind",
        bridge_gateway(),
        "--port",
        str(port_for(prefix)),
        "--xet",
    ]
    if token:
        token_file = folder / "token"
        token_file.touch(mode=0o600)
        token_file.write_text(token)
        command += ["--token-file", str(token_file)]
    log = log_path(prefix).open("a")
    process = subprocess.Popen(
        command, cwd=PROJECT_ROOT, stdout=log, stderr=log, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )
    atexit.register(_stop, process)
    deadline = time.monotonic() + 90  # --xet: hf_xet chunks and uploads the 46 MiB first (seconds)
    while time.monotonic() < deadline:
        if _answers(url):
            return url
        if process.poll() is not None:
            break
        time.sleep(0.2)
    _stop(process)
    raise RuntimeError(f"the Hugging Face Hub stand-in could not be served on {url}; see {log_path(prefix)}")


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
