"""Issue 44, the site model's side: values a careless operator writes that would reach a root
shell, a system folder, a system unit, another listener's port or a world-readable file, each
refused in one line naming the file, the host and the setting, with the value escaped (or read
back as one unchanged word by the consumer's own parser). Each case failed on the code before."""

from __future__ import annotations

import datetime
import json
import shutil
import subprocess
import sys
import time

import pytest

from roles.shared import templates
from roles.site import SiteError, load_site, vault
from roles.site.credentials import found_credentials
from roles.site.fields import pci_address
from tests.unit.conftest import PASSWORD, PROJECT_ROOT, gpu_node
from tests.unit.test_refusals import NODE, lxc
from tests.unit.test_validation_rules import validate  # noqa: F401 (a fixture)

# --- A. host paths, folders, package names, sysctl keys, IPv6 zones ------------------------------------

PATH_TEXT = "an absolute path without shell syntax ($ ` ; | & < > ( ) \\ quotes * ? [ ] { } ! # ~)"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"base_uv_dir": "/opt/uv|tools"}, f"base_uv_dir = '/opt/uv|tools' is invalid; expected {PATH_TEXT}; '|'"),
        (
            {"base_install_root": "/opt/ih$(touch /tmp/x)"},
            f"base_install_root = '/opt/ih$(touch /tmp/x)' is invalid; expected {PATH_TEXT}; '$' at position 7",
        ),
        ({"build_wheelhouse_dir": "/srv/a;b"}, f"build_wheelhouse_dir = '/srv/a;b' is invalid; expected {PATH_TEXT}"),
        ({"base_data_dir": "/"}, "base_data_dir = '/' is invalid; expected a folder of its own, not / (the whole"),
        ({"serving_model_path": "/"}, "serving_model_path = '/' is invalid; expected a folder of its own, not /"),
        ({"base_log_dir": "/var/log"}, "base_log_dir = '/var/log' is invalid; expected a folder of its own, not the"),
        ({"base_log_dir": "/var//log/"}, "base_log_dir = '/var//log/' is invalid; expected a folder of its own, not"),
        (
            {"base_data_dir": "/etc"},
            "base_data_dir = '/etc' is invalid; expected a folder of its own, not the system's",
        ),
        ({"base_model_dir": "/proc/models"}, "base_model_dir = '/proc/models' is invalid; expected a folder on a disk"),
        (
            {"base_extra_packages": ["-oDpkg::Pre-Invoke::=touch /tmp/x"]},
            "base_extra_packages = ['-oDpkg::Pre-Invoke::=touch /tmp/x'] is invalid; expected Debian package names",
        ),
        (
            {"base_sysctl": {"vm.swappiness=100 #": "1"}},
            "base_sysctl = {'vm.swappiness=100 #': '1'} is invalid; expected sysctl.d(5) settings",
        ),
        ({"base_sysctl": {"-kernel.panic": "1"}}, "base_sysctl = {'-kernel.panic': '1'} is invalid; expected sysctl"),
        ({"base_sysctl": {"kernel.panic": " 1"}}, "base_sysctl = {'kernel.panic': ' 1'} is invalid; expected sysctl"),
        (
            {"gateway_host": "fe80::1%$(reboot)"},
            "gateway_host = 'fe80::1%$(reboot)' is invalid; expected an IP address to bind",
        ),
        (
            {"ssh_hostname": "fe80::1%eth0;reboot"},
            "ssh_hostname = 'fe80::1%eth0;reboot' is invalid; expected a DNS name or an IP address",
        ),
    ],
)
def test_a_path_package_sysctl_or_zone_no_consumer_reads_as_written_is_refused(inventory, validate, data, message):  # noqa: F811
    path = inventory.groups(gpu_nodes=[gpu_node("gpu.invalid", **data)])
    line = validate(path)
    assert line.startswith(f"{path}: host gpu.invalid: {message}"), line


def test_valid_paths_packages_sysctl_and_zones_pass(inventory):
    data = {
        "base_uv_dir": "/opt/uv tools",  # a space: quoted for the shell, for systemd (issue 38)
        "base_install_root": "/srv/inference-host",
        "base_extra_packages": ["nvtop", "libfoo1=1:2.3-1ubuntu1", "g++"],
        "base_sysctl": {"kernel.numa_balancing": "0", "net.ipv4.conf.all.rp_filter": "2", "net/core/somaxconn": "4096"},
        "ssh_hostname": "fe80::1%eth0",
    }
    host = load_site(inventory.groups(gpu_nodes=[gpu_node("gpu1", **data)])).hosts["gpu1"]
    assert host.base.extra_packages == data["base_extra_packages"] and host.ssh_hostname == "fe80::1%eth0"


@pytest.mark.skipif(shutil.which("sysctl") is None, reason="procps' sysctl is not installed here")
def test_the_sysctl_file_reads_back_unchanged_with_sysctl_itself(tmp_path):
    """The file roles/base writes, read by procps' `sysctl -p` (the deploy applies it so;
    systemd-sysctl reads the same grammar at boot), in --dry-run: nothing is written. Keys this
    machine's kernel has; values with the characters a value may hold ('#', '=', spaces inside)."""
    wanted = {"kernel.numa_balancing": "0", "vm.swappiness": "100 # not a comment", "kernel.core_pattern": "a=b c"}
    conf = tmp_path / "90-inference-host-sysctl.conf"
    conf.write_text(templates.render("roles/base/templates/90-inference-host-sysctl.conf.j2", sysctl=wanted))
    result = subprocess.run(["sysctl", "--dry-run", "-p", str(conf)], capture_output=True, text=True, timeout=30)
    read = dict(line.split(" = ", 1) for line in result.stdout.splitlines())
    assert read == wanted, result.stderr


