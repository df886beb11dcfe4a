"""roles/eagle3_training: SpecForge's source at the pinned commit with its patches, and the job's
sglang 0.5.9 patched with Kimi-K2.5's capture hook (patches/<package>/<version>/)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pyinfra import host
from pyinfra.facts.server import Command
from pyinfra.operations import files, server

from roles.shared.layout import SYSTEM_CA_BUNDLE
from roles.shared.patches import patch_queue
from roles.shared.shell import sh
from roles.site import HostSettings

HERE = Path(__file__).resolve().parent
JOB_SGLANG = "0.5.9"  # the sglang of SpecForge's lock (files/specforge-<commit7>.lock.txt)


def patch_files(commit: str) -> list[Path]:
    """patches/specforge/<commit>/: applied to the checkout."""
    return patch_queue(HERE / "patches", "specforge", commit)


def sglang_patch_files() -> list[Path]:
    """patches/sglang/<version>/: applied to the job's sglang (its lock pins 0.5.9)."""
    return patch_queue(HERE / "patches", "sglang", JOB_SGLANG)


def source_dir(settings: HostSettings) -> str:
    return f"{settings.base.install_root}/specforge/{settings.eagle3_training.specforge_commit}"


def sglang_capture_hook(target: str, built) -> None:
    """sglang 0.5.9 in the job's environment: Kimi-K2.5's capture hook (0.5.10's method).
    A patch whose reverse applies is in place; one that applies neither way stops the deploy."""
    for patch in sglang_patch_files():
        dest = f"{target}.{patch.name}"
        upload = files.put(name=f"Upload {patch.name}", src=str(patch), dest=dest, mode="0644")
        site = sh("site=$(echo {target}/lib/python3*/site-packages)", target=target)
        applied = host.get_fact(
            Command,
            command=sh(
                '{site}; patch -p1 -R -s -f --dry-run -d "$site" < {dest} >/dev/null 2>&1 && echo applied || echo no',
                site=site,
                dest=dest,
            ),
        )
        server.shell(
            name=f"Apply {patch.name} to sglang 0.5.9 in {target}",
            # The patched modules are byte-compiled again, as the install did (umask 022).
            commands=[
                sh(
                    'umask 022; {site}; patch -p1 -R -s -f --dry-run -d "$site" < {dest} >/dev/null 2>&1'
                    ' || {{ patch -p1 -s -f -d "$site" < {dest}'
                    ' && {target}/bin/python -m compileall -q -- "$site"/sglang >/dev/null; }}',
                    site=site,
                    dest=dest,
                    target=target,
                )
            ],
            _if=_apply_needed(applied, built, upload),
        )


def _apply_needed(applied: str, *changes) -> Callable[[], bool]:
    """A patch is (re)applied when it is not applied, or what it applies to or itself changed."""
    return lambda: applied != "applied" or any(change.did_change() for change in changes)


def sources(settings: HostSettings) -> None:
    """SpecForge's checkout at the pinned commit, its patches applied."""
    job = settings.eagle3_training
    target = source_dir(settings)
    head = host.get_fact(Command, command=sh("git -C {target} rev-parse HEAD 2>/dev/null || true", target=target))
    # A shallow fetch of exactly the pinned commit: the checkout is that commit or nothing.
    checkout = server.shell(
        name=f"Check out SpecForge {job.specforge_commit[:12]} from {job.specforge_repo} at {target}",
        commands=[
            sh(
                "rm -rf -- {fetching} && git init -q -- {fetching}"
                " && git -C {fetching} fetch -q --depth 1 -- {repo} {commit}"
                " && git -C {fetching} -c advice.detachedHead=false checkout -q FETCH_HEAD"
                ' && test "$(git -C {fetching} rev-parse HEAD)" = {commit}'
                " && rm -rf -- {target} && mv -T -- {fetching} {target}"
                " || {{ rm -rf -- {fetching}; exit 1; }}",
                fetching=f"{target}.fetching",
                repo=job.specforge_repo,
                commit=job.specforge_commit,
                target=target,
            )
        ],
        _env={"GIT_SSL_CAINFO": SYSTEM_CA_BUNDLE},
        _if=lambda: head != job.specforge_commit,
    )
    for patch in patch_files(job.specforge_commit):
        dest = f"{target}.{patch.name}"
        upload = files.put(name=f"Upload SpecForge patch {patch.name}", src=str(patch), dest=dest, mode="0644")
        applied = host.get_fact(
            Command,
            command=sh(
                "git -C {target} apply --reverse --check -- {dest} 2>/dev/null && echo applied || echo no",
                target=target,
                dest=dest,
            ),
        )
        server.shell(
            name=f"Apply SpecForge patch {patch.name} to {target}",
            commands=[
                sh(
                    "git -C {target} apply --reverse --check -- {dest} 2>/dev/null || git -C {target} apply -- {dest}",
                    target=target,
                    dest=dest,
                )
            ],
            _if=_apply_needed(applied, checkout, upload),
        )
