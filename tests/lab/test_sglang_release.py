"""The pinned SGLang releases themselves, downloaded from PyPI (cached under
$XDG_CACHE_HOME/inference-host/wheels): the committed CLI captures match the real wheels, and
every patch of the queue applies to the real wheel. Network: the lab tier (no Docker needed)."""

from __future__ import annotations

import subprocess
import zipfile

import pytest

from roles.engine_envs import patches_for
from roles.serving import cli_capture
from roles.serving import command as cmd
from roles.shared import pypi_wheels
from roles.site import PROJECT_ROOT, load_stack

pytestmark = pytest.mark.lab

STACK = load_stack(PROJECT_ROOT / "inventory" / "stack.yml")
PATCHED_VERSIONS = sorted(p.name for p in (PROJECT_ROOT / "roles/engine_envs/patches/sglang").iterdir() if p.is_dir())


@pytest.mark.parametrize("version", sorted({s.sglang for s in STACK.stacks.values() if s.engine == "sglang"}))
def test_committed_cli_matches_the_real_wheel(version):
    committed = cmd.cli_options(version)
    assert cli_capture.capture(pypi_wheels.pypi_wheel(version)) == committed
    assert len(committed["options"]) > 300


@pytest.mark.parametrize("version", PATCHED_VERSIONS)
def test_every_patch_applies_to_the_real_wheel(version, tmp_path):
    with zipfile.ZipFile(pypi_wheels.pypi_wheel(version)) as archive:
        archive.extractall(tmp_path)
    for patch in patches_for(version):
        header = patch.read_text().split("\n--- ", 1)[0]
        for word in ("What:", "Why:", "Upstream:"):
            assert word in header, f"{patch.name} lacks a {word} line in its header"
        for args in (["--dry-run"], [], ["-R", "--dry-run"]):  # applies, and is then detectable
            result = subprocess.run(
                ["patch", "-p1", "-s", "-f", *args, "-d", str(tmp_path)],
                stdin=patch.open(),
                capture_output=True,
                text=True,
            )
            assert result.returncode == 0, f"{patch.name} {args}: {result.stdout}{result.stderr}"
