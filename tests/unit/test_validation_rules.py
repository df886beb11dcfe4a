"""Values a careless operator writes, each refused in one line that names our file (issue 38):
groups that are not lists, duplicate YAML keys, host names that are not ASCII DNS names,
invisible characters, secrets in plain settings, serving_extra_env lines that would override a
setting or change what code runs, and values accepted before but wrong on the target (ports,
addresses, bounds, root, key files). Each test names its class; each failed on the code before."""

from __future__ import annotations

import os

import pytest

from roles.site import load_site, loading, vault
from roles.site.rules import NO_ROLE_CHECKS
from tests.unit.conftest import ADMIN, GATEWAY_PLAINTEXT, PROJECT_ROOT, ROLE_KEYS, SERVING_PLAINTEXT, gpu_node
from tests.unit.test_refusals import NODE, lxc, one_line, tree

TOKEN = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz01234567"  # shaped like a Hugging Face token, not one
API_KEY = "sk-" + "proj0123456789abcdefABCDEF"


@pytest.fixture
def validate(tmp_path, capsys, monkeypatch):
    """`inference-host validate PATH` in this process, as test_refusals.py's: exit 2, exactly one
    problem line (returned), nothing written under the test's folder, HOME an empty folder."""
    from validation import main

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()

    def run(path) -> str:
        before = tree(tmp_path)
        assert main([str(path)]) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and tree(tmp_path) == before
        lines = [line.removeprefix("  - ") for line in err.splitlines() if line.startswith("  - ")]
        assert len(lines) == 1, "expected one problem line, got:\n" + "\n".join(lines)
        return lines[0]

    return run


# --- every group a list of hosts ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "message"),
    [
        (
            "gpu_nodes = {'gpu1': {'gpu_count': 8}}\n",
            "gpu_nodes = {'gpu1': {'gpu_count': 8}} is a dict, not a group; expected a list of hosts, each a host name"
            " or a (name, {data}) tuple: gpu_nodes = [('gpu1', {'gpu_count': 8})]",
        ),
        (
            "gpu_nodes = [('gpu1', {'gpu_count': 8})]\nbuilders = 'gpu1'\n",
            "builders = 'gpu1' is a str, not a group; expected a list of hosts, each a host name or a (name, {data})"
            " tuple: builders = [('gpu1', {'gpu_count': 8})]",
        ),
        # A host tuple with a list for its data: pyinfra's own file and a ValueError before.
        (
            "gpu_nodes = [('gpu1', ['gpu_count', 8])]\n",
            "gpu_nodes entry 1 = ('gpu1', ['gpu_count', 8]) is not a host; expected a host name or a (name, {data})"
            " tuple (its data is a list, expected a dict of settings)",
        ),
    ],
)
def test_a_group_that_is_not_a_list_of_hosts_is_refused(inventory, validate, source, message):
    path = inventory.write(source)
    assert validate(path) == f"{path}: {message}"


def test_a_dict_group_stops_the_deploys_validation_too(inventory, capsys):
    # Under pyinfra's CLI the groups are the file's globals (validation.py passes them).
    path = inventory.write("builders = 'gpu1'\n")
    namespace = {"gpu_nodes": [gpu_node()], "builders": "gpu1"}
    with pytest.raises(SystemExit) as stopped:
        loading.require_valid_inventory(str(path), namespace, NO_ROLE_CHECKS)
    assert stopped.value.code == 2
    assert f"{path}: builders = 'gpu1' is a str, not a group" in capsys.readouterr().err


# --- YAML files: a key written twice ------------------------------------------------------------------


def test_a_key_twice_in_the_stack_file_is_refused(inventory, validate):
    inventory.edit_stack("active:", "active: vllm-0.16.0-cu128\nactive:")
    path = inventory.groups(gpu_nodes=[gpu_node("gpu.invalid")])
    line = next(
        n
        for n, text in enumerate((inventory.dir / "stack.yml").read_text().splitlines(), 1)
        if text.startswith("active:")
    )
    assert validate(path) == (
        f"{inventory.dir / 'stack.yml'}: key 'active' is written twice (lines {line} and"
        f" {line + 1}); expected each key once"
    )


def test_a_secret_twice_in_the_vault_is_refused(inventory, validate):
    name = inventory.vault(hf_token="first")
    vault_file = inventory.dir / name
    vault_file.write_text(vault_file.read_text() * 2)
    path = inventory.groups(gpu_nodes=[gpu_node("gpu.invalid", secrets_file=name, serving_hf_token_secret="hf_token")])
    assert validate(path) == (
        f"{path}: secrets_file = 'secrets.vault.yml': key 'hf_token' is written twice"
        " (lines 1 and 8); expected each key once"
    )


