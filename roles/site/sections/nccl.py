"""NCCL's environment on the gpu nodes (nccl_*), rendered by roles/serving."""

from __future__ import annotations

import re
from typing import Annotated, ClassVar

from pydantic import Field

from roles.site.fields import (
    Section,
    check,
    one_of,
    positive,
)

# NCCL_P2P_LEVEL and NCCL_DEBUG values (docs/upstream.md, "NCCL").
NCCL_P2P_LEVELS = ("LOC", "NVL", "PIX", "PXB", "PHB", "SYS")
NCCL_DEBUG_LEVELS = ("VERSION", "WARN", "INFO", "TRACE")


class NcclSettings(Section):
    """NCCL environment for a PCIe-only, two-socket host (docs/upstream.md, "NCCL")."""

    PREFIX: ClassVar[str] = "nccl_"

    p2p_level: Annotated[str, one_of(*NCCL_P2P_LEVELS, "off")] = Field(
        "SYS",
        description=(
            "NCCL_P2P_LEVEL: SYS allows P2P on every pair. NCCL's default PXB turns P2P off for any pair"
            " whose path passes a CPU host bridge (PHB/NODE on one socket as well as SYS across sockets;"
            " NVIDIA/nccl src/graph/paths.cc ncclTopoCheckP2p), which then goes through host memory;"
            " 'off' sets NCCL_P2P_DISABLE=1 instead."
        ),
    )
    ib_disable: bool | None = Field(
        None,
        description=(
            "NCCL_IB_DISABLE. None: off on a single node; must be set for tensor_parallel across "
            "nodes: True sends the all-reduce over TCP sockets (any network, slow), False lets NCCL "
            "use InfiniBand/RoCE."
        ),
    )
    # NCCL's own grammars (docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html): NCCL_IB_HCA
    # is an optional '^' (exclude) and '=' (exact names), then adapters with an optional :port,
    # comma-separated; NCCL_DEBUG_SUBSYS an optional '^' and subsystem names, comma-separated.
    ib_hca: (
        Annotated[
            str,
            check(
                re.compile(r"\^?=?[A-Za-z0-9_.-]+(:\d+)?(,[A-Za-z0-9_.-]+(:\d+)?)*").fullmatch,
                "adapters like mlx5, =mlx5_0:1,mlx5_1:1 or ^=mlx5_3 (NCCL_IB_HCA)",
            ),
        ]
        | None
    ) = Field(
        None, description=("NCCL_IB_HCA: which InfiniBand/RoCE adapters NCCL uses when nccl_ib_disable is False.")
    )
    socket_ifname: (
        Annotated[
            str,
            check(
                re.compile(r"^[=^]?[A-Za-z0-9_.,:@-]+$").match,
                "interface names or prefixes like eth0, ^docker,lo, =ens1f0",
            ),
        ]
        | None
    ) = Field(
        None,
        description=(
            "NCCL_SOCKET_IFNAME: the interface NCCL's bootstrap and socket transport use between "
            "nodes; unset, NCCL takes the first non-loopback one, which can be a bridge the other node"
            " cannot reach."
        ),
    )
    debug: Annotated[str, one_of(*NCCL_DEBUG_LEVELS)] = Field(
        "WARN", description=("NCCL_DEBUG level written to the engine's environment file.")
    )
    debug_subsys: (
        Annotated[
            str,
            check(
                re.compile(r"\^?[A-Za-z0-9_]+(,[A-Za-z0-9_]+)*").fullmatch,
                "subsystems like INIT,P2P or ^NET (NCCL_DEBUG_SUBSYS)",
            ),
        ]
        | None
    ) = Field(None, description=("NCCL_DEBUG_SUBSYS (e.g. INIT,P2P); None: not set."))
    min_nchannels: Annotated[int, positive] | None = Field(
        None, description=("NCCL_MIN_NCHANNELS; None: NCCL's own choice.")
    )
