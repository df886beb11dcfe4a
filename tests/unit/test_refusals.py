"""Bad input refused in one line before any host is contacted or any file is written (issue 25).

Each case runs the real command in a subprocess, with an empty fake HOME and hosts that do not
resolve (a connection attempt would print pyinfra's or SSH's own error and exit otherwise),
and checks: exit 2, exactly one problem line with the exact message, and no file written
anywhere under the test's folder (the inventory's, HOME, the output paths)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from roles.shared import pve
from roles.site import load_site
from roles.site import lock as site_lock
from tests.unit.conftest import PROJECT_ROOT, gpu_node

NODE = ("pve.invalid", {"proxmox_gpu_addresses": ["0000:01:00.0", "0000:02:00.0"]})


def lxc(name, **data):
    return (name, {"guest_vmid": 200, "guest_node": "pve.invalid", **data})


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def refused(tmp_path: Path, *argv: str, stdin: str = "", env: dict | None = None) -> list[str]:
    """Runs the command; asserts exit 2, nothing contacted, nothing written; returns its problem lines."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    before = tree(tmp_path)
    result = subprocess.run(
        [sys.executable, *argv],
        cwd=PROJECT_ROOT,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HOME": str(home), "INFERENCE_HOST_VAULT_PASSWORD_FILE": str(home / "none"), **(env or {})},
    )
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert "Traceback" not in output and "Warning" not in output, output
    assert "Connecting to hosts" not in output and "Name or service not known" not in output, output
    assert tree(tmp_path) == before, "a file was written"
    return [line.removeprefix("  - ") for line in result.stderr.splitlines() if line.startswith("  - ")]


def one_line(tmp_path: Path, *argv: str, **kwargs) -> str:
    lines = refused(tmp_path, *argv, **kwargs)
    assert len(lines) == 1, "expected one problem line, got:\n" + "\n".join(lines)
    return lines[0]


@pytest.fixture
def validate(tmp_path, capsys, monkeypatch):
    """`inference-host validate PATH` in this process (the subprocess form is slow): exit 2, one
    problem line, nothing written under the test's folder, HOME an empty folder."""
    from validation import main

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()

    def run(path: Path) -> str:
        before = tree(tmp_path)
        assert main([str(path)]) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and tree(tmp_path) == before
        lines = [line.removeprefix("  - ") for line in err.splitlines() if line.startswith("  - ")]
        assert len(lines) == 1, "expected one problem line, got:\n" + "\n".join(lines)
        return lines[0]

    return run


# --- an inventory's own Python error --------------------------------------------------------------


def test_python_error_is_one_line_with_file_and_line(inventory, validate):
    path = inventory.write("gpu_nodes = [('gpu.invalid', {'gpu_count': 8})]\n\nx = undefined_name\n")
    assert validate(path) == f"{path}:3: NameError: name 'undefined_name' is not defined"


@pytest.mark.parametrize(
    "module",
    [["roles.render", "--out", "OUT"], ["checks", "--inventory"], ["checks.gateway"], ["checks.bench", "--inventory"]],
)
def test_every_loader_prints_the_python_error_in_one_line(inventory, tmp_path, module):
    path = inventory.write("gpu_nodes = [('gpu.invalid', {'gpu_count': 8})]\nx = 1 / 0\n")
    argv = [str(tmp_path / "out") if part == "OUT" else part for part in module]
    assert one_line(tmp_path, "-m", *argv, str(path)) == f"{path}:2: ZeroDivisionError: division by zero"


OLD_IMPORT = (
    "from roles.site import require_valid_inventory\n"
    "gpu_nodes = [('gpu.invalid', {'gpu_count': 8})]\nrequire_valid_inventory(__file__, globals())\n"
)
MOVED = (
    "ImportError: require_valid_inventory moved: write `from validation import require_valid_inventory`"
    " (validation.py at the project root)"
)


def test_an_old_inventorys_import_is_refused_in_one_line(inventory, tmp_path, validate):
    path = inventory.write(OLD_IMPORT)
    assert validate(path) == f"{path}:1: {MOVED}"


def test_an_old_inventorys_import_stops_pyinfra_in_one_line(inventory, tmp_path):
    path = inventory.write(OLD_IMPORT)
    pyinfra = str(PROJECT_ROOT / ".venv" / "bin" / "pyinfra")
    assert one_line(tmp_path, pyinfra, "-y", str(path), "deploy.py") == f"{path}:1: {MOVED}"