# --- host names: ASCII DNS names ------------------------------------------------------------------


def test_a_host_name_with_a_cyrillic_letter_is_refused(inventory, validate):
    path = inventory.groups(gpu_nodes=[gpu_node("gpu\u0435.example")])  # U+0435 looks like 'e'
    assert validate(path) == (
        f"{path}: host 'gpu\\u0435.example': the host name is not a DNS name in ASCII: \\u0435 (U+0435 CYRILLIC SMALL"
        " LETTER IE) at position 3 is not ASCII; expected letters a-z, digits, '-' and dots (RFC 1123) or an IP"
        " address"
    )


@pytest.mark.parametrize("name", ["gpu_1.example", "gpu-.example", "a..b"])
def test_a_host_name_that_is_no_dns_name_is_refused(inventory, validate, name):
    assert "the host name is not a DNS name in ASCII" in validate(inventory.groups(gpu_nodes=[gpu_node(name)]))


@pytest.mark.parametrize("name", ["10.0.0.5", "2001:db8::5", "gpu-1.example.internal", "@docker/ih-unit_gpu"])
def test_dns_names_addresses_and_connectors_are_host_names(inventory, name):
    assert name in load_site(inventory.groups(gpu_nodes=[gpu_node(name)])).hosts


# --- invisible characters: refused, and escaped in every message --------------------------------------


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"serving_served_model_name": "kimi\u200b"},
            "serving_served_model_name = 'kimi\\u200b' has the invisible character \\u200b (ZERO WIDTH SPACE) at"
            " position 4",
        ),
        (
            {"serving_model_path": "/models/\u202eKimi"},
            "serving_model_path = '/models/\\u202eKimi' has the invisible character \\u202e (RIGHT-TO-LEFT OVERRIDE) at"
            " position 8",
        ),
        (
            {"base_extra_packages": ["htop\u00a0"]},
            "base_extra_packages = ['htop\\xa0'] has the invisible character \\xa0 (NO-BREAK SPACE) at position 4 of"
            " item 0",
        ),
    ],
)
def test_invisible_characters_are_refused(inventory, validate, data, message):
    path = inventory.groups(gpu_nodes=[gpu_node("gpu.invalid", **data)])
    assert validate(path) == (
        f"{path}: host gpu.invalid: {message}; expected text without invisible, format or look-alike space characters"
    )


def test_a_key_ending_in_a_zero_width_space_is_not_printed_like_the_right_one(inventory, validate):
    path = inventory.groups(gpu_nodes=[gpu_node("gpu.invalid", **{"serving_port\u200b": 8080})])
    line = validate(path)
    assert "\u200b" not in line
    assert line == (
        f"{path}: host gpu.invalid: unknown key 'serving_port\\u200b' = 8080; did you mean serving_port?"
        " (valid keys are listed in docs/settings.md)"
    )


# --- every refusal names our file -------------------------------------------------------------------


def test_a_byte_that_is_not_utf8_names_the_inventory_and_its_line(inventory, validate):
    path = inventory.dir / "site.py"
    path.write_bytes(b"gpu_nodes = [('gpu.invalid', {'gpu_count': 8})]\n# caf\xe9\n")
    assert validate(path) == f"{path}:2: byte 0xe9 is not UTF-8; expected a UTF-8 text file (save it as UTF-8)"


def test_a_byte_that_is_not_utf8_stops_pyinfra_in_one_line(inventory, tmp_path):
    # pyinfra reads the file before running it and raised the bare UnicodeDecodeError (`<frozen codecs>`).
    path = inventory.dir / "site.py"
    path.write_bytes(
        b"from validation import require_valid_inventory\n"
        b"gpu_nodes = [('@docker/ih-unit-never-started', {'gpu_count': 8})]\n# caf\xe9\n"
        b"require_valid_inventory(__file__, globals())\n"
    )
    pyinfra = str(PROJECT_ROOT / ".venv" / "bin" / "pyinfra")
    assert one_line(tmp_path, pyinfra, "-y", str(path), "deploy.py") == (
        f"{path}:3: byte 0xe9 is not UTF-8; expected a UTF-8 text file (save it as UTF-8)"
    )


