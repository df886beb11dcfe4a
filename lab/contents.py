"""What the lab copies into its containers, each only when it changed: the stand-in SGLang
server with the captured CLIs it parses, and the tiny Llama the lab's real vLLM serves."""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from pathlib import Path

from lab.docker_engine import PROJECT_ROOT, STATE_DIR, _docker, state_lock

# Rehearsal hosts that run the stand-in SGLang server.
STANDIN_ROLES = ("gpu", "rep-a", "rep-b")


# The hosts whose engine serves the tiny Llama (lab/fixtures/tiny_llama.py): the main lab's guest
# (its vLLM stack) and the vLLM replicas (tests/lab/inventories/replicas_vllm.py).
TINY_MODEL_ROLES = ("gpu", "vrep-a", "vrep-b")


# The stand-in SGLang server (no GPU here) and the captured CLIs it parses its arguments with.
# Copied by the lab only: no production path ships it (serving_launch_command points at it).
STANDIN_SOURCE = PROJECT_ROOT / "lab" / "standins" / "sglang_server"
STANDIN_DEST = "/opt/inference-host-lab/sglang_server"
# The lab's engine hosts install the lock's GPU-free subset (sglang_install_mode = "no-gpu-deps")
# in Debian 12's Python 3.11 (uv cannot download CPython from GitHub here). These locked
# releases require Python >= 3.12 (uv says "depends on Python>=3.12"): numpy 2.5.5, scipy
# 1.18.1, airportsdata 20261103 (the 0.5.9 and 0.5.10 locks; networkx 3.7 too, already left out
# with torch) and av 19.0.2 (the training job's lock). Both lab inventories leave them out.
PYTHON311_LEAVE_OUT = ["airportsdata", "av", "numpy", "scipy"]


# Every pyinfra run over the lab inventory calls up(); what it copies in is copied only when it
# changed (a digest of what would be copied, kept in the container): a no-change deploy of the
# lab otherwise spent ~3 s of docker cp/exec and ~2.5 s regenerating the tiny model (measured
# with lab/profile.py and cProfile on 2 loaded cores).
def _tree_digest(*roots: Path, extra: str = "") -> str:
    digest = hashlib.sha256(extra.encode())
    for root in roots:
        for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
            digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _unchanged(name: str, stamp: str, digest: str, copied: str) -> bool:
    found = _docker("exec", name, "sh", "-c", f"test -e {copied} && cat {stamp}", check=False)
    return found.returncode == 0 and found.stdout.strip() == digest


def _stamp(name: str, stamp: str, digest: str) -> None:
    _docker("exec", name, "sh", "-c", f'mkdir -p "$(dirname {stamp})" && echo {digest} > {stamp}')


def install_standins(name: str) -> None:
    stamp, digest = (
        f"{STANDIN_DEST}.lab-stamp",
        _tree_digest(STANDIN_SOURCE, PROJECT_ROOT / "roles" / "serving" / "cli"),
    )
    if _unchanged(name, stamp, digest, STANDIN_DEST):
        return
    _install_standins(name)
    _stamp(name, stamp, digest)


def _install_standins(name: str) -> None:
    with tempfile.TemporaryDirectory(prefix="ih-lab-standin-") as folder:
        target = Path(folder) / "sglang_server"
        shutil.copytree(STANDIN_SOURCE, target, ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copytree(PROJECT_ROOT / "roles" / "serving" / "cli", target / "cli")
        _docker("exec", name, "mkdir", "-p", str(Path(STANDIN_DEST).parent))
        _docker("exec", name, "rm", "-rf", STANDIN_DEST)
        _docker("cp", str(target), f"{name}:{STANDIN_DEST}")
        _docker("exec", name, "chmod", "-R", "a+rX", STANDIN_DEST)


# The model the lab's real vLLM (CPU build) serves: a 2-layer Llama with random weights
# (lab/fixtures/tiny_llama.py), made on this machine and copied in like a model folder an
# operator fills. serving_model_path of the lab's gpu node points here.
TINY_MODEL_DEST = "/opt/inference-host-lab/models/tiny-llama"


def install_tiny_model(name: str) -> None:
    from lab.fixtures import tiny_llama

    folder = STATE_DIR / "tiny-llama"
    source = hashlib.sha256(Path(tiny_llama.__file__).read_bytes()).hexdigest()
    made = folder / ".made-by"  # the generator's digest: its output is the same bytes every time
    with state_lock("tiny-llama"):  # two labs at once (pytest-xdist's workers) write one folder
        if not (made.is_file() and made.read_text() == source and (folder / "model.safetensors").is_file()):
            tiny_llama.write(folder)
            made.write_text(source)
    digest = hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()
    present = _docker("exec", name, "sha256sum", f"{TINY_MODEL_DEST}/model.safetensors", check=False)
    if present.returncode == 0 and present.stdout.split()[:1] == [digest]:
        return
    _docker("exec", name, "mkdir", "-p", str(Path(TINY_MODEL_DEST).parent))
    _docker("exec", name, "rm", "-rf", TINY_MODEL_DEST)
    _docker("cp", str(folder), f"{name}:{TINY_MODEL_DEST}")
    _docker("exec", name, "chmod", "-R", "a+rX", TINY_MODEL_DEST)
