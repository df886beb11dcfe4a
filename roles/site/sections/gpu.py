"""The gpu node's GPUs (gpu_*): tensor parallel size, kernels' architecture, the health checks' expectations."""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import Field

from roles.site.fields import (
    Section,
    check,
    one_of,
)

# GPU architectures the project knows how to build for and check; the target is sm120.
GPU_ARCHS = {
    "sm80": "8.0",
    "sm86": "8.6",
    "sm89": "8.9",
    "sm90": "9.0",
    "sm100": "10.0",
    "sm120": "12.0",
}


class GpuSettings(Section):
    """What GPUs a gpu node has: used for tensor parallel size and by the health checks."""

    PREFIX: ClassVar[str] = "gpu_"

    count: Annotated[int, check(lambda v: 0 <= v <= 16, "an integer from 0 to 16")] = Field(
        0,
        description=(
            "GPUs of this gpu node: --tp-size (the group's sum with serving_topology tensor_parallel) "
            "and what the health checks expect to see."
        ),
    )
    arch: Annotated[str, one_of(*GPU_ARCHS)] = Field(
        "sm120",
        description=(
            "GPU architecture the kernels are built for and the checks expect (sm120: RTX PRO 6000 Blackwell)."
        ),
    )
    model: str = Field(
        "NVIDIA RTX PRO 6000 Blackwell Server Edition",
        description=(
            "GPU model name nvidia-smi must report; it also selects the expected link class and "
            "bandwidth floors (checks/gpu_models.py)."
        ),
    )
    # 1024 GiB: four times the largest GPU memory sold (288 GB); more is a unit mistake.
    memory_gib: Annotated[int, check(lambda v: 1 <= v <= 1024, "1 to 1024 GiB")] = Field(
        96,
        description=(
            "Memory per GPU in GiB; 16 or more marks a large-BAR GPU (a KVM guest then needs guest_cpu"
            " host and guest_bios ovmf)."
        ),
    )

    @property
    def compute_capability(self) -> str:
        return GPU_ARCHS[self.arch]
