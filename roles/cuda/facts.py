"""Facts of roles/cuda."""

from __future__ import annotations

from pyinfra.api import FactBase


class SelectedCudaDirectory(FactBase):
    """Returns the directory /usr/local/cuda resolves to (e.g. /usr/local/cuda-12.8), or None."""

    def command(self) -> str:
        return "readlink -e /usr/local/cuda || true"

    def process(self, output) -> str | None:
        value = "".join(output).strip()
        return value or None
