"""The README is the front door: short, the two lab commands, the production path, and one click
to every document (tests/unit/test_docs.py checks that the links resolve)."""

from __future__ import annotations

import re

from tests.unit.conftest import PROJECT_ROOT

README = (PROJECT_ROOT / "README.md").read_text()
LINKS = set(re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README))


def test_the_readme_is_at_most_250_lines():
    assert len(README.splitlines()) <= 250


def test_quickstart_has_the_two_commands():
    assert "uv run pyinfra -y inventory/lab.py deploy.py" in README
    assert "uv run pytest" in README


def test_the_production_path_is_in_order():
    steps = [
        "uv run inference-host vault set",
        "uv run inference-host validate inventory/prod.py",
        "uv run inference-host preview inventory/prod.py",
        "uv run inference-host deploy inventory/prod.py --check",
        "uv run pyinfra inventory/prod.py deploy.py",
        "uv run inference-host status inventory/prod.py",
        "uv run inference-host check inventory/prod.py",
    ]
    places = [README.index(step) for step in steps]
    assert places == sorted(places)


def test_every_document_is_one_click_from_the_readme():
    documents = {f"docs/{p.name}" for p in (PROJECT_ROOT / "docs").glob("*.md")}
    documents |= {str(p.relative_to(PROJECT_ROOT)) for p in (PROJECT_ROOT / "roles").glob("*/README.md")}
    documents.add("checks/README.md")
    assert not documents - LINKS, "link these from README.md: " + ", ".join(sorted(documents - LINKS))


def test_what_is_verified_where_is_in_the_readme_and_one_click_away():
    assert "## What is verified where" in README
    assert "docs/testing.md#what-is-verified-where" in README
    assert "## What is verified where" in (PROJECT_ROOT / "docs" / "testing.md").read_text()


# Flags of CI's commands that change how, not what, is installed or tested: the lock as committed
# (--frozen), bytecode compiled once (--compile-bytecode), pytest's timing and report files.
CI_ONLY_FLAGS = re.compile(r"^(--frozen|--compile-bytecode|--durations=\S+|--junitxml=\S+)$")


def _words(command: str) -> list[str]:
    return [word for word in command.split() if not CI_ONLY_FLAGS.match(word)]


def test_ci_runs_the_readmes_set_up_and_test_command():
    """.ci/run installs with the README's `uv sync` and tests with its `uv run pytest`, nothing
    more (no extra, no group): CI fails where a newcomer following the README would."""
    ci = (PROJECT_ROOT / ".ci" / "run").read_text()
    ci_sync = [_words(line) for line in ci.splitlines() if line.strip().startswith("uv sync")]
    ci_test = [_words(line) for line in ci.splitlines() if re.match(r"\s*uv run\b.*\bpytest\b", line)]
    readme_sync = {" ".join(_words(c)) for c in re.findall(r"`(uv sync[^`]*)`", README)}
    readme_test = {" ".join(c.split()) for c in re.findall(r"^\s+(uv run pytest)\b", README, re.MULTILINE)}
    assert readme_sync == {"uv sync"}, readme_sync
    assert readme_test == {"uv run pytest"}, readme_test
    assert ci_sync == [["uv", "sync"]], ci_sync
    assert ci_test == [["uv", "run", "pytest"]], ci_test


def test_the_lab_runs_timings_live_in_one_run_md_only():
    """A figure of the lab's runs goes stale with the code it measured; docs/one-run.md keeps each
    with the commit and date it was measured at, the README links there and quotes none."""
    assert not re.findall(r"\b\d+\.\d+ s\b", README)
    assert "docs/one-run.md" in LINKS
