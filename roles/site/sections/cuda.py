"""roles/cuda: NVIDIA's CUDA apt repository (cuda_*)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from roles.site.fields import (
    KeyFingerprint,
    MirrorUrl,
    SecretName,
    Section,
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
    repo_key_fingerprint: KeyFingerprint = Field(
        "EB693B3035CD5710E231E123A4B469963BF863CC",
        description=(
            "Fingerprint of the key that signs the CUDA repository; the deploy fetches <repository>/<key id>.pub"
            " (3bf863cc.pub: the fingerprint's last 8 digits) and installs it only when it is this key. NVIDIA's"
            " CUDA repository key since 2022 (cudatools <cudatools@nvidia.com>)."
        ),
    )
