"""Run by the interconnect suite with the engine environment's python, in the service's
environment: the engine's own all-reduce across every GPU, checked against the exact sum.

It starts the tensor-parallel group the way SGLang 0.5.9's ModelRunner does
(sglang/srt/model_executor/model_runner.py, init_torch_distributed):
set_custom_all_reduce(not --disable-custom-all-reduce), init_distributed_environment(nccl,
tcp://127.0.0.1:<port>), initialize_model_parallel(tp = all GPUs); then calls
tensor_model_parallel_all_reduce (sglang/srt/distributed/communication_op.py), which every
tensor-parallel layer calls. GroupCoordinator.all_reduce (parallel_state.py) picks SGLang's
custom all-reduce when its communicator is enabled and should_custom_ar() accepts the tensor,
else NCCL (pynccl / torch.distributed): the program reports which one each size went through.
Sizes are the engine's: bf16 rows of the model's hidden size (7168, Kimi-K2) for a decode
step, a prefill chunk, and one above custom all-reduce's buffer (NCCL).

Values are small integers ((i mod 8) + rank), so every sum is exact in bf16 (< 256).

    python engine_allreduce.py [--disable-custom-all-reduce] [--communicator engine|torch-nccl]
                               [--break-for-test]

--communicator torch-nccl uses torch.distributed's NCCL group directly (where SGLang is not
installed); torch-gloo runs --ranks CPU processes (float32: the judgement and the multi-rank
bookkeeping tested where there are fewer GPUs than ranks); --break-for-test adds 1 to every
reduced element, to prove the check fails on a wrong sum. Prints IH-ENGINE-ALLREDUCE {...}.
"""

import argparse
import json
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HIDDEN = 7168
ROWS = (1, 16, 256, 2048)
PATTERN = 8


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def method_of(group, tensor) -> str:
    """Which communicator SGLang's GroupCoordinator.all_reduce takes for this tensor."""
    if group is None:
        return f"torch.distributed {dist.get_backend()}"
    if group.world_size == 1:
        return "none (world size 1: SGLang returns the input)"
    ca = getattr(group, "ca_comm", None)
    if ca is not None and not ca.disabled and ca.should_custom_ar(tensor):
        return "sglang custom all-reduce"
    return "nccl (pynccl / torch.distributed)"


def worker(rank: int, world_size: int, port: int, args, queue) -> None:
    init = f"tcp://127.0.0.1:{port}"
    group = None
    device, dtype = "cpu", torch.float32
    if args.communicator == "torch-gloo":
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world_size)

        def reduce(tensor):
            dist.all_reduce(tensor)
            return tensor
    elif args.communicator == "engine":
        torch.cuda.set_device(rank)
        device, dtype = f"cuda:{rank}", torch.bfloat16
        from sglang.srt.distributed import parallel_state as ps
        from sglang.srt.distributed.communication_op import tensor_model_parallel_all_reduce

        ps.set_custom_all_reduce(not args.disable_custom_all_reduce)
        ps.init_distributed_environment(
            backend="nccl", world_size=world_size, rank=rank, local_rank=rank, distributed_init_method=init
        )
        ps.initialize_model_parallel(tensor_model_parallel_size=world_size)
        group = ps.get_tp_group()
        reduce = tensor_model_parallel_all_reduce
    else:
        torch.cuda.set_device(rank)
        device, dtype = f"cuda:{rank}", torch.bfloat16
        dist.init_process_group(
            "nccl", init_method=init, rank=rank, world_size=world_size, device_id=torch.device(device)
        )

        def reduce(tensor):
            dist.all_reduce(tensor)
            return tensor

    if rank == 0:
        print(f"IH-ENGINE-ALLREDUCE-STAGE collective {time.time():.1f}", flush=True)
    results = []
    for rows in ROWS:
        base = (torch.arange(rows * HIDDEN, device=device) % PATTERN).view(rows, HIDDEN)
        tensor = (base + rank).to(dtype)
        method = method_of(group, tensor)
        out = reduce(tensor)
        if args.break_for_test:
            out = out + 1
        if device != "cpu":
            torch.cuda.synchronize()
        expected = (base * world_size + world_size * (world_size - 1) // 2).to(dtype)
        wrong = int((out != expected).sum().item())
        results.append(
            {
                "rows": rows,
                "bytes": tensor.numel() * tensor.element_size(),
                "method": method,
                "wrong_elements": wrong,
                "elements": tensor.numel(),
            }
        )
    queue.put({"rank": rank, "results": results})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--disable-custom-all-reduce", action="store_true")
    parser.add_argument("--communicator", choices=("engine", "torch-nccl", "torch-gloo"), default="engine")
    parser.add_argument("--ranks", type=int, default=0, help="torch-gloo: CPU processes (default: GPUs)")
    parser.add_argument("--break-for-test", action="store_true")
    args = parser.parse_args()
    print(f"IH-ENGINE-ALLREDUCE-STAGE start {time.time():.1f}", flush=True)
    world_size = torch.cuda.device_count()
    if args.communicator == "torch-gloo":
        world_size = args.ranks or max(world_size, 2)
    base = {
        "world_size": world_size,
        "communicator": args.communicator,
        "custom_all_reduce": not args.disable_custom_all_reduce,
        "broken_for_test": args.break_for_test,
        "env_source": os.environ.get("IH_ENV_SOURCE", "the caller's environment"),
    }
    if args.communicator == "engine":
        try:
            import sglang
            from sglang.srt.distributed import parallel_state  # noqa: F401

            base["sglang"] = sglang.__version__
        except Exception as error:  # the finding to report
            print(
                "IH-ENGINE-ALLREDUCE "
                + json.dumps({**base, "error": f"import sglang failed: {type(error).__name__}: {error}"})
            )
            return
    if world_size < 1:
        print("IH-ENGINE-ALLREDUCE " + json.dumps({**base, "error": "torch sees no GPU"}))
        return
    start = time.perf_counter()
    context = mp.get_context("spawn")
    queue = context.SimpleQueue()
    mp.spawn(worker, args=(world_size, free_port(), args, queue), nprocs=world_size, join=True)
    ranks = sorted((queue.get() for _ in range(world_size)), key=lambda r: r["rank"])
    wrong = sum(r["wrong_elements"] for rank in ranks for r in rank["results"])
    print(
        "IH-ENGINE-ALLREDUCE "
        + json.dumps(
            {
                **base,
                "correct": wrong == 0,
                "wrong_elements": wrong,
                "seconds": time.perf_counter() - start,
                "sizes": ranks[0]["results"],
                "per_rank_wrong": [sum(r["wrong_elements"] for r in rank["results"]) for rank in ranks],
            }
        )
    )


if __name__ == "__main__":
    main()