# --- control characters ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"serving_served_model_name": "kimi\nExecStartPre=/bin/sh -c id"},
            "serving_served_model_name = 'kimi\\nExecStartPre=/bin/sh -c id' has the control character '\\n' at"
            " position 4; expected text without newlines, tabs, NUL or other control characters",
        ),
        (
            {"serving_launch_command": ["/bin/sglang", "a\x00b"]},
            "serving_launch_command = ['/bin/sglang', 'a\\x00b'] has the control character '\\x00' at position 1 of"
            " item 1; expected text without newlines, tabs, NUL or other control characters",
        ),
        (
            {"serving_extra_env": {"A\nB": "1"}},
            "serving_extra_env = {'A\\nB': '1'} has the control character '\\n' at position 1 of the key 'A\\nB';"
            " expected text without newlines, tabs, NUL or other control characters",
        ),
        (
            {"serving_extra_env": {"A": "1\rB=2"}},
            "serving_extra_env = {'A': '1\\rB=2'} has the control character '\\r' at position 1 of ['A'];"
            " expected text without newlines, tabs, NUL or other control characters",
        ),
        (
            {"serving_extra_env": {"A B": "1"}},
            "serving_extra_env = {'A B': '1'} is invalid; expected {NAME: value} with environment variable names"
            " ([A-Za-z_][A-Za-z0-9_]*)",
        ),
    ],
)
def test_control_characters_and_bad_env_names_are_refused(inventory, tmp_path, data, message, validate):
    path = inventory.groups(gpu_nodes=[gpu_node("gpu.invalid", **data)])
    assert validate(path) == f"{path}: host gpu.invalid: {message}"


# --- one host, several entries ----------------------------------------------------------------------


def test_the_same_host_twice_in_a_group(inventory, tmp_path, validate):
    path = inventory.groups(
        gpu_nodes=[gpu_node("ct101.invalid", guest_vmid=101), gpu_node("ct101.invalid", guest_vmid=105)]
    )
    assert validate(path) == (
        f"{path}: host ct101.invalid is listed twice in gpu_nodes (entries 1 and 2); expected each host once per"
        " group, with all its data in that one entry"
    )


def test_one_key_with_two_values_in_two_groups(inventory, tmp_path, validate):
    path = inventory.groups(
        gpu_nodes=[gpu_node("gpu.invalid", serving_port=31000)], builders=[("gpu.invalid", {"serving_port": 32000})]
    )
    assert validate(path) == (
        f"{path}: host gpu.invalid: serving_port = 32000 in builders but 31000 in gpu_nodes; expected one value"
        " (set it in one group only)"
    )


def test_one_key_with_one_value_in_two_groups_is_fine(inventory):
    path = inventory.groups(
        gpu_nodes=[gpu_node("gpu.invalid", serving_port=31000)], builders=[("gpu.invalid", {"serving_port": 31000})]
    )
    assert load_site(path).hosts["gpu.invalid"].serving.port == 31000


# --- PCI addresses ----------------------------------------------------------------------------------


def test_two_spellings_of_one_gpu_are_one_gpu(inventory, tmp_path, validate):
    path = inventory.groups(
        proxmox_hosts=[NODE],
        lxc_guests=[
            lxc("ct1.invalid", guest_gpu_addresses=["01:00.0"]),
            lxc("ct2.invalid", guest_vmid=201, guest_gpu_addresses=["0000:01:00.0"]),
        ],
    )
    assert validate(path) == (
        f"{path}: host ct2.invalid: guest_gpu_addresses has 0000:01:00.0, already given to ct1.invalid;"
        " expected each GPU in at most one guest"
    )


def test_one_gpu_listed_many_times_is_one_line(inventory, tmp_path, validate):
    path = inventory.groups(proxmox_hosts=[NODE], lxc_guests=[lxc("ct.invalid", guest_gpu_addresses=["01:00.0"] * 8)])
    assert validate(path) == (
        f"{path}: host ct.invalid: guest_gpu_addresses = ['01:00.0', '01:00.0', '01:00.0', '01:00.0', '01:00.0',"
        " '01:00.0', '01:00.0', '0… (88 characters as written) is invalid; expected each GPU once (01:00.0 and"
        " 0000:01:00.0 are one GPU); listed: 0000:01:00.0 8 times"
    )


def test_short_addresses_are_stored_with_their_domain(inventory):
    site = load_site(
        inventory.groups(
            proxmox_hosts=[
                ("pve.invalid", {"proxmox_gpu_addresses": ["01:00.0"], "proxmox_iommu_groups": {"01:00.0": 3}})
            ]
        )
    )
    node = site.hosts["pve.invalid"].proxmox
    assert node.gpu_addresses == ["0000:01:00.0"] and node.iommu_groups == {"0000:01:00.0": 3}


