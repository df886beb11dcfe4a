"""Make the committed lock of the EAGLE-3 training job's environment (talks to the index).

    uv run python -m roles.eagle3_training.lock 82951a9       # this one
    uv run python -m roles.eagle3_training.lock --all         # every files/specforge-<lock>.in
    uv run python -m roles.eagle3_training.lock --all --index-url https://mirror/simple

With no argument it refuses, as the engines' and the gateway's lock commands do: a committed lock
is rewritten only when it is named.

files/specforge-<lock>.in lists SpecForge's dependencies at that commit (its pyproject.toml's
`dependencies`, plus openai and huggingface-hub, which the job's driver uses). They are
resolved with hashes like an engine stack's pins (roles/shared/lock_compile.py: CPython 3.12,
x86_64 manylinux_2_39) into files/specforge-<lock>.lock.txt, whose header records a digest
of the .in file; loading an inventory that enables the job refuses a lock that is missing or
was made from another .in (roles/eagle3_training/checks.py). Commit the result. Hosts install
it exactly (`uv pip sync --require-hashes`, roles/shared/locked_env.py).
"""

from __future__ import annotations

from pathlib import Path

from roles.eagle3_training.lock_files import FILES, PYTHON, lock_file, requirements_file
from roles.shared import lock_compile
from roles.site import SiteError
from roles.site import lock as site_lock
from roles.site.command_line import OneLineParser


def requirements(lock: str) -> list[str]:
    lines = requirements_file(lock).read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def command(lock: str) -> str:
    return f"uv run python -m roles.eagle3_training.lock {lock}"


def lock_problem(lock: str) -> str | None:
    """None when files/specforge-<lock>.lock.txt was made from files/specforge-<lock>.in."""
    if not requirements_file(lock).is_file():
        return f"no requirements file {requirements_file(lock).name}"
    return site_lock.requirements_lock_problem(lock_file(lock), requirements(lock), PYTHON, command(lock))


def make_lock(lock: str, index_url: str | None = None) -> Path:
    wanted = requirements(lock)
    compile_ = lock_compile.compile_command(lock_compile.uv_binary(), PYTHON, (), index_url)
    body = lock_compile.resolve(
        compile_, wanted, f"SpecForge lock {lock}", PYTHON, f"fix {requirements_file(lock).name}"
    )
    title = f"the EAGLE-3 training job (SpecForge {lock}, {requirements_file(lock).name})"
    lock_file(lock).write_text(
        site_lock.sealed(site_lock.requirements_header(title, command(lock), wanted, PYTHON) + body)
    )
    return lock_file(lock)


def main(argv: list[str] | None = None, prog: str = "python -m roles.eagle3_training.lock") -> int:
    parser = OneLineParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("locks", nargs="*", help="lock ids (7-character SpecForge commits)")
    parser.add_argument("--all", action="store_true", help="every files/specforge-<lock>.in")
    parser.add_argument("--index-url", default=None, help="package index (a mirror); default: UV_INDEX_URL or PyPI")
    args = parser.parse_args(argv)
    known = sorted(p.name[len("specforge-") : -len(".in")] for p in FILES.glob("specforge-*.in"))
    if not args.locks and not args.all:
        parser.error(f"name the locks to make ({', '.join(known)}) or give --all; nothing written")

    def jobs():
        unknown = [lock for lock in args.locks if lock not in known]
        if unknown:
            raise SiteError([f"no {', '.join(f'files/specforge-{u}.in' for u in unknown)}; locks: {', '.join(known)}"])
        return [
            (f"SpecForge {lock}", lambda lock=lock: make_lock(lock, args.index_url)) for lock in args.locks or known
        ]

    return lock_compile.run_lock_command(jobs)


if __name__ == "__main__":
    raise SystemExit(main())
