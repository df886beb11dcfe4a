"""The lab's throwaway secrets, made once under .lab/ and never a site's: the vault (API key,
Hub token, monitor password) with its password file, one per lab prefix (.lab/<prefix>/), and the
guest's SSH key pair (.lab/, shared)."""

from __future__ import annotations

import os
from pathlib import Path

from lab.docker_engine import PREFIX, STATE_DIR, state_lock


def vault_secret(vault: str, name: str, password_file: Path | None = None) -> str:
    """One value of the lab's throwaway vault (the Hub stand-in requires the lab's hf_token)."""
    from roles.site.vault import decrypt_all

    password = password_file.read_bytes().strip() if password_file else None
    return decrypt_all(Path(vault), [name], password)[name]


def guest_ssh_public_keys() -> list[str]:
    """The lab guest's keys: INFERENCE_HOST_LAB_GUEST_KEYS_FILE's lines, else the lab's key."""
    path = os.environ.get("INFERENCE_HOST_LAB_GUEST_KEYS_FILE")
    if path:
        return [line.strip() for line in Path(path).read_text().splitlines() if line.strip()]
    return [throwaway_ssh_public_key()]


def throwaway_ssh_public_key() -> str:
    """A lab-only SSH key pair made once under .lab/; returns the public key line."""
    with state_lock("secrets"):
        return _ssh_public_key()


def _ssh_public_key() -> str:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    STATE_DIR.mkdir(mode=0o700, exist_ok=True)
    public = STATE_DIR / "guest-ssh-key.pub"
    if not public.exists():
        key = Ed25519PrivateKey.generate()
        fd = os.open(STATE_DIR / "guest-ssh-key", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(
                key.private_bytes(
                    serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
                )
            )
        line = (
            key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
        )
        public.write_text(f"{line} inference-host-lab\n")
    return public.read_text().strip()


def throwaway_vault() -> tuple[str, str]:
    """A lab-only vault with a random API key, Hub token and monitor password, and its password,
    made once under .lab/."""
    with state_lock("secrets"):
        return _vault()


# The lab's keys besides engine_api_key (the client key): the engine's admin key, the gateways'
# control-plane key (inventory/lab.py, inventory/lab_replicas.py).
ROLE_KEYS = ("engine_admin_api_key", "gateway_control_plane_api_key")


def vault_folder() -> Path:
    """Where the vault of this lab prefix lives: one per prefix, as its heartbeat URL is the
    prefix's (two labs at once, pytest-xdist's workers, rewrote one shared vault's URL each)."""
    return STATE_DIR / PREFIX


def _vault() -> tuple[str, str]:
    import secrets

    from roles.site.vault import decrypt_all, load, rename_secret, set_secret, stored

    folder = vault_folder()
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    password_file = folder / "vault-password"
    vault = folder / "secrets.vault.yml"
    if not password_file.exists():
        fd = os.open(password_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_urlsafe(32))
        vault.unlink(missing_ok=True)
    password = password_file.read_bytes().strip()
    if vault.exists() and "sglang_api_key" in stored(vault):
        # Made before the engine-neutral names (docs/upgrades.md#engine-neutral-setting-names): the
        # same key under its new name, without a notice on every run.
        rename_secret(vault, "sglang_api_key", "engine_api_key")
    if not vault.exists():
        set_secret(vault, "engine_api_key", _api_key(), password)
        set_secret(vault, "hf_token", "hf_lab_" + secrets.token_hex(16), password)
    elif decrypt_all(vault, ["engine_api_key"], password)["engine_api_key"].startswith("-"):
        # Made before the site model refused keys that argparse reads as an option
        # (roles/site/loading.py api_key_problems): a new one.
        set_secret(vault, "engine_api_key", _api_key(), password)
    # One key per role (docs/security.md#keys-and-their-roles): a lab vault made before the roles
    # gets the new ones beside its client key.
    for name in ROLE_KEYS:
        if name not in load(vault):
            set_secret(vault, name, _api_key(), password)
    if "monitoring_web_password" not in load(vault):  # the monitors' basic auth (every lab has one)
        set_secret(vault, "monitoring_web_password", secrets.token_urlsafe(18), password)
    _heartbeat_url(vault, password)
    return str(vault), str(password_file)


def _heartbeat_url(vault: Path, password: bytes) -> None:
    """The heartbeat stand-in's ping URL (inventory/lab.py's monitoring_heartbeat_url_secret): its
    address and port follow the lab's prefix and bridge, so it is set again when they change."""
    from lab.standins.heartbeat import ping_url
    from roles.site.vault import decrypt_all, load, set_secret

    url = ping_url(PREFIX)
    if "monitoring_heartbeat_url" not in load(vault) or (
        decrypt_all(vault, ["monitoring_heartbeat_url"], password)["monitoring_heartbeat_url"] != url
    ):
        set_secret(vault, "monitoring_heartbeat_url", url, password)


def _api_key() -> str:
    """A random key that argparse takes as a value: token_urlsafe may begin with '-'."""
    import secrets

    return "lab" + secrets.token_urlsafe(24)
