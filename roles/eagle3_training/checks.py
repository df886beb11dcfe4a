"""Inventory-time checks of the training job's settings (registered by validation.py)."""

from __future__ import annotations

from pathlib import Path

from roles.site import EngineStack, HostSettings

HERE = Path(__file__).resolve().parent


def training_problems(host: HostSettings, hosts: dict[str, HostSettings], stack: EngineStack) -> list[str]:
    job = host.eagle3_training
    if not job.enabled:
        return []
    problems = []
    if not (HERE / "files" / f"specforge-{job.specforge_lock}.lock.txt").is_file():
        problems.append(f"eagle3_training_specforge_lock = {job.specforge_lock!r} names no locked environment"
                        f" (roles/eagle3_training/files/specforge-{job.specforge_lock}.lock.txt); expected a lock"
                        " the project has, or one made with uv pip compile from that commit's pyproject.toml")
    return problems
