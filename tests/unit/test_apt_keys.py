"""A repository's signing key goes into place only when it is the pinned one (roles/shared/apt_keys.py).

The install command and the fact run here as a host runs them: `sh -c`, apt's own helper fetching
a file:// URL, and the real gpg reading what was fetched. The keys are made for each test run
with gpg itself."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from roles.shared import apt_keys

pytestmark = pytest.mark.skipif(
    not (os.access(apt_keys.APT_HELPER, os.X_OK) and shutil.which("gpg")),
    reason="apt's helper and gpg are Debian's and Ubuntu's (CI installs gnupg: .ci/run)",
)


def _gpg(home: Path, *args: str) -> str:
    done = subprocess.run(["gpg", "--homedir", str(home), "--batch", *args], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> dict[str, tuple[str, Path]]:
    """Three keys, each as (fingerprint, armored public key file): "pinned" and "other" with a
    signing subkey as NVIDIA's and Docker's have, and both in one file ("both")."""
    folder = tmp_path_factory.mktemp("keys")
    home = folder / "gnupg"
    home.mkdir(mode=0o700)
    made: dict[str, tuple[str, Path]] = {}
    for name in ("pinned", "other"):
        _gpg(home, "--passphrase", "", "--quick-gen-key", f"{name} <{name}@invalid>", "ed25519", "cert", "never")
        listed = _gpg(home, "--with-colons", "--list-keys", f"{name}@invalid")
        fingerprint = next(line.split(":")[9] for line in listed.splitlines() if line.startswith("fpr:"))
        _gpg(home, "--passphrase", "", "--quick-add-key", fingerprint, "ed25519", "sign", "never")
        path = folder / f"{name}.asc"
        path.write_text(_gpg(home, "--armor", "--export", fingerprint))
        made[name] = (fingerprint, path)
    both = folder / "both.asc"
    both.write_text(made["pinned"][1].read_text() + made["other"][1].read_text())
    made["both"] = ("", both)
    return made


def _install(source: Path, dest: Path, fingerprint: str) -> subprocess.CompletedProcess:
    command = apt_keys.install_command(f"file://{source}", str(dest), fingerprint, "cuda_repo_key_fingerprint")
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=60)


def test_the_pinned_key_is_installed(keys, tmp_path):
    fingerprint, source = keys["pinned"]
    dest = tmp_path / "keyrings" / "nvidia-cuda.asc"
    done = _install(source, dest, fingerprint)
    assert (done.returncode, done.stderr) == (0, "")
    assert dest.read_bytes() == source.read_bytes()
    assert oct(dest.stat().st_mode & 0o777) == "0o644"


@pytest.mark.parametrize("served", ["other", "both"])
def test_another_key_is_refused_in_one_line_and_the_key_in_place_stays(keys, served, tmp_path):
    fingerprint, pinned_source = keys["pinned"]
    dest = tmp_path / "nvidia-cuda.asc"
    dest.write_bytes(pinned_source.read_bytes())
    before = dest.read_bytes()
    source = keys[served][1]
    done = _install(source, dest, fingerprint)
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    served_fingerprints = (
        keys["other"][0] if served == "other" else " ".join(sorted([keys["pinned"][0], keys["other"][0]]))
    )
    assert lines[0] == (
        f"file://{source}: the key served there is {served_fingerprints}, not the one cuda_repo_key_fingerprint"
        f" pins ({fingerprint}); nothing was installed"
    )
    assert dest.read_bytes() == before


def test_a_file_that_is_no_key_is_refused(keys, tmp_path):
    page = tmp_path / "3bf863cc.pub"
    page.write_text("<html><body>Not Found</body></html>\n")
    dest = tmp_path / "nvidia-cuda.asc"
    done = _install(page, dest, keys["pinned"][0])
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        f"file://{page}: the key served there is no OpenPGP key, not the one cuda_repo_key_fingerprint"
        f" pins ({keys['pinned'][0]}); nothing was installed"
    ]
    assert not dest.exists()


def test_a_download_that_fails_says_what_apt_said(keys, tmp_path):
    missing = tmp_path / "gone.pub"
    done = _install(missing, tmp_path / "k.asc", keys["pinned"][0])
    assert done.returncode == 1
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"could not download file://{missing} within 600 s: E: Failed to fetch"), line
    assert "File not found" in line


def test_the_fact_reads_the_primary_fingerprints_only(keys, tmp_path):
    fact = apt_keys.KeyFingerprints()

    def read(path: Path) -> list[str] | None:
        done = subprocess.run(["sh", "-c", fact.command(str(path))], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return fact.process(done.stdout.splitlines())

    assert read(keys["pinned"][1]) == [keys["pinned"][0]]  # not its signing subkey's
    assert read(keys["both"][1]) == sorted([keys["pinned"][0], keys["other"][0]])
    assert read(tmp_path / "absent.asc") == []


def test_the_lab_pins_the_key_its_stand_in_signs_with(tmp_path):
    """The public key the stand-in serves (exported from its committed key, as the build does)
    is the one inventory/lab.py pins."""
    from lab.standins.nvidia_apt_repo import repo

    home = tmp_path / "gnupg"
    home.mkdir(mode=0o700)
    _gpg(home, "--import", str(repo.SIGNING_KEY_FILE))
    served = tmp_path / repo.cuda_key_file_name(repo.SIGNING_KEY_FINGERPRINT)
    served.write_text(_gpg(home, "--armor", "--export"))
    done = _install(served, tmp_path / "nvidia-cuda.asc", repo.SIGNING_KEY_FINGERPRINT)
    assert (done.returncode, done.stderr) == (0, "")
