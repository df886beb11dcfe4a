"""Facts of roles/serving: where `current` points and whether the engine unit runs."""

from __future__ import annotations

from pyinfra.api import FactBase

from roles.shared.fact_batch import batched


@batched
class LinkTarget(FactBase):
    """Returns the target a symbolic link points at (None: no link there)."""

    def command(self, path: str) -> str:
        return f"readlink {path} || true"

    def process(self, output: list[str]) -> str | None:
        text = "\n".join(output).strip()
        return text or None


class UnitActiveState(FactBase):
    """Returns `systemctl is-active` of a unit: active, activating, failed, inactive, ..."""

    def command(self, unit: str) -> str:
        return f"systemctl is-active {unit} || true"

    def process(self, output: list[str]) -> str:
        return "\n".join(output).strip() or "unknown"
