"""Commit subjects are 72 characters or fewer (the detail goes in the body), for every commit
after SINCE (issue 48). Older subjects stay as they are: history is not rewritten. The rule
landed on one of eight branches worked in parallel; the other seven were written without it,
so SINCE is the merge that brought the last of them in (28 of their subjects are longer). A
subject that is already merged cannot be shortened either, so one that slips through is listed
in ALLOWED with why, where a reviewer sees it."""

from __future__ import annotations

import subprocess

import pytest

from tests.unit.conftest import PROJECT_ROOT

MAX_SUBJECT = 72
SINCE = "aeb376a"  # the merge of the last branch made before the rule (2026-12-05)
ALLOWED: dict[str, str] = {}  # full commit hash -> why its long subject stays


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=30)


def long_subjects(log: str) -> list[str]:
    """'hash: N characters: subject' for each line 'hash<TAB>subject' of `git log` over the limit."""
    found = []
    for line in filter(None, log.splitlines()):
        commit, _, subject = line.partition("\t")
        if len(subject) > MAX_SUBJECT and commit not in ALLOWED:
            found.append(f"{commit[:10]}: {len(subject)} characters: {subject[:MAX_SUBJECT]}...")
    return found


def test_commit_subjects_since_the_rule_are_at_most_72_characters():
    if _git("rev-parse", "--is-inside-work-tree").returncode != 0:
        pytest.skip("not a git checkout (a source archive has no history to check)")
    if _git("cat-file", "-e", f"{SINCE}^{{commit}}").returncode != 0:
        pytest.fail(f"commit {SINCE} is not in this clone's history (a shallow clone?): git fetch --unshallow")
    log = _git("log", "--format=%H%x09%s", f"{SINCE}..HEAD")
    assert log.returncode == 0, log.stderr
    found = long_subjects(log.stdout)
    assert found == [], (
        f"commit subjects over {MAX_SUBJECT} characters (shorten with git commit --amend or an"
        " interactive rebase before merging; the detail goes in the body):\n" + "\n".join(found)
    )


def test_a_long_subject_is_caught():
    log = f"{'a' * 40}\t{'x' * 72}\n{'b' * 40}\t{'y' * 73}\n{'c' * 40}\tshort\n"
    assert long_subjects(log) == [f"{'b' * 10}: 73 characters: {'y' * 72}..."]
