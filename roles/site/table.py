"""The README's settings table, generated from the schema (tests/unit/test_readme.py checks it)."""

from __future__ import annotations

from roles.site.schema import SECTIONS, SITE_KEYS, type_text


def settings_table() -> str:
    """Markdown table of every host-data key: the README's "Settings" section is checked against it."""
    rows = ["| key | type | default |", "|---|---|---|"]
    for cls in SECTIONS:
        for name, field in cls.model_fields.items():
            default = "(required)" if field.is_required() else field.get_default(call_default_factory=True)
            kind = type_text(field.annotation).replace(" | ", " or ")
            rows.append(f"| `{cls.PREFIX}{name}` | {kind} | `{default!r}` |")
    for key, meaning in SITE_KEYS.items():
        rows.append(f"| `{key}` | str | {meaning} |")
    return "\n".join(rows)