def test_a_corrupt_vault_is_one_line_and_not_called_empty(inventory, validate):
    (inventory.dir / "secrets.vault.yml").write_text(
        "hf_token: !vault |\n  $ANSIBLE_VAULT;1.1;AES256\n  6231\n bad: [\n"
    )
    path = inventory.groups(
        gpu_nodes=[gpu_node("gpu.invalid", secrets_file="secrets.vault.yml", serving_hf_token_secret="hf_token")]
    )
    assert validate(path) == (
        f"{path}: secrets_file = 'secrets.vault.yml': line 4, column 2: not valid YAML (expected <block end>, but"
        " found '<block mapping start>'); expected the secrets file as `inference-host vault set` writes it"
    )


def test_a_plaintext_secret_in_the_vault_is_one_line_without_the_value(inventory, validate):
    (inventory.dir / "secrets.vault.yml").write_text(f"hf_token: {TOKEN}\n")
    path = inventory.groups(
        gpu_nodes=[gpu_node("gpu.invalid", secrets_file="secrets.vault.yml", serving_hf_token_secret="hf_token")]
    )
    line = validate(path)
    assert TOKEN not in line and "empty" not in line
    assert line == (
        f"{path}: secrets_file = 'secrets.vault.yml': key 'hf_token' (line 1) not encrypted (plaintext in the file:"
        " treat it as leaked); expected every value to be a !vault value: remove the line and set it"
        " with `inference-host vault set FILE NAME`"
    )


def test_a_vault_without_the_key_says_what_it_holds(inventory, validate):
    name = inventory.vault(api_key="k")
    path = inventory.groups(gpu_nodes=[gpu_node("gpu.invalid", secrets_file=name, serving_hf_token_secret="hf_token")])
    assert validate(path) == (
        f"{path}: host gpu.invalid: serving_hf_token_secret = 'hf_token' names no secret in"
        f" {inventory.dir / name}; expected one of: api_key"
    )


# --- serving_extra_env: not a second way to set a setting, nor to change the code -------------------------


@pytest.mark.parametrize(
    ("name", "instead"),
    [
        ("NCCL_P2P_LEVEL", "nccl_p2p_level"),
        ("NCCL_SOCKET_IFNAME", "nccl_socket_ifname"),
        ("HF_HOME", "base_data_dir"),
        ("VLLM_PORT", "serving_port"),
        ("SGLANG_ENABLE_SPEC_V2", "serving_speculative's spec_v2"),
    ],
)
def test_an_env_variable_a_setting_owns_names_that_setting(inventory, validate, name, instead):
    path = inventory.groups(gpu_nodes=[gpu_node("gpu.invalid", serving_extra_env={name: "1"})])
    line = validate(path)
    assert line.startswith(
        f"{path}: host gpu.invalid: serving_extra_env = {{'{name}': '1'}} is invalid; expected no"
        f" variable the project already sets from a setting: {name} (set it with {instead}"
    )


@pytest.mark.parametrize("name", ["LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHONPATH", "PATH"])
def test_an_env_variable_that_changes_what_code_runs_is_refused(inventory, validate, name):
    path = inventory.groups(gpu_nodes=[gpu_node("gpu.invalid", serving_extra_env={name: "/tmp/x"})])
    assert validate(path) == (
        f"{path}: host gpu.invalid: serving_extra_env = {{'{name}': '/tmp/x'}} is invalid; expected no variable that"
        f" changes what code runs ({name}; nor any *_PRELOAD, *INJECTION*, *_PLUGIN or PYTHON*): the engine runs"
        " the locked environment of its stack; change the stack instead"
    )


def test_the_labs_own_extra_env_stays_valid(inventory):
    env = {
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "TMPDIR": "/var/lib/inference-engine",
        "INFERENCE_HOST_STANDIN_STUBBORN_CHILD": "1",
    }
    site = load_site(inventory.groups(gpu_nodes=[gpu_node(serving_extra_env=env)]))
    assert site.hosts["gpu1"].serving.extra_env == env


# --- secrets in plain settings: refused, pointing at the vault, never printed ------------------------------


