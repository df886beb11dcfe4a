"""Secret values as `inference-host vault set` reads them: one line, but for a PEM text (a TLS
certificate or key, serving_tls_*), the one kind of secret that spans lines."""

from __future__ import annotations

from typing import TextIO

ONE_LINE = (
    "the secret on one line without control characters (a Windows line end \\r, a tab, a NUL), or a PEM"
    " certificate or key"
)


def is_pem(value: str) -> bool:
    return value.startswith("-----BEGIN ")


def control_character(value: str) -> int | None:
    """Where the first control character (C0, DEL, C1) of value is; a PEM's line breaks are none."""
    breaks = "\n" if is_pem(value) else ""
    return next((i for i, c in enumerate(value) if c not in breaks and (ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F)), None)


def read_value(stream: TextIO, limit: int) -> str:
    """The first line of stream; for a PEM text, everything up to its end (at most limit characters each)."""
    value = stream.readline(limit).rstrip("\n")
    if is_pem(value):
        value = (value + "\n" + stream.read(limit)).rstrip("\n")
    return value
