"""The hashed locks of the tools root installs with pip, outside the engine environments:

    weights-tool   roles/weights/files/    huggingface_hub + hf_xet (the weights downloader, run as
                                           root on the Proxmox node or the gpu node)
    cuobjdump      roles/wheels/files/     nvidia-cuda-cuobjdump (checks the built wheels)
    build-tools    roles/wheels/docker/wheels/
                                           setuptools, wheel, ninja, ... (the kernel builders' image)
    uv-<version>   locks/ beside the stack file
                                           uv itself (the stack file's `uv` pin; roles/base)

Each lock is made from its requirements (<name>.in beside it; uv's from the stack file's pin)
by `uv pip compile --universal --generate-hashes --only-binary :all:`: one resolution valid on
every host Python from MIN_PYTHON (Debian 12's 3.11: Proxmox VE 8, the lab; Ubuntu 24.04's
3.12), with the sha256 of every wheel of every pinned release and no source distribution (a
hashed sdist would still build with unhashed build requirements). Hosts install it with

    pip install --require-hashes --only-binary :all: -r LOCK

so a file whose hash is not in the lock (a re-uploaded or tampered release, a mirror's other
build) stops the install. Like the engines' locks, each carries a digest of what it was made
from and a seal over its whole text (roles/site/lock.py); a stale or edited lock is refused
before any host is touched, with the command that remakes it:

    uv run python -m roles.shared.tool_locks weights-tool cuobjdump build-tools
    uv run python -m roles.shared.tool_locks --uv inventory/stack.yml
    (or: inference-host lock tools ...)
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from roles.site import SiteError
from roles.site import lock as site_lock

ROLES = Path(__file__).resolve().parent.parent
MIN_PYTHON = site_lock.TOOL_MIN_PYTHON
COMMAND = "uv run python -m roles.shared.tool_locks"
# What every install of a tool lock passes to pip (written literally in each sh() template; the
# plan test tests/unit/test_tool_locks.py holds every rendered install to it).
PIP_INSTALL_OPTIONS = "--require-hashes --only-binary :all:"


@dataclass(frozen=True)
class ToolLock:
    name: str
    folder: Path

    @property
    def requirements_file(self) -> Path:
        return self.folder / f"{self.name}.in"

    @property
    def path(self) -> Path:
        return self.folder / f"{self.name}.lock.txt"

    def requirements(self) -> list[str]:
        lines = self.requirements_file.read_text().splitlines()
        return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]

    @property
    def remake(self) -> str:
        """The command line that remakes this lock, as a user types it."""
        return f"{COMMAND} {self.name}"

    def problem(self) -> str | None:
        """None when the committed lock was made from the requirements beside it and is sealed."""
        return site_lock.tool_lock_problem(self.path, self.requirements(), self.remake)

    def text(self) -> str:
        """What a host installs: the lock without its seal line (roles/site/lock.py)."""
        return site_lock.unsealed(self.path.read_text())


def tool_lock_text(lock: ToolLock) -> str:
    """The lock a role uploads; a stale, edited or unhashed one stops the deploy while planning."""
    problem = lock.problem()
    if problem:
        from roles.shared.refusal import Refused

        raise Refused(f"{lock.folder.relative_to(ROLES.parent)}/{problem}")
    return lock.text()


WEIGHTS_TOOL = ToolLock("weights-tool", ROLES / "weights" / "files")
CUOBJDUMP = ToolLock("cuobjdump", ROLES / "wheels" / "files")
BUILD_TOOLS = ToolLock("build-tools", ROLES / "wheels" / "docker" / "wheels")
TOOL_LOCKS = {lock.name: lock for lock in (WEIGHTS_TOOL, CUOBJDUMP, BUILD_TOOLS)}


# -- making them (talks to the index) ---------------------------------------------------------------


def compile_command(uv: str, index_url: str | None) -> list[str]:
    command = [uv, "pip", "compile", "-", "--quiet", "--no-header", "--generate-hashes", "--universal"]
    command += ["--python-version", MIN_PYTHON, "--only-binary", ":all:"]
    if index_url:
        command += ["--index-url", index_url]
    return command


def make(path: Path, title: str, requirements: list[str], command: str, index_url: str | None) -> Path:
    from roles.shared import lock_compile  # the index is asked only here

    body = lock_compile.resolve(
        compile_command(lock_compile.uv_binary(), index_url),
        requirements,
        title,
        MIN_PYTHON,
        "fix the requirements (each must have wheels for Linux x86_64)",
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(site_lock.sealed(site_lock.tool_header(title, command, requirements) + body))
    return path


def make_tool_lock(lock: ToolLock, index_url: str | None) -> Path:
    title = f"{lock.name} ({lock.requirements_file.name})"
    return make(lock.path, title, lock.requirements(), lock.remake, index_url)


def main(argv: list[str] | None = None) -> int:
    from roles.shared import lock_compile
    from roles.site.command_line import OneLineParser

    parser = OneLineParser(prog="python -m roles.shared.tool_locks", description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help=f"tool locks to make ({', '.join(TOOL_LOCKS)})")
    parser.add_argument("--all", action="store_true", help="every tool lock (not uv's)")
    parser.add_argument("--uv", metavar="STACK_FILE", default=None, help="uv's lock, for the stack file's uv pin")
    parser.add_argument("--index-url", default=None, help="package index (a mirror); default: UV_INDEX_URL or PyPI")
    args = parser.parse_args(argv)
    if not args.names and not args.all and not args.uv:
        parser.error(f"name the locks to make ({', '.join(TOOL_LOCKS)}), --all or --uv STACK_FILE; nothing written")

    def jobs():
        unknown = [name for name in args.names if name not in TOOL_LOCKS]
        if unknown:
            raise SiteError([f"no tool lock {', '.join(unknown)}; tool locks: {', '.join(TOOL_LOCKS)}"])
        chosen = list(TOOL_LOCKS.values()) if args.all else [TOOL_LOCKS[n] for n in args.names]
        found: list[tuple[str, Callable[[], Path]]] = [
            (lock.name, functools.partial(make_tool_lock, lock, args.index_url)) for lock in chosen
        ]
        if args.uv:
            from roles.site.stack import load_stack

            version = load_stack(Path(args.uv)).uv
            found.append(
                (
                    f"uv {version}",
                    functools.partial(
                        make,
                        site_lock.uv_lock_path(Path(args.uv), version),
                        f"uv {version} ({args.uv})",
                        site_lock.uv_roots(version),
                        site_lock.uv_lock_command(args.uv),
                        args.index_url,
                    ),
                )
            )
        return found

    return lock_compile.run_lock_command(jobs)


if __name__ == "__main__":
    raise SystemExit(main())
