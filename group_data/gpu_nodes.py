"""Defaults for every host that serves the engine.

NCCL on a PCIe-only, two-socket box (docs/upstream.md, "NCCL"): let P2P cross the socket link,
no InfiniBand on a single host (nccl_ib_disable unset), quiet logs in production.
"""

nccl_p2p_level = "SYS"
# nccl_ib_disable: unset = off on one node; tensor_parallel across nodes must choose
# (docs/engines-and-stacks.md#several-gpu-nodes-replicas-or-tensor-parallel).
nccl_debug = "WARN"
