"""Vault secrets: encrypted per value with ansible-core's vault, names readable without the
password, values only with it; files are 0600; the CLI takes values on stdin, never argv."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from roles.site import vault
from tests.unit.conftest import PASSWORD, PROJECT_ROOT


def test_round_trip_and_names_without_password(tmp_path):
    vault_file = tmp_path / "s.vault.yml"
    vault.set_secret(vault_file, "hf_token", "hf_secret_value", PASSWORD)
    vault.set_secret(vault_file, "engine_api_key", "k-123", PASSWORD)
    assert set(vault.load(vault_file)) == {"hf_token", "engine_api_key"}
    assert "hf_secret_value" not in vault_file.read_text()
    assert "$ANSIBLE_VAULT;1.1;AES256" in vault_file.read_text()
    assert vault.decrypt_all(vault_file, password=PASSWORD) == {
        "hf_token": "hf_secret_value",
        "engine_api_key": "k-123",
    }


def test_vault_file_is_mode_0600(tmp_path):
    vault_file = tmp_path / "s.vault.yml"
    vault.set_secret(vault_file, "a", "b", PASSWORD)
    assert stat.S_IMODE(vault_file.stat().st_mode) == 0o600


def test_wrong_password_names_the_secret_not_the_value(tmp_path):
    vault_file = tmp_path / "s.vault.yml"
    vault.set_secret(vault_file, "hf_token", "hf_secret_value", PASSWORD)
    with pytest.raises(vault.SecretsError) as caught:
        vault.decrypt_all(vault_file, password=b"wrong")
    assert "'hf_token' cannot be decrypted" in str(caught.value)
    assert "hf_secret_value" not in str(caught.value)


def test_password_comes_from_the_file_named_by_the_environment(tmp_path, monkeypatch):
    vault_file = tmp_path / "s.vault.yml"
    vault.set_secret(vault_file, "a", "value-a", PASSWORD)
    password_file = tmp_path / "pw"
    password_file.write_bytes(PASSWORD + b"\n")
    monkeypatch.setenv(vault.PASSWORD_FILE_ENV, str(password_file))
    assert vault.decrypt_all(vault_file) == {"a": "value-a"}
    monkeypatch.setenv(vault.PASSWORD_FILE_ENV, str(tmp_path / "missing"))
    with pytest.raises(vault.SecretsError, match="cannot read the vault password"):
        vault.decrypt_all(vault_file)


def test_cli_reads_the_value_from_stdin(tmp_path):
    vault_file = tmp_path / "s.vault.yml"
    password_file = tmp_path / "pw"
    password_file.write_bytes(PASSWORD)
    env = {**os.environ, vault.PASSWORD_FILE_ENV: str(password_file)}
    result = subprocess.run(
        [sys.executable, "-m", "roles.site.vault", "set", str(vault_file), "hf_token"],
        input="hf_from_stdin\n",
        text=True,
        capture_output=True,
        env=env,
        cwd=PROJECT_ROOT,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "hf_from_stdin" not in result.stdout + result.stderr
    assert vault.decrypt_all(vault_file, password=PASSWORD) == {"hf_token": "hf_from_stdin"}
    check = subprocess.run(
        [sys.executable, "-m", "roles.site.vault", "check", str(vault_file)],
        text=True,
        capture_output=True,
        env=env,
        cwd=PROJECT_ROOT,
        timeout=60,
    )
    assert check.returncode == 0 and "1 secrets decrypt" in check.stdout


def test_committed_prod_vault_is_a_template_of_names():
    # Its values were encrypted with a discarded password: users replace them with their own.
    assert set(vault.load(PROJECT_ROOT / "inventory" / "secrets.vault.yml")) == {
        "hf_token",
        "engine_api_key",
        "monitoring_web_password",
    }
