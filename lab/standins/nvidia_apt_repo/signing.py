"""The key that signs the lab's NVIDIA stand-in repositories, and the name NVIDIA gives its key file."""

from __future__ import annotations

import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
# The key that signs the stand-in's repositories: a throwaway made for the lab and committed, as
# apt's own test suite commits the keys its test archives are signed with (apt, test/integration/
# keys/). Committed, its fingerprint is known before anything runs: inventory/lab.py pins it in
# the settings where a site pins NVIDIA's (cuda_repo_key_fingerprint,
# docker_nvidia_toolkit_key_fingerprint), so the lab's deploys check keys as production's do.
# It signs nothing outside the lab's stand-in: no host trusts it but the lab's containers.
SIGNING_KEY_FILE = HERE / "signing-key.asc"
SIGNING_KEY_FINGERPRINT = "3EDD86368B4141983260640B14003A4152B3208D"


def cuda_key_file_name(fingerprint: str) -> str:
    """NVIDIA's name for the CUDA repository's key file: its key id, the fingerprint's last 8
    hex digits, in lower case (3bf863cc.pub for EB69...63CC)."""
    return f"{fingerprint[-8:].lower()}.pub"


def keyring(state_dir: Path) -> tuple[Path, bytes, str]:
    """The lab's throwaway signing key (SIGNING_KEY_FILE), imported once into a keyring of this
    checkout; returns that keyring's folder and the public key, binary and armored."""
    home = state_dir / f"gnupg-{SIGNING_KEY_FINGERPRINT[-8:].lower()}"
    if not (home / "pubring.kbx").exists():
        home.mkdir(parents=True, exist_ok=True, mode=0o700)
        subprocess.run(
            ["gpg", "--homedir", str(home), "--batch", "--import", str(SIGNING_KEY_FILE)],
            capture_output=True,
            check=True,
        )
    binary = subprocess.run(["gpg", "--homedir", str(home), "--export"], capture_output=True, check=True).stdout
    armored = subprocess.run(
        ["gpg", "--homedir", str(home), "--export", "--armor"], capture_output=True, text=True, check=True
    ).stdout
    return home, binary, armored
