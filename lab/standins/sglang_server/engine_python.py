#!/usr/bin/python3
"""STAND-IN for the engine environment's python as the checks use it (lab only: no GPU, no torch).

The checks run two things with the engine's python that need what the lab lacks:

- checks/programs/allreduce.py (the interconnect suite's all-reduce): torch and NCCL on the GPUs.
  Here the same collective runs for real on this machine's CPU: one process per GPU that
  nvidia-smi lists (the lab's nvidia-smi stand-in; torch.cuda.device_count() sees the driver's
  GPUs, narrowed by CUDA_VISIBLE_DEVICES), a reduce-scatter then all-gather over shared memory,
  the program's exact-sum check on rank + (i mod 1024), its warm-up and timed iterations, and its
  output lines (IH-ALLREDUCE-STAGE start / collective, IH-ALLREDUCE {json}) with the bus bandwidth
  measured here, which is the CPU's, not a GPU's: the lab's floor (health_allreduce_min_busbw_gbps)
  is set for it. At most MAX_SIZE_MIB, refused above (the program's default is 256 MiB).
- `-m sglang.bench_serving` (the benchmark; SGLang's client imports numpy and torch): the requests
  SGLang 0.5.9's client makes with --backend sglang-oai-chat (python/sglang/bench_serving.py
  async_request_openai_chat_completions: POST /v1/chat/completions, {"model", "messages",
  "max_completion_tokens", "stream": true, "temperature": 0.0, "ignore_eos": true}, the
  Authorization header from OPENAI_API_KEY, get_auth_headers), timed as it times them (TTFT at the
  first content chunk, ITL between chunks, the output length from the usage chunk or the request)
  and one JSON line appended to --output-file with its metric names (benchmark(): output_throughput
  = output tokens / duration, request_throughput, mean/median TTFT, ITL and TPOT in ms). The
  prompts are words, not the random token ids of --dataset-name random-ids: the lab's model has no
  tokenizer, and the stand-in server counts words as tokens.

Anything else runs with the real engine python (the deploy's environment), as before.
"""

from __future__ import annotations

import http.client
import json
import os
import statistics
import subprocess
import sys
import time
from array import array
from concurrent.futures import ThreadPoolExecutor
from multiprocessing import get_context, shared_memory
from urllib.parse import urlsplit

REAL_PYTHON = os.environ.get("INFERENCE_HOST_STANDIN_ENGINE_PYTHON", "/opt/inference-host/current/bin/python")
MAX_SIZE_MIB = 4
PATTERN = 1024  # checks/programs/allreduce.py
WARMUP, ITERATIONS = 5, 20
SHOWN = ("NCCL_", "CUDA_", "TORCH_", "NVSHMEM_", "SGLANG_", "SGL_", "PYTORCH_", "LD_")


# -- the all-reduce ------------------------------------------------------------------------------


def stage(name: str) -> None:
    print(f"IH-ALLREDUCE-STAGE {name} {time.time():.1f}", flush=True)