# --- IPv6 -------------------------------------------------------------------------------------------


def test_ipv6_is_written_as_proxmox_takes_it():
    # pve-container src/PVE/LXC/Config.pm $netconf_desc: ip6 / gw6; qemu-server $ipconfig_fmt: the same.
    assert pve.lxc_net0("vmbr0", "2001:db8::11/64", "2001:db8::1") == (
        "name=eth0,bridge=vmbr0,gw6=2001:db8::1,ip6=2001:db8::11/64,type=veth"
    )
    assert (
        pve.lxc_net0("vmbr0", "10.0.0.5/24", "10.0.0.1")
        == "name=eth0,bridge=vmbr0,gw=10.0.0.1,ip=10.0.0.5/24,type=veth"
    )
    assert pve.print_property_string(pve.address_keys("2001:db8::11/64", None)) == "ip6=2001:db8::11/64"


def test_ipv6_guest_renders_ip6_in_its_create_command(inventory):
    from roles.lxc_guest import create_command

    site = load_site(
        inventory.groups(
            proxmox_hosts=[NODE],
            lxc_guests=[lxc("ct.invalid", guest_ip="2001:db8::11/64", guest_gateway="2001:db8::1")],
        )
    )
    command = create_command(site.hosts["ct.invalid"], [])
    assert "ip6=2001:db8::11/64" in command and "gw6=2001:db8::1" in command and ",ip=" not in command


def test_a_gateway_of_the_other_family_is_refused(inventory, tmp_path, validate):
    path = inventory.groups(
        proxmox_hosts=[NODE], lxc_guests=[lxc("ct.invalid", guest_ip="2001:db8::11/64", guest_gateway="10.0.0.1")]
    )
    assert validate(path) == (
        f"{path}: host ct.invalid: guest_gateway = '10.0.0.1' is IPv4 but guest_ip = '2001:db8::11/64' is IPv6;"
        " expected a gateway of the same family (Proxmox writes ip/gw and ip6/gw6 as pairs)"
    )


# --- the inventory as a whole -----------------------------------------------------------------------


def test_an_empty_inventory_is_refused(inventory, tmp_path, validate):
    path = inventory.write("# nothing yet\n")
    assert validate(path) == (
        f"{path}: no host in the inventory; expected at least one host in one of the groups proxmox_hosts,"
        " lxc_guests, kvm_guests, gpu_nodes, builders, gateways, monitors (a list named after the group)"
    )


def test_an_unknown_stack_is_named_with_the_choices(inventory, tmp_path, validate):
    path = inventory.groups(gpu_nodes=[gpu_node("gpu.invalid", stack="sglang-0.5.11-cu128")])
    assert validate(path) == (
        f"{path}: stack = 'sglang-0.5.11-cu128' is not a stack of {inventory.dir / 'stack.yml'}; did you mean"
        " sglang-0.5.10-cu128?; expected one of: sglang-0.5.9-cu128, sglang-0.5.10-cu128, sglang-0.5.23-cu130,"
        " vllm-0.16.0-cu128"
    )


def test_the_stack_setting_picks_another_stack_of_the_same_file(inventory):
    site = load_site(inventory.groups(gpu_nodes=[gpu_node("gpu.invalid", stack="sglang-0.5.10-cu128")]))
    assert site.stack.active.id == "sglang-0.5.10-cu128" and site.stack.active.sglang == "0.5.10"
    # (another file name: pyinfra caches an inventory's code by its file name)
    default = load_site(inventory.groups("default.py", gpu_nodes=[gpu_node("gpu.invalid")]))
    assert default.stack.active.id == "sglang-0.5.9-cu128"


@pytest.mark.parametrize("edit", ["version", "hash"])
def test_a_hand_edited_lock_body_is_refused(inventory, tmp_path, edit, validate):
    lock = inventory.dir / "locks" / "sglang-0.5.9-cu128.txt"
    text = lock.read_text()
    old = "aiohappyeyeballs==" if edit == "version" else "--hash=sha256:0"
    new = "aiohappyeyeballs==9" if edit == "version" else "--hash=sha256:1"
    lock.write_text(text.replace(old, new, 1))
    path = inventory.groups(gpu_nodes=[gpu_node("gpu.invalid")])
    stack = inventory.dir / "stack.yml"
    assert validate(path) == (
        f"{stack}: stacks.sglang-0.5.9-cu128: locks/sglang-0.5.9-cu128.txt: it was edited after its lock command"
        " wrote it (the lock-sha256 seal no longer matches); re-lock with `uv run python -m roles.engine_envs.lock"
        f" {stack} sglang-0.5.9-cu128` and commit the new lock"
    )


