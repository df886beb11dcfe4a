"""The health checks' demands (health_*): checks."""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import Field

from roles.site.fields import (
    AbsolutePath,
    Section,
    check,
    one_of,
    positive,
)

HEALTH_SUITES = ("gpu", "interconnect", "service", "server")


class HealthSettings(Section):
    """checks: what the health checks demand beyond the host's own description."""

    PREFIX: ClassVar[str] = "health_"

    after_deploy: Annotated[
        list[str], check(lambda v: set(v) <= set(HEALTH_SUITES), "a list from: " + ", ".join(HEALTH_SUITES))
    ] = Field(
        list(HEALTH_SUITES),
        description=(
            "Suites run as the last step of every deploy (gpu, interconnect, service, server); [] turns that off."
        ),
    )
    engine_python: AbsolutePath | None = Field(
        None,
        description=(
            "Python of the engine environment (torch) for the CUDA and all-reduce checks and "
            "bench_serving; None: <base_install_root>/current/bin/python."
        ),
    )
    allreduce_timeout_s: Annotated[int, positive] = Field(
        120,
        description=(
            "The all-reduce check is killed after this many seconds: killed before NCCL started means"
            " the start-up is too slow, killed inside the collective a P2P deadlock."
        ),
    )
    allreduce_min_busbw_gbps: Annotated[float, positive] | None = Field(
        None,
        description=(
            "Bus-bandwidth floor (nccl-tests definition) of the all-reduce in GB/s; None: the floor "
            "of health_gpu_link's class (checks/gpu_models.py)."
        ),
    )
    allreduce_size_mib: Annotated[int, positive] = Field(256, description=("Message size of the all-reduce check."))
    server_timeout_s: Annotated[int, positive] = Field(
        20, description=("/health must answer 200 within this many seconds.")
    )
    max_unit_restarts: Annotated[int, check(lambda v: v >= 0, "an integer >= 0")] = Field(
        0,
        description=(
            "Automatic restarts of the engine unit (NRestarts) tolerated before the service suite "
            "reports it restart-looping."
        ),
    )
    min_accept_length: Annotated[float, check(lambda v: v >= 1.0, "a number >= 1.0")] = Field(
        1.5,
        description=(
            "With serving_speculative: the drafter's accept length must reach this (1.0: no draft token accepted)."
        ),
    )
    gpu_link: Annotated[str, one_of("nvlink", "pcie-switch", "host-bridge", "cross-socket")] | None = Field(
        None,
        description=(
            "Slowest link expected between two GPUs in nvidia-smi topo -m: nvlink (NV#), pcie-switch "
            "(PIX/PXB), host-bridge (PHB/NODE), cross-socket (SYS). None: from the GPU model "
            "(H200/H100 SXM nvlink, RTX PRO 6000 cross-socket)."
        ),
    )
    min_temp_margin_c: Annotated[int, check(lambda v: v >= 0, "an integer >= 0")] = Field(
        10, description=("Degrees below the GPU's slowdown temperature (nvidia-smi -q 'GPU T.Limit Temp') required.")
    )
    power_limit_w: Annotated[float, positive] | None = Field(
        None,
        description=("Enforced power limit expected in watts; None: the GPU's default limit (a lowered cap fails)."),
    )
    mig_enabled: bool = Field(False, description=("MIG mode expected on every GPU (the engine needs whole GPUs)."))
    min_memory_bandwidth_gbps: Annotated[float, positive] | None = Field(
        None, description=("Device-memory copy bandwidth floor in GB/s; None: 75% of the GPU model's spec.")
    )
