"""`python -m roles.render`: what the deploy would write, per host, with every secret masked."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from roles import render
from roles.site import PROJECT_ROOT, load_site
from roles.site import vault as secrets

PLANTED = {"hf_token": "hf_planted_token_5b1d", "sglang_api_key": "planted-api-key-77c3"}


def _prod_with_planted_vault(tmp_path):
    """inventory/prod.py beside a vault whose values are known (and a password file)."""
    folder = tmp_path / "inventory"
    shutil.copytree(PROJECT_ROOT / "inventory", folder)
    password = tmp_path / "password"
    password.write_text("render-test-password\n")
    vault = folder / "secrets.vault.yml"
    vault.unlink()
    for name, value in PLANTED.items():
        secrets.set_secret(vault, name, value, b"render-test-password")
    return folder / "prod.py", password


def test_prod_preview_has_every_templated_file_and_no_secret(tmp_path, monkeypatch):
    inventory, password = _prod_with_planted_vault(tmp_path)
    monkeypatch.setenv("INFERENCE_HOST_VAULT_PASSWORD_FILE", str(password))
    site = load_site(inventory)
    assert secrets.decrypt_all(site.secrets_file, password=b"render-test-password") == PLANTED
    out = tmp_path / "preview"
    assert render.main([str(inventory), "--out", str(out)]) == 0
    node, gpu = site.group("proxmox_hosts")[0], site.group("gpu_nodes")[0]
    from roles import serving

    env = serving.config_dir(gpu, site.stack.active, site).lstrip("/")
    for host, path in [(node.name, "etc/modprobe.d/blacklist-nouveau.conf"),
                       (node.name, "etc/modules-load.d/vfio.conf"),
                       (node.name, "inference-host-commands/pct-create-201.sh"),
                       (node.name, "inference-host-commands/qm-create-202.sh"),
                       (gpu.name, f"{env}/sglang.service"), (gpu.name, f"{env}/sglang.env"),
                       (gpu.name, f"{env}/launch"), (gpu.name, f"{env}/sglang-secret-args.yaml"),
                       (gpu.name, "etc/sysctl.d/90-inference-host-sysctl.conf"),
                       (gpu.name, "var/lib/sglang/.cache/huggingface/token")]:
        assert (out / host / path).is_file(), f"{host}: {path}"
    assert (out / gpu.name / env / "sglang-secret-args.yaml").read_text() == '{"api-key": "***"}\n'
    assert (out / gpu.name / "var/lib/sglang/.cache/huggingface/token").read_text() == "***"
    assert "pct create 201 " in (out / node.name / "inference-host-commands/pct-create-201.sh").read_text()
    leaks = [str(path) for path in out.rglob("*") if path.is_file()
             for value in PLANTED.values() if value in path.read_text()]
    assert leaks == []


def test_command_runs_on_a_fresh_clone_without_the_vault_password(tmp_path):
    """The committed vault's password was discarded: the preview must not need one."""
    env = {k: v for k, v in os.environ.items() if k != "INFERENCE_HOST_VAULT_PASSWORD_FILE"}
    env["INFERENCE_HOST_VAULT_PASSWORD_FILE"] = str(tmp_path / "no-such-file")
    result = subprocess.run([sys.executable, "-m", "roles.render", "inventory/prod.py", "--out",
                             str(tmp_path / "preview")], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "sglang-lxc.example.internal: " in result.stdout


def test_bad_inventory_stops_with_the_site_models_message(tmp_path, inventory, capsys):
    from tests.unit.conftest import gpu_node

    path = inventory.groups(gpu_nodes=[gpu_node(serving_prot=1)])
    assert render.main([str(path), "--out", str(tmp_path / "out")]) == 2
    assert "serving_prot" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
