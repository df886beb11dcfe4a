"""Issue 56, item 1: the preview is the deploy, recorded. For each example inventory, the files
`python -m roles.render` writes (deploy.py run in-process against the stated state,
roles/recording.py and roles/stated_state.py) are the files pyinfra's own CLI records when it
runs deploy.py against the same state (tests/unit/plans/record.py --stated), file by file: every
upload, the commands in order (inference-host-commands/deploy.sh), the state note."""

from __future__ import annotations

import base64
import json
import subprocess
import sys

import pytest

import validation
from roles import composition, render
from roles.site import load_site
from tests.unit.conftest import PROJECT_ROOT

INVENTORIES = ("prod.py", "lab.py", "lab_replicas.py")


def recorded_by_the_cli(inventory: str) -> dict[str, dict[str, str | bytes]]:
    result = subprocess.run(
        [sys.executable, "tests/unit/plans/record.py", "--stated", f"inventory/{inventory}", "deploy.py"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return {
        host: {path: base64.b64decode(c["base64"]) if isinstance(c, dict) else c for path, c in files.items()}
        for host, files in json.loads(result.stdout).items()
    }


def previewed(inventory: str) -> dict[str, dict[str, str | bytes]]:
    path = str(PROJECT_ROOT / "inventory" / inventory)
    site = load_site(path, validation.ROLE_CHECKS)
    return {host: render.files_of(r, site.hosts[host]) for host, r in render.record(site, path).items()}


def differences(preview: dict, recorded: dict) -> list[str]:
    """`host: path: why` for each file that is not the same in both, one line each."""
    found = [f"{host}: only in the {'preview' if host in preview else 'record'}" for host in preview.keys() ^ recorded]
    for host in sorted(preview.keys() & recorded):
        mine, theirs = preview[host], recorded[host]
        found += [f"{host}: {p}: only in the preview" for p in sorted(mine.keys() - theirs)]
        found += [f"{host}: {p}: only in the recorded deploy" for p in sorted(theirs.keys() - mine)]
        found += [f"{host}: {p}: differs" for p in sorted(mine.keys() & theirs) if mine[p] != theirs[p]]
    return found


@pytest.fixture(scope="module")
def recorded() -> dict[str, dict]:
    return {name: recorded_by_the_cli(name) for name in INVENTORIES}


@pytest.mark.parametrize("inventory", INVENTORIES)
def test_the_preview_is_the_recorded_deploy_file_by_file(recorded, inventory):
    preview = previewed(inventory)
    assert differences(preview, recorded[inventory]) == []
    # Not an empty comparison: the deploy's commands and files (a host no role runs on has none).
    assert any(files[render.COMMANDS] for files in preview.values())
    assert sum(len(files) for files in preview.values()) > 30


def test_a_preview_that_skips_a_role_is_found(recorded, monkeypatch):
    """Planted: the preview runs the table without roles/cuda; the comparison names its file."""
    monkeypatch.setattr(composition, "STEPS", tuple(s for s in composition.STEPS if s.role != "cuda"))
    found = differences(previewed("prod.py"), recorded["prod.py"])
    assert "gpu-lxc.example.internal: etc/profile.d/90-inference-host-cuda.sh: only in the recorded deploy" in found
    assert "gpu-lxc.example.internal: inference-host-commands/deploy.sh: differs" in found
