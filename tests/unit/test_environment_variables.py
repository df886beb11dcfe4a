"""Every INFERENCE_HOST_* environment variable the code reads is in docs/layout.md's one table,
and every variable of the table is still read somewhere: a knob nobody can find, or a documented
one that is gone, fails here."""

from __future__ import annotations

import re

from tests.unit.conftest import PROJECT_ROOT
from tests.unit.test_layout import _tracked_texts

GUARD = "tests/unit/test_environment_variables.py"  # plants names to show they are caught
TABLE_DOCUMENT = "docs/layout.md"
VARIABLE = re.compile(r"\bINFERENCE_HOST_[A-Z0-9_]*[A-Z0-9]\b")


def table(document: str) -> set[str]:
    """The variables named in the first cell of each row under '## Environment variables'."""
    section = document.partition("\n## Environment variables\n")[2].partition("\n## ")[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return {name for row in rows for name in VARIABLE.findall(row.split(" | ")[0])}


def used(texts: dict[str, str]) -> dict[str, str]:
    """{variable: the first file that names it} over the code: every tracked file but documents."""
    found: dict[str, str] = {}
    for name, text in sorted(texts.items()):
        if name == GUARD or name.endswith(".md"):
            continue
        for variable in VARIABLE.findall(text):
            found.setdefault(variable, name)
    return found


def problems(texts: dict[str, str], documented: set[str]) -> list[str]:
    code = used(texts)
    return [
        f"{where}: {v} is not in {TABLE_DOCUMENT}'s table" for v, where in sorted(code.items()) if v not in documented
    ] + [f"{TABLE_DOCUMENT}: {v} is read nowhere" for v in sorted(documented - set(code))]


def test_every_environment_variable_is_in_the_one_table():
    documented = table((PROJECT_ROOT / TABLE_DOCUMENT).read_text())
    assert len(documented) >= 40  # the table is found and read
    found = problems(_tracked_texts(), documented)
    assert found == [], "\n".join(found)


def test_a_missing_or_stale_variable_is_caught():
    document = (
        "# x\n\n## Environment variables\n\n| variable | read by | what |\n|---|---|---|\n"
        "| `INFERENCE_HOST_A`, `INFERENCE_HOST_B` | x | y |\n| `INFERENCE_HOST_GONE` | x | y |\n\n## Next\n"
        "| `INFERENCE_HOST_C` | not this table |\n"
    )
    documented = table(document)
    assert documented == {"INFERENCE_HOST_A", "INFERENCE_HOST_B", "INFERENCE_HOST_GONE"}
    texts = {
        "x.py": 'os.environ.get("INFERENCE_HOST_A") or os.environ["INFERENCE_HOST_B"]',
        "tool": "INFERENCE_HOST_NEW=1",
        "README.md": "INFERENCE_HOST_DOCUMENTED_ONLY_IN_PROSE",
    }
    assert problems(texts, documented) == [
        f"tool: INFERENCE_HOST_NEW is not in {TABLE_DOCUMENT}'s table",
        f"{TABLE_DOCUMENT}: INFERENCE_HOST_GONE is read nowhere",
    ]
