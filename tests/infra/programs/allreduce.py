"""Run by the interconnect suite with the engine environment's python: an NCCL all-reduce
across every GPU, one process per GPU (torch.distributed), under the NCCL environment the
service uses. Prints one line: IH-ALLREDUCE {"world_size": N, "busbw_gbps": ..., ...}.

Bus bandwidth as nccl-tests defines it: algbw * 2 (n - 1) / n, so figures compare with
all_reduce_perf. A P2P deadlock shows as no output at all: the caller kills this after its
timeout (the check's `timeout` wrapper), never this program itself.
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


def worker(rank: int, world_size: int, port: int, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world_size,
                            device_id=torch.device(f"cuda:{rank}"))
    elements = SIZE_MIB * 1024 * 1024 // 4
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
    # ones summed ITERATIONS times over world_size ranks: exact in float32 at these sizes
    expected = float(world_size ** ITERATIONS)
    correct = bool(torch.all(tensor == expected).item())
    if rank == 0:
        queue.put({"seconds": seconds, "correct": correct})
    dist.destroy_process_group()


def main() -> None:
    world_size = torch.cuda.device_count()
    nccl = {k: v for k, v in os.environ.items() if k.startswith("NCCL_")}
    if world_size < 2:
        print("IH-ALLREDUCE " + json.dumps({"world_size": world_size, "nccl_env": nccl}))
        return
    context = mp.get_context("spawn")
    queue = context.SimpleQueue()
    mp.spawn(worker, args=(world_size, free_port(), queue), nprocs=world_size, join=True)
    result = queue.get()
    size = SIZE_MIB * 1024 * 1024
    algbw = size / result["seconds"] / 1e9
    busbw = algbw * 2 * (world_size - 1) / world_size
    print("IH-ALLREDUCE " + json.dumps({
        "world_size": world_size, "size_mib": SIZE_MIB, "time_ms": result["seconds"] * 1e3,
        "algbw_gbps": algbw, "busbw_gbps": busbw, "correct": result["correct"],
        "nccl_version": ".".join(map(str, torch.cuda.nccl.version())), "nccl_env": nccl,
    }))


if __name__ == "__main__":
    main()