def test_every_committed_lock_is_sealed():
    locks = [
        *(PROJECT_ROOT / "inventory" / "locks").glob("*.txt"),
        *(PROJECT_ROOT / "roles" / "eagle3_training" / "files").glob("*.lock.txt"),
        *(PROJECT_ROOT / "tests" / "lab" / "inventories" / "locks").glob("*.txt"),
    ]
    assert len(locks) >= 8
    assert {lock.name: site_lock.tampered(lock.read_text()) for lock in locks} == {lock.name: None for lock in locks}


def test_a_long_value_is_cut_in_the_message(inventory, tmp_path):
    path = inventory.groups(
        gpu_nodes=[gpu_node("gpu.invalid", serving_served_model_name="x" * 200_000, gpu_arch="y" * 200_000)]
    )
    lines = refused(tmp_path, "-m", "validation", str(path))
    assert lines == [
        f"{path}: host gpu.invalid: serving_served_model_name = '{'x' * 79}… (200000 characters) is longer than"
        " any host takes; expected at most 4096 characters (PATH_MAX)",
        f"{path}: host gpu.invalid: gpu_arch = '{'y' * 79}… (200000 characters) is longer than any host takes;"
        " expected at most 4096 characters (PATH_MAX)",
    ]


# --- how hosts are reached: ssh_* ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"ssh_port": "twenty-two"}, "ssh_port = 'twenty-two' is invalid; expected an integer or None (1 to 65535)"),
        ({"ssh_port": 70000}, "ssh_port = 70000 is invalid; expected 1 to 65535"),
        (
            {"ssh_key": "~/.ssh/missing_key"},
            "ssh_key = '~/.ssh/missing_key' is invalid; expected an existing private key file on this machine",
        ),
        (
            {"ssh_user": "root admin"},
            "ssh_user = 'root admin' is invalid; expected a user name (letters, digits, _ . @ -)",
        ),
        ({"ssh_hostname": "10.0.0.1 "}, "ssh_hostname = '10.0.0.1 ' is invalid; expected a DNS name or an IP address"),
    ],
)
def test_connection_settings_are_checked(inventory, tmp_path, data, message, validate):
    path = inventory.groups(gpu_nodes=[gpu_node("gpu.invalid", **data)])
    assert validate(path) == f"{path}: host gpu.invalid: {message}"


def test_connection_settings_are_typed(inventory, tmp_path):
    key = tmp_path / "id_ed25519"
    key.write_text("not checked beyond existing and its mode\n")
    key.chmod(0o600)  # only its owner reads it (a key open to others is refused: test_validation_rules.py)
    site = load_site(
        inventory.groups(
            gpu_nodes=[
                gpu_node("gpu.invalid", ssh_port=2222, ssh_key=str(key), ssh_user="root", ssh_hostname="2001:db8::5")
            ]
        )
    )
    host = site.hosts["gpu.invalid"]
    assert (host.ssh.port, host.ssh.key, host.ssh.user, host.ssh_hostname) == (2222, str(key), "root", "2001:db8::5")


# --- the commands' own paths and flags ------------------------------------------------------------------


def test_health_report_path_is_checked_before_connecting(tmp_path, short_tmp):
    blocker = short_tmp / "a-file"
    blocker.write_text("")
    assert one_line(
        tmp_path, "-m", "checks", "--inventory", "inventory/prod.py", "--report", str(blocker / "x.json")
    ) == (f"--report '{blocker / 'x.json'}': '{blocker}' is a file; expected a file path in an existing folder")
    assert one_line(
        tmp_path, "-m", "checks", "--inventory", "inventory/prod.py", "--report", str(short_tmp / "missing" / "x.json")
    ) == (
        f"--report '{short_tmp / 'missing' / 'x.json'}': '{short_tmp / 'missing'}' is missing; expected a file path"
        " in an existing folder"
    )


def test_render_out_must_be_a_folder(tmp_path, short_tmp):
    out = short_tmp / "a-file"
    out.write_text("")
    assert one_line(tmp_path, "-m", "roles.render", "inventory/prod.py", "--out", str(out)) == (
        f"--out '{out}' is a file; expected a folder (new or existing)"
    )


