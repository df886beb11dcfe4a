"""Lab only: a local image that stands in for NVIDIA's CUDA devel image.

No registry answers here, so nvidia/cuda:<version>-devel-ubuntu24.04 cannot be pulled. This
machine kind has a real CUDA toolkit under /usr/local/cuda (nvcc, ptxas, headers, cudart);
copying it onto the lab's Debian 12 base gives the kernel wheel Dockerfiles a base image with a
working nvcc, passed to them through BASE_IMAGE exactly as a user would pass another base.

    uv run python -m lab.cuda_image      # prints the tag, building it once
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import lab

CUDA_ROOT = Path(os.environ.get("INFERENCE_HOST_LAB_CUDA", "/usr/local/cuda"))
DOCKERFILE = lab.PROJECT_ROOT / "lab" / "docker" / "cuda-devel.Dockerfile"


def cuda_version(root: Path = CUDA_ROOT) -> str:
    """major.minor of the toolkit at root, from nvcc itself (version.json is not always there)."""
    if not (root / "bin" / "nvcc").exists():
        raise lab.LabError(f"no nvcc under {root}; the kernel wheel lab needs a CUDA toolkit there"
                           " (or set INFERENCE_HOST_LAB_CUDA)")
    output = subprocess.run([str(root / "bin" / "nvcc"), "--version"], capture_output=True,
                            text=True, check=True).stdout
    for line in output.splitlines():
        if "release" in line:  # "Cuda compilation tools, release 13.0, V13.0.88"
            return line.split("release", 1)[1].split(",")[0].strip()
    raise lab.LabError(f"cannot read the CUDA version from `nvcc --version`: {output!r}")


def cuda_devel_image(build: bool = True) -> str:
    """Tag of the lab's CUDA devel image; built once per toolkit version and Dockerfile.
    build=False only names it (validating an inventory starts nothing)."""
    base = lab.base_image() if build else lab.DEBOOTSTRAP_IMAGE
    version = cuda_version()
    real = CUDA_ROOT.resolve()
    digest = hashlib.sha256(
        DOCKERFILE.read_bytes() + json.dumps([base, version, str(real)]).encode()
    ).hexdigest()[:12]
    tag = f"inference-host/lab-cuda-devel:{version}-{digest}"
    if build and not lab._image_exists(tag):
        lab._log(f"building {tag}: {base} + the CUDA {version} toolkit from {real}")
        lab._docker("build", "-q", "--build-arg", f"BASE={base}",
                    "--build-arg", f"CUDA_DIR_NAME={real.name}",
                    "-t", tag, "-f", str(DOCKERFILE), str(real))
    return tag


if __name__ == "__main__":
    print(cuda_devel_image())
