"""systemd's time spans as the checks read them back from `systemctl show`: the acceptance
report and the checks' own bounds both read them, so neither imports the other for it."""

from __future__ import annotations

import re


def parse_timespan(text: str) -> float | None:
    """systemd's timespan as `systemctl show` prints it (10min, 1h 30s, 600000000 in USec)."""
    text = text.strip()
    if not text or text == "infinity":
        return None
    if text.isdigit():
        return int(text) / 1e6
    units = {"us": 1e-6, "ms": 1e-3, "s": 1, "min": 60, "h": 3600, "d": 86400}
    total = 0.0
    for number, unit in re.findall(r"([\d.]+)\s*(us|ms|min|s|h|d)", text):
        total += float(number) * units[unit]
    return total or None