def sysctl_d_read(text: str) -> list[tuple[str, str, bool]]:
    """(key, value, ignore failure) of each line, as systemd-sysctl reads a sysctl.d file
    (src/sysctl/sysctl.c parse_file, systemd 252: the line stripped; empty lines and lines
    beginning with '#' or ';' skipped; the key before the first '=', the value after it, both
    stripped; a key beginning with '-' is set with failures ignored, the '-' dropped)."""
    read = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        key, equals, value = line.partition("=")
        assert equals, f"not an assignment: {line!r}"
        key, value = key.strip(), value.strip()
        read.append((key.removeprefix("-"), value, key.startswith("-")))
    return read


def test_a_sysctl_key_is_refused_or_read_back_unchanged():
    """Seeded hostile keys and values: each pair is refused by the rule, or the file roles/base
    renders from it reads back as exactly that key and value, with no failure flag."""
    import random

    from roles.site.grammars import sysctl_problem

    rng = random.Random(44)
    alphabet = "abz09_.*/-=#; \t\u00a0%$'\"x"
    accepted = 0
    for _ in range(3000):
        key = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12)))
        value = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 8)))
        if sysctl_problem(key, value):
            continue
        accepted += 1
        text = templates.render("roles/base/templates/90-inference-host-sysctl.conf.j2", sysctl={key: value})
        assert sysctl_d_read(text) == [(key, value, False)], (key, value)
    assert accepted > 100  # the rule is not refusing everything


def test_an_ipv6_guest_address_with_a_zone_and_a_comma_is_one_line(inventory, validate):  # noqa: F811
    path = inventory.groups(proxmox_hosts=[NODE], lxc_guests=[lxc("ct.invalid", guest_ip="fe80::1%eth0,x/64")])
    assert validate(path) == (
        f"{path}: host ct.invalid: guest_ip = 'fe80::1%eth0,x/64' is invalid; expected 'dhcp', 'manual',"
        " an IPv4/CIDR or an IPv6/CIDR"
    )


def test_folders_that_mix_owners_are_refused(inventory, validate):  # noqa: F811
    path = inventory.groups(gpu_nodes=[gpu_node("gpu.invalid", base_data_dir="/var/log/inference-engine/data")])
    assert validate(path) == (
        f"{path}: host gpu.invalid: base_data_dir = '/var/log/inference-engine/data' is inside base_log_dir ="
        " '/var/log/inference-engine': base_data_dir and base_log_dir are for different things (data, logs,"
        " models); expected it elsewhere"
    )
    path = inventory.groups("b.py", gpu_nodes=[gpu_node("gpu.invalid", base_uv_dir="/models/uv")])
    assert "the service account owns base_model_dir and could replace a folder of root inside it" in validate(path)
    path = inventory.groups("c.py", gpu_nodes=[gpu_node("gpu.invalid", base_uv_dir="/opt/inference-host")])
    assert "base_uv_dir = '/opt/inference-host' is base_install_root too" in validate(path)


# --- B. credentials only from the vault -----------------------------------------------------------------

GITHUB = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
SHAPES = {
    "GitHub Token": GITHUB,
    "github_pat_": "github_pat_" + "11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz",
    "GitLab Token": "glpat-" + "abcdefghij0123456789",
    "Slack Token": "xoxb-" + "123456789012-abcdefghijkl",
    "AWS Access Key": "AKIA" + "IOSFODNN7EXAMPLE",
    "Google API Key": "AIza" + "SyA1234567890abcdefghijklmnopqrstuv",
    "JSON Web Token": "eyJhbGciOiJIUzI1NiJ9" + ".eyJzdWIiOiIxMjM0In0.c2lnbmF0dXJl",
    "Private Key": "-----BEGIN " + "PRIVATE KEY-----",
    "URL with a password": "https://user:" + "s3cr3tpass@mirror.example/simple",
    "URL with a token as its user part": "https://" + "abcdef0123456789abcdef@git.example/x",
}


@pytest.mark.parametrize("shape", SHAPES)
def test_a_credential_in_any_plain_setting_is_refused_without_printing_it(inventory, validate, shape):  # noqa: F811
    value = SHAPES[shape]
    path = inventory.groups(gpu_nodes=[gpu_node("gpu.invalid", serving_served_model_name=value)])
    line = validate(path)
    secret_part = value.split("//")[-1].split("@")[0][-10:]
    assert secret_part not in line
    assert line.startswith(
        f"{path}: host gpu.invalid: serving_served_model_name holds what looks like a credential ("
    ) and line.endswith(
        "expected it in the vault: inference-host vault set FILE NAME (value on stdin), named by a *_secret setting"
    )


@pytest.mark.parametrize(
    ("key", "value", "kind", "setting"),
    [
        (
            "cuda_repo_url",
            "https://user:" + "p4ssw0rd@cuda.example/repos",
            "Basic Auth Credentials",
            "cuda_repo_credentials_secret",
        ),
        (
            "base_pypi_index_url",
            "https://" + "tok0123456789abcdefXYZ@pypi.example/simple",
            "URL with a token",
            "base_pypi_index_credentials_secret",
        ),
    ],
)
def test_a_mirror_url_with_a_credential_is_refused(inventory, validate, key, value, kind, setting):  # noqa: F811
    path = inventory.groups(gpu_nodes=[gpu_node("gpu.invalid", **{key: value})])
    line = validate(path)
    assert "p4ssw0rd" not in line and "tok0123456789abcdef" not in line
    assert line.startswith(f"{path}: host gpu.invalid: {key} holds what looks like a credential ({kind}")
    assert line.endswith(
        f"expected {key} without its user part, and the credential as login:password in the vault:"
        f" inference-host vault set FILE NAME (value on stdin), named by {setting}"
    )


