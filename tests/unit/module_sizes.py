"""The size ratchet's record: every non-test module over LIMIT lines, at the size it had when
recorded. No module may grow past max(LIMIT, its record); one that shrinks lowers its record.

Record again after splitting or shrinking a module (never to let one grow):

    uv run python -m tests.unit.module_sizes
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.unit.conftest import PROJECT_ROOT

LIMIT = 400
RECORD = PROJECT_ROOT / "tests" / "unit" / "data" / "module_sizes.json"
FOLDERS = ("roles", "checks", "inference_host", "lab")
TOP_LEVEL = ("deploy.py", "config.py", "validation.py")


def modules(root: Path = PROJECT_ROOT) -> dict[str, int]:
    """Each non-test Python module of the product and the lab, with its line count."""
    paths = [p for folder in FOLDERS for p in (root / folder).rglob("*.py")]
    paths += [root / name for name in TOP_LEVEL if (root / name).exists()]
    return {
        str(p.relative_to(root)): len(p.read_text(encoding="utf-8").splitlines())
        for p in sorted(paths)
        if "__pycache__" not in p.parts and ".venv" not in p.parts
    }


def problems(sizes: dict[str, int], record: dict[str, int]) -> list[str]:
    found = []
    for path, lines in sizes.items():
        ceiling = max(LIMIT, record.get(path, 0))
        if lines > ceiling:
            found.append(f"{path}: {lines} lines, over its ceiling of {ceiling}: split it by concern")
    for path, recorded in record.items():
        if path not in sizes:
            found.append(f"{path}: recorded ({recorded} lines) but gone: record again")
        elif sizes[path] < recorded:
            found.append(f"{path}: {sizes[path]} lines, under its record of {recorded}: record again to lower it")
    return found


def current_record(sizes: dict[str, int]) -> dict[str, int]:
    return {path: lines for path, lines in sizes.items() if lines > LIMIT}


if __name__ == "__main__":
    RECORD.write_text(json.dumps(current_record(modules()), indent=1, sort_keys=True) + "\n")
    print(f"{RECORD.relative_to(PROJECT_ROOT)}: {len(current_record(modules()))} modules over {LIMIT} lines")
    sys.exit(0)
