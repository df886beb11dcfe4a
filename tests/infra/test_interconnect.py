"""Interconnect suite: topology and NUMA affinity (reported), and an NCCL all-reduce across all
GPUs with a timeout (a P2P deadlock hangs it) and a bus-bandwidth floor (a slow path)."""

from __future__ import annotations

import pytest

from tests.infra import gpu_parsers as parse
from tests.infra.probes import explain, report

pytestmark = pytest.mark.interconnect


def test_topology_reported(gpu, expect, request):
    topology = parse.parse_topology(gpu.topology.require("the GPU topology"))
    assert len(topology.gpus) == expect.gpu_count, explain(
        f"{expect.gpu_count} GPUs in `nvidia-smi topo -m`", f"{len(topology.gpus)}",
        "see the check 'gpu count'")
    kinds = sorted(topology.link_kinds())
    report(request, f"links {', '.join(kinds) or 'none (one GPU)'}")


def test_numa_affinity_reported(gpu, expect, request):
    topology = parse.parse_topology(gpu.topology.require("NUMA affinity"))
    missing = [name for name in topology.gpus if topology.cpu_affinity.get(name) is None]
    assert not missing, explain(
        "a CPU affinity for every GPU", f"none for {', '.join(missing)}",
        "check that the guest sees the host's NUMA layout (LXC: cpuset; KVM: numa=1 and vCPU pinning)")
    report(request, "; ".join(f"{name}: CPUs {topology.cpu_affinity[name]} NUMA "
                              f"{topology.numa_affinity.get(name) or 'N/A'}" for name in topology.gpus))


def test_allreduce_across_all_gpus(gpu, expect, request):
    if expect.gpu_count < 2:
        pytest.skip(f"one GPU expected ({expect.source}): there is no interconnect to exercise")
    missing = gpu.engine_python_missing(expect.engine_python)
    assert not missing, explain("the engine environment's python", missing, "deploy the engine first")
    result = gpu.run_program(expect.engine_python, "allreduce.py", str(expect.allreduce_size_mib),
                             env=expect.nccl_env, timeout_s=expect.allreduce_timeout_s)
    env_text = " ".join(f"{k}={v}" for k, v in expect.nccl_env.items())
    if result.rc in (124, 137):
        pytest.fail(explain(
            f"the all-reduce to finish within {expect.allreduce_timeout_s} s", "it hung and was killed "
            f"(with {env_text})", "a P2P deadlock: lower nccl_p2p_level (e.g. PHB) or set it to 'off', "
            "and check PCIe ACS/IOMMU settings (NVIDIA/nccl #631)"))
    try:
        found = parse.parse_json_line(result.stdout, "IH-ALLREDUCE ")
    except ValueError:
        pytest.fail(explain("the all-reduce to print its result", f"rc {result.rc}: "
                            f"{(result.stdout + result.stderr).strip()[-600:]}",
                            "run it with NCCL_DEBUG=INFO to see the failing transport"))
    assert found["world_size"] == expect.gpu_count, explain(
        f"{expect.gpu_count} ranks", f"{found['world_size']} GPUs visible to torch", "see 'gpu count'")
    assert found["correct"], explain("the all-reduce sum to be exact", "a wrong sum",
                                     "a corrupting transport: try nccl_p2p_level = 'off' and report it")
    busbw = found["busbw_gbps"]
    assert busbw >= expect.allreduce_min_busbw_gbps, explain(
        f"bus bandwidth >= {expect.allreduce_min_busbw_gbps} GB/s (health_allreduce_min_busbw_gbps)",
        f"{busbw:.1f} GB/s over {found['world_size']} GPUs, {found['size_mib']} MiB (with {env_text})",
        "P2P is probably off or falling back to host memory: check `nvidia-smi topo -m`, "
        "nccl_p2p_level, and NCCL_DEBUG=INFO for the chosen transport")
    report(request, f"busbw {busbw:.1f} GB/s (algbw {found['algbw_gbps']:.1f}) over "
                    f"{found['world_size']} GPUs, {found['size_mib']} MiB, NCCL {found['nccl_version']}, "
                    f"{env_text}")
