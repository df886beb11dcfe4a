"""The lab's images: a Debian 12 base (debootstrap into a folder and `docker import`, as these
machines reach no registry) or ubuntu:24.04 pulled when a registry answers, and the
systemd-capable image on top of it (lab/docker/systemd-host.Dockerfile), tagged by its inputs."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile

from lab.docker_engine import PROJECT_ROOT, LabError, _docker, _log, state_lock

# "auto": pull ubuntu:24.04 when a registry answers, else debootstrap Debian 12.
BASE_SOURCE = os.environ.get("INFERENCE_HOST_LAB_BASE", "auto")
DEBIAN_MIRROR = os.environ.get("INFERENCE_HOST_LAB_DEBIAN_MIRROR", "http://deb.debian.org/debian")

DEBOOTSTRAP_IMAGE = "inference-host/lab-base:debian12"
REGISTRY_IMAGE = "ubuntu:24.04"
SYSTEMD_DOCKERFILE = PROJECT_ROOT / "lab" / "docker" / "systemd-host.Dockerfile"
# What debootstrap puts in so that the image boots systemd and pyinfra/testinfra can work.
DEBOOTSTRAP_PACKAGES = ["systemd", "systemd-sysv", "dbus", "python3", "procps", "iproute2"]


def _image_exists(tag: str) -> bool:
    return _docker("image", "inspect", tag, check=False).returncode == 0


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
            " (docs/lab.md: Prerequisites)"
        )
    _log(f"making {DEBOOTSTRAP_IMAGE} with debootstrap from {DEBIAN_MIRROR} (about a minute, once)")
    with tempfile.TemporaryDirectory(prefix="ih-lab-rootfs-") as rootfs:
        subprocess.run(
            [
                "debootstrap",
                "--variant=minbase",
                "--include=" + ",".join(DEBOOTSTRAP_PACKAGES),
                "bookworm",
                rootfs,
                DEBIAN_MIRROR,
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        tar = subprocess.Popen(["tar", "-C", rootfs, "-c", "."], stdout=subprocess.PIPE)
        imported = subprocess.run(
            ["docker", "import", "-", DEBOOTSTRAP_IMAGE], stdin=tar.stdout, capture_output=True, text=True
        )
        assert tar.stdout is not None  # stdout=PIPE
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
    with state_lock("images"):  # the lab's worker and a module beside it (tests/lab/conftest.py)
        return _systemd_image()


def _systemd_image() -> str:
    base = base_image()
    digest = hashlib.sha256(SYSTEMD_DOCKERFILE.read_bytes() + base.encode()).hexdigest()[:12]
    tag = f"inference-host/lab-systemd:{digest}"
    if not _image_exists(tag):
        _log(f"building {tag} from {base}")
        _docker(
            "build",
            "-q",
            "--build-arg",
            f"BASE={base}",
            "-t",
            tag,
            "-f",
            str(SYSTEMD_DOCKERFILE),
            str(SYSTEMD_DOCKERFILE.parent),
        )
    return tag
