"""Issue 44, "Done means": no file the preview writes for prod.py, lab.py or lab_replicas.py holds
a credential-shaped value. The preview (python -m roles.render, the same code and template
arguments as the deploy) masks every secret the vault gives (`***`), and the site model refuses a
credential-shaped plain setting, so no credential may reach any of its files, 0600 on the host or
not. Each file is scanned with the project's credential rule (roles/site/credentials.py: Yelp's
detect-secrets vendor plugins and the shapes it lacks)."""

from __future__ import annotations

from pathlib import Path

import pytest

from roles import render
from roles.site.credentials import found_credentials
from tests.unit.conftest import PROJECT_ROOT

INVENTORIES = ("prod.py", "lab.py", "lab_replicas.py")


def leaks(folder: Path) -> list[str]:
    """`file: kind` for each credential-shaped part of each file under folder. Left out: the
    checks' bundle (a tar of the repository's own checks/ and roles/site, whose sources and
    docstrings show URL shapes such as `user:password@host`; no setting of the site is in it)."""
    found = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != "bundle.tar"):
        text = path.read_bytes().decode("utf-8", errors="replace")
        found += [f"{path.relative_to(folder)}: {kind}" for kind, _, _ in found_credentials(text)]
    return found


@pytest.fixture(scope="module")
def previews(tmp_path_factory) -> dict[str, Path]:
    out = {}
    for name in INVENTORIES:
        folder = tmp_path_factory.mktemp(Path(name).stem)
        assert render.main([str(PROJECT_ROOT / "inventory" / name), "--out", str(folder)]) == 0
        out[name] = folder
    return out


@pytest.mark.parametrize("name", INVENTORIES)
def test_no_preview_file_holds_a_credential(previews, name):
    files = [p for p in previews[name].rglob("*") if p.is_file()]
    assert len(files) > 10  # the preview was written (units, env files, scripts, sysctl, ...)
    assert leaks(previews[name]) == []


def test_the_scan_finds_a_credential_planted_in_a_preview(previews, tmp_path):
    """The scan can fail: a GitHub token planted in a copy of the engine's environment file."""
    env_file = next(previews["prod.py"].rglob("*.env"))
    planted = tmp_path / "host" / "inference-engine.env"
    planted.parent.mkdir()
    planted.write_text(env_file.read_text() + "EXTRA=ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8\n")
    assert leaks(tmp_path) == ["host/inference-engine.env: GitHub Token"]
