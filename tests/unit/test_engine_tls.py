"""TLS on the engine (docs/security.md#tls): serving_tls_cert_secret and serving_tls_key_secret
render each release's own options (--ssl-certfile/--ssl-keyfile, read from its captured CLI) with
the paths of the 0600 files the deploy writes, never the PEM itself; SGLang 0.5.9, which has no
such option, is refused in one line naming the alternative; a half pair, a vault key the vault
lacks and a replica behind a gateway without the CA its gateway verifies it with are refused in
one line each; TLS needs no plaintext acknowledgement."""

from __future__ import annotations

import dataclasses
import io

import pytest

from lab.tls_ca import make_tls_material
from roles.serving import command as cmd
from roles.shared import layout
from roles.site import PROJECT_ROOT, SiteError, address_of, load_site, vault
from tests.unit.conftest import ADMIN, CLIENT_KEY, CONTROL, GATEWAY_PLAINTEXT, ROLE_KEYS, gpu_node
from tests.unit.test_site import assert_names, only_problem

PROD = load_site(PROJECT_ROOT / "inventory" / "prod.py")
CERT_PEM = "-----BEGIN CERTIFICATE-----\nMIIBplanted\n-----END CERTIFICATE-----"
KEY_PEM = "-----BEGIN PRIVATE KEY-----\nMIIEplantedkey\n-----END PRIVATE KEY-----"
TLS = {"serving_tls_cert_secret": "engine_tls_cert", "serving_tls_key_secret": "engine_tls_key"}


def _tls(host, cert="engine_tls_cert", key="engine_tls_key", **serving):
    return dataclasses.replace(
        host,
        serving=host.serving.model_copy(update={"tls_cert_secret": cert, "tls_key_secret": key, **serving}),
    )


HOST = PROD.group("gpu_nodes")[0]
VLLM_HOST = dataclasses.replace(HOST, serving=HOST.serving.model_copy(update={"admin_api_key_secret": None}))
PATHS = layout.tls_files(HOST.serving.unit_name)


@pytest.mark.parametrize(
    ("stack_id", "host"),
    [("sglang-0.5.10-cu128", HOST), ("sglang-0.5.23-cu130", HOST), ("vllm-0.16.0-cu128", VLLM_HOST)],
)
def test_each_release_with_tls_options_gets_them_with_the_file_paths(stack_id, host):
    stack = PROD.stack.stacks[stack_id]
    args = cmd.server_arguments(_tls(host), PROD.hosts, stack)
    assert args[-4:] == ["--ssl-certfile", PATHS["cert"], "--ssl-keyfile", PATHS["key"]]
    assert cmd.unknown_flags(args, stack.version, stack.engine) == []
    assert cmd.command_problems(_tls(host), PROD.hosts, stack) == []
    assert not any("BEGIN" in arg for arg in args)  # paths, never the PEM
    without = cmd.server_arguments(host, PROD.hosts, stack)
    assert not [arg for arg in without if arg.startswith("--ssl")]


def test_sglang_0_5_9_has_no_tls_option_and_is_refused_in_one_line():
    stack = PROD.stack.stacks["sglang-0.5.9-cu128"]
    assert "--ssl-certfile" not in cmd.cli_options("0.5.9")["options"]  # the captured CLI of the wheel
    assert not [arg for arg in cmd.server_arguments(_tls(HOST), PROD.hosts, stack) if arg.startswith("--ssl")]
    [problem] = cmd.command_problems(_tls(HOST), PROD.hosts, stack)
    assert_names(
        problem,
        "stack sglang-0.5.9-cu128: serving_tls_cert_secret with sglang 0.5.9, which has no TLS option",
        "expected a stack with sglang 0.5.10+ or vLLM",
        "serving_host = '127.0.0.1'",
    )


def _site(inventory, name="site.py", gateway=None, stack="sglang-0.5.10-cu128", **node):
    if f"active: {stack}" not in (inventory.dir / "stack.yml").read_text():  # once per inventory folder
        inventory.edit_stack("active: sglang-0.5.9-cu128", f"active: {stack}")
    secrets = inventory.vault(engine_api_key=CLIENT_KEY, engine_tls_cert=CERT_PEM, engine_tls_key=KEY_PEM, **ROLE_KEYS)
    keyed = {"secrets_file": secrets, "serving_api_key_secret": "engine_api_key", **ADMIN, **node}
    groups = {"gpu_nodes": [gpu_node(ssh_hostname="10.0.0.1", **keyed)]}
    if gateway is not None:
        groups["gateways"] = [("gw", {"secrets_file": secrets, **GATEWAY_PLAINTEXT, **CONTROL, **gateway})]
    return inventory.groups(name, **groups)