@pytest.mark.parametrize("key", ["base_python_install_mirror", "docker_repo_url", "weights_endpoint"])
def test_a_url_no_vault_key_takes_is_refused_saying_so(inventory, validate, key):  # noqa: F811
    path = inventory.groups(gpu_nodes=[gpu_node("gpu.invalid", **{key: "https://user:" + "p4ssw0rd@mirror.example/x"})])
    line = validate(path)
    assert "p4ssw0rd" not in line and line.startswith(f"{path}: host gpu.invalid: {key} holds what looks like")
    assert line.endswith(
        f"expected {key} without a credential (no vault key takes one for this URL: use a mirror that trusts"
        " the host's address)"
    )


@pytest.mark.parametrize("key", ["cuda_repo_url", "base_pypi_index_url"])
def test_a_mirror_url_with_any_user_part_is_refused(inventory, validate, key):  # noqa: F811
    """A user name alone is no credential shape, but apt ignores auth.conf for a URL that has one,
    and the URL is written in clear: the login belongs to the vault as well."""
    path = inventory.groups(gpu_nodes=[gpu_node("gpu.invalid", **{key: "https://bob@mirror.example/repos"})])
    assert validate(path) == (
        f"{path}: host gpu.invalid: {key} = 'https://bob@mirror.example/repos' is invalid; expected an http(s) URL"
        " without a user part or trailing spaces (a credential goes in the vault)"
    )


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"cuda_repo_url": "http://mirror.example/cuda", "cuda_repo_credentials_secret": "login"},
            "cuda_repo_credentials_secret = 'login' with cuda_repo_url = 'http://mirror.example/cuda', plain http,"
            " which would send the credential in clear; expected an https:// cuda_repo_url",
        ),
        (
            {"base_pypi_index_credentials_secret": "login"},
            "base_pypi_index_credentials_secret = 'login' without base_pypi_index_url; expected"
            " base_pypi_index_url, the mirror it logs in to",
        ),
        (
            {"base_pypi_index_url": "https://pypi.example/simple", "base_pypi_index_credentials_secret": "nope"},
            "base_pypi_index_credentials_secret = 'nope' names no secret in {vault}; expected one of: login",
        ),
    ],
)
def test_a_mirror_login_needs_its_vault_key_and_an_https_mirror(inventory, validate, data, message):  # noqa: F811
    secrets = inventory.vault(login="mirror-user:pw")
    path = inventory.groups(gpu_nodes=[gpu_node("gpu.invalid", secrets_file=secrets, **data)])
    assert validate(path) == f"{path}: host gpu.invalid: " + message.format(vault=inventory.dir / secrets)


@pytest.mark.parametrize(
    "data",
    [
        {
            "monitoring_webhook_url": "https://hooks.slack.com/services/"
            + "T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX"
        },
        {"serving_extra_env": {"AWS_ACCESS_KEY_ID": "AKIA" + "IOSFODNN7EXAMPLE"}},
    ],
)
def test_credentials_in_urls_and_the_environment_are_refused(inventory, validate, data):  # noqa: F811
    path = inventory.groups(gpu_nodes=[gpu_node("gpu.invalid", **data)])
    line = validate(path)
    assert "looks like a credential" in line and "p4ssw0rd" not in line and "IOSFODNN7" not in line


def test_the_credential_rule_takes_linear_time_on_a_long_value():
    started = time.monotonic()
    assert found_credentials("eyJ" * 60_000) == []
    assert found_credentials("x" * 100_000 + GITHUB)[0][0] == "GitHub Token"
    assert time.monotonic() - started < 10


def test_the_checks_expectations_file_has_no_extra_env_value(inventory):
    from roles.monitoring import checks_env

    env = {"TMPDIR": "/var/lib/inference-engine/tmp-value-marker"}
    site = load_site(inventory.groups(gpu_nodes=[gpu_node(serving_extra_env=env)]))
    text = json.dumps(checks_env.expectations(site.hosts["gpu1"], site), default=str)
    assert "tmp-value-marker" not in text and "serving_extra_env" not in text
    assert "serving_model_path" in text  # the rest is still there


def _certificate_and_key():
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "unit-test CA")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    pem_key = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return cert.public_bytes(serialization.Encoding.PEM), pem_key


