"""Lab only: a local image that stands in for NVIDIA's CUDA devel image.

No registry answers here, so nvidia/cuda:<version>-devel-ubuntu24.04 cannot be pulled. This
machine kind has a real CUDA toolkit under /usr/local/cuda (nvcc, ptxas, headers, cudart);
copying it onto the lab's Debian 12 base gives the kernel wheel Dockerfiles a base image with a
working nvcc, passed to them through BASE_IMAGE exactly as a user would pass another base: pinned
by digest. The image is pushed to the lab's registry on 127.0.0.1 (lab/registry.py), and the
builds name it there by the digest the push reported, so BuildKit resolves it as it resolves
NVIDIA's image in production.

    uv run python -m lab.cuda_image      # prints the pinned reference, building and pushing once
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import lab
from lab import registry

CUDA_ROOT = Path(os.environ.get("INFERENCE_HOST_LAB_CUDA", "/usr/local/cuda"))
DOCKERFILE = lab.PROJECT_ROOT / "lab" / "docker" / "cuda-devel.Dockerfile"


def cuda_version(root: Path = CUDA_ROOT) -> str:
    """major.minor of the toolkit at root, read from its cuda.h (CUDA_VERSION is 1000 * major +
    10 * minor, as cuda.h documents it): a file, not `nvcc --version`, because the lab
    inventories name the image while they load, and loading runs no program."""
    header = root / "include" / "cuda.h"
    if not (root / "bin" / "nvcc").exists() or not header.is_file():
        raise lab.LabError(
            f"no nvcc and cuda.h under {root}; the kernel wheel lab needs a CUDA toolkit there"
            " (or set INFERENCE_HOST_LAB_CUDA)"
        )
    found = re.search(r"^#define CUDA_VERSION (\d+)", header.read_text(errors="replace"), re.MULTILINE)
    if not found:
        raise lab.LabError(f"cannot read the CUDA version from {header}: no `#define CUDA_VERSION`")
    number = int(found.group(1))
    return f"{number // 1000}.{number % 1000 // 10}"


def _base() -> str:
    """The image it is built on, known without asking Docker (the tag is named while the
    inventory loads): the registry's Ubuntu only when the lab is told to use it, else the
    lab's Debian 12 made with debootstrap."""
    return lab.REGISTRY_IMAGE if lab.BASE_SOURCE == "registry" else lab.DEBOOTSTRAP_IMAGE


REPOSITORY = "inference-host/lab-cuda-devel"  # its name in the lab's registry
# What a lab inventory names before anything ran (loading starts nothing, so there is no push and
# no digest yet): a valid pin that no registry serves. The lab connector puts the pushed one in
# its place as it connects `@lab/local` (lab.pinned_base_image), as it puts in a guest's address.
PENDING = f"{registry.ADDRESS}/{REPOSITORY}@sha256:" + "0" * 64


def cuda_devel_image(build: bool = True) -> str:
    """The lab's CUDA devel image pinned by digest in the lab's registry, built once per toolkit
    version and Dockerfile and pushed (again: a push of layers the registry has is a few HEAD
    requests). build=False only names it, PENDING: lab inventories do, while they load."""
    if not build:
        cuda_version()  # a toolkit the lab can use, refused as the inventory loads
        return PENDING
    tag = _local_tag()
    with lab.state_lock("images"):  # two labs at once (pytest-xdist's workers) built it twice
        _build_cuda_devel(tag)
    return registry.push(tag, REPOSITORY)


def _local_tag() -> str:
    """The image's tag in this machine's engine: one per toolkit version, base and Dockerfile."""
    base = _base()
    version = cuda_version()
    real = CUDA_ROOT.resolve()
    digest = hashlib.sha256(DOCKERFILE.read_bytes() + json.dumps([base, version, str(real)]).encode()).hexdigest()[:12]
    return f"inference-host/lab-cuda-devel:{version}-{digest}"


def _build_cuda_devel(tag: str) -> None:
    base, version, real = _base(), cuda_version(), CUDA_ROOT.resolve()
    if not lab._image_exists(tag):
        if base == lab.DEBOOTSTRAP_IMAGE:
            lab._debootstrap_base()
        else:
            lab.base_image()
        lab._log(f"building {tag}: {base} + the CUDA {version} toolkit from {real}")
        lab._docker(
            "build",
            "-q",
            "--build-arg",
            f"BASE={base}",
            "--build-arg",
            f"CUDA_DIR_NAME={real.name}",
            "-t",
            tag,
            "-f",
            str(DOCKERFILE),
            str(real),
        )


if __name__ == "__main__":
    print(cuda_devel_image())
