"""Run by the interconnect suite with the engine environment's python: an NCCL all-reduce
across every GPU, one process per GPU (torch.distributed), under the NCCL environment the
service uses. Prints one line: IH-ALLREDUCE {"world_size": N, "busbw_gbps": ..., ...}.

Bus bandwidth as nccl-tests defines it: algbw * 2 (n - 1) / n, so figures compare with
all_reduce_perf. A P2P deadlock shows as no result line: the caller kills this after its
timeout (the check's `timeout` wrapper), never this program itself. The stage lines
(IH-ALLREDUCE-STAGE start / collective) tell the caller whether it was killed while starting
(imports, spawning, NCCL's communicator set-up: ~8 s on 2 x H200) or inside a collective.

The sum is checked on its own all-reduce of small integers (rank + (i mod 1024)): every
partial sum stays below 2^24, so float32 holds it exactly for any number of ranks up to 8 and
in any order NCCL adds them (a power such as 3^20 would not: float32 has a 24-bit mantissa).
"""

import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SIZE_MIB = int(sys.argv[1]) if len(sys.argv) > 1 else 256
WARMUP, ITERATIONS = 5, 20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


PATTERN = 1024
SHOWN = ("NCCL_", "CUDA_", "TORCH_", "NVSHMEM_", "SGLANG_", "SGL_", "PYTORCH_", "LD_")


def effective_environment() -> dict:
    """The variables that steer NCCL/CUDA/the engine, as this process sees them (secrets masked)."""
    return {
        k: ("***" if any(w in k for w in ("TOKEN", "KEY", "SECRET", "PASSWORD")) else v)
        for k, v in sorted(os.environ.items())
        if k.startswith(SHOWN)
    }


def stage(name: str) -> None:
    print(f"IH-ALLREDUCE-STAGE {name} {time.time():.1f}", flush=True)


def expected_sum(world_size: int, pattern: int = PATTERN) -> list[int]:
    """Element i of the reduced check tensor: sum over ranks r of (r + i mod pattern)."""
    return [world_size * i + world_size * (world_size - 1) // 2 for i in range(pattern)]


def worker(rank: int, world_size: int, port: int, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world_size, device_id=torch.device(f"cuda:{rank}"))
    elements = SIZE_MIB * 1024 * 1024 // 4
    check = (torch.arange(elements, dtype=torch.int64, device=f"cuda:{rank}") % PATTERN + rank).float()
    if rank == 0:
        stage("collective")
    dist.all_reduce(check)
    reference = torch.tensor(expected_sum(world_size), dtype=torch.float32, device=f"cuda:{rank}")
    correct_sum = bool(torch.equal(check.view(-1, PATTERN), reference.expand(elements // PATTERN, PATTERN)))
    del check
    tensor = torch.ones(elements, dtype=torch.float32, device=f"cuda:{rank}")
    for _ in range(WARMUP):
        dist.all_reduce(tensor)
    torch.cuda.synchronize()
    tensor.fill_(1.0)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(ITERATIONS):
        dist.all_reduce(tensor)
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / ITERATIONS
    if rank == 0:
        queue.put({"seconds": seconds, "correct": correct_sum})
    dist.destroy_process_group()


def main() -> None:
    stage("start")
    world_size = torch.cuda.device_count()
    nccl = effective_environment()
    source = os.environ.get("IH_ENV_SOURCE", "the caller's environment")
    if world_size < 2:
        print("IH-ALLREDUCE " + json.dumps({"world_size": world_size, "nccl_env": nccl, "env_source": source}))
        return
    context = mp.get_context("spawn")
    queue = context.SimpleQueue()
    mp.spawn(worker, args=(world_size, free_port(), queue), nprocs=world_size, join=True)
    result = queue.get()
    size = SIZE_MIB * 1024 * 1024
    algbw = size / result["seconds"] / 1e9
    busbw = algbw * 2 * (world_size - 1) / world_size
    print(
        "IH-ALLREDUCE "
        + json.dumps(
            {
                "world_size": world_size,
                "size_mib": SIZE_MIB,
                "time_ms": result["seconds"] * 1e3,
                "algbw_gbps": algbw,
                "busbw_gbps": busbw,
                "correct": result["correct"],
                "nccl_version": ".".join(map(str, torch.cuda.nccl.version())),
                "nccl_env": nccl,
                "env_source": source,
            }
        )
    )


if __name__ == "__main__":
    main()
