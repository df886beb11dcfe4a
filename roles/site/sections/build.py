"""roles/wheels on builders: kernel wheel builds in Docker (build_*)."""

from __future__ import annotations

import re
from typing import Annotated, ClassVar

from pydantic import Field

from roles.site.fields import (
    HostFolder,
    Section,
    check,
    positive,
)

# Kernel packages roles/wheels can build from source (roles/wheels/docker/<package>.Dockerfile).
WHEEL_PACKAGES = ("flash-attn", "sgl-kernel")


class BuildSettings(Section):
    """roles/wheels on builders: kernel wheel builds in Docker."""

    PREFIX: ClassVar[str] = "build_"

    max_jobs: Annotated[int, positive] | None = Field(
        None,
        description=(
            "Parallel compile jobs (MAX_JOBS) of the kernel-wheel builds; None: computed from the "
            "builder's memory and cores."
        ),
    )
    nvcc_threads: Annotated[int, positive] | None = Field(
        None, description=("nvcc --threads per job; None: computed with build_max_jobs.")
    )
    wheelhouse_dir: HostFolder = Field(
        "/var/lib/inference-host/wheelhouse",
        description=("Where built kernel wheels are kept, keyed by a hash of every input."),
    )
    # A Docker image reference (distribution/reference's grammar, reference/regexp.go): an
    # optional registry host[:port], lower-case path components, an optional :tag and @digest.
    # Written into `docker build --build-arg` and a Dockerfile's FROM: a space or an option there
    # ends the build.
    base_image: (
        Annotated[
            str,
            check(
                re.compile(
                    r"([A-Za-z0-9.-]+(:[0-9]{1,5})?/)?[a-z0-9]+([._-]+[a-z0-9]+)*(/[a-z0-9]+([._-]+[a-z0-9]+)*)*"
                    r"(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[0-9a-f]{64})?"
                ).fullmatch,
                "a Docker image reference like nvidia/cuda:12.8.1-devel-ubuntu24.04 (registry/name:tag@digest)",
            ),
        ]
        | None
    ) = Field(
        None,
        description=("Base image of the wheel builds; None: NVIDIA's CUDA devel image of the active stack's CUDA."),
    )
    source_overrides: Annotated[
        dict[str, str], check(lambda v: set(v) <= set(WHEEL_PACKAGES), "keys from: " + ", ".join(WHEEL_PACKAGES))
    ] = Field({}, description=("Package -> a local source tree built instead of the pinned upstream release."))
    with_torch: bool = Field(
        True,
        description=(
            "Install torch in the build image; False only for sources that need none (the lab's test extension)."
        ),
    )
    timeout_minutes: Annotated[int, positive] = Field(720, description="Limit of one wheel build.")
    kernel_wheels: bool = Field(
        True,
        description=(
            "False: this builder compiles no kernel wheel (the engine takes PyPI's or another "
            "builder's); its Docker engine is still managed."
        ),
    )
    force: Annotated[
        list[str], check(lambda v: set(v) <= set(WHEEL_PACKAGES), "names from: " + ", ".join(WHEEL_PACKAGES))
    ] = Field(
        [], description=("Packages rebuilt even when the wheelhouse has them: --data 'build_force=[\"flash-attn\"]'.")
    )
