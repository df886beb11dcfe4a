"""`python -m roles.render`: what the deploy would write and run, per host, with every secret
masked (the deploy itself, recorded: tests/unit/test_preview_is_the_deploy.py)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

from roles import render
from roles.site import PROJECT_ROOT, load_site, vault, weight_sets_kept_by

PLANTED = {
    "hf_token": "hf_planted_token_5b1d",
    "engine_api_key": "planted-api-key-77c3-0123456789abcdef",
    "engine_admin_api_key": "planted-admin-key-91d0-0123456789abcdef",
    "monitoring_web_password": "planted-web-password-4e2a",
}


def _prod_with_planted_vault(tmp_path):
    """inventory/prod.py beside a vault whose values are known (and a password file)."""
    folder = tmp_path / "inventory"
    shutil.copytree(PROJECT_ROOT / "inventory", folder)
    password = tmp_path / "password"
    password.write_text("render-test-password\n")
    vault_file = folder / "secrets.vault.yml"
    vault_file.unlink()
    for name, value in PLANTED.items():
        vault.set_secret(vault_file, name, value, b"render-test-password")
    return folder / "prod.py", password


def test_prod_preview_has_every_templated_file_and_no_secret(tmp_path, monkeypatch):
    inventory, password = _prod_with_planted_vault(tmp_path)
    monkeypatch.setenv("INFERENCE_HOST_VAULT_PASSWORD_FILE", str(password))
    site = load_site(inventory)
    assert vault.decrypt_all(site.secrets_file, password=b"render-test-password") == PLANTED
    out = tmp_path / "preview"
    assert render.main([str(inventory), "--out", str(out)]) == 0
    node, gpu = site.group("proxmox_hosts")[0], site.group("gpu_nodes")[0]
    from roles import serving

    env = serving.config_dir(gpu, site.stack.active, site).lstrip("/")
    for host, path in [
        (node.name, "etc/modprobe.d/blacklist-nouveau.conf"),
        (node.name, "etc/modules-load.d/vfio.conf"),
        # The LXC guest's GPUs run on the node's driver: its files are the node's.
        (node.name, "etc/apt/preferences.d/90-inference-host-nvidia-driver"),
        (node.name, "etc/apt/sources.list.d/cuda-debian12-x86_64.list"),
        (node.name, "etc/modules-load.d/nvidia-uvm.conf"),
        (node.name, "etc/systemd/system/nvidia-uvm-devices.service"),
        (node.name, "etc/sysctl.d/90-inference-host-node.conf"),
        (node.name, render.COMMANDS),
        (node.name, render.STATE_NOTE),
        (gpu.name, f"{env}/inference-engine.service"),
        (gpu.name, f"{env}/inference-engine.env"),
        (gpu.name, f"{env}/launch"),
        (gpu.name, f"{env}/inference-engine-secret-args.yaml"),
        (gpu.name, "etc/apt/preferences.d/90-inference-host-nvidia-driver"),
        # The GPU guest is its own monitor (prod.py's monitors group).
        (gpu.name, "etc/prometheus/prometheus.yml"),
        (gpu.name, "etc/prometheus/amtool.yml"),
        (gpu.name, "etc/prometheus/inference-host.grafana.json"),
    ]:
        assert (out / host / path).is_file(), f"{host}: {path}"
    secret_args = (out / gpu.name / env / "inference-engine-secret-args.yaml").read_text()
    assert secret_args == '{"api-key": "***", "admin-api-key": "***"}\n'
    # An LXC guest shares its node's kernel: kernel.numa_balancing is written on the node only.
    assert "kernel.numa_balancing = 0" in (out / node.name / "etc/sysctl.d/90-inference-host-node.conf").read_text()
    assert not (out / gpu.name / "etc/sysctl.d").exists()
    assert "Ubuntu 24.04" in (out / gpu.name / render.STATE_NOTE).read_text()
    # A served local directory needs no Hub token in the engine's guest (the path the token
    # would have: test_prod_with_a_hub_model_previews_the_engines_token shows it there).
    assert not (out / gpu.name / _engine_token(gpu)).exists()
    # The driver the node installs is the one its LXC guest's userspace follows.
    pin = (out / node.name / "etc/apt/preferences.d/90-inference-host-nvidia-driver").read_text()
    assert site.stack.driver_version in pin
    assert "nvidia-modprobe" in (out / node.name / "etc/systemd/system/nvidia-uvm-devices.service").read_text()
    # The stated node has its guests, their configurations empty: every setting is set.
    commands = (out / node.name / render.COMMANDS).read_text()
    assert "\npct set 201 --hostname gpu-lxc " in commands
    assert "\nqm set 202 --name gpu-vm " in commands
    leaks = [
        str(path)
        for path in out.rglob("*")
        if path.is_file()
        for value in PLANTED.values()
        if value in path.read_text()
    ]
    assert leaks == []


def _engine_token(gpu) -> str:
    """Where the engine's guest keeps its Hub token, relative to the host's root (roles/base)."""
    return f"{gpu.base.data_dir}/.cache/huggingface/token".lstrip("/")


def _edited_prod(tmp_path, *edits: tuple[str, str]):
    inventory, _ = _prod_with_planted_vault(tmp_path)
    text = inventory.read_text()
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new)
    inventory.write_text(text)
    return load_site(inventory)


def test_prod_with_a_hub_model_previews_the_engines_token(tmp_path, monkeypatch):
    """The path the preview test finds absent is the one the token takes when the engine itself
    reads the Hub (a drafter named by a Hub id: tests/unit/test_placement.py)."""
    site = load_site(_prod_with_planted_vault(tmp_path)[0])
    import roles.base

    monkeypatch.setattr(roles.base, "engine_reads_hub_token", lambda host, hosts: host.in_group("gpu_nodes"))
    out = tmp_path / "preview"
    render.render(site, out)
    gpu = site.group("gpu_nodes")[0]
    assert (out / gpu.name / _engine_token(gpu)).read_text() == "***"


def test_prods_model_storage_is_read_only_once_weights_repo_names_the_model(tmp_path):
    """inventory/prod.py's comment: /tank/models is mounted with ro=1 when the weights live there
    (the shipped example pins them), read-write when the inventory names no weights."""
    shipped = load_site(PROJECT_ROOT / "inventory" / "prod.py")
    out = tmp_path / "shipped"
    render.render(shipped, out)
    node = shipped.group("proxmox_hosts")[0].name
    script = (out / node / render.COMMANDS).read_text()
    assert re.search(r"--mp0 /tank/models,mp=/models,ro=1\s", script)
    site = _edited_prod(
        tmp_path,
        ('"weights_repo": "moonshotai/Kimi-K2.5"', '# "weights_repo": "moonshotai/Kimi-K2.5"'),
        ('"weights_revision": "3367c8d1', '# "weights_revision": "3367c8d1'),
    )
    render.render(site, tmp_path / "no-weights")
    script = (tmp_path / "no-weights" / node / render.COMMANDS).read_text()
    assert re.search(r"--mp0 /tank/models,mp=/models\s", script)


def test_command_runs_on_a_fresh_clone_without_the_vault_password(tmp_path):
    """The committed vault's password was discarded: the preview must not need one."""
    env = {k: v for k, v in os.environ.items() if k != "INFERENCE_HOST_VAULT_PASSWORD_FILE"}
    env["INFERENCE_HOST_VAULT_PASSWORD_FILE"] = str(tmp_path / "no-such-file")
    result = subprocess.run(
        [sys.executable, "-m", "roles.render", "inventory/prod.py", "--out", str(tmp_path / "preview")],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert "gpu-lxc.example.internal: " in result.stdout


def test_bad_inventory_stops_with_the_site_models_message(tmp_path, inventory, capsys):
    from tests.unit.conftest import gpu_node

    path = inventory.groups(gpu_nodes=[gpu_node(serving_prot=1)])
    assert render.main([str(path), "--out", str(tmp_path / "out")]) == 2
    assert "serving_prot" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_weights_the_node_downloads_are_previewed_on_the_node_with_its_token(tmp_path, inventory):
    """The node keeps the weights of an LXC guest's mounted directory: unit, config, tool and the
    masked token are the node's; the guest, serving a local directory, holds no token."""
    from roles import weights
    from tests.unit.test_site import NODE
    from tests.unit.test_weights import WEIGHTS, guest_node

    inventory.vault(hf_token="hf_planted_token_5b1d")
    ct = guest_node(
        "ct",
        200,
        **WEIGHTS,
        serving_model_path="/models/Kimi-K2.5",
        serving_hf_token_secret="hf_token",
        secrets_file="secrets.vault.yml",
    )
    site = load_site(inventory.groups(proxmox_hosts=[NODE], lxc_guests=[ct], gpu_nodes=[ct]))
    out = tmp_path / "preview"
    written = render.render(site, out)
    (ws,) = weight_sets_kept_by(site, "pve")
    node = out / "pve"
    assert (node / weights.token_file("hf_token").lstrip("/")).read_text() == "***"
    unit = (node / f"etc/systemd/system/{weights.unit_name(ws)}.service").read_text()
    assert f"HF_TOKEN_PATH={weights.token_file('hf_token')}" in unit
    config = (node / f"etc/inference-host/weights/{ws.name}.json").read_text()
    assert '"local_dir": "/tank/models/Kimi-K2.5"' in config
    assert (node / "usr/local/bin/inference-host-weights").is_file()
    guest_files = [str(p.relative_to(out / "ct")) for p in written["ct"]]
    assert not any("huggingface" in f or "weights" in f for f in guest_files), guest_files
    assert not any("hf_planted_token_5b1d" in p.read_text() for p in out.rglob("*") if p.is_file())