@pytest.mark.parametrize(
    ("data", "what", "setting"),
    [
        (
            {"serving_served_model_name": TOKEN},
            "serving_served_model_name holds what looks like a credential (Hugging Face Token)",
            "serving_hf_token_secret",
        ),
        (
            {"serving_extra_env": {"OPENAI_BASE": API_KEY}},
            "serving_extra_env['OPENAI_BASE'] holds what looks like a credential (OpenAI API Key)",
            "serving_api_key_secret",
        ),
        (
            {"serving_extra_env": {"SGLANG_API_KEY": "swordfish"}},
            "serving_extra_env['SGLANG_API_KEY'] is named like a secret (*_TOKEN, *_KEY, *_SECRET, *_PASSWORD)",
            "serving_api_key_secret",
        ),
        (
            {"serving_extra_env": {"WANDB_PASSWORD": "swordfish"}},
            "serving_extra_env['WANDB_PASSWORD'] is named like a secret (*_TOKEN, *_KEY, *_SECRET, *_PASSWORD)",
            "a *_secret setting",
        ),
    ],
)
def test_a_secret_in_a_plain_setting_points_at_the_vault(inventory, validate, data, what, setting):
    path = inventory.groups(gpu_nodes=[gpu_node("gpu.invalid", **data)])
    line = validate(path)
    assert TOKEN not in line and API_KEY not in line and "swordfish" not in line
    assert line == (
        f"{path}: host gpu.invalid: {what}, in a plain setting (written in clear to the preview, unit"
        " files and command lines); expected it in the vault: inference-host vault set FILE NAME"
        f" (value on stdin), named by {setting}"
    )


# --- accepted before, wrong on the target ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"serving_port": 22},
            "serving_port = 22 is the port of the SSH server (the deploy's own way in) on this host",
        ),
        (
            {"serving_port": 2222, "ssh_port": 2222},
            "serving_port = 2222 is the port of the SSH server (the deploy's own way in) on this host",
        ),
        ({"serving_port": 9100}, "serving_port = 9100 is the port of node_exporter (roles/monitoring) on this host"),
    ],
)
def test_an_engine_on_a_port_of_the_nodes_own_services_is_refused(inventory, validate, data, message):
    path = inventory.groups(gpu_nodes=[gpu_node("gpu.invalid", **data)])
    assert validate(path) == f"{path}: host gpu.invalid: {message}; expected a free port"


def test_an_engine_on_proxmoxs_port_of_a_bare_metal_node_is_refused(inventory, validate):
    node = ("pve.invalid", {**NODE[1], "gpu_count": 8, "serving_port": 8006})
    path = inventory.groups(proxmox_hosts=[node], gpu_nodes=["pve.invalid"])
    assert validate(path) == (
        f"{path}: host pve.invalid: serving_port = 8006 is the port of pveproxy (Proxmox's"
        " web UI and API) on this host; expected a free port"
    )


def test_two_services_of_ours_on_one_port_of_one_host_are_refused(inventory, validate):
    host = gpu_node(
        "gpu.invalid",
        serving_port=8000,
        serving_host="10.0.0.5",
        serving_api_key_secret="api_key",
        **ADMIN,
        gateway_control_plane_api_key_secret="gateway_control_plane_api_key",
        secrets_file=inventory.vault(api_key="k", **ROLE_KEYS),
        **SERVING_PLAINTEXT,
        **GATEWAY_PLAINTEXT,
    )
    path = inventory.groups(gpu_nodes=[host], gateways=["gpu.invalid"])
    assert validate(path) == (
        f"{path}: host gpu.invalid: gateway_port = 8000 is serving_port too on this host;"
        " expected two different ports (one listener per port)"
    )


def test_the_dist_init_port_on_the_engines_port_is_refused(inventory, validate):
    path = inventory.groups(
        gpu_nodes=[gpu_node("gpu.invalid", serving_topology="tensor_parallel", serving_dist_init_port=30000)]
    )
    assert validate(path) == (
        f"{path}: host gpu.invalid: serving_dist_init_port = 30000 is serving_port too on this"
        " host; expected two different ports (one listener per port)"
    )


def test_a_dist_init_host_with_a_lookalike_letter_is_refused(inventory, validate):
    path = inventory.groups(gpu_nodes=[gpu_node("gpu.invalid", serving_dist_init_host="gpu\u0435.example")])
    assert validate(path) == (
        f"{path}: host gpu.invalid: serving_dist_init_host = 'gpu\\u0435.example' is invalid;"
        " expected a DNS name or an IP address"
    )


def test_two_guests_with_one_ip_are_refused(inventory, validate):
    path = inventory.groups(
        proxmox_hosts=[NODE],
        lxc_guests=[
            lxc("a.invalid", guest_ip="10.0.0.11/24"),
            lxc("b.invalid", guest_vmid=201, guest_ip="10.0.0.11/24"),
        ],
    )
    assert validate(path) == (
        f"{path}: host b.invalid: guest_ip = '10.0.0.11/24' is a.invalid's address too;"
        " expected one IP address per guest (two machines on one IP answer for each other)"
    )