def test_tls_beyond_loopback_needs_no_plaintext_acknowledgement(inventory):
    site = load_site(_site(inventory, serving_host="0.0.0.0", **TLS))
    assert site.hosts["gpu1"].serving.tls_key_secret == "engine_tls_key"
    assert "WARNING" not in site.summary()


def test_a_certificate_without_its_key_is_refused_in_one_line(inventory):
    message = only_problem(_site(inventory, serving_tls_cert_secret="engine_tls_cert"))
    assert_names(message, "serving_tls_cert_secret = 'engine_tls_cert' without serving_tls_key_secret", "expected both")


def test_a_key_without_its_certificate_is_refused_in_one_line(inventory):
    message = only_problem(_site(inventory, serving_tls_key_secret="engine_tls_key"))
    assert_names(message, "serving_tls_key_secret = 'engine_tls_key' without serving_tls_cert_secret", "expected both")


def test_a_vault_key_the_vault_lacks_is_refused_in_one_line(inventory):
    message = only_problem(_site(inventory, **{**TLS, "serving_tls_key_secret": "other_tls_key"}))
    assert_names(message, "host gpu1: serving_tls_key_secret = 'other_tls_key' names no secret in", "engine_tls_key")


def test_tls_on_0_5_9_is_refused_by_the_validator_in_one_line(inventory):
    from validation import ROLE_CHECKS

    with pytest.raises(SiteError) as caught:
        load_site(_site(inventory, stack="sglang-0.5.9-cu128", **TLS), checks=ROLE_CHECKS)
    [message] = caught.value.problems
    assert_names(message, "host gpu1: stack sglang-0.5.9-cu128: serving_tls_cert_secret with sglang 0.5.9")


def test_a_replica_behind_a_gateway_with_tls_needs_the_ca_the_gateway_verifies_it_with(inventory, tmp_path):
    message = only_problem(_site(inventory, gateway={}, serving_host="10.0.0.1", **TLS))
    assert_names(
        message,
        "host gpu1: serving_tls_cert_secret behind a gateway without serving_tls_ca_file",
        "expected serving_tls_ca_file",
        "smg --ca-cert-paths",
    )
    ca = tmp_path / "ca.pem"
    ca.write_text(make_tls_material(["10.0.0.1"]).ca_pem)
    site = load_site(_site(inventory, "ca.py", gateway={}, serving_host="10.0.0.1", serving_tls_ca_file=str(ca), **TLS))
    assert site.hosts["gpu1"].serving.tls_enabled  # tests/unit/test_gateway_tls.py: what the gateway does with it


def test_a_ca_file_must_hold_certificates_only(inventory, tmp_path):
    key_file = tmp_path / "key.pem"
    key_file.write_text(KEY_PEM + "\n")
    message = only_problem(_site(inventory, serving_tls_ca_file=str(key_file), **TLS))
    assert_names(message, "serving_tls_ca_file", "holds a private key")


def test_the_vault_takes_a_pem_on_several_lines_and_nothing_else(tmp_path, monkeypatch):
    """`inference-host vault set FILE NAME < cert.pem` stores the whole PEM text; other secrets stay
    on one line (a line break there is a pasting mistake)."""
    path = tmp_path / "secrets.vault.yml"
    assert vault.new_value_problem(path, "engine_tls_cert", CERT_PEM) is None
    assert "control character '\\n'" in (vault.new_value_problem(path, "hf_token", "abc\ndef") or "")
    monkeypatch.setenv("ANSIBLE_VAULT_PASSWORD", "x")
    monkeypatch.setattr("sys.stdin", io.StringIO(CERT_PEM + "\n"))
    monkeypatch.setattr(vault, "set_secret", lambda p, name, value: stored.update({name: value}))
    stored: dict[str, str] = {}
    assert vault._set(path, "engine_tls_cert") == 0
    assert stored == {"engine_tls_cert": CERT_PEM}


# -- the checks, the readiness probe and the benchmark verify the certificate ------------------


