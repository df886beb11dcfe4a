"""What the health checks expect of a GPU model and of a link class, with where each figure
comes from. A setting in the site model overrides each of them (health_gpu_link,
health_allreduce_min_busbw_gbps, health_min_memory_bandwidth_gbps).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuModel:
    memory_bandwidth_gbps: float  # vendor spec, GB/s
    source: str
    gpu_link: str  # the slowest link expected between two of these GPUs
    needs_resizable_bar: bool  # BAR1 must map the whole memory (the driver/engine need it)


# Keys are nvidia-smi's product names (`--query-gpu=name`).
MODELS = {
    "NVIDIA H200": GpuModel(
        4800.0, "NVIDIA H200 datasheet: 4.8 TB/s HBM3e; SXM boards join all GPUs by NVLink", "nvlink", False
    ),
    "NVIDIA H100 80GB HBM3": GpuModel(
        3350.0, "NVIDIA H100 SXM datasheet: 3.35 TB/s HBM3; SXM boards join all GPUs by NVLink", "nvlink", False
    ),
    "NVIDIA RTX PRO 6000 Blackwell Server Edition": GpuModel(
        1792.0,
        "NVIDIA RTX PRO 6000 Blackwell Server Edition datasheet: 1792 GB/s GDDR7; PCIe "
        "cards, no NVLink; the target spreads 8 over two sockets",
        "cross-socket",
        True,
    ),
}

# A device-to-device copy reads and writes every byte; measured on one H200 (2026-12-01,
# driver 580.159.04, tests/unit/data/gpu/h200-1gpu-checks/membw.txt): 4294 GB/s = 89% of the
# spec. A floor at 75% of spec leaves room for clocks and ECC, and catches a memory clock
# stuck low or a degraded stack (these lose a third or more).
MEMORY_BANDWIDTH_FRACTION = 0.75

# Bus-bandwidth floor (nccl-tests definition) of the health suite's all-reduce per link class.
ALLREDUCE_FLOORS_GBPS = {
    # 2 x H200, NV18: 297.7 GB/s; the same with NCCL_P2P_DISABLE=1: 26.2-28 GB/s
    # (tests/unit/data/gpu/h200-2gpu). 100 fails anything that is not NVLink.
    "nvlink": 100.0,
    # PCIe Gen5 x16 moves 64 GB/s per direction (PCI-SIG); P2P through a switch reaches
    # about 80% of it in NCCL's ring. Through host memory (P2P off, SHM transport) every byte
    # crosses the link twice, so it reaches at most half. Not yet measured on the target: the
    # first run there should confirm these (health_allreduce_min_busbw_gbps overrides).
    "pcie-switch": 30.0,
    "host-bridge": 25.0,
    # Across sockets P2P crosses the CPUs' interconnect (UPI/xGMI) as well; the floor only
    # separates P2P from a host-memory fallback.
    "cross-socket": 15.0,
}


def model(name: str) -> GpuModel | None:
    return MODELS.get(name)


def expected_link(gpu_model: str, setting: str | None) -> tuple[str, str]:
    """(link class, where it comes from)."""
    if setting:
        return setting, "health_gpu_link"
    known = model(gpu_model)
    if known:
        return known.gpu_link, f"{gpu_model}: {known.source}"
    return "cross-socket", f"{gpu_model} is not in checks/gpu_models.py: the weakest class assumed"


def allreduce_floor(link: str, setting: float | None) -> tuple[float, str]:
    if setting:
        return setting, "health_allreduce_min_busbw_gbps"
    return ALLREDUCE_FLOORS_GBPS[link], f"the {link} floor (checks/gpu_models.py)"


def memory_bandwidth_floor(gpu_model: str, setting: float | None) -> tuple[float | None, str]:
    if setting:
        return setting, "health_min_memory_bandwidth_gbps"
    known = model(gpu_model)
    if known is None:
        return None, f"no spec for {gpu_model} in checks/gpu_models.py; set health_min_memory_bandwidth_gbps"
    return (
        round(known.memory_bandwidth_gbps * MEMORY_BANDWIDTH_FRACTION, 1),
        f"{MEMORY_BANDWIDTH_FRACTION:.0%} of {known.memory_bandwidth_gbps:.0f} GB/s ({known.source})",
    )
