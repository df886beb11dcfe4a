"""roles/wheels on builders: kernel wheel builds in Docker (build_*)."""

from __future__ import annotations

import re
from typing import Annotated, ClassVar

from pydantic import AfterValidator, Field
from pydantic_core import PydanticCustomError

from roles.site.fields import (
    HostFolder,
    Section,
    check,
    positive,
)
from roles.site.grammars import host_folder_problem

# Kernel packages roles/wheels can build from source (roles/wheels/docker/<package>.Dockerfile).
WHEEL_PACKAGES = ("flash-attn", "sgl-kernel")

# An image pinned by content ends in its manifest's (or index's) digest.
IMAGE_DIGEST_RE = re.compile(r"@sha256:[0-9a-f]{64}$")
PINNED_IMAGE_RULE = (
    "an image pinned by content, name[:tag]@sha256:<64 hex>, never a tag alone (the registry can move a tag);"
    " read the digest with `docker buildx imagetools inspect IMAGE` or, once pulled,"
    " `docker inspect --format '{{index .RepoDigests 0}}' IMAGE`"
)


# A source override is a tree on this machine that the deploy tars, whole, into the builder's
# Docker context (roles/shared/wheel_plan.py): `/etc` or `~/.ssh` would send this machine's
# configuration and keys to the builder, and into the wheel. Accepted: a path relative to the
# checkout that stays inside it, or an absolute folder of its own (not /, not a system folder or
# tree, not a home folder itself nor a dot folder in one: grammars.host_folder_problem).
def _source_tree_problem(value: str) -> str | None:
    if not value.startswith("/"):
        parts = [part for part in value.split("/") if part not in ("", ".")]
        return "it leaves the checkout ('..')" if ".." in parts or not parts else None
    return host_folder_problem(value)


def _source_trees(value: dict[str, str]) -> dict[str, str]:
    bad = next(((k, p) for k, v in value.items() if (p := _source_tree_problem(v))), None)
    if bad:
        raise PydanticCustomError(
            "inference_host",
            "{valid}",
            {
                "valid": "source trees on this machine: a folder of the checkout (relative) or an absolute folder of"
                f" its own, never a system folder, a home or its dot folders; {bad[0]}: {bad[1]}"
            },
        )
    return value


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
    # ends the build. Then the digest, required: a tag is the registry's to move, so a tag alone
    # builds root-run kernels from whatever the tag names that day; BuildKit pulls by the digest
    # and checks the content against it (issue 53).
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
            check(lambda v: IMAGE_DIGEST_RE.search(v), PINNED_IMAGE_RULE),
        ]
        | None
    ) = Field(
        None,
        description=(
            "Base image of the wheel builds, pinned by digest (name[:tag]@sha256:...); None: NVIDIA's CUDA devel"
            " image of the active stack's CUDA, at the digest in roles/shared/wheel_plan.py."
        ),
    )
    source_overrides: Annotated[
        dict[str, str],
        check(lambda v: set(v) <= set(WHEEL_PACKAGES), "keys from: " + ", ".join(WHEEL_PACKAGES)),
        AfterValidator(_source_trees),
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
