"""A uv environment installed exactly from a committed lock, built beside the live one: the
engine environments (roles/engine_envs) and the gateway's (roles/gateway) are made the same way.

    <envs>/<name>.building   made from nothing: `uv venv`, `uv pip sync --require-hashes LOCK`
    <envs>/<name>            renamed into place (`mv -T`) only once complete, with a copy of the
                             lock it was installed from and a marker naming it (its stamp)

The name carries a stamp (a hash of the lock text and whatever else shapes the environment),
so a changed lock is a new folder and the live one is never replaced in place. A failed build
removes only its own `.building` folder and says that the live environment still serves.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable

from pyinfra.api import FactBase

from roles.shared.fact_batch import batched
from roles.shared.shell import Shell, chain, sh

MARKER = ".inference-host-stack"
LOCK_COPY_NAME = "inference-host-lock.txt"
STAMP_CHARS = 12


def stamp(parts: Iterable[str]) -> str:
    """A short hash of everything that shapes an environment."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()[:STAMP_CHARS]


@batched
class EnvironmentStamp(FactBase):
    """Returns the name a finished install left in an environment (None: not built)."""

    def command(self, env_dir: str) -> Shell:
        return sh("cat -- {marker} 2>/dev/null || true", marker=f"{env_dir}/{MARKER}")

    def process(self, output: list[str]) -> str | None:
        text = "\n".join(output).strip()
        return text or None


def build_command(
    target: str,
    python: str,
    requirements: str,
    current: str,
    checks: Iterable[Shell] = (),
    installs: Callable[[str], list[Shell]] = lambda _: [],
    pip_check: bool = False,
    compile_only: tuple[str, ...] | None = None,
) -> Shell:
    """The shell command that builds target from the lock file requirements: checks run first
    (each stops the build with its own message), installs(venv_python) after the sync. A
    target that exists but is not live is an unfinished earlier build and is rebuilt; one that
    is live is never touched.

    Byte-compiled at install (`--compile-bytecode`) as root with umask 022, so other users read
    the .pyc and a start compiles nothing. compile_only (the lab's no-gpu-deps mode): compile
    only these packages' folders; the lab runs nothing of its environments but sglang's
    metadata and patched source, and compiling the other ~16,000 modules of the subset costs
    about 20 s of a 2-core machine per environment (a CI run builds about eight)."""
    name = target.rsplit("/", 1)[1]
    building = f"{target}.building"
    venv_python = f"{building}/bin/python"
    steps = [
        *checks,
        sh(
            'if [ -e {target} ]; then [ "$(readlink -f -- {current})" != "$(readlink -f -- {target})" ]'
            " || {{ echo {live} >&2; exit 1; }}; rm -rf -- {target}; fi",
            target=target,
            current=current,
            live=f"{target} is live but incomplete; not replaced",
        ),
        sh("rm -rf -- {building}", building=building),
        sh("uv venv --quiet --python {python} {building}", python=python, building=building),
        sh(
            "uv pip sync --quiet --require-hashes --python {python} {requirements}"
            if compile_only
            else "uv pip sync --quiet --require-hashes --compile-bytecode --python {python} {requirements}",
            python=venv_python,
            requirements=requirements,
        ),
        *installs(venv_python),
    ]
    if compile_only:
        # The glob stays outside the quotes: it picks the one python3.X folder of the venv.
        steps.append(
            sh(
                "site=$(echo {building}/lib/python3*/site-packages)"
                ' && set -- && for p in {packages}; do set -- "$@" "$site/$p"; done'
                ' && {python} -m compileall -q -- "$@" >/dev/null',
                building=building,
                packages=list(compile_only),
                python=venv_python,
            )
        )
    if pip_check:
        steps.append(sh("uv pip check --quiet --python {python}", python=venv_python))
    steps += [
        sh("cp -- {requirements} {copy}", requirements=requirements, copy=f"{building}/{LOCK_COPY_NAME}"),
        sh("echo {name} > {marker}", name=name, marker=f"{building}/{MARKER}"),
        sh("mv -T {building} {target}", building=building, target=target),
    ]
    return sh(
        "umask 022; ( {steps} ) || {{ rm -rf -- {building};"
        " printf 'FAILED to build %s; the live environment (%s) was not touched and still serves\\n'"
        ' {target} "$(readlink -- {current} || echo none)" >&2; exit 1; }}',
        steps=chain(*steps),
        building=building,
        target=target,
        current=current,
    )