def test_vault_commands_refuse_in_one_line_without_a_warning(tmp_path):
    folder = tmp_path / "folder"
    folder.mkdir()
    result = refused(tmp_path, "-m", "roles.site.vault", "list", str(folder))
    assert result == []  # the vault command's own one-line form: FILE: problem
    out = subprocess.run(
        [sys.executable, "-m", "roles.site.vault", "list", str(folder)],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.stderr == f"{folder}: is a folder; expected the secrets file (YAML)\n"
    out = subprocess.run(
        [sys.executable, "-m", "roles.site.vault", "set", str(tmp_path / "v.yml"), "bad name"],
        cwd=PROJECT_ROOT,
        input="value\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (out.returncode, out.stderr) == (
        2,
        f"{tmp_path / 'v.yml'}: secret name 'bad name' is invalid; expected"
        " letters, digits and _ (the name an inventory's *_secret setting"
        " refers to)\n",
    )
    assert not (tmp_path / "v.yml").exists()


def test_bench_names_the_unknown_host_before_its_chart_library(tmp_path):
    # matplotlib missing (the bench extra not installed): the host is still what is named.
    code = (
        "import sys; sys.modules['matplotlib'] = None; from checks.bench import main;"
        " raise SystemExit(main(['--inventory', 'inventory/prod.py', '--host', 'ghost']))"
    )
    assert one_line(tmp_path, "-c", code) == (
        "inventory/prod.py: no host 'ghost'; expected one of: pve.example.internal, gpu-lxc.example.internal,"
        " gpu-vm.example.internal"
    )


def test_gateway_check_without_gateways_says_so(tmp_path):
    assert one_line(tmp_path, "-m", "checks.gateway", "inventory/prod.py") == (
        "inventory/prod.py: the gateways group is empty; nothing to check (add the gateway hosts to `gateways`,"
        " or check a gpu node with python -m checks)"
    )


def test_a_control_character_in_a_host_name_is_refused(inventory, validate):
    path = inventory.groups(gpu_nodes=[gpu_node("gpu\n.invalid")])
    assert validate(path) == (
        f"{path}: host 'gpu\\n.invalid': the host name has the control character '\\n' at"
        " position 3; expected text without newlines, tabs, NUL or other control characters"
    )


def test_gateway_lock_checks_its_stack_file_before_asking_the_index(tmp_path):
    # A missing stack file is named before uv asks any index (no fake uv needed: it never runs).
    missing = tmp_path / "missing.yml"
    result = subprocess.run(
        [sys.executable, "-m", "roles.gateway.lock", str(missing), "1.13.0"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "UV_INDEX_URL": "http://0.0.0.0:9/"},
    )
    assert (result.returncode, result.stderr) == (
        2,
        f"{missing}: no such stack file; expected the stack file the lock goes beside, e.g. inventory/stack.yml\n",
    )
    assert not (tmp_path / "locks").exists()


def test_a_deploy_refuses_a_host_listed_twice_before_connecting(inventory, tmp_path):
    # Under pyinfra's CLI the groups come from the file's own globals (validation.py): the same check.
    path = inventory.write(
        "from validation import require_valid_inventory\n"
        "gpu_nodes = [('@docker/ih-unit-never-started', {'gpu_count': 8}),"
        " ('@docker/ih-unit-never-started', {'gpu_count': 8})]\n"
        "require_valid_inventory(__file__, globals())\n"
    )
    pyinfra = str(PROJECT_ROOT / ".venv" / "bin" / "pyinfra")
    assert one_line(tmp_path, pyinfra, "-y", str(path), "deploy.py") == (
        f"{path}: host @docker/ih-unit-never-started is listed twice in gpu_nodes (entries 1 and 2); expected each"
        " host once per group, with all its data in that one entry"
    )


@pytest.mark.parametrize(
    ("source", "message"),
    [
        (
            "gpu_nodes = [('@docker/ih-unit-never-started', {'gpu_count': 8})]\nx = undefined_name\n",
            "{path}:2: NameError: name 'undefined_name' is not defined",
        ),
        (
            "gpu_nodes = [('@docker/ih-unit-never-started', {'gpu_count': 8})\n",
            "{path}:1: SyntaxError: '[' was never closed",
        ),
    ],
)
def test_a_deploy_prints_an_inventorys_python_error_in_one_line(inventory, tmp_path, source, message):
    # config.py (pyinfra runs it before the inventory) turns pyinfra's traceback into the one line.
    path = inventory.write(source)
    pyinfra = str(PROJECT_ROOT / ".venv" / "bin" / "pyinfra")
    assert one_line(tmp_path, pyinfra, "-y", str(path), "deploy.py") == message.format(path=path)
