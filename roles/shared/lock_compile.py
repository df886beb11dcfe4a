"""Resolving a lock on the control machine (the one step that talks to the index): `uv pip
compile --generate-hashes` of some root requirements for the target platform. Used by the
engine stacks' lock command (roles/engine_envs/lock.py) and the gateway's (roles/gateway/lock.py);
the lock's format, place and staleness are roles/site/lock.py's."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from roles.site import SiteError
from roles.site import lock as site_lock

COMPILE_TIMEOUT_S = 600


def uv_binary() -> str:
    found = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
    if not Path(found).exists():
        raise SiteError(["the lock command needs uv on the control machine (docs/lab.md: Prerequisites)"])
    return found


def compile_command(
    uv: str, python: str, no_emit=(), index_url: str | None = None, platform: str = site_lock.TARGET_PLATFORM
) -> list[str]:
    command = [
        uv,
        "pip",
        "compile",
        "-",
        "--quiet",
        "--no-header",
        "--generate-hashes",
        "--python-version",
        python,
        "--python-platform",
        platform,
    ]
    for package in no_emit:
        command += ["--no-emit-package", package]
    if index_url:
        command += ["--index-url", index_url]
    return command


OVERRIDES_FILE = "overrides.txt"


def resolve(
    command: list[str],
    roots: list[str],
    what: str,
    python: str,
    fix: str,
    preferences: str | None = None,
    overrides: Sequence[str] = (),
) -> str:
    """uv's hashed resolution of roots (the lock body); raises SiteError naming what, with
    uv's own explanation of a conflict and how to fix it.
    preferences: the committed lock's body, whose versions uv keeps wherever they still
    satisfy the pins (uv pip compile reads an existing --output-file as preferences), so a
    re-lock changes only what it must. overrides: requirements that replace the pins of the
    resolved packages (--overrides). uv runs in a scratch folder and is given both files by
    their bare names, because it writes the overrides file's path into the lock's `# via`."""
    with tempfile.TemporaryDirectory(prefix="inference-host-lock-") as folder:
        if overrides:
            Path(folder, OVERRIDES_FILE).write_text("".join(f"{line}\n" for line in overrides))
            command = [*command, "--overrides", OVERRIDES_FILE]
        if preferences is not None:
            Path(folder, "lock.txt").write_text(preferences)
            command = [*command, "--output-file", "lock.txt"]
        body = _compile(command, roots, what, python, fix, folder)
        return Path(folder, "lock.txt").read_text() if preferences is not None else body


def _compile(command: list[str], roots: list[str], what: str, python: str, fix: str, folder: str) -> str:
    try:
        result = subprocess.run(
            command,
            input="\n".join(roots) + "\n",
            text=True,
            capture_output=True,
            cwd=folder,
            timeout=COMPILE_TIMEOUT_S,
            env={**os.environ, "UV_NO_PROGRESS": "1"},
        )
    except subprocess.TimeoutExpired:
        raise SiteError(
            [
                f"{what}: uv pip compile did not finish in {COMPILE_TIMEOUT_S}s"
                " (is the index reachable? --index-url sets a mirror)"
            ]
        ) from None
    if result.returncode != 0:
        raise SiteError(
            [
                f"{what}: the pins {', '.join(roots)} do not resolve together"
                f" for Python {python} on {site_lock.TARGET_PLATFORM}; uv says:\n"
                + "\n".join("      " + line for line in result.stderr.strip().splitlines())
                + f"\n    {fix}"
            ]
        )
    return result.stdout


def run_lock_command(jobs: Callable[[], Iterable[tuple[str, Callable[[], Path]]]]) -> int:
    """A lock command's main loop: make each (label, make) lock, print what it holds; a
    SiteError (raised while listing the jobs or making one) is printed and exits 2."""
    try:
        for label, make in jobs():
            path = make()
            print(f"{label}: {len(site_lock.entries(path.read_text()))} packages locked in {path}")
    except SiteError as error:
        print("\n".join(error.problems), file=sys.stderr)
        return 2
    return 0
