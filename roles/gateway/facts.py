"""What the gateway role reads on its host."""

from __future__ import annotations

from pyinfra.api import FactBase


class SmgVersion(FactBase):
    """The smg release installed at path (`smg --version` prints "smg 1.13.0"), or None."""

    def command(self, path: str) -> str:
        return f"test -x {path} && {path} --version || true"

    def process(self, output):
        words = " ".join(output).split()
        return words[1] if len(words) >= 2 and words[0] == "smg" else None


class UnitActiveState(FactBase):
    """`systemctl is-active` of a unit: active, activating, failed, inactive, ..."""

    def command(self, unit: str) -> str:
        return f"systemctl is-active {unit} || true"

    def process(self, output: list[str]) -> str:
        return "\n".join(output).strip() or "unknown"