def test_a_ca_file_must_be_certificates_only(inventory, validate, tmp_path):  # noqa: F811
    cert, key = _certificate_and_key()
    good, with_key, junk = tmp_path / "ca.pem", tmp_path / "ca-and-key.pem", tmp_path / "notes.pem"
    good.write_bytes(cert)
    with_key.write_bytes(cert + key)
    junk.write_text("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
    site = load_site(inventory.groups(gpu_nodes=[gpu_node("gpu1", base_extra_ca_certificates=[str(good)])]))
    assert site.hosts["gpu1"].base.extra_ca_certificates == [str(good)]
    path = inventory.groups("b.py", gpu_nodes=[gpu_node("gpu.invalid", base_extra_ca_certificates=[str(with_key)])])
    assert "holds a private key, which must never be uploaded (0644)" in validate(path)
    path = inventory.groups("c.py", gpu_nodes=[gpu_node("gpu.invalid", base_extra_ca_certificates=[str(junk)])])
    assert "is not PEM X.509 certificates" in validate(path)


# --- C. names and ports that cannot take over the host ---------------------------------------------------


@pytest.mark.parametrize("name", ["ssh", "sshd", "systemd-journald", "dbus", "cron", "getty@tty1", "pveproxy"])
def test_a_unit_named_like_the_systems_is_refused(inventory, validate, name):  # noqa: F811
    path = inventory.groups(gpu_nodes=[gpu_node("gpu.invalid", serving_unit_name=name)])
    line = validate(path)
    assert line.startswith(f"{path}: host gpu.invalid: serving_unit_name = '{name}' is invalid; expected a systemd")
    assert line.endswith("is a unit of the system or of this project, which the deploy would replace")


def test_a_gateway_unit_named_like_the_engines_is_refused(inventory):
    data = {
        "serving_unit_name": "inference-engine",
        "gateway_unit_name": "inference-engine",
        "serving_host": "10.0.0.5",
    }
    path = inventory.groups(gpu_nodes=[gpu_node("gpu.invalid", **data)], gateways=["gpu.invalid"])
    with pytest.raises(SiteError) as raised:  # the API key the gateway needs is named by lines of its own
        load_site(path)
    assert (
        f"{path}: host gpu.invalid: gateway_unit_name = 'inference-engine' is serving_unit_name too on this host;"
        " expected a unit name of its own (one would overwrite the other's unit file)"
    ) in raised.value.problems


def test_a_node_and_its_guest_on_one_ssh_hostname_are_refused(inventory, validate):  # noqa: F811
    node = ("pve.invalid", {**NODE[1], "ssh_hostname": "10.0.0.2"})
    path = inventory.groups(proxmox_hosts=[node], lxc_guests=[lxc("ct.invalid", ssh_hostname="10.0.0.2")])
    assert validate(path) == (
        f"{path}: host ct.invalid: ssh_hostname = '10.0.0.2' is pve.invalid's address too; expected each host"
        " of the inventory at an address of its own"
    )


def test_a_guest_named_like_its_nodes_address_is_refused(inventory, validate):  # noqa: F811
    node = ("pve.invalid", {**NODE[1], "ssh_hostname": "10.0.0.2"})
    path = inventory.groups(proxmox_hosts=[node], lxc_guests=[lxc("10.0.0.2")])
    assert validate(path) == (
        f"{path}: host 10.0.0.2: ssh_hostname = '10.0.0.2' is pve.invalid's address too; expected each host"
        " of the inventory at an address of its own (no ssh_hostname: pyinfra connects to the host's name)"
    )


def test_prometheus_on_node_exporters_port_of_its_own_host_is_refused(inventory):
    data = {"monitoring_prometheus_port": 9100, "serving_host": "10.0.0.5"}
    path = inventory.groups(gpu_nodes=[gpu_node("gpu.invalid", **data)], monitors=["gpu.invalid"])
    with pytest.raises(SiteError) as raised:  # the monitor's receiver and pins add lines of their own
        load_site(path)
    assert (
        f"{path}: host gpu.invalid: monitoring_prometheus_port = 9100 is monitoring_node_exporter_port too on this"
        " host; expected two different ports (one listener per port)"
    ) in raised.value.problems


def test_pci_addresses_are_one_spelling(inventory, validate):  # noqa: F811
    assert pci_address("00000:01:00.0") == "0000:01:00.0" == pci_address("01:00.0") == pci_address("0000:01:00.0")
    assert pci_address("0000:0A:00.0") == "0000:0a:00.0"
    guests = [lxc("ct1.invalid", guest_gpu_addresses=["0000:01:00.0"])]
    guests.append(("ct2.invalid", {**lxc("x", guest_gpu_addresses=["00000:01:00.0"])[1], "guest_vmid": 201}))
    path = inventory.groups(proxmox_hosts=[NODE], lxc_guests=guests)
    assert validate(path) == (
        f"{path}: host ct2.invalid: guest_gpu_addresses has 0000:01:00.0, already given to ct1.invalid;"
        " expected each GPU in at most one guest"
    )


def test_the_command_line_runs_the_role_checks_without_the_files_call(inventory, tmp_path):
    """The throwaway inventories do not call require_valid_inventory: the role check (the
    speculative settings' own, roles/serving/speculative.py) still runs."""
    spec = {"draft_model_path": "/models/drafter", "algorithm": "EAGLE3"}
    path = inventory.groups(gpu_nodes=[gpu_node("gpu.invalid", serving_speculative=spec)])
    result = subprocess.run(
        [sys.executable, "-m", "validation", str(path)], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2 and "draft_config and target_config missing" in result.stderr


# --- D. refused badly before: now one line each -------------------------------------------------------------


def test_a_stack_file_that_is_a_folder_is_one_line(inventory, validate):  # noqa: F811
    (inventory.dir / "stacks").mkdir()
    path = inventory.groups(gpu_nodes=[gpu_node("gpu.invalid", stack_file="stacks")])
    assert validate(path) == (
        f"{path}: host gpu.invalid: stack_file = 'stacks' is a folder ({inventory.dir / 'stacks'}); expected the"
        " stack file (YAML), relative to the inventory, like 'stack.yml'"
    )


def test_nested_yaml_aliases_are_refused_at_once(inventory, validate):  # noqa: F811
    laughs = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for level, previous in zip("bcdefghi", "abcdefgh", strict=True):
        laughs.append(f"{level}: &{level} [{','.join(['*' + previous] * 9)}]")
    (inventory.dir / "laughs.yml").write_text("\n".join(laughs) + "\n")
    path = inventory.groups(gpu_nodes=[gpu_node("gpu.invalid", stack_file="laughs.yml")])
    started = time.monotonic()
    line = validate(path)
    assert time.monotonic() - started < 20
    assert line == (
        f"{inventory.dir / 'laughs.yml'}: line 2, column 8: an alias (*a) is not allowed; expected every value"
        " written out (nested aliases expand a file of a few lines into billions of values)"
    )


def test_host_data_with_an_integer_key_is_one_line(inventory, validate):  # noqa: F811
    path = inventory.write("gpu_nodes = [('gpu.invalid', {'gpu_count': 8, 5: 'x'})]\n")
    assert validate(path) == (
        f"{path}: host gpu.invalid: the key 5 (= 'x') is not a string but a int; expected setting names as"
        " strings, like 'serving_port'"
    )


def test_a_key_with_a_trailing_space_is_shown_with_it(inventory, validate):  # noqa: F811
    path = inventory.groups(gpu_nodes=[gpu_node("gpu.invalid", **{"serving_port ": 8080})])
    assert validate(path) == (
        f"{path}: host gpu.invalid: unknown key 'serving_port ' = 8080; did you mean serving_port? (valid keys"
        " are listed in docs/settings.md)"
    )


def test_a_look_alike_letter_is_shown_escaped(inventory, validate):  # noqa: F811
    path = inventory.groups(gpu_nodes=[gpu_node("gpu.invalid", **{"serving_p\u043ert": 8080})])  # Cyrillic o
    line = validate(path)
    assert "\u043e" not in line and "unknown key 'serving_p\\u043ert' = 8080" in line
    path = inventory.groups("b.py", gpu_nodes=[gpu_node("gpu.invalid", gpu_arch="sm12\u043e")])
    line = validate(path)
    assert "\u043e" not in line and line.startswith(f"{path}: host gpu.invalid: gpu_arch = 'sm12\\u043e' is invalid")


def test_a_vault_value_cut_mid_way_is_not_blamed_on_the_password(inventory):
    name = inventory.vault(api_key="k" * 40, hf_token="t" * 40)
    path = inventory.dir / name
    entries = vault.stored(path)
    entries["hf_token"] = vault._Encrypted(entries["hf_token"][: len(entries["hf_token"]) // 2])
    vault._write(path, entries)
    with pytest.raises(vault.SecretsError) as raised:
        vault.decrypt_all(path, password=PASSWORD)
    message = str(raised.value)
    assert "secret 'hf_token' is damaged in the file" in message and "password" not in message.split(":")[1]
    assert "\n" not in message


# --- H. more cases (the hostile tester's round: each was called valid before) -------------------------


@pytest.mark.parametrize(
    ("data", "message"),
    [
        # The node's / or /etc bind-mounted into a guest (as root in a privileged container).
        ({"guest_mount_points": {"/": "/models"}}, "the host path '/' is not one: expected a folder of its own, not /"),
        ({"guest_mount_points": {"/etc": "/models"}}, "the host path '/etc' is not one: expected a folder of its own"),
        ({"guest_mount_points": {"/dev": "/models"}}, "the host path '/dev' is not one: expected a folder of its own"),
        # A mount over the guest's own / or /etc.
        ({"guest_mount_points": {"/tank/models": "/"}}, "the path in the guest '/' is not one: expected a folder"),
        ({"guest_mount_points": {"/tank/models": "/etc/"}}, "the path in the guest '/etc/' is not one: expected a"),
        # Two mount points at one path in the guest (pct refuses it at create time).
        (
            {"guest_mount_points": {"/tank/a": "/models", "/tank/b": "/models/"}},
            "the path in the guest '/models/' is where '/tank/a' is mounted too",
        ),
    ],
)
def test_h_a_mount_point_of_a_system_folder_or_twice_at_one_path_is_refused(inventory, validate, data, message):  # noqa: F811
    path = inventory.groups(proxmox_hosts=[NODE], lxc_guests=[lxc("ct.invalid", **data)])
    line = validate(path)
    assert line.startswith(f"{path}: host ct.invalid: guest_mount_points = "), line
    assert message in line, line


ACCOUNT = "an unprivileged lower-case Unix user or group name ([a-z_][a-z0-9_-]*) of the deploy's own"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        # An account or group of the system's: the engine would share its files and powers.
        ({"base_service_user": "daemon"}, f"base_service_user = 'daemon' is invalid; expected {ACCOUNT}"),
        ({"base_service_user": "sshd"}, "sshd is an account of the system"),
        ({"base_service_user": "systemd-network"}, "systemd-network is an account of the system"),
        ({"base_service_group": "root"}, f"base_service_group = 'root' is invalid; expected {ACCOUNT}"),
        ({"base_service_group": "docker"}, "docker is a group of the system"),  # the Docker API is root
        ({"base_service_group": "disk"}, "disk is a group of the system"),  # raw disks
        ({"base_service_group": "shadow"}, "shadow is a group of the system"),  # /etc/shadow
        ({"base_service_group": "sudo"}, "sudo is a group of the system"),
        # daemon.json keys that hand root to whoever reaches the API.
        ({"docker_daemon_extra": {"hosts": ["tcp://0.0.0.0:2375"]}}, "docker_daemon_extra = {'hosts': ['tcp://0.0"),
        ({"docker_daemon_extra": {"group": "inference"}}, "expected daemon.json keys other than data-root, defau"),
        ({"docker_daemon_extra": {"userland-proxy-path": "/tmp/x"}}, "group, hosts, log-driver, log-opts, runtimes"),
        # Unit names the roles would write as x.service.service, a template, or an instance.
        ({"serving_unit_name": "engine.service"}, "it ends in .service; expected the name without it"),
        ({"serving_unit_name": "multi-user.target"}, "it ends in .target; expected the name without it"),
        ({"serving_unit_name": "ssh.socket"}, "it ends in .socket"),
        ({"serving_unit_name": "engine@"}, "it has an '@', which makes it a template or an instance of one"),
        ({"serving_unit_name": "engine@0"}, "serving_unit_name = 'engine@0' is invalid"),
        # URLs whose readers cannot connect as written: a port beyond 65535 or 0, a raw IPv6 zone
        # (Go's net/url wants %25), a space, a host that is no DNS name.
        ({"base_pypi_index_url": "https://pypi.example:70000/simple"}, "Port out of range"),
        ({"base_pypi_index_url": "https://pypi.example/simple --index-url x"}, "an http(s) URL without spaces"),
        ({"weights_endpoint": "http://hub.example:0/"}, "its port 0 is no port to connect to"),
        ({"weights_endpoint": "http://[fe80::1%eth0]:8080"}, "its IPv6 zone is not written %25 and an interface"),
        ({"cuda_repo_url": "https://-x.example/repos"}, "its host '-x.example' is not a DNS name"),
    ],
)
def test_h_an_account_group_daemon_key_unit_or_url_that_harms_or_breaks_is_refused(inventory, validate, data, message):  # noqa: F811
    path = inventory.groups(gpu_nodes=[gpu_node("gpu.invalid", **data)], builders=["gpu.invalid"])
    line = validate(path)
    (key,) = data
    assert line.startswith(f"{path}: host gpu.invalid: {key} = "), line
    assert message in line, line


def test_h_the_accounts_units_and_urls_a_site_writes_pass(inventory):
    data = {
        "base_service_user": "sglang",
        "base_service_group": "sglang",
        "serving_unit_name": "kimi-engine",
        "docker_daemon_extra": {"registry-mirrors": ["https://mirror.example.internal"]},
        "base_pypi_index_url": "https://pypi.example.internal:8443/simple/",
        "weights_endpoint": "http://[fe80::1%25eth0]:8080",
        "cuda_repo_url": "http://10.0.0.5/cuda/repos",
    }
    site = load_site(inventory.groups(gpu_nodes=[gpu_node("gpu1", **data)], builders=["gpu1"]))
    host = site.hosts["gpu1"]
    assert (host.base.service_user, host.serving.unit_name, host.weights.endpoint) == (
        "sglang",
        "kimi-engine",
        data["weights_endpoint"],
    )


@pytest.mark.parametrize("kind", ["device", "pipe"])
@pytest.mark.parametrize("key", ["stack_file", "secrets_file"])
def test_h_a_stack_or_secrets_file_that_is_a_device_or_a_pipe_is_one_line_not_a_hang(
    inventory,
    validate,  # noqa: F811
    short_tmp,
    key,
    kind,
):
    """/dev/zero was read until memory ran out, and a named pipe waited for a writer forever."""
    import os

    if kind == "pipe":
        target = short_tmp / "pipe.yml"  # shown whole: a message cuts a value past 80 characters
        os.mkfifo(target)
    else:
        target = "/dev/zero"
    path = inventory.groups(gpu_nodes=[gpu_node("gpu.invalid", **{key: str(target)})])
    started = time.monotonic()
    line = validate(path)
    assert time.monotonic() - started < 30
    assert str(target) in line and "not a regular file but a device, a pipe or a socket" in line, line


@pytest.mark.parametrize(
    ("data", "message"),
    [
        # A folder the service account owns inside a tree root reads or runs: a unit, a cron job,
        # a module of the system's Python, root's home; or a user's home, or /tmp (a link first).
        ({"base_data_dir": "/etc/systemd/system"}, "expected a folder of its own, not inside the system's /etc"),
        ({"base_data_dir": "/etc/cron.d"}, "not inside the system's /etc"),
        ({"base_log_dir": "/usr/local/lib/python3.12"}, "not inside the system's /usr"),
        ({"base_model_dir": "/root/models"}, "not inside the system's /root"),
        ({"base_data_dir": "/var/lib/containerd"}, "not the system's /var/lib/containerd"),
        ({"base_data_dir": "/home/ubuntu"}, "not /home/ubuntu (a user's home folder)"),
        ({"base_data_dir": "/tmp/engine"}, "is invalid; expected a path outside /tmp, where every user may write"),
        ({"weights_source_dir": "/etc"}, "weights_source_dir = '/etc' is invalid; expected a folder of its own"),
        ({"weights_source_dir": "/"}, "weights_source_dir = '/' is invalid; expected a folder of its own, not /"),
        # A program root runs, where every user may put one first.
        ({"engine_python": "/tmp/python3"}, "engine_python = '/tmp/python3' is invalid; expected a path outside"),
        ({"health_engine_python": "/var/tmp/py"}, "expected a path outside /var/tmp, where every user may write"),
        # Longer than any host takes (execve's MAX_ARG_STRLEN is 131072; PATH_MAX 4096).
        (
            {"serving_served_model_name": "k" * 200_000},
            "is longer than any host takes; expected at most 4096 characters",
        ),
        ({"serving_model_path": "/models/" + "a" * 5000}, "(5008 characters) is longer than any host takes"),
        ({"base_extra_packages": ["nvtop"] * 100_000}, "<a list of 100000 entries> has 100000 entries"),
    ],
)
def test_h_a_folder_in_a_system_tree_or_a_value_too_long_is_refused(inventory, validate, data, message):  # noqa: F811
    path = inventory.groups(gpu_nodes=[gpu_node("gpu.invalid", **data)])
    line = validate(path)
    (key,) = data
    assert line.startswith(f"{path}: host gpu.invalid: {key} = "), line
    assert message in line, line


def test_h_a_cloud_image_of_the_nodes_secrets_is_refused(inventory, validate):  # noqa: F811
    """qm import-from copies the file, as root, into the guest's disk: /etc/shadow would be the VM's."""
    path = inventory.groups(
        proxmox_hosts=[NODE], kvm_guests=[("vm.invalid", {"guest_vmid": 300, "guest_node": NODE[0]})]
    )
    assert load_site(path).hosts["vm.invalid"].guest.cloud_image is None
    for number, image in enumerate(("/etc/shadow", "/root/.ssh/id_ed25519", "/tmp/noble.img")):
        path = inventory.groups(
            f"image{number}.py",
            proxmox_hosts=[NODE],
            kvm_guests=[("vm.invalid", {"guest_vmid": 300, "guest_node": NODE[0], "guest_cloud_image": image})],
        )
        line = validate(path)
        assert line.startswith(f"{path}: host vm.invalid: guest_cloud_image = {image!r} is invalid;"), line
        assert "not in /etc, /root, /home" in line, line


def test_h_a_value_that_holds_itself_or_nests_deep_is_one_line_not_a_traceback(inventory, validate):  # noqa: F811
    """Built by a loop in a Python inventory: the rules' recursion ended in a RecursionError."""
    path = inventory.groups(gpu_nodes=[gpu_node("gpu.invalid")])
    text = path.read_text()
    looped = text + "\n_loop = []\n_loop.append(_loop)\ngpu_nodes[0][1]['base_extra_packages'] = _loop\n"
    path.write_text(looped)
    line = validate(path)
    assert line.startswith(f"{path}: host gpu.invalid: base_extra_packages = <a list of 1 entries> holds itself"), line
    deep = text + (
        "\nimport functools\ngpu_nodes[0][1]['serving_speculative'] ="
        " functools.reduce(lambda a, _: {'x': a}, range(5000), {})\n"
    )
    path = path.with_name("deep.py")
    path.write_text(deep)
    line = validate(path)
    assert line.startswith(f"{path}: host gpu.invalid: serving_speculative = <a dict of 1 entries> is nested"), line


@pytest.mark.parametrize("code", ["0", "None", "3"])
def test_h_an_inventory_that_ends_the_program_is_not_valid(inventory, validate, code):  # noqa: F811
    """`raise SystemExit(0)` in the file made `inference-host validate` exit 0 with no output, which a
    script reads as valid, without a rule run."""
    path = inventory.groups(f"exits{code}.py", gpu_nodes=[gpu_node("gpu.invalid", serving_port=22)])
    path.write_text(path.read_text() + f"\nraise SystemExit({code})\n")
    line = validate(path)
    assert line.startswith(str(path)) or line.startswith(f"inventory/{path.name}"), line
    assert line.endswith(
        f"{path.name}: the file ended the program (SystemExit({code})) while it was loaded;"
        " expected an inventory that defines its groups and returns"
    ), line


def test_h_a_credential_as_a_mappings_key_or_before_an_smtp_relay_is_refused_unshown(inventory, validate):  # noqa: F811
    """A mount point's host path is written into pct's command line and the preview: its key was
    never scanned. user:password@relay:25 (no scheme) was echoed in clear by the grammar's line."""
    token = "ghp_" + "a1B2" * 9
    path = inventory.groups(
        "mount.py", proxmox_hosts=[NODE], lxc_guests=[lxc("ct.invalid", guest_mount_points={f"/tank/{token}": "/m"})]
    )
    line = validate(path)
    assert line.startswith(f"{path}: host ct.invalid: guest_mount_points has a key that looks like a credential"), line
    assert token not in line
    relay = {"monitoring_email_to": "a@b.example", "monitoring_email_from": "x@y.example"}
    path = inventory.groups(
        "relay.py", monitors=[("mon.invalid", {**relay, "monitoring_email_smarthost": "mailer:hunter2pw@smtp:25"})]
    )
    line = validate(path)
    assert line.startswith(f"{path}: host mon.invalid: monitoring_email_smarthost holds what looks like a credential")
    assert "hunter2pw" not in line and line.endswith("named by monitoring_email_auth_password_secret"), line
    path = inventory.groups(
        "port.py", monitors=[("mon.invalid", {**relay, "monitoring_email_smarthost": "smtp.example:99999"})]
    )
    assert validate(path) == (
        f"{path}: host mon.invalid: monitoring_email_smarthost = 'smtp.example:99999' is invalid; expected host:port"
        " of the SMTP relay (a DNS name or IPv4 address, a port from 1 to 65535)"
    )


@pytest.mark.parametrize(
    ("data", "message"),
    [
        # Linux interface names are at most 15 bytes (IFNAMSIZ); \w took a Cyrillic letter.
        ({"guest_bridge": "vmbr0123456789012345"}, "guest_bridge = 'vmbr0123456789012345' is invalid; expected a"),
        ({"guest_bridge": "vmbr\u0435"}, "guest_bridge = 'vmbr\\u0435' is invalid; expected a bridge name: 1 to 15"),
        ({"guest_bridge": "-x"}, "not beginning with '-' (IFNAMSIZ)"),
        # Proxmox's parse_property_string dies on a duplicate key ("nesting=1,nesting=1").
        ({"guest_features": ["nesting", "nesting"]}, "each once (pct refuses a repeated key)"),
    ],
)
def test_h_a_bridge_or_feature_proxmox_would_refuse_at_create_is_refused_first(inventory, validate, data, message):  # noqa: F811
    path = inventory.groups(proxmox_hosts=[NODE], lxc_guests=[lxc("ct.invalid", **data)])
    line = validate(path)
    (key,) = data
    assert line.startswith(f"{path}: host ct.invalid: {key} = "), line
    assert message in line, line


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"nccl_ib_hca": "mlx5_0;reboot"}, "expected adapters like mlx5, =mlx5_0:1,mlx5_1:1 or ^=mlx5_3"),
        ({"nccl_debug_subsys": "INIT`id`"}, "expected subsystems like INIT,P2P or ^NET (NCCL_DEBUG_SUBSYS)"),
    ],
)
def test_h_an_nccl_list_outside_nccls_grammar_is_refused(inventory, validate, data, message):  # noqa: F811
    path = inventory.groups(gpu_nodes=[gpu_node("gpu.invalid", **data)])
    line = validate(path)
    (key,) = data
    assert line.startswith(f"{path}: host gpu.invalid: {key} = "), line
    assert message in line, line


