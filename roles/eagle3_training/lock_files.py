"""Where the training job's lock lives and which Python it is for (read by the role while
planning; made by `python -m roles.eagle3_training.lock`, which the role does not import)."""

from __future__ import annotations

from pathlib import Path

FILES = Path(__file__).resolve().parent / "files"
# SpecForge 82951a9 runs on CPython 3.12 with torch 2.9.1 (the job's environment; the serving
# stack's python pin is the same).
PYTHON = "3.12"


def requirements_file(lock: str) -> Path:
    return FILES / f"specforge-{lock}.in"


def lock_file(lock: str) -> Path:
    return FILES / f"specforge-{lock}.lock.txt"
