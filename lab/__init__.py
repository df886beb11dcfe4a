"""The rehearsal lab: local Docker containers with systemd as PID 1 standing in for hosts.

Used by inventory/lab.py. With only a Docker engine running, it makes what it needs:

1. a Debian 12 base image: debootstrap into a folder and `docker import` when no registry
   answers (these machines have none), or ubuntu:24.04 pulled when one does;
2. a systemd-capable image on top of it (docker/lab/systemd-host.Dockerfile);
3. one running container per rehearsal host, started with the flags that let systemd run
   as PID 1 without --privileged (DESIGN.md, "Facts about these machines").

Everything is cached: images by tag, containers by name. `python -m lab down` removes the
containers; `python -m lab status` lists them.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
STATE_DIR = PROJECT_ROOT / ".lab"  # git-ignored: throwaway vault and its password

# Container names carry the prefix so that several labs can share one Docker engine.
PREFIX = os.environ.get("INFERENCE_HOST_LAB_PREFIX", "ih-lab")
# "auto": pull ubuntu:24.04 when a registry answers, else debootstrap Debian 12.
BASE_SOURCE = os.environ.get("INFERENCE_HOST_LAB_BASE", "auto")
DEBIAN_MIRROR = os.environ.get("INFERENCE_HOST_LAB_DEBIAN_MIRROR", "http://deb.debian.org/debian")

DEBOOTSTRAP_IMAGE = "inference-host/lab-base:debian12"
REGISTRY_IMAGE = "ubuntu:24.04"
SYSTEMD_DOCKERFILE = PROJECT_ROOT / "docker" / "lab" / "systemd-host.Dockerfile"
# What debootstrap puts in so that the image boots systemd and pyinfra/testinfra can work.
DEBOOTSTRAP_PACKAGES = ["systemd", "systemd-sysv", "dbus", "python3", "procps", "iproute2"]

# systemd as PID 1 without --privileged (one capability is missing on these machines).
SYSTEMD_RUN_FLAGS = [
    "--cap-add", "SYS_ADMIN",
    "--security-opt", "seccomp=unconfined",
    "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw",
    "--tmpfs", "/run",
    "--tmpfs", "/run/lock",
]

# Rehearsal hosts: role -> what it stands in for. Later roles add the Proxmox node.
HOSTS = {
    "gpu": "the GPU guest (an LXC container or KVM VM on the target) that serves the engine",
}


class LabError(RuntimeError):
    pass


def container_name(role: str) -> str:
    return f"{PREFIX}-{role}"


def pyinfra_name(role: str) -> str:
    return f"@docker/{container_name(role)}"


def _docker(*args: str, check: bool = True, capture: bool = True, **kwargs) -> subprocess.CompletedProcess:
    if not shutil.which("docker"):
        raise LabError("the lab needs the docker CLI and a running Docker engine (README: Prerequisites)")
    result = subprocess.run(["docker", *args], text=True, capture_output=capture, **kwargs)
    if check and result.returncode != 0:
        raise LabError(f"docker {' '.join(args[:3])} failed: {(result.stderr or '').strip()[-2000:]}")
    return result


def engine_available() -> bool:
    return shutil.which("docker") is not None and _docker("info", check=False).returncode == 0


def _image_exists(tag: str) -> bool:
    return _docker("image", "inspect", tag, check=False).returncode == 0


def _log(message: str) -> None:
    print(f"[lab] {message}", file=sys.stderr, flush=True)


def _registry_answers() -> bool:
    """True when ubuntu:24.04 can be pulled (fails in seconds when no registry is reachable)."""
    try:
        result = _docker("pull", "-q", REGISTRY_IMAGE, check=False, timeout=120)
    except subprocess.TimeoutExpired:
        return False
    return result.returncode == 0


def _debootstrap_base() -> str:
    if _image_exists(DEBOOTSTRAP_IMAGE):
        return DEBOOTSTRAP_IMAGE
    if not shutil.which("debootstrap"):
        raise LabError(
            "no registry answers and debootstrap is missing: `apt-get install -y debootstrap`"
            " (README: Prerequisites)"
        )
    _log(f"making {DEBOOTSTRAP_IMAGE} with debootstrap from {DEBIAN_MIRROR} (about a minute, once)")
    with tempfile.TemporaryDirectory(prefix="ih-lab-rootfs-") as rootfs:
        subprocess.run(
            ["debootstrap", "--variant=minbase", "--include=" + ",".join(DEBOOTSTRAP_PACKAGES),
             "bookworm", rootfs, DEBIAN_MIRROR],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        tar = subprocess.Popen(["tar", "-C", rootfs, "-c", "."], stdout=subprocess.PIPE)
        imported = subprocess.run(["docker", "import", "-", DEBOOTSTRAP_IMAGE], stdin=tar.stdout,
                                  capture_output=True, text=True)
        tar.stdout.close()
        if tar.wait() != 0 or imported.returncode != 0:
            raise LabError(f"docker import of the debootstrap folder failed: {imported.stderr.strip()}")
    return DEBOOTSTRAP_IMAGE


def base_image() -> str:
    if BASE_SOURCE == "debootstrap":
        return _debootstrap_base()
    if BASE_SOURCE == "registry" or _image_exists(REGISTRY_IMAGE):
        if _image_exists(REGISTRY_IMAGE) or _registry_answers():
            return REGISTRY_IMAGE
        if BASE_SOURCE == "registry":
            raise LabError(f"INFERENCE_HOST_LAB_BASE=registry but {REGISTRY_IMAGE} cannot be pulled")
    if _image_exists(DEBOOTSTRAP_IMAGE) or not _registry_answers():
        return _debootstrap_base()
    return REGISTRY_IMAGE


def systemd_image() -> str:
    """The systemd-capable image; its tag changes when its Dockerfile or base changes."""
    base = base_image()
    digest = hashlib.sha256(SYSTEMD_DOCKERFILE.read_bytes() + base.encode()).hexdigest()[:12]
    tag = f"inference-host/lab-systemd:{digest}"
    if not _image_exists(tag):
        _log(f"building {tag} from {base}")
        _docker("build", "-q", "--build-arg", f"BASE={base}", "-t", tag,
                "-f", str(SYSTEMD_DOCKERFILE), str(SYSTEMD_DOCKERFILE.parent))
    return tag


def container_state(name: str) -> dict | None:
    result = _docker("container", "inspect", name, check=False)
    if result.returncode != 0:
        return None
    return json.loads(result.stdout)[0]


def ensure_container(role: str, image: str) -> str:
    name = container_name(role)
    state = container_state(name)
    if state and state["Config"]["Image"] != image:
        _log(f"{name} runs an older lab image; recreating it")
        _docker("rm", "-f", name)
        state = None
    if state is None:
        _log(f"starting {name} ({HOSTS[role]})")
        _docker("run", "-d", "--name", name, "--hostname", name,
                "--label", "inference-host.lab=1", *SYSTEMD_RUN_FLAGS, image)
    elif not state["State"]["Running"]:
        _docker("start", name)
    _wait_for_systemd(name)
    return name


def _wait_for_systemd(name: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    status = ""
    while time.monotonic() < deadline:
        result = _docker("exec", name, "systemctl", "is-system-running", check=False)
        status = result.stdout.strip()
        if status in ("running", "degraded"):
            return
        time.sleep(1)
    raise LabError(f"systemd in {name} did not come up within {timeout:.0f}s (state: {status!r})")


def up(roles=tuple(HOSTS)) -> list[str]:
    """Bring up the rehearsal containers; idempotent and quick once the images exist."""
    if not engine_available():
        raise LabError("no Docker engine answers `docker info`; start one (README: Prerequisites)")
    image = systemd_image()
    return [ensure_container(role, image) for role in roles]


def down() -> None:
    for role in HOSTS:
        _docker("rm", "-f", container_name(role), check=False)


def throwaway_vault() -> tuple[str, str]:
    """A lab-only vault with a random API key and its password, made once under .lab/."""
    import secrets as random

    from roles import secrets

    STATE_DIR.mkdir(mode=0o700, exist_ok=True)
    password_file = STATE_DIR / "vault-password"
    vault = STATE_DIR / "secrets.vault.yml"
    if not password_file.exists():
        fd = os.open(password_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(random.token_urlsafe(32))
        vault.unlink(missing_ok=True)
    if not vault.exists():
        password = password_file.read_bytes().strip()
        secrets.set_secret(vault, "sglang_api_key", random.token_urlsafe(24), password)
        secrets.set_secret(vault, "hf_token", "hf_lab_" + random.token_hex(16), password)
    return str(vault), str(password_file)
