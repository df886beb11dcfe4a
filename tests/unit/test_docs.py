"""The documents: short lines, and every relative link in README.md and docs/ leads somewhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.unit.conftest import PROJECT_ROOT

MAX_LINE = 200
# Not ours to wrap: copies of upstream files, and folders the tools make.
# Upstream files, and reports captured as written by our tools on real machines (test data).
SKIPPED = ("tests/unit/data/upstream/", "tests/unit/data/acceptance/h200-1gpu/report.md")
SKIPPED_PARTS = {".git", ".venv", ".lab", ".ruff_cache", ".pytest_cache", "node_modules", "__pycache__"}

LINK_RE = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def documents() -> list[Path]:
    found = []
    for path in sorted(PROJECT_ROOT.rglob("*.md")):
        relative = path.relative_to(PROJECT_ROOT)
        if SKIPPED_PARTS & set(relative.parts) or str(relative).startswith(SKIPPED):
            continue
        found.append(path)
    return found


def long_lines(path: Path) -> list[str]:
    return [
        f"{path.relative_to(PROJECT_ROOT)}:{number}: {len(line)} characters"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if len(line) > MAX_LINE
    ]


def anchors(path: Path) -> set[str]:
    """GitHub's heading ids: lower case, punctuation dropped, spaces to '-', repeats numbered."""
    seen: dict[str, int] = {}
    ids = set()
    in_code = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        match = None if in_code else re.match(r"^#{1,6}\s+(.*?)\s*#*$", line)
        if not match:
            continue
        slug = re.sub(r"[^\w\- ]", "", match.group(1).strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        ids.add(slug if count == 0 else f"{slug}-{count}")
    ids.update(re.findall(r'<a (?:id|name)="([^"]+)"', path.read_text()))
    return ids


def broken_links(path: Path) -> list[str]:
    problems = []
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.DOTALL)
    text = re.sub(r"`[^`\n]*`", "", text)
    for target in LINK_RE.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        destination = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(PROJECT_ROOT)}: link {target}"
        if not destination.exists():
            problems.append(f"{where}: no such file")
        elif anchor and destination.suffix == ".md" and anchor not in anchors(destination):
            problems.append(f"{where}: no heading #{anchor} in {destination.relative_to(PROJECT_ROOT)}")
    return problems


def test_the_documents_are_found():
    names = {str(p.relative_to(PROJECT_ROOT)) for p in documents()}
    assert {"README.md", "docs/settings.md", "roles/wheels/README.md"} <= names
    assert not any(name.startswith("tests/unit/data/upstream/") for name in names)


def test_no_document_line_is_longer_than_200_characters():
    problems = [problem for path in documents() for problem in long_lines(path)]
    assert not problems, "wrap these lines (tables: shorter cells, detail in the text):\n" + "\n".join(problems)


def test_every_relative_link_in_the_readme_and_docs_resolves():
    # README.md and docs/ first of all; the roles' and the checks' documents are held to it too.
    paths = [PROJECT_ROOT / "README.md", *sorted((PROJECT_ROOT / "docs").glob("*.md")), *documents()]
    problems = sorted({problem for path in paths for problem in broken_links(path)})
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    "text, problem",
    [
        ("see [x](missing.md)", "no such file"),
        ("see [x](README.md#no-such-heading)", "no heading #no-such-heading"),
    ],
)
def test_a_broken_link_is_caught(tmp_path, monkeypatch, text, problem):
    monkeypatch.setattr("tests.unit.test_docs.PROJECT_ROOT", tmp_path)
    (tmp_path / "README.md").write_text("# Title\n\n## A heading\n")
    doc = tmp_path / "doc.md"
    doc.write_text(text + "\n[ok](README.md#a-heading) [web](https://example.com) `[no](code.md)`\n")
    found = broken_links(doc)
    assert len(found) == 1 and problem in found[0]


def test_a_long_line_is_caught(tmp_path, monkeypatch):
    monkeypatch.setattr("tests.unit.test_docs.PROJECT_ROOT", tmp_path)
    doc = tmp_path / "doc.md"
    doc.write_text("short\n" + "x" * 201 + "\n" + "y" * 200 + "\n")
    assert long_lines(doc) == ["doc.md:2: 201 characters"]