def device_count() -> int:
    listed = subprocess.run(
        ["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True, text=True, timeout=60
    )
    gpus = len(listed.stdout.split()) if listed.returncode == 0 else 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return gpus if visible is None else min(gpus, len([d for d in visible.split(",") if d.strip()]))


def all_reduce(rank: int, world: int, n: int, mine: array, data, result, barrier) -> array:
    """Reduce-scatter (each rank sums its slice over every rank's buffer) then all-gather."""
    view, out = data.buf.cast("f"), result.buf.cast("f")
    view[rank * n : (rank + 1) * n] = mine
    barrier.wait()
    lo, hi = rank * n // world, (rank + 1) * n // world
    slices = [view[k * n + lo : k * n + hi] for k in range(world)]
    out[lo:hi] = array("f", map(sum, zip(*slices, strict=True)))
    del slices
    barrier.wait()
    reduced = array("f", out)
    barrier.wait()  # nobody writes the next round before every rank has read this one
    del view, out
    return reduced


def worker(rank: int, world: int, n: int, names: tuple[str, str], barrier, queue) -> None:
    data, result = shared_memory.SharedMemory(names[0]), shared_memory.SharedMemory(names[1])
    check = all_reduce(rank, world, n, array("f", (float(i % PATTERN + rank) for i in range(n))), data, result, barrier)
    expected = [world * i + world * (world - 1) // 2 for i in range(PATTERN)]
    correct = all(check[i] == expected[i % PATTERN] for i in range(n))
    ones = array("f", [1.0]) * n
    for _ in range(WARMUP):
        all_reduce(rank, world, n, ones, data, result, barrier)
    barrier.wait()
    start = time.perf_counter()
    for _ in range(ITERATIONS):
        all_reduce(rank, world, n, ones, data, result, barrier)
    if rank == 0:
        queue.put({"seconds": (time.perf_counter() - start) / ITERATIONS, "correct": correct})
    data.close()
    result.close()


def allreduce(size_mib: int) -> int:
    stage("start")
    world = device_count()
    nccl = {k: v for k, v in sorted(os.environ.items()) if k.startswith(SHOWN)}
    source = os.environ.get("IH_ENV_SOURCE", "the caller's environment")
    if world < 2:
        print("IH-ALLREDUCE " + json.dumps({"world_size": world, "nccl_env": nccl, "env_source": source}))
        return 0
    if size_mib > MAX_SIZE_MIB:
        print(
            f"lab stand-in: {size_mib} MiB is more than this CPU all-reduce takes ({MAX_SIZE_MIB} MiB):"
            " set health_allreduce_size_mib",
            file=sys.stderr,
        )
        return 1
    n = size_mib * 1024 * 1024 // 4
    context = get_context("spawn")
    data = shared_memory.SharedMemory(create=True, size=world * n * 4)
    result = shared_memory.SharedMemory(create=True, size=n * 4)
    barrier, queue = context.Barrier(world), context.SimpleQueue()
    try:
        stage("collective")
        ranks = [
            context.Process(target=worker, args=(r, world, n, (data.name, result.name), barrier, queue))
            for r in range(world)
        ]
        for process in ranks:
            process.start()
        for process in ranks:
            process.join()
        if any(process.exitcode for process in ranks):
            print(f"lab stand-in: a rank failed: exit codes {[p.exitcode for p in ranks]}", file=sys.stderr)
            return 1
        found = queue.get()
    finally:
        for block in (data, result):
            block.close()
            block.unlink()
    algbw = size_mib * 1024 * 1024 / found["seconds"] / 1e9
    print(
        "IH-ALLREDUCE "
        + json.dumps(
            {
                "world_size": world,
                "size_mib": size_mib,
                "time_ms": found["seconds"] * 1e3,
                "algbw_gbps": algbw,
                "busbw_gbps": algbw * 2 * (world - 1) / world,
                "correct": found["correct"],
                "nccl_version": "none (lab stand-in: CPU processes over shared memory)",
                "nccl_env": nccl,
                "env_source": source,
            }
        ),
        flush=True,
    )
    return 0


# -- SGLang's benchmark client ---------------------------------------------------------------------


def options(argv: list[str]) -> dict[str, str]:
    found, key = {}, None
    for word in argv:
        if word.startswith("--"):
            key = word[2:]
            found[key] = "true"
        elif key:
            found[key], key = word, None
    return found


def one_request(base: str, model: str, input_len: int, output_len: int, index: int) -> dict:
    url = urlsplit(base)
    if not url.hostname:
        raise SystemExit(f"engine_python stand-in: no host in the server URL {base!r}")
    connection = http.client.HTTPConnection(url.hostname, url.port or 80, timeout=600)
    prompt = " ".join(f"w{(index * 7919 + i) % 1000}" for i in range(input_len))
    payload = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_completion_tokens": output_len,
        "stream": True,
        "temperature": 0.0,
        "ignore_eos": True,
    }
    headers = {"Content-Type": "application/json"}
    if os.environ.get("OPENAI_API_KEY"):
        headers["Authorization"] = f"Bearer {os.environ['OPENAI_API_KEY']}"
    began = last = time.perf_counter()
    ttft, itl, length = 0.0, [], output_len
    connection.request("POST", (url.path.rstrip("/") or "") + "/v1/chat/completions", json.dumps(payload), headers)
    response = connection.getresponse()
    if response.status != 200:
        return {"success": False, "error": f"HTTP {response.status}: {response.read()[:200]!r}"}
    for raw in response:
        chunk = raw.decode().strip().removeprefix("data: ")
        if not chunk or chunk == "[DONE]":
            continue
        data = json.loads(chunk)
        if ((data.get("choices") or [{}])[0].get("delta") or {}).get("content"):
            now = time.perf_counter()
            if ttft == 0.0:
                ttft = now - began
            else:
                itl.append(now - last)
            last = now
        length = (data.get("usage") or {}).get("completion_tokens", length)
    connection.close()
    return {"success": True, "latency": time.perf_counter() - began, "ttft": ttft, "itl": itl, "output_len": length}


def bench_serving(argv: list[str]) -> int:
    given = options(argv)
    input_len, output_len = int(given["random-input-len"]), int(given["random-output-len"])
    prompts, concurrency = int(given["num-prompts"]), int(given.get("max-concurrency", "1"))
    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        outputs = list(
            pool.map(lambda i: one_request(given["base-url"], given["model"], input_len, output_len, i), range(prompts))
        )
    duration = time.perf_counter() - started
    done = [o for o in outputs if o["success"]]
    if not done:
        print(f"lab stand-in bench_serving: every request failed: {outputs[0].get('error')}", file=sys.stderr)
        return 1
    lengths = [o["output_len"] for o in done]
    ttfts = [o["ttft"] * 1000 for o in done]
    itls = [x * 1000 for o in done for x in o["itl"]] or [0.0]
    tpots = [(o["latency"] - o["ttft"]) / (o["output_len"] - 1) * 1000 for o in done if o["output_len"] > 1] or [0.0]
    result = {
        "tag": "lab stand-in client (lab/standins/sglang_server/engine_python.py)",
        "backend": given.get("backend"),
        "dataset_name": given.get("dataset-name"),
        "request_rate": float("inf"),
        "max_concurrency": concurrency,
        "random_input_len": input_len,
        "random_output_len": output_len,
        "random_range_ratio": float(given.get("random-range-ratio", "0")),
        "duration": duration,
        "completed": len(done),
        "total_input_tokens": input_len * len(done),
        "total_output_tokens": sum(lengths),
        "request_throughput": len(done) / duration,
        "input_throughput": input_len * len(done) / duration,
        "output_throughput": sum(lengths) / duration,
        "mean_ttft_ms": statistics.mean(ttfts),
        "median_ttft_ms": statistics.median(ttfts),
        "mean_itl_ms": statistics.mean(itls),
        "median_itl_ms": statistics.median(itls),
        "mean_tpot_ms": statistics.mean(tpots),
        "median_tpot_ms": statistics.median(tpots),
        "accept_length": None,
    }
    with open(given["output-file"], "a") as file:
        file.write(json.dumps(result) + "\n")
    print(f"lab stand-in bench_serving: {len(done)} requests, {result['output_throughput']:.1f} output tok/s")
    return 0


def main(argv: list[str]) -> int:
    if len(argv) >= 1 and os.path.basename(argv[0]) == "allreduce.py":
        return allreduce(int(argv[1]) if len(argv) > 1 else 256)
    if argv[:2] == ["-m", "sglang.bench_serving"]:
        return bench_serving(argv[2:])
    os.execv(REAL_PYTHON, [REAL_PYTHON, *argv])
    return 127


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
