"""Vault secrets: encrypted per value with ansible-core's vault, names readable without the
password, values only with it; files are 0600; the CLI takes values on stdin, never argv."""

from __future__ import annotations

import io
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
        "engine_admin_api_key",
        "monitoring_web_password",
    }


def _check_said(vault_file, capsys, monkeypatch, password_file) -> tuple[int, str]:
    password_file.chmod(0o600)
    monkeypatch.setenv(vault.PASSWORD_FILE_ENV, str(password_file))
    code = vault._main(["check", str(vault_file)], prog="inference-host vault")
    return code, capsys.readouterr().err


def test_a_half_done_step_2_names_the_template_values_not_damage(tmp_path, capsys, monkeypatch):
    """README step 2 half done: one value set with the new password, the others still the
    committed template's (encrypted with a discarded password)."""
    import shutil

    vault_file = tmp_path / "secrets.vault.yml"
    shutil.copy(vault.TEMPLATE, vault_file)
    vault.set_secret(vault_file, "hf_token", "hf_new", PASSWORD)
    (tmp_path / "pw").write_bytes(PASSWORD)
    code, said = _check_said(vault_file, capsys, monkeypatch, tmp_path / "pw")
    assert code == 2
    assert "is still the template's value" in said and "damaged" not in said, said
    assert "inference-host vault set" in said and "python -m" not in said, said
    assert said.count(str(vault_file)) == 2, said  # the file it names, and in the command to run
    assert said.startswith(f"{vault_file}: ") and not said.startswith(f"{vault_file}: {vault_file}"), said


def test_the_path_is_said_once(tmp_path, capsys, monkeypatch):
    vault_file = tmp_path / "s.vault.yml"
    vault.set_secret(vault_file, "hf_token", "v", PASSWORD)
    (tmp_path / "pw").write_bytes(b"another password")
    code, said = _check_said(vault_file, capsys, monkeypatch, tmp_path / "pw")
    assert code == 2 and said.count(str(vault_file)) == 1, said


def test_a_write_that_fails_midway_leaves_the_old_file_whole(tmp_path, monkeypatch):
    vault_file = tmp_path / "s.vault.yml"
    vault.set_secret(vault_file, "hf_token", "old", PASSWORD)
    before = vault_file.read_bytes()

    def half(data, handle, **kwargs):
        handle.write("hf_token: !vault |\n  $ANSIBLE_VAULT;1.1;AES256\n  6231")
        raise KeyboardInterrupt  # Ctrl-C while writing

    monkeypatch.setattr(vault.yaml, "dump", half)
    with pytest.raises(KeyboardInterrupt):
        vault.set_secret(vault_file, "hf_token", "new", PASSWORD)
    assert vault_file.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.vault.yml"]  # no temporary file left


def test_rekey_changes_the_password(tmp_path, capsys, monkeypatch):
    vault_file = tmp_path / "s.vault.yml"
    vault.set_secret(vault_file, "hf_token", "a", PASSWORD)
    vault.set_secret(vault_file, "engine_api_key", "b", PASSWORD)
    (tmp_path / "old").write_bytes(PASSWORD)
    (tmp_path / "new").write_bytes(b"the new password\n")
    monkeypatch.setenv(vault.PASSWORD_FILE_ENV, str(tmp_path / "old"))
    assert vault._main(["rekey", str(vault_file), str(tmp_path / "new")]) == 0
    assert "2 secrets encrypted" in capsys.readouterr().out
    assert vault.decrypt_all(vault_file, password=b"the new password") == {"hf_token": "a", "engine_api_key": "b"}
    with pytest.raises(vault.SecretsError):
        vault.decrypt_all(vault_file, password=PASSWORD)
    assert stat.S_IMODE(vault_file.stat().st_mode) == 0o600


