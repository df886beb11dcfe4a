"""The committed upstream snapshot (tests/unit/upstream_sources.py) is the pinned releases' code."""

import json

from tests.unit import upstream_sources as upstream

MANIFEST = json.loads(upstream.MANIFEST.read_text())


def test_every_pinned_release_has_a_snapshot():
    assert sorted(MANIFEST) == sorted(f"{p}-{v}" for p, v in upstream.pinned_releases())


def test_each_snapshot_comes_from_the_wheel_the_lock_allows():
    for release, entry in MANIFEST.items():
        project, version = release.rsplit("-", 1)
        assert entry["sha256"] in upstream.lock_hashes(project, version), (
            f"{release}: the snapshot's wheel {entry['wheel']} is not the one inventory/locks pins; "
            "refresh: uv run python -m tests.unit.upstream_sources"
        )


def test_snapshot_files_are_unedited_and_complete():
    for project, version in upstream.pinned_releases():
        entry = MANIFEST[f"{project}-{version}"]
        assert upstream.release_files(project, version) == entry["files"], f"{project} {version}: snapshot edited"


def test_every_file_a_patch_touches_is_in_the_snapshot():
    for project, version in upstream.pinned_releases():
        files = MANIFEST[f"{project}-{version}"]["files"]
        missing = upstream._patched_paths(project, version) - set(files)
        assert not missing, f"{project} {version}: refresh the snapshot, it lacks {sorted(missing)}"
