"""Writing a secret onto a host: mode 0600, never in a command line, a log or a diff."""

from __future__ import annotations

from contextlib import contextmanager
from io import StringIO

from pyinfra import state
from pyinfra.api import deploy
from pyinfra.operations import files

# pyinfra uploads to a temporary file first; keep it in a root-only folder, not /tmp.
UPLOAD_DIR = "/var/lib/inference-host/upload"


@contextmanager
def _without_diffs():
    """`pyinfra --diff` prints file contents; never for a secret."""
    previous = state.config.DIFF
    state.config.DIFF = False
    try:
        yield
    finally:
        state.config.DIFF = previous


@deploy("Secret file")
def secret_file(label: str, value: str, dest: str, user: str, group: str):
    """Returns the upload operation (callers wire restarts to its did_change)."""
    files.directory(
        name="Create the root-only upload folder for secrets",
        path=UPLOAD_DIR,
        user="root",
        group="root",
        mode="0700",
    )
    with _without_diffs():
        return files.put(
            name=f"Install {label} at {dest} (mode 0600)",
            src=StringIO(value),
            dest=dest,
            user=user,
            group=group,
            mode="0600",
            _temp_dir=UPLOAD_DIR,
        )
