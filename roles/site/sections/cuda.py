"""roles/cuda: NVIDIA's CUDA apt repository (cuda_*)."""

from __future__ import annotations

import re
from typing import Annotated, ClassVar

from pydantic import Field

from roles.site.fields import (
    Section,
    Url,
    check,
)


class CudaSettings(Section):
    """roles/cuda and the driver packages: NVIDIA's CUDA apt repository (a mirror when air-gapped)."""

    PREFIX: ClassVar[str] = "cuda_"

    repo_url: Url = Field(
        "https://developer.download.nvidia.com/compute/cuda/repos",
        description=(
            "Base of NVIDIA's CUDA apt repositories (<url>/<ubuntu2404|debian12>/x86_64/); a mirror "
            "for air-gapped sites."
        ),
    )
    keyring_version: Annotated[
        str, check(re.compile(r"^\d+\.\d+-\d+$").match, "a cuda-keyring package version like 1.1-1")
    ] = Field("1.1-1", description=("Version of the cuda-keyring package downloaded from that repository."))
