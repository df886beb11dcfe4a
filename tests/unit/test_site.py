"""The site model: valid inventories pass, and each kind of bad input is refused with its own
message naming the file, the field, the bad value and what would be valid."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from roles.serving.command import node_topology
from roles.site import SiteError, load_site
from tests.unit.conftest import PASSWORD, PROJECT_ROOT, SERVING_PLAINTEXT, gpu_node


def problems_of(path) -> list[str]:
    with pytest.raises(SiteError) as caught:
        load_site(path)
    return caught.value.problems


def only_problem(path) -> str:
    problems = problems_of(path)
    assert len(problems) == 1, "expected exactly one problem, got:\n" + "\n".join(problems)
    return problems[0]


def assert_names(message: str, *parts: str) -> None:
    for part in parts:
        assert part in message, f"{part!r} missing from: {message}"


# --- valid inventories ------------------------------------------------------------------------


def test_prod_inventory_is_valid():
    site = load_site(PROJECT_ROOT / "inventory" / "prod.py")
    lxc = site.hosts["gpu-lxc.example.internal"]
    assert lxc.groups == ("lxc_guests", "gpu_nodes", "builders", "monitors")  # its own monitor
    assert lxc.gpu.count == 8 and lxc.gpu.compute_capability == "12.0"
    assert lxc.guest.vmid == 201 and len(lxc.guest.gpu_addresses) == 8
    assert site.stack.active.sglang == "0.5.9"
    assert site.secret_names == {"engine_admin_api_key", "engine_api_key", "hf_token", "monitoring_web_password"}


def test_defaults_fill_what_the_inventory_leaves_out(inventory):
    site = load_site(inventory.groups(gpu_nodes=[gpu_node()]))
    host = site.hosts["gpu1"]
    assert host.serving.port == 30000 and host.serving.host == "127.0.0.1"
    assert host.nccl.p2p_level == "SYS" and host.nccl.ib_disable is None  # group_data/gpu_nodes.py
    assert host.base.sysctl == {"kernel.numa_balancing": "0"}
    assert host.base.service_user == "inference" and host.base.service_group == "inference"
    assert (host.base.data_dir, host.base.log_dir) == ("/var/lib/inference-engine", "/var/log/inference-engine")


def test_host_in_several_groups_merges_its_data(inventory):
    path = inventory.groups(gpu_nodes=[gpu_node(serving_port=31000)], builders=[("gpu1", {"build_max_jobs": 2})])
    host = load_site(path).hosts["gpu1"]
    assert host.serving.port == 31000 and host.build.max_jobs == 2
    assert host.groups == ("gpu_nodes", "builders")


def test_multi_node_rank_is_derived_from_inventory_order(inventory):
    path = inventory.groups(gpu_nodes=[gpu_node("10.0.0.1"), gpu_node("10.0.0.2")])
    site = load_site(path)
    # replicas (the default): each node is its own server.
    assert node_topology(site.hosts["10.0.0.2"], site.hosts) == (8, 1, 0, "10.0.0.2:50000")
    path = inventory.groups(
        "tp.py",
        gpu_nodes=[
            gpu_node("10.0.0.1", serving_topology="tensor_parallel", nccl_ib_disable=True),
            gpu_node("10.0.0.2", serving_topology="tensor_parallel", nccl_ib_disable=True),
        ],
    )
    site = load_site(path)
    assert node_topology(site.hosts["10.0.0.2"], site.hosts) == (16, 2, 1, "10.0.0.1:50000")


# --- bad inputs: one message each, naming file, field, value and what is valid ----------------


BAD_HOST_DATA = [
    # (data for the gpu node, parts the message must contain)
    ({"gpu_count": "8"}, ["gpu_count = '8'", "expected an integer"]),
    ({"serving_prot": 30000}, ["unknown key serving_prot", "did you mean serving_port"]),
    ({"gpu_arch": "sm999"}, ["gpu_arch = 'sm999'", "one of", "'sm120'"]),
    ({"serving_port": 70000}, ["serving_port = 70000", "1 to 65535"]),
    ({"serving_port": True}, ["serving_port = True", "expected an integer"]),
    ({"nccl_p2p_level": "ALL"}, ["nccl_p2p_level = 'ALL'", "'SYS'", "'off'"]),
    ({"nccl_ib_disable": "yes"}, ["nccl_ib_disable = 'yes'", "True or False"]),
    ({"serving_mem_fraction_static": 1.5}, ["serving_mem_fraction_static = 1.5", "0.1 to 0.99"]),
    ({"base_install_root": "opt/sglang"}, ["base_install_root = 'opt/sglang'", "an absolute path"]),
    ({"base_service_user": "Root User"}, ["base_service_user = 'Root User'", "Unix user"]),
    # gpu_addresses was a setting nothing used: now an unknown key like any typo.
    ({"gpu_addresses": ["0000:01:00.0"]}, ["unknown key gpu_addresses", "did you mean guest_gpu_addresses"]),
    ({"gpu_count": 0}, ["gpu_count = 0", "a gpu node needs an integer >= 1"]),
    (
        {"serving_host": "0.0.0.0", **SERVING_PLAINTEXT},
        ["serving_host = '0.0.0.0'", "serving_api_key_secret"],
    ),
    ({"serving_host": "localhost"}, ["serving_host = 'localhost'", "an IP address"]),
    ({"serving_attention_backend": "flashattn"}, ["serving_attention_backend = 'flashattn'", "'triton'"]),
    ({"serving_speculative": {"num_steps": 3}}, ["serving_speculative", "draft_model_path"]),
    ({"serving_speculative": {"draft_model_path": "/m", "algorithm": "MEDUSA"}}, ["algorithm 'MEDUSA'"]),
    ({"serving_api_key_secret": "api_key"}, ["serving_api_key_secret = 'api_key'", "no secrets_file set"]),
    ({"build_max_jobs": -1}, ["build_max_jobs = -1", "greater than 0"]),
    ({"base_sysctl": ["kernel.numa_balancing=0"]}, ["base_sysctl", "expected dict[str, str]"]),
]


@pytest.mark.parametrize(("data", "parts"), BAD_HOST_DATA, ids=[str(d) for d, _ in BAD_HOST_DATA])
def test_bad_host_data_is_refused_with_its_own_message(inventory, data, parts):
    path = inventory.groups(gpu_nodes=[gpu_node(**data)])
    message = only_problem(path)
    assert_names(message, "inventory/site.py", "host gpu1", *parts)


def test_unknown_group_is_refused(inventory):
    message = only_problem(inventory.groups(gpu_node=[gpu_node()]))
    assert_names(message, "unknown group 'gpu_node'", "did you mean gpu_nodes", "proxmox_hosts")


def test_secret_reference_that_does_not_exist(inventory):
    vault = inventory.vault(hf_token="x")
    path = inventory.groups(gpu_nodes=[gpu_node(secrets_file=vault, serving_api_key_secret="api_key")])
    assert_names(only_problem(path), "serving_api_key_secret = 'api_key'", "expected one of: hf_token")


def test_missing_secrets_file(inventory):
    path = inventory.groups(gpu_nodes=[gpu_node(secrets_file="nope.vault.yml")])
    assert_names(only_problem(path), "secrets_file = 'nope.vault.yml'", "file not found")


def test_plaintext_secret_is_refused(inventory):
    (inventory.dir / "plain.yml").write_text("hf_token: hf_abc\n")
    path = inventory.groups(gpu_nodes=[gpu_node(secrets_file="plain.yml")])
    message = only_problem(path)
    assert_names(message, "hf_token", "not encrypted")
    assert "hf_abc" not in message  # a plaintext secret is not echoed back


# --- guests: the Proxmox rules -----------------------------------------------------------------

NODE = ("pve", {"proxmox_gpu_addresses": ["0000:01:00.0", "0000:02:00.0"]})


def lxc(name="ct", **data):
    return (name, {"guest_vmid": 200, "guest_node": "pve", **data})


def test_duplicate_vmids_across_lxc_and_kvm(inventory):
    path = inventory.groups(proxmox_hosts=[NODE], lxc_guests=[lxc("ct")], kvm_guests=[lxc("vm")])
    assert_names(only_problem(path), "host vm", "guest_vmid = 200 is already used by ct")


def test_vmid_below_100(inventory):
    path = inventory.groups(proxmox_hosts=[NODE], lxc_guests=[lxc(guest_vmid=99)])
    assert_names(problems_of(path)[0], "guest_vmid = 99", "an integer >= 100")


def test_gpu_given_to_two_guests(inventory):
    gpus = ["0000:01:00.0"]
    path = inventory.groups(
        proxmox_hosts=[NODE],
        lxc_guests=[lxc("ct", guest_gpu_addresses=gpus)],
        kvm_guests=[lxc("vm", guest_vmid=300, guest_gpu_addresses=gpus)],
    )
    assert_names(only_problem(path), "host vm", "0000:01:00.0, already given to ct")


def test_guest_gpu_not_on_its_node(inventory):
    path = inventory.groups(proxmox_hosts=[NODE], lxc_guests=[lxc(guest_gpu_addresses=["0000:09:00.0"])])
    assert_names(only_problem(path), "0000:09:00.0", "not in pve's proxmox_gpu_addresses")


def test_guest_node_must_be_a_proxmox_host(inventory):
    path = inventory.groups(proxmox_hosts=[NODE], lxc_guests=[lxc(guest_node="pve2")])
    assert_names(only_problem(path), "guest_node = 'pve2'", "expected one of: pve")


def test_keyctl_requires_unprivileged(inventory):
    path = inventory.groups(proxmox_hosts=[NODE], lxc_guests=[lxc(guest_unprivileged=False)])
    assert_names(only_problem(path), "'keyctl'", "guest_unprivileged = False")


def test_unknown_lxc_feature(inventory):
    path = inventory.groups(proxmox_hosts=[NODE], lxc_guests=[lxc(guest_features=["nesting", "docker"])])
    assert_names(only_problem(path), "guest_features = ['nesting', 'docker']", "force_rw_sys")


def test_guest_gpu_count_must_match_its_addresses(inventory):
    path = inventory.groups(
        proxmox_hosts=[NODE],
        lxc_guests=[lxc(guest_gpu_addresses=["0000:01:00.0"])],
        gpu_nodes=[("ct", {"gpu_count": 2})],
    )
    assert_names(only_problem(path), "gpu_count = 2 but guest_gpu_addresses lists 1 GPUs")


# --- the stack file ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "parts"),
    [
        ('torch: "2.9.1"', 'torch: "two"', ["stacks.sglang-0.5.9-cu128.torch = 'two'", "a version like"]),
        ('torch: "2.9.1"', "torch: 2.9", ["torch = 2.9", "(quoted string)"]),
        ('cuda: "12.8"', 'cuda: "12"', ["cuda = '12'", "a CUDA major.minor like 12.8"]),
        ("active: sglang-0.5.9-cu128", "active: sglang-0.6", ["active = 'sglang-0.6'", "one of the stacks"]),
        ('version: "580.95.05"', 'version: "575.57.08"', ["nvidia_driver.version = '575.57.08'", "on branch 580"]),
        ("package: sgl-kernel", "package: sgl_kernel", ["kernel.package = 'sgl_kernel'", "'sgl-kernel'"]),
        ('uv: "0.13.9"', 'uv: "0.13.9"\nsglang_version: "0.5.9"', ["unknown key sglang_version", "valid keys"]),
        ("flash_attn_source: build", "flash_attn_source: download", ["flash_attn_source = 'download'"]),
        # A flash-attn built from source needs its archive's sha256 in the stack file.
        (
            '    flash_attn_sha256: "1e71dd64',
            '    # flash_attn_sha256: "1e71dd64',
            ["sglang-0.5.9-cu128.flash_attn_sha256 = None", "the sha256 of flash_attn-2.8.3.tar.gz"],
        ),
        (
            'flash_attn_sha256: "1e71dd64',
            'flash_attn_sha256: "1E71DD64',
            ["flash_attn_sha256 = '1E71DD64", "64 lowercase hex digits"],
        ),
    ],
)
def test_bad_stack_file_is_refused(inventory, old, new, parts):
    inventory.edit_stack(old, new)
    message = only_problem(inventory.groups(gpu_nodes=[gpu_node()]))
    assert_names(message, "inventory/stack.yml", *parts)


def test_stack_file_that_is_not_yaml(inventory):
    inventory.stack("uv: [unclosed\n")
    assert_names(only_problem(inventory.groups(gpu_nodes=[gpu_node()])), "stack.yml", "not valid YAML")


def test_missing_stack_file(inventory):
    path = inventory.groups(gpu_nodes=[gpu_node(stack_file="missing.yml")])
    assert_names(only_problem(path), "missing.yml", "file not found")


def test_python_error_in_inventory(inventory):
    path = inventory.write("gpu_nodes = [('gpu1', {'gpu_count': 8})\n")
    assert_names(only_problem(path), "inventory/site.py:1: SyntaxError: '[' was never closed")


def test_all_problems_are_reported_at_once(inventory):
    path = inventory.groups(gpu_nodes=[gpu_node(serving_port=0, gpu_arch="x", serving_prot=1)])
    assert len(problems_of(path)) == 3


# --- the command line --------------------------------------------------------------------------


def run_cli(path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "validation", str(path)], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120
    )


def test_cli_summarises_a_valid_inventory():
    result = run_cli("inventory/prod.py")
    assert result.returncode == 0, result.stderr
    assert "inventory/prod.py: valid" in result.stdout
    assert "gpu-lxc.example.internal: lxc_guests, gpu_nodes, builders, monitors; 8 x sm120 GPU" in result.stdout


def test_cli_exits_non_zero_with_one_line_per_problem(inventory):
    path = inventory.groups(gpu_nodes=[gpu_node(serving_port=0, gpu_arch="x")])
    result = run_cli(path)
    assert result.returncode == 2
    assert result.stderr.count("\n  - ") == 2, result.stderr


def test_deploy_stops_before_connecting_on_a_bad_inventory(inventory):
    # A docker host that does not exist: if pyinfra tried to connect it would try to start it.
    source = (
        "from validation import require_valid_inventory\n"
        "gpu_nodes = [('@docker/ih-unit-never-started', {'gpu_count': 8, 'serving_prot': 1})]\n"
        "require_valid_inventory(__file__, globals())\n"
    )
    path = inventory.write(source)
    pyinfra = str(PROJECT_ROOT / ".venv" / "bin" / "pyinfra")
    result = subprocess.run(
        [pyinfra, "-y", str(path), "deploy.py"], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "unknown key serving_prot" in result.stderr
    assert "no host was contacted" in result.stderr
    assert "Connecting to hosts" not in result.stdout + result.stderr


def _counting_inventory(inventory, counter) -> Path:
    # Each run of the file adds one "x" to counter; the host is never reached.
    return inventory.write(
        "from pathlib import Path\n"
        "from validation import require_valid_inventory\n"
        f"_counter = Path({str(counter)!r})\n"
        "_counter.write_text((_counter.read_text() if _counter.exists() else '') + 'x')\n"
        "builders = [('never-connected.invalid', {'build_kernel_wheels': False})]\n"
        "require_valid_inventory(__file__, globals())\n"
    )


def test_a_deploy_runs_the_inventory_file_once(inventory, tmp_path):
    counter = tmp_path / "runs"
    path = _counting_inventory(inventory, counter)
    pyinfra = str(PROJECT_ROOT / ".venv" / "bin" / "pyinfra")
    result = subprocess.run(
        [pyinfra, "-y", str(path), "deploy.py"], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120
    )
    assert "Connecting to hosts" in result.stdout + result.stderr, result.stderr  # validated
    assert counter.read_text() == "x", "validation ran the inventory file again"


def test_load_site_runs_the_inventory_file_once(inventory, tmp_path):
    counter = tmp_path / "runs"
    site = load_site(_counting_inventory(inventory, counter))
    assert list(site.hosts) == ["never-connected.invalid"]
    assert counter.read_text() == "x"


def test_deploy_with_a_wrong_vault_password_stops_before_connecting(inventory, tmp_path):
    vault = inventory.vault(hf_token="hf_value")
    source = (
        "from validation import require_valid_inventory\n"
        "gpu_nodes = [('@docker/ih-unit-never-started', {'gpu_count': 8,"
        f" 'secrets_file': {vault!r}, 'serving_hf_token_secret': 'hf_token'}})]\n"
        "require_valid_inventory(__file__, globals())\n"
    )
    path = inventory.write(source)
    wrong = tmp_path / "wrong-password"
    wrong.write_text("not-the-password")
    pyinfra = str(PROJECT_ROOT / ".venv" / "bin" / "pyinfra")
    result = subprocess.run(
        [pyinfra, "-y", str(path), "deploy.py"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "INFERENCE_HOST_VAULT_PASSWORD_FILE": str(wrong)},
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "secret 'hf_token' cannot be decrypted" in result.stderr
    assert "Connecting to hosts" not in result.stdout + result.stderr


def test_an_api_key_beginning_with_a_dash_stops_the_deploy_before_connecting(inventory, tmp_path):
    """argparse (vLLM's --config file, smg's --api-key) reads "-..." as an option: refused,
    naming the secret, never printing its value."""
    key = "-dash-first-key-value-long-enough-to-be-a-key"
    vault = inventory.vault(engine_api_key=key, engine_admin_api_key="admin-key-of-the-dash-test-0123456789")
    source = (
        "from validation import require_valid_inventory\n"
        "gpu_nodes = [('@docker/ih-unit-never-started', {'gpu_count': 8,"
        f" 'secrets_file': {vault!r}, 'serving_api_key_secret': 'engine_api_key',"
        " 'serving_admin_api_key_secret': 'engine_admin_api_key'})]\n"
        "require_valid_inventory(__file__, globals())\n"
    )
    pyinfra = str(PROJECT_ROOT / ".venv" / "bin" / "pyinfra")
    password = tmp_path / "password"
    password.write_bytes(PASSWORD)
    result = subprocess.run(
        [pyinfra, "-y", str(inventory.write(source)), "deploy.py"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "INFERENCE_HOST_VAULT_PASSWORD_FILE": str(password)},
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "secret 'engine_api_key' (serving_api_key_secret) begins with '-'" in result.stderr, result.stderr
    assert key not in result.stdout + result.stderr
    assert "Connecting to hosts" not in result.stdout + result.stderr
