"""The lab's identity and its one way to the Docker engine: the prefix its containers and
volumes carry (several labs share one engine), the git-ignored state folder, and the `docker`
CLI every other lab module runs through (a failure is one LabError line)."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
STATE_DIR = PROJECT_ROOT / ".lab"  # git-ignored: throwaway vault and its password


_HELD: set[str] = set()


@contextmanager
def state_lock(name: str):
    """One process of this checkout at a time in what `name` guards (a file lock in .lab/): the
    unit and lab workers of pytest-xdist load the lab inventory and ask for the lab's images at the
    same moment on a fresh clone, and each made the SSH key (one read the other's empty file) or
    an image of its own."""
    if name in _HELD:  # this process has it already (a nested call, or another greenlet of pyinfra's)
        yield
        return
    STATE_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(STATE_DIR / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _HELD.add(name)
        try:
            yield
        finally:
            _HELD.discard(name)


# Container names carry the prefix so that several labs can share one Docker engine.
PREFIX = os.environ.get("INFERENCE_HOST_LAB_PREFIX", "ih-lab")


class LabError(RuntimeError):
    pass


def _docker(*args: str, check: bool = True, capture: bool = True, **kwargs) -> subprocess.CompletedProcess:
    if not shutil.which("docker"):
        raise LabError("the lab needs the docker CLI and a running Docker engine (docs/lab.md: Prerequisites)")
    result = subprocess.run(["docker", *args], text=True, capture_output=capture, **kwargs)
    if check and result.returncode != 0:
        raise LabError(f"docker {' '.join(args[:3])} failed: {(result.stderr or '').strip()[-2000:]}")
    return result


def engine_available() -> bool:
    return shutil.which("docker") is not None and _docker("info", check=False).returncode == 0


def _log(message: str) -> None:
    print(f"[lab] {message}", file=sys.stderr, flush=True)
