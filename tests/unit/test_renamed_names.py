"""Engine-neutral names (docs/upgrades.md#engine-neutral-setting-names): an old setting key in an
inventory (plain text) is refused in one line naming the key to write, before any host is
contacted; an old vault key is read under its new name for one release, with a notice; the new
names are read."""

from __future__ import annotations

import io

import pytest

from roles.shared.uv import uv_environment
from roles.site import load_site, vault
from roles.site.errors import display
from roles.site.old_keys import RENAMED_KEYS
from tests.unit.conftest import ADMIN, CLIENT_KEY, PASSWORD, ROLE_KEYS, gpu_node
from tests.unit.test_site import only_problem

OLD_SETTINGS = [
    ("sglang_python", "/usr/bin/python3", "engine_python"),
    ("sglang_keep_environments", 4, "engine_keep_environments"),
    ("sglang_python_install_mirror", "https://mirror.example/pbs", "base_python_install_mirror"),
]


@pytest.mark.parametrize(("old", "value", "new"), OLD_SETTINGS, ids=[old for old, _, _ in OLD_SETTINGS])
def test_an_old_setting_key_is_refused_in_one_line_naming_the_new_one(inventory, old, value, new):
    path = inventory.groups(gpu_nodes=[gpu_node(**{old: value})])
    assert only_problem(path) == (
        f"{display(path)}: host gpu1: {old} was renamed {new}; write {new} = {value!r} instead"
        " (docs/upgrades.md#engine-neutral-setting-names)"
    )


def test_every_renamed_key_is_tested():
    assert {old: new for old, _, new in OLD_SETTINGS} == RENAMED_KEYS


def test_the_new_keys_are_read(inventory):
    path = inventory.groups(
        gpu_nodes=[
            gpu_node(
                engine_python="/usr/bin/python3",
                engine_keep_environments=4,
                base_python_install_mirror="https://mirror.example/pbs",
            )
        ]
    )
    host = load_site(path).hosts["gpu1"]
    assert (host.engine.python, host.engine.keep_environments) == ("/usr/bin/python3", 4)
    assert uv_environment(host)["UV_PYTHON_INSTALL_MIRROR"] == "https://mirror.example/pbs"


# --- the vault key: sglang_api_key -> engine_api_key --------------------------------------------
# The vault is encrypted and changed with a tool: its old entry is read under the new name for one
# release, with one notice line; both names at once are refused. The inventory's reference to the
# old name is plain text: refused like an old setting key.


def _api_key_inventory(inventory, **vault_values):
    name = inventory.vault(**vault_values, engine_admin_api_key=ROLE_KEYS["engine_admin_api_key"])
    return inventory.groups(gpu_nodes=[gpu_node(secrets_file=name, serving_api_key_secret="engine_api_key", **ADMIN)])


def _notice(path) -> str:
    return (
        f"inference-host: notice: {path}: the vault key sglang_api_key is read as engine_api_key, its new name,"
        f" in this release only; the next release refuses it: uv run inference-host vault rename {path}"
        " sglang_api_key engine_api_key\n"
    )


def test_an_old_vault_key_is_read_under_its_new_name_with_one_notice(inventory, capsys):
    path = _api_key_inventory(inventory, sglang_api_key="old-key-5f3a", hf_token="t")
    site = load_site(path)
    assert site.secret_names == {"engine_api_key", "engine_admin_api_key", "hf_token"}
    vault_file = inventory.dir / "secrets.vault.yml"
    assert vault.decrypt_all(vault_file, ["engine_api_key"], PASSWORD) == {"engine_api_key": "old-key-5f3a"}
    err = capsys.readouterr().err
    assert err == _notice(vault_file)  # once per file, not once per read
    assert "old-key-5f3a" not in err


def test_a_vault_with_both_names_is_refused_in_one_line(inventory, capsys):
    # engine_api_key first: setting it would replace sglang_api_key (as a hand edit would not)
    path = _api_key_inventory(inventory, engine_api_key="new-key", sglang_api_key="old-key")
    assert only_problem(path) == (
        f"{display(path)}: secrets_file = 'secrets.vault.yml': holds both sglang_api_key and engine_api_key, the"
        " new name of sglang_api_key; expected engine_api_key only: remove sglang_api_key (its line and its !vault"
        " block) once engine_api_key holds the key"
    )
    assert "old-key" not in capsys.readouterr().err


