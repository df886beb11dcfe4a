"""Lab only: a real image registry on 127.0.0.1, so that the kernel wheel builds take their base
image by digest through a registry, as production does from NVIDIA's.

The lab's CUDA devel image is made on this machine (lab/cuda_image.py) and has no registry
digest of its own. Pushed to Debian 12's `docker-registry` (distribution 2.8, the upstream
registry), it gets one: the digest of the manifest the push wrote. The lab then names it
`127.0.0.1:PORT/inference-host/lab-cuda-devel@sha256:<digest>`, and BuildKit resolves that
exactly as it resolves nvidia/cuda@sha256:... : a digest the registry does not have stops the
build (tests/lab/test_wheels.py plants one).

Docker allows plain HTTP to registries on 127.0.0.0/8 by default (dockerd's insecure-registries
list starts with it), and the lab's builds run on this machine's own engine (inventory/lab_builder.py,
`@lab/local`), which reaches 127.0.0.1. One registry serves every lab of this machine (each
prefix, each checkout): started by the first that needs it, in a session of its own so that it
outlives that process, and stopped by nothing (like the Docker engine it serves); its storage is
a cache the next push fills again. `lab registry-stop` ends one this checkout started.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request

import lab

PORT = int(os.environ.get("INFERENCE_HOST_LAB_REGISTRY_PORT", "15000"))
ADDRESS = f"127.0.0.1:{PORT}"
STORAGE = lab.STATE_DIR / "registry"
PID_FILE = STORAGE / "registry.pid"
START_TIMEOUT_S = 15

# distribution 2.8's configuration reference (the configuration page of its docs): filesystem
# storage, loopback only, no auth (only this machine reaches it), access log off (every push
# writes dozens of lines).
_CONFIG = """\
version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: {storage}
  delete:
    enabled: true
http:
  addr: {address}
"""


def answers() -> bool:
    """Whether a registry speaks the v2 API at ADDRESS (distribution's `GET /v2/` is 200 and
    carries Docker-Distribution-API-Version: registry/2.0)."""
    try:
        with urllib.request.urlopen(f"http://{ADDRESS}/v2/", timeout=2) as response:
            return response.headers.get("Docker-Distribution-API-Version") == "registry/2.0"
    except (urllib.error.URLError, OSError):
        return False


def ensure_registry() -> str:
    """The registry's address, started here when none answers (idempotent; one starter at a
    time per checkout, and a second checkout's racing start fails to bind and finds the first's)."""
    if answers():
        return ADDRESS
    with lab.state_lock("registry"):
        if answers():
            return ADDRESS
        binary = shutil.which("docker-registry") or shutil.which("registry")
        if not binary:
            raise lab.LabError(
                "the lab's image registry needs Debian's docker-registry package"
                " (apt-get install docker-registry; docs/lab.md: Prerequisites)"
            )
        STORAGE.mkdir(mode=0o700, parents=True, exist_ok=True)
        config = STORAGE / "config.yml"
        config.write_text(_CONFIG.format(storage=STORAGE / "data", address=ADDRESS))
        log = open(STORAGE / "registry.log", "ab")  # the child writes to it; ours is closed below
        process = subprocess.Popen(
            [binary, "serve", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,  # outlives this process: other labs use it after this one ends
        )
        log.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if answers():
                PID_FILE.write_text(f"{process.pid}\n")
                lab._log(f"image registry {ADDRESS} started (pid {process.pid}, storage {STORAGE / 'data'})")
                return ADDRESS
            if process.poll() is not None:
                if answers():  # another checkout's registry took the port first
                    return ADDRESS
                break
            time.sleep(0.2)
        if process.poll() is None:
            process.terminate()
        tail = (STORAGE / "registry.log").read_text(errors="replace").strip().splitlines()[-1:]
        raise lab.LabError(f"the lab's image registry did not answer on {ADDRESS}: {' '.join(tail) or 'no output'}")


def push(local_tag: str, repository: str) -> str:
    """Push the local image `local_tag` to the lab's registry as `repository` and return it
    pinned by the digest the push reported: ADDRESS/repository@sha256:<64 hex>."""
    address = ensure_registry()
    _name, _, tag = local_tag.rpartition(":")
    remote = f"{address}/{repository}:{tag}"
    lab._docker("tag", local_tag, remote)
    output = lab._docker("push", remote).stdout
    # The client's last line: "<tag>: digest: sha256:<hex> size: <n>" (docker/cli's push output).
    digest = next(
        (
            word
            for line in output.splitlines()
            if ": digest: " in line
            for word in line.split()
            if word.startswith("sha256:")
        ),
        "",
    )
    if len(digest) != 71:
        raise lab.LabError(f"docker push {remote} printed no digest: {output.strip()[-300:]}")
    return f"{address}/{repository}@{digest}"