def test_h_nccl_lists_and_bridges_as_written_pass(inventory):
    data = {"nccl_ib_hca": "^=mlx5_0:1,mlx5_1", "nccl_debug_subsys": "^INIT,P2P"}
    host = load_site(inventory.groups(gpu_nodes=[gpu_node("gpu1", **data)])).hosts["gpu1"]
    assert (host.nccl.ib_hca, host.nccl.debug_subsys) == ("^=mlx5_0:1,mlx5_1", "^INIT,P2P")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        # inet_aton(3) reads these as IPv4 addresses: 8.0.0.1 (octal), 10.0.0.1 (one number).
        ({"ssh_hostname": "010.0.0.1"}, "expected a DNS name or an IP address; its last label is all digits"),
        ({"ssh_hostname": "167772161"}, "through inet_aton(3) (010.0.0.1 is 8.0.0.1, 167772161 is 10.0.0.1)"),
        # A path with shell syntax: the only path setting that took any non-space text.
        ({"gateway_python": "/opt/x$(reboot)"}, "expected a Python version like 3.12 or an absolute path without"),
        ({"gateway_python": "/tmp/python3"}, "outside /tmp"),
        # FROM / --build-arg BASE_IMAGE: a space or an option ends the build.
        ({"build_base_image": "ubuntu:24.04 --privileged"}, "expected a Docker image reference like nvidia/cuda"),
        # A tag is the registry's to move: root-run kernels built from whatever it names that day.
        ({"build_base_image": "nvidia/cuda:12.8.1-devel-ubuntu24.04"}, "never a tag alone (the registry can move"),
        ({"build_base_image": "nvidia/cuda@sha256:" + "0" * 63}, "expected a Docker image reference like"),
    ],
)
def test_h_an_address_interpreter_or_image_read_otherwise_is_refused(inventory, validate, data, message):  # noqa: F811
    path = inventory.groups(gpu_nodes=[gpu_node("gpu.invalid", **data)], builders=["gpu.invalid"])
    line = validate(path)
    (key,) = data
    assert line.startswith(f"{path}: host gpu.invalid: {key} = "), line
    assert message in line, line