def test_an_inventory_naming_the_old_vault_key_is_refused_in_one_line(inventory):
    name = inventory.vault(sglang_api_key="k")
    path = inventory.groups(gpu_nodes=[gpu_node(secrets_file=name, serving_api_key_secret="sglang_api_key")])
    assert only_problem(path) == (
        f"{display(path)}: host gpu1: serving_api_key_secret = 'sglang_api_key' names the vault key by its old"
        " name; write serving_api_key_secret = 'engine_api_key' (docs/upgrades.md#engine-neutral-setting-names)"
    )


def test_the_new_vault_key_is_read_without_a_notice(inventory, capsys):
    path = _api_key_inventory(inventory, engine_api_key="new-key")
    assert load_site(path).secret_names == {"engine_api_key", "engine_admin_api_key"}
    assert capsys.readouterr().err == ""


def test_rename_moves_the_entry_without_the_password(inventory, capsys, monkeypatch):
    inventory.vault(sglang_api_key="old-key", hf_token="t")
    vault_file = inventory.dir / "secrets.vault.yml"
    monkeypatch.setenv(vault.PASSWORD_FILE_ENV, str(inventory.dir / "no-such-password-file"))
    assert vault._main(["rename", str(vault_file), "sglang_api_key", "engine_api_key"]) == 0
    assert set(vault.stored(vault_file)) == {"engine_api_key", "hf_token"}
    assert vault.decrypt_all(vault_file, ["engine_api_key"], PASSWORD) == {"engine_api_key": "old-key"}
    assert vault._main(["rename", str(vault_file), "hf_token", "engine_api_key"]) == 2
    assert capsys.readouterr().err == (
        f"{vault_file}: already holds engine_api_key; expected a new name (remove engine_api_key first to replace it)\n"
    )


def test_set_writes_the_new_name_only(inventory, capsys, monkeypatch):
    inventory.vault(sglang_api_key="old-key")
    vault_file = inventory.dir / "secrets.vault.yml"
    password_file = inventory.dir / "pw"
    password_file.write_bytes(PASSWORD)
    monkeypatch.setenv(vault.PASSWORD_FILE_ENV, str(password_file))
    monkeypatch.setattr("sys.stdin", io.StringIO(CLIENT_KEY + "\n"))
    assert vault._main(["set", str(vault_file), "sglang_api_key"]) == 2
    assert capsys.readouterr().err == (
        f"{vault_file}: the key sglang_api_key was renamed engine_api_key; expected the new name\n"
    )
    assert vault._main(["set", str(vault_file), "engine_api_key"]) == 0
    assert capsys.readouterr().out == f"{vault_file}: engine_api_key set (replaces sglang_api_key, its old name)\n"
    assert vault.decrypt_all(vault_file, password=PASSWORD) == {"engine_api_key": CLIENT_KEY}


def test_the_lab_renames_its_own_old_vault_key(tmp_path, monkeypatch, capsys):
    """lab/vault.py: a throwaway vault made before the rename keeps its key, under the new name."""
    import lab.vault

    monkeypatch.setattr(lab.vault, "STATE_DIR", tmp_path)
    folder = lab.vault.vault_folder()  # the prefix's folder under STATE_DIR
    folder.mkdir(mode=0o700)
    (folder / "vault-password").write_bytes(PASSWORD)
    vault.set_secret(folder / "secrets.vault.yml", "sglang_api_key", "lab-old-key", PASSWORD)
    made, _ = lab.vault.throwaway_vault()
    assert set(vault.stored(made)) == {
        "engine_api_key",
        *lab.vault.ROLE_KEYS,
        "monitoring_web_password",
        "monitoring_heartbeat_url",
    }
    assert vault.decrypt_all(made, ["engine_api_key"], PASSWORD) == {"engine_api_key": "lab-old-key"}
    assert "notice" not in capsys.readouterr().err
