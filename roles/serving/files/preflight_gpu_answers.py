"""The GPUs' answers for engine_preflight.py --answer-gpus, where the target's GPUs are not here
(the preview on the control machine, the project's tests): what the engine releases ask the GPUs
before they load a weight, answered from the inventory. Never installed on a host that serves
(roles/serving installs engine_preflight.py alone), so a host's gate always asks its own GPUs.
Standard library only until torch is imported.
"""

from __future__ import annotations

import dataclasses
import os
import re
import stat
import tempfile
from pathlib import Path


def answer_gpus(gpus: dict) -> None:
    """Answer the questions the releases ask the GPUs before loading a weight, as the target's
    GPUs would: torch.cuda's availability, count, name, compute capability and memory, and
    `nvidia-smi --query-gpu=...` (sglang's get_nvgpu_memory_capacity and
    get_device_sm_nvidia_smi, srt/utils/common.py). Installed before the engine is imported:
    its modules read these at import (e.g. `_is_cuda = is_cuda()`)."""
    import torch

    count, memory = int(gpus["count"]), int(gpus["memory_mib"]) * 1024 * 1024
    major, minor = (int(part) for part in gpus["capability"])
    properties = _Properties(gpus["name"], memory, major, minor, int(gpus.get("multi_processor_count", 188)))
    cuda = torch.cuda
    cuda.is_available = lambda: True
    cuda.device_count = lambda: count
    cuda.current_device = lambda: 0
    cuda.get_device_capability = lambda device=None: (major, minor)
    cuda.get_device_name = lambda device=None: gpus["name"]
    cuda.get_device_properties = lambda device=None: properties
    cuda.mem_get_info = lambda device=None: (memory, memory)
    cuda.is_initialized = lambda: True
    _nvidia_smi_on_path(gpus, count)
    _driver_library_answers()


@dataclasses.dataclass(frozen=True)
class _Properties:
    """torch.cuda.get_device_properties()'s fields that the releases read."""

    name: str
    total_memory: int
    major: int
    minor: int
    multi_processor_count: int
    is_integrated: bool = False
    L2_cache_size: int = 128 * 1024 * 1024


NVIDIA_SMI_ANSWERS = """#!/bin/sh
# Answers `nvidia-smi --query-gpu=FIELDS --format=csv,noheader[,nounits]` as the target's GPUs
# would (engine_preflight.py --answer-gpus: a machine without them). Nothing else.
query=""; units=yes
for a in "$@"; do case "$a" in --query-gpu=*) query=${a#--query-gpu=};; --format=*nounits*) units=no;; esac; done
[ -n "$query" ] || { echo "this stand-in answers --query-gpu only" >&2; exit 2; }
i=0
while [ $i -lt %(count)d ]; do
  line=""
  for f in $(echo "$query" | tr ',' ' '); do
    case "$f" in
      index) v=$i;; name) v="%(name)s";; compute_cap) v="%(cap)s";; count) v=%(count)d;;
      memory.total) v=%(memory)d; [ $units = yes ] && v="$v MiB";;
      *) v="[N/A]";;
    esac
    line="${line:+$line, }$v"
  done
  echo "$line"; i=$((i + 1))
done
"""


def _nvidia_smi_on_path(gpus: dict, count: int) -> None:
    folder = Path(tempfile.mkdtemp(prefix="engine-preflight-gpus-"))
    script = folder / "nvidia-smi"
    script.write_text(
        NVIDIA_SMI_ANSWERS
        % {
            "count": count,
            "name": gpus["name"],
            "memory": int(gpus["memory_mib"]),
            "cap": ".".join(str(p) for p in gpus["capability"]),
        }
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    os.environ["PATH"] = f"{folder}{os.pathsep}{os.environ.get('PATH', '')}"


def _driver_library_answers() -> None:
    """The kernel packages' extension modules link the driver's libcuda.so.1 (sgl-kernel's
    common_ops, deep_gemm, mscclpp ...), so importing them needs the driver's userspace, which
    a machine without NVIDIA's driver lacks. Stand in for exactly the driver functions those
    modules name (each returns CUDA_ERROR_NO_DEVICE, 100, as libcuda does without a GPU; none is
    called before a weight loads) in a library of that soname, loaded first: the dynamic
    linker then binds every later `NEEDED libcuda.so.1` to it."""
    import ctypes
    import shutil
    import subprocess
    import sysconfig

    if any(Path(folder, "libcuda.so.1").exists() for folder in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64")):
        return  # the driver's own library is here
    found = {tool: shutil.which(tool) for tool in ("readelf", "nm", "cc")}
    tools = {tool: path for tool, path in found.items() if path}
    if len(tools) < len(found):
        raise RuntimeError(
            "--answer-gpus on a machine without NVIDIA's driver needs readelf, nm (binutils)"
            " and a C compiler (cc) to stand in for libcuda.so.1; install them"
        )
    site = Path(sysconfig.get_paths()["purelib"])
    symbols: set[str] = set()
    for library in sorted(site.rglob("*.so*")):
        if not library.is_file():
            continue
        dynamic = subprocess.run([tools["readelf"], "-d", str(library)], capture_output=True, text=True).stdout
        if "[libcuda.so.1]" not in dynamic:
            continue
        listed = subprocess.run(
            [tools["nm"], "-D", "--undefined-only", str(library)], capture_output=True, text=True
        ).stdout
        symbols |= {
            line.split()[-1]
            for line in listed.splitlines()
            if line.split() and re.fullmatch(r"cu[A-Z]\w*", line.split()[-1])
        }
    folder = Path(tempfile.mkdtemp(prefix="engine-preflight-driver-"))
    source = folder / "libcuda.c"
    source.write_text(
        "".join(f"int {name}(void) {{ return 100; }}\n" for name in sorted(symbols))
        or "int cuInit(void) { return 100; }\n"
    )
    built = subprocess.run(
        [tools["cc"], "-shared", "-fPIC", "-o", str(folder / "libcuda.so.1"), "-Wl,-soname,libcuda.so.1", str(source)],
        capture_output=True,
        text=True,
    )
    if built.returncode != 0:
        raise RuntimeError(f"could not build the libcuda.so.1 stand-in: {built.stderr.strip()[:500]}")
    ctypes.CDLL(str(folder / "libcuda.so.1"), mode=ctypes.RTLD_GLOBAL)