def test_h_images_interpreters_and_numeric_looking_names_as_written_pass(inventory):
    data = {
        "build_base_image": "registry.example:5000/nvidia/cuda:12.8.1-devel-ubuntu24.04@sha256:" + "5" * 64,
        "gateway_python": "/usr/bin/python3.12",
        "ssh_hostname": "10.0.0.1",
    }
    host = load_site(inventory.groups(gpu_nodes=[gpu_node("gpu1", **data)], builders=["gpu1"])).hosts["gpu1"]
    assert (host.build.base_image, host.gateway.python, host.ssh_hostname) == tuple(data.values())


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("hf_token_value\r", "has the control character '\\r' at position 14; expected the secret on one line"),
        ("hf_\x00token", "has the control character '\\x00' at position 3"),
        ("t" * 70_000, "is longer than 65536 characters; expected a token, key, password or URL"),
    ],
)
def test_h_vault_set_refuses_a_value_no_secret_holds_without_echoing_it(tmp_path, monkeypatch, capsys, value, message):
    """A Windows paste's '\\r' or a NUL was stored and reached the 0600 files as a line break or a
    string's end; a value of megabytes made a vault file the reader then refused."""
    import io

    password = tmp_path / "password"
    password.write_bytes(PASSWORD)
    password.chmod(0o600)
    monkeypatch.setenv(vault.PASSWORD_FILE_ENV, str(password))
    monkeypatch.setattr(sys, "stdin", io.StringIO(value + "\n"))
    target = tmp_path / "secrets.vault.yml"
    assert vault._main(["set", str(target), "hf_token"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{target}: the value for hf_token {message}") and err.count("\n") == 1, err
    assert "token_value" not in err and "t" * 100 not in err and not target.exists()
