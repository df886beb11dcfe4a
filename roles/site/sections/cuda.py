"""roles/cuda: NVIDIA's CUDA apt repository (cuda_*)."""

from __future__ import annotations

import re
from typing import Annotated, ClassVar

from pydantic import Field

from roles.site.fields import (
    MirrorUrl,
    SecretName,
    Section,
    check,
)


class CudaSettings(Section):
    """roles/cuda and the driver packages: NVIDIA's CUDA apt repository (a mirror when air-gapped)."""

    PREFIX: ClassVar[str] = "cuda_"

    repo_url: MirrorUrl = Field(
        "https://developer.download.nvidia.com/compute/cuda/repos",
        description=(
            "Base of NVIDIA's CUDA apt repositories (<url>/<ubuntu2404|debian12>/x86_64/); a mirror "
            "for air-gapped sites. Without a credential in it: a mirror that needs one takes it from"
            " cuda_repo_credentials_secret."
        ),
    )
    repo_credentials_secret: SecretName | None = Field(
        None,
        description=(
            "Vault key of the login:password the cuda_repo_url mirror asks for (an https URL); written only into"
            " a 0600 root file apt reads (/etc/apt/auth.conf.d/inference-host-cuda.conf), never into the apt"
            " source or a command line."
        ),
    )
    keyring_version: Annotated[
        str, check(re.compile(r"^\d+\.\d+-\d+$").match, "a cuda-keyring package version like 1.1-1")
    ] = Field("1.1-1", description=("Version of the cuda-keyring package downloaded from that repository."))