def _expect(host):
    from checks.expectations import Expectations

    return Expectations.from_host(host, PROD.stack.driver_version, "unit test")


def test_the_checks_ask_https_and_verify_with_the_deployed_ca():
    from checks import server_checks

    host = _tls(HOST, tls_ca_file=None)
    expect = _expect(host)
    assert expect.tls_server_name == address_of(HOST)  # the name the certificate must cover
    assert server_checks.base_url(expect) == f"https://{address_of(HOST)}:{HOST.serving.port}"
    assert server_checks.tls_options(expect) == [
        "--cacert",
        layout.SYSTEM_CA_BUNDLE,
        "--connect-to",
        "::127.0.0.1:",
    ]  # serving_host 0.0.0.0 in prod.py: loopback, the name's certificate verified
    with_ca = _expect(dataclasses.replace(host, serving=host.serving.model_copy(update={"tls_ca_file": "ca.pem"})))
    assert server_checks.tls_options(with_ca)[:2] == ["--cacert", PATHS["ca"]]
    plain = _expect(HOST)
    assert server_checks.base_url(plain).startswith("http://") and server_checks.tls_options(plain) == []


def test_a_request_of_the_checks_carries_the_ca_and_never_skips_verification(monkeypatch):
    from argparse import Namespace

    from checks import bounded, server_checks

    commands = []

    def run(host, command, what, **_):
        commands.append(str(command))
        return Namespace(rc=0, stdout="ok\n" + server_checks.STATUS_MARKER + "200 0.01", stderr="")

    monkeypatch.setattr(bounded, "run", run)
    monkeypatch.setattr(bounded, "unanswered", lambda host, endpoint: None)
    answer = server_checks.request(None, _expect(_tls(HOST)), "/health", with_key=False)
    assert answer.status == 200
    [command] = commands
    assert "--cacert" in command and "https://" in command
    assert " -k " not in command and "--insecure" not in command


def test_the_readiness_probe_verifies_the_engine_with_the_ca():
    from roles import serving

    host = _tls(HOST)
    assert serving.probe_url(host).startswith("https://")
    assert serving.probe_tls_options(host) == ["--cacert", layout.SYSTEM_CA_BUNDLE, "--connect-to", "::127.0.0.1:"]
    assert serving.probe_tls_options(HOST) == []


def test_the_benchmark_verifies_the_engine_with_the_ca(monkeypatch):
    from argparse import Namespace

    from checks import bench_workload, bounded

    scripts = []

    def run(host, command, what, **_):
        scripts.append(str(command))
        return Namespace(rc=0, stdout="", stderr="")

    monkeypatch.setattr(bounded, "run", run)
    expect = _expect(_tls(HOST))
    args = Namespace(concurrency=[1], min_prompts=1, prompts_per_stream=1, input_len=8, output_len=8)
    bench_workload.run_workload(None, {"expect": expect, "model_path": "/m"}, args)
    [script] = scripts
    assert f"SSL_CERT_FILE={layout.SYSTEM_CA_BUNDLE}" in script and "https://" in script


def test_the_timers_checks_on_the_host_expect_the_same_tls_as_from_the_controller(tmp_path):
    """The 0644 expect.json carries the host's copy of the CA and the name to ask, not the
    controller's serving_tls_ca_file (a path the host does not have)."""
    from checks.expectations import Expectations
    from checks.textfile import expect_arguments
    from roles.monitoring import units

    ca = tmp_path / "ca.pem"
    ca.write_text(make_tls_material(["gpu1"]).ca_pem)
    host = _tls(HOST, tls_ca_file=str(ca))
    site = dataclasses.replace(PROD, hosts={**PROD.hosts, HOST.name: host})
    expect = tmp_path / "expect.json"
    expect.write_text(units.expect_text(host, site))
    assert str(ca) not in expect.read_text()
    on_host = Expectations.from_overrides([a.removeprefix("--expect=") for a in expect_arguments(expect)])
    from_inventory = Expectations.from_site(site, HOST.name)
    for name in ("serving_tls", "tls_server_name", "tls_ca_file"):
        assert getattr(on_host, name) == getattr(from_inventory, name), name
    assert on_host.serving_tls and on_host.tls_ca_file == PATHS["ca"] and on_host.tls_server_name == address_of(HOST)
