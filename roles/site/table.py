"""The README's settings table, generated from the schema (tests/unit/test_readme.py checks it)."""

from __future__ import annotations

import dataclasses
import typing

from roles.site.schema import SECTIONS, SITE_KEYS


def settings_table() -> str:
    """Markdown table of every host-data key: the README's "Settings" section is checked against it."""
    hints_cache = {cls: typing.get_type_hints(cls) for cls in SECTIONS}
    rows = ["| key | type | default |", "|---|---|---|"]
    for cls in SECTIONS:
        for f in dataclasses.fields(cls):
            if f.default is not dataclasses.MISSING:
                default = f.default
            elif f.default_factory is not dataclasses.MISSING:
                default = f.default_factory()
            else:
                default = "(required)"
            kind = str(hints_cache[cls][f.name]).replace("typing.", "").replace("<class '", "").replace("'>", "").replace(" | ", " or ")
            rows.append(f"| `{cls.PREFIX}{f.name}` | {kind} | `{default!r}` |")
    for key, meaning in SITE_KEYS.items():
        rows.append(f"| `{key}` | str | {meaning} |")
    return "\n".join(rows)
