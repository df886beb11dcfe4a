"""The one convention for patch queues: patches live in the folder of the role that applies
them, as

    roles/<role>/patches/<package>/NNNN-name.patch             every version of <package>
    roles/<role>/patches/<package>/<version>/NNNN-name.patch   that version only

and are applied in file-name order. Each patch starts with a header: what, why, upstream."""

from __future__ import annotations

from pathlib import Path


def patch_queue(patches_dir: Path, package: str, version: str) -> list[Path]:
    folder = patches_dir / package
    found = [*folder.glob("*.patch"), *(folder / version).glob("*.patch")]
    return sorted(found, key=lambda p: p.name)
