"""What the gateway role reads on its host."""

from __future__ import annotations

from pyinfra.api import FactBase


class UnitActiveState(FactBase):
    """`systemctl is-active` of a unit: active, activating, failed, inactive, ..."""

    def command(self, unit: str) -> str:
        return f"systemctl is-active {unit} || true"

    def process(self, output: list[str]) -> str:
        return "\n".join(output).strip() or "unknown"
