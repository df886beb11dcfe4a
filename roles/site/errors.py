"""The one error of the site model: a list of problems, each naming file, field, value and remedy."""

from __future__ import annotations

import difflib
import sys
from pathlib import Path


class SiteError(Exception):
    """One or more problems in the user's input, each naming file, field, value and remedy."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


def unknown_keys(raw: dict, known: set, prefix: str, where: str, problems: list[str]) -> None:
    for key in raw:
        if key not in known:
            problems.append(
                f"{where}: unknown key {prefix}{key} = {raw[key]!r}; valid keys: "
                + ", ".join(sorted(prefix + k for k in known))
            )


def display(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def closest(key: str, candidates) -> str:
    match = difflib.get_close_matches(key, list(candidates), n=1)
    return f"; did you mean {match[0]}?" if match else ""


def print_problems(error: SiteError) -> None:
    print(f"inference-host: {len(error.problems)} problem(s) in the inventory; no host was contacted:",
          file=sys.stderr)
    for problem in error.problems:
        print(f"  - {problem}", file=sys.stderr)

