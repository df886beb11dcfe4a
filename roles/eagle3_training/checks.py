"""Inventory-time checks of the training job's settings (registered by validation.py)."""

from __future__ import annotations

from pathlib import Path

from roles.eagle3_training.lock import lock_problem
from roles.site import EngineStack, HostSettings

HERE = Path(__file__).resolve().parent


def training_problems(host: HostSettings, hosts: dict[str, HostSettings], stack: EngineStack) -> list[str]:
    job = host.eagle3_training
    if not job.enabled:
        return []
    problems = []
    if not (HERE / "files" / f"specforge-{job.specforge_lock}.lock.txt").is_file():
        problems.append(
            f"eagle3_training_specforge_lock = {job.specforge_lock!r} names no locked environment"
            f" (roles/eagle3_training/files/specforge-{job.specforge_lock}.lock.txt); expected a lock"
            " the project has, or files/specforge-<lock>.in (that commit's dependencies) locked with"
            f" `uv run python -m roles.eagle3_training.lock {job.specforge_lock}`"
        )
        return problems
    # Like an engine stack's lock: made from the requirements it says, else one clear error
    # before any host is contacted (local files only).
    stale = lock_problem(job.specforge_lock)
    if stale:
        problems.append(f"eagle3_training_specforge_lock = {job.specforge_lock!r}: {stale}")
    return problems