@pytest.mark.parametrize(
    ("ip", "gateway", "message"),
    [
        (
            "10.0.0.11/24",
            "10.0.1.1",
            "guest_gateway = '10.0.1.1' is outside the guest's subnet 10.0.0.0/24 (guest_ip ="
            " '10.0.0.11/24'); expected a router the guest reaches on its own link, inside 10.0.0.0/24",
        ),
        (
            "10.0.0.11/24",
            "10.0.0.11",
            "guest_gateway = '10.0.0.11' is the guest's own address (guest_ip ="
            " '10.0.0.11/24'); expected the router of its subnet 10.0.0.0/24",
        ),
        (
            "10.0.0.255/24",
            "10.0.0.1",
            "guest_ip = '10.0.0.255/24' is the broadcast address of 10.0.0.0/24; expected a"
            " host address of the subnet (10.0.0.1 to 10.0.0.254)",
        ),
    ],
)
def test_a_gateway_the_guest_cannot_reach_is_refused(inventory, validate, ip, gateway, message):
    path = inventory.groups(proxmox_hosts=[NODE], lxc_guests=[lxc("ct.invalid", guest_ip=ip, guest_gateway=gateway)])
    assert validate(path) == f"{path}: host ct.invalid: {message}"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"guest_cores": 10**30},
            "guest_cores = 1000000000000000000000000000000 is beyond a 64-bit integer (31 digits);"
            " expected a number the host's tools can read",
        ),
        ({"guest_cores": 100000}, "guest_cores = 100000 is invalid; expected 1 to 8192 cores"),
        ({"guest_memory_mib": 8}, "guest_memory_mib = 8 is invalid; expected 16 to 67108864 MiB (64 TiB)"),
    ],
)
def test_a_guest_beyond_its_bounds_is_refused(inventory, validate, data, message):
    path = inventory.groups(proxmox_hosts=[NODE], lxc_guests=[lxc("ct.invalid", **data)])
    assert validate(path) == f"{path}: host ct.invalid: {message}"


def test_an_iommu_group_of_minus_one_is_refused(inventory, validate):
    node = ("pve.invalid", {**NODE[1], "proxmox_iommu_groups": {"0000:01:00.0": -1}})
    path = inventory.groups(proxmox_hosts=[node])
    assert validate(path) == (
        f"{path}: host pve.invalid: proxmox_iommu_groups = {{'0000:01:00.0': -1}} is invalid;"
        " expected {PCI address: group number} with group numbers from 0 to 2147483647"
    )


def test_the_engine_as_root_is_refused(inventory, validate):
    path = inventory.groups(gpu_nodes=[gpu_node("gpu.invalid", base_service_user="root")])
    assert validate(path) == (
        f"{path}: host gpu.invalid: base_service_user = 'root' is invalid; expected an unprivileged lower-case"
        " Unix user or group name ([a-z_][a-z0-9_-]*) of the deploy's own, not root nor an account or group of"
        " the system (daemon, nobody, sshd, systemd-*, sudo, adm, disk, shadow, docker, ...); root is an account of the"
        " system, whose files and powers the engine would share"
    )


def test_an_ssh_key_others_can_read_is_refused(inventory, short_tmp, validate):
    key = short_tmp / "id_ed25519"
    key.write_text("key\n")
    key.chmod(0o644)
    path = inventory.groups(gpu_nodes=[gpu_node("gpu.invalid", ssh_key=str(key))])
    assert validate(path) == (
        f"{path}: host gpu.invalid: ssh_key = '{key}' is invalid; expected a private key file"
        " only its owner can read (chmod 600 it; OpenSSH refuses a key open to others)"
    )


def test_a_vault_password_file_others_can_read_is_warned_in_one_line(inventory, tmp_path, monkeypatch, capsys):
    password = tmp_path / "vault-password"
    password.write_bytes(b"unit-test-password\n")
    password.chmod(0o644)
    monkeypatch.setenv(vault.PASSWORD_FILE_ENV, str(password))
    monkeypatch.setattr(vault, "_WARNED", set())
    name = inventory.vault(api_key="k")
    assert vault.decrypt_all(inventory.dir / name) == {"api_key": "k"}
    err = capsys.readouterr().err
    assert err == (
        f"inference-host: warning: the vault password file {password} is open to other users (mode 0644):"
        f" it unlocks every secret; expected mode 0600 (chmod 600 {password})\n"
    )
    os.chmod(password, 0o600)
    monkeypatch.setattr(vault, "_WARNED", set())
    vault.decrypt_all(inventory.dir / name)
    assert capsys.readouterr().err == ""