def test_at_a_terminal_the_value_is_asked_for_and_not_echoed(tmp_path):
    """`inference-host vault set` on a real terminal (a pty): a prompt, the typed value not shown."""
    import pty
    import time

    vault_file = tmp_path / "s.vault.yml"
    (tmp_path / "pw").write_bytes(PASSWORD)
    env = {**os.environ, vault.PASSWORD_FILE_ENV: str(tmp_path / "pw")}
    command = [sys.executable, "-m", "roles.site.vault", "set", str(vault_file), "hf_token"]
    pid, terminal = pty.fork()
    if pid == 0:  # the child: its controlling terminal is the pty
        os.chdir(PROJECT_ROOT)
        os.execve(sys.executable, command, env)
    seen = b""
    deadline = time.monotonic() + 120
    while b"(not echoed): " not in seen and time.monotonic() < deadline:
        seen += os.read(terminal, 1024)
    os.write(terminal, b"typed-secret-value\n")
    while True:
        try:
            chunk = os.read(terminal, 1024)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    _, status = os.waitpid(pid, 0)
    os.close(terminal)
    assert os.waitstatus_to_exitcode(status) == 0, seen
    assert b"value of hf_token (not echoed): " in seen
    assert b"typed-secret-value" not in seen
    assert vault.decrypt_all(vault_file, password=PASSWORD) == {"hf_token": "typed-secret-value"}


# --- API keys: one rule for every command that reads the vault ---------------------------------

GOOD_KEY = "a-client-key-of-at-least-32-characters"


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("   ", "is empty or only white space"),
        ("short-key", "is 9 characters long, under 32"),
        (" " + GOOD_KEY, "has white space at one end"),
        ("-" + GOOD_KEY, "begins with '-'"),
    ],
)
def test_vault_set_refuses_a_bad_api_key_in_one_line_without_the_value(tmp_path, monkeypatch, capsys, value, says):
    vault_file = tmp_path / "s.vault.yml"
    (tmp_path / "pw").write_bytes(PASSWORD)
    (tmp_path / "pw").chmod(0o600)
    monkeypatch.setenv(vault.PASSWORD_FILE_ENV, str(tmp_path / "pw"))
    monkeypatch.setattr("sys.stdin", io.StringIO(value + "\n"))
    assert vault._main(["set", str(vault_file), "engine_api_key"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"{vault_file}: the value for engine_api_key {says}"), err
    assert "at least 32 characters" in err and (value.strip() not in err or not value.strip())
    assert not vault_file.exists()  # nothing written


def test_vault_set_refuses_an_api_key_another_role_holds(tmp_path, monkeypatch, capsys):
    vault_file = tmp_path / "s.vault.yml"
    vault.set_secret(vault_file, "engine_api_key", GOOD_KEY, PASSWORD)
    (tmp_path / "pw").write_bytes(PASSWORD)
    (tmp_path / "pw").chmod(0o600)
    monkeypatch.setenv(vault.PASSWORD_FILE_ENV, str(tmp_path / "pw"))
    monkeypatch.setattr("sys.stdin", io.StringIO(GOOD_KEY + "\n"))
    assert vault._main(["set", str(vault_file), "engine_admin_api_key"]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"{vault_file}: the value for engine_admin_api_key is the key engine_api_key holds; expected each API key"
        " distinct (one key, one role); nothing written\n"
    )
    assert set(vault.load(vault_file)) == {"engine_api_key"}
    # a token that is not an API key (its name does not end in api_key) is not held to the rule
    monkeypatch.setattr("sys.stdin", io.StringIO("t\n"))
    assert vault._main(["set", str(vault_file), "hf_token"]) == 0


def test_vault_check_names_every_bad_api_key_in_one_line_each(tmp_path, monkeypatch, capsys):
    vault_file = tmp_path / "s.vault.yml"
    for name, value in (
        ("engine_api_key", GOOD_KEY),
        ("engine_admin_api_key", GOOD_KEY),  # the same key in two roles
        ("gateway_control_plane_api_key", ""),  # set by hand, bypassing `vault set`
        ("tenant_a_api_key", "short"),
        ("hf_token", "x"),
    ):
        vault.set_secret(vault_file, name, value, PASSWORD)
    (tmp_path / "pw").write_bytes(PASSWORD)
    (tmp_path / "pw").chmod(0o600)
    monkeypatch.setenv(vault.PASSWORD_FILE_ENV, str(tmp_path / "pw"))
    assert vault._main(["check", str(vault_file)]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 3, lines
    assert lines[0].startswith(f"{vault_file}: secrets 'engine_admin_api_key' and 'engine_api_key' hold the same key")
    assert lines[1].startswith(f"{vault_file}: secret 'gateway_control_plane_api_key' is empty or only white space")
    assert lines[2].startswith(f"{vault_file}: secret 'tenant_a_api_key' is 5 characters long, under 32")
    assert not any(GOOD_KEY in line or "short" in line.split("under")[0] for line in lines)
