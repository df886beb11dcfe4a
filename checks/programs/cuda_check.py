"""Run by the GPU suite with the engine environment's python: a small matrix product on every
GPU, checked against the CPU. Prints one line: IH-CUDA {"devices": [...]}."""

import json
import os
import sys

# What steers device visibility, as this process sees it (run in the service's environment).
ENV = {
    k: v
    for k, v in sorted(os.environ.items())
    if k.startswith(("CUDA_", "NVIDIA_", "LD_LIBRARY_PATH")) or k == "IH_ENV_SOURCE"
}

try:
    import torch
except Exception as error:  # any import failure is the finding to report
    print("IH-CUDA " + json.dumps({"error": f"import torch failed: {error}", "env": ENV}))
    sys.exit(0)

devices = []
if not torch.cuda.is_available():
    print(
        "IH-CUDA " + json.dumps({"error": "torch.cuda.is_available() is False", "torch": torch.__version__, "env": ENV})
    )
    sys.exit(0)
generator = torch.Generator().manual_seed(0)
a = torch.randn(512, 512, generator=generator, dtype=torch.float64)
expected = a @ a
for index in range(torch.cuda.device_count()):
    entry: dict[str, object] = {"index": index}
    try:
        with torch.cuda.device(index):
            props = torch.cuda.get_device_properties(index)
            entry.update(
                name=props.name,
                capability=f"{props.major}.{props.minor}",
                memory_mib=props.total_memory // (1024 * 1024),
            )
            got = (a.to(f"cuda:{index}") @ a.to(f"cuda:{index}")).cpu()
            torch.cuda.synchronize(index)
            entry["max_error"] = float((got - expected).abs().max())
            entry["ok"] = bool(torch.allclose(got, expected, rtol=1e-9, atol=1e-9))
    except Exception as error:  # a failing GPU is reported, the others still run
        entry.update(ok=False, error=f"{type(error).__name__}: {error}")
    devices.append(entry)
print("IH-CUDA " + json.dumps({"torch": torch.__version__, "cuda": torch.version.cuda, "devices": devices, "env": ENV}))
