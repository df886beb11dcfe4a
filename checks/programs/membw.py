"""Run by the GPU suite with the engine environment's python: device-memory bandwidth per GPU.

A device-to-device copy of SIZE_MIB reads and writes every byte, so bandwidth is
2 * bytes / time (the convention of NVIDIA's bandwidthTest and nvbandwidth's device-local
copy). Copies are queued on every GPU at once for about LOAD_S seconds, timed with CUDA
events; while they run, nvidia-smi is asked for each GPU's PCIe link (a GPU lowers its link
speed when idle, so the link is judged here, under load). Prints one line:
IH-MEMBW {"devices": [{"index": 0, "gbps": ...}], "pcie_under_load": "<nvidia-smi csv>"}.
"""

import json
import os
import subprocess
import sys
import time

import torch

SIZE_MIB = int(sys.argv[1]) if len(sys.argv) > 1 else 2048
LOAD_S = float(sys.argv[2]) if len(sys.argv) > 2 else 2.0
SMI = sys.argv[3] if len(sys.argv) > 3 else "nvidia-smi"
# CUDA queues about a thousand launches per stream before the CPU blocks; staying below keeps
# every GPU's copies queued before the first one drains, so all GPUs are under load together.
MAX_COPIES = 800
PCIE_FIELDS = (
    "index,pci.bus_id,pstate,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max"
)


def main() -> None:
    count = torch.cuda.device_count()
    n = SIZE_MIB * 1024 * 1024
    buffers, plans = [], []
    for i in range(count):
        src = torch.empty(n, dtype=torch.uint8, device=f"cuda:{i}").fill_(1)
        dst = torch.empty_like(src)
        with torch.cuda.device(i):
            for _ in range(3):
                dst.copy_(src)
            torch.cuda.synchronize(i)
            start = time.perf_counter()
            for _ in range(5):
                dst.copy_(src)
            torch.cuda.synchronize(i)
            per_copy = (time.perf_counter() - start) / 5
        buffers.append((src, dst))
        plans.append(min(MAX_COPIES, max(10, int(LOAD_S / per_copy))))
    events = []
    for i, ((src, dst), iterations) in enumerate(zip(buffers, plans, strict=True)):
        with torch.cuda.device(i):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iterations):
                dst.copy_(src)
            end.record()
            events.append((start, end, iterations))
    time.sleep(0.3)
    try:
        pcie = subprocess.run(
            [SMI, f"--query-gpu={PCIE_FIELDS}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
    except (OSError, subprocess.SubprocessError) as error:
        pcie = f"nvidia-smi failed: {error}"
    devices = []
    for i, (start, end, iterations) in enumerate(events):
        torch.cuda.synchronize(i)
        ms = start.elapsed_time(end) / iterations
        devices.append(
            {
                "index": i,
                "name": torch.cuda.get_device_name(i),
                "gbps": 2 * n / (ms / 1e3) / 1e9,
                "size_mib": SIZE_MIB,
                "copies": iterations,
            }
        )
    env = {k: v for k, v in sorted(os.environ.items()) if k.startswith(("CUDA_", "NVIDIA_")) or k == "IH_ENV_SOURCE"}
    print("IH-MEMBW " + json.dumps({"devices": devices, "pcie_under_load": pcie, "env": env}))


if __name__ == "__main__":
    main()
