"""TLS on the gateway and from the gateway to its workers (docs/security.md#tls): gateway_tls_*
render smg 1.13.0's own --tls-cert-path/--tls-key-path (checked against its captured CLI) with the
paths of the 0600 files the deploy writes, never the PEM; replicas that serve TLS are reached at
https://NAME:PORT with --ca-cert-paths; a half pair, a vault key the vault lacks and the mixes smg
or the replicas' clients cannot verify are refused in one line each; TLS on the gateway needs no
plaintext acknowledgement; every client of the gateway (its readiness wait, the gateway check,
`inference-host status`, the rolling drain, the benchmark) verifies it with the CA."""

from __future__ import annotations

import pytest

from lab.tls_ca import make_tls_material
from roles.gateway import command as gw_cmd
from roles.shared import layout
from roles.shared.replicas import gateway_on_its_host, gateway_url, replicas, worker_url
from roles.site import load_site
from tests.unit.conftest import ADMIN, CLIENT_KEY, CONTROL, GATEWAY_PLAINTEXT, ROLE_KEYS, SERVING_PLAINTEXT
from tests.unit.test_engine_tls import CERT_PEM, KEY_PEM
from tests.unit.test_site import assert_names, only_problem

GATEWAY_TLS = {"gateway_tls_cert_secret": "gateway_tls_cert", "gateway_tls_key_secret": "gateway_tls_key"}
REPLICA_TLS = {"serving_tls_cert_secret": "engine_tls_cert", "serving_tls_key_secret": "engine_tls_key"}


@pytest.fixture
def ca(tmp_path) -> str:
    path = tmp_path / "site-ca.pem"
    path.write_text(make_tls_material(["10.0.0.1", "10.0.0.2", "10.0.0.100"]).ca_pem)
    return str(path)


def _site(inventory, gateway=None, first=None, second=None, name="site.py", gateways=1):
    """Two replicas (10.0.0.1, 10.0.0.2; plain HTTP unless first/second say otherwise) behind
    `gateways` gateways (10.0.0.100, ...), on SGLang 0.5.10 (it serves TLS)."""
    if "active: sglang-0.5.10-cu128" not in (inventory.dir / "stack.yml").read_text():  # once per folder
        inventory.edit_stack("active: sglang-0.5.9-cu128", "active: sglang-0.5.10-cu128")
    inventory.vault(
        engine_api_key=CLIENT_KEY,
        engine_tls_cert=CERT_PEM,
        engine_tls_key=KEY_PEM,
        gateway_tls_cert=CERT_PEM,
        gateway_tls_key=KEY_PEM,
        **ROLE_KEYS,
    )
    common = {"secrets_file": "secrets.vault.yml"}
    node = {**common, "gpu_count": 8, "serving_host": "0.0.0.0", "serving_api_key_secret": "engine_api_key", **ADMIN}

    def replica(address, data):
        data = data if data is not None else SERVING_PLAINTEXT
        return (f"gpu{address[-1]}", {**node, "ssh_hostname": address, **data})

    gateway = gateway if gateway is not None else GATEWAY_PLAINTEXT
    return inventory.groups(
        name,
        gpu_nodes=[replica("10.0.0.1", first), replica("10.0.0.2", second)],
        gateways=[
            (f"gw{i}", {**common, **CONTROL, "ssh_hostname": f"10.0.0.10{i}", **gateway}) for i in range(gateways)
        ],
    )


# -- what smg is given ------------------------------------------------------------------------


def test_the_gateway_gets_smgs_own_tls_options_with_the_file_paths(inventory, ca):
    site = load_site(_site(inventory, {**GATEWAY_TLS, "gateway_tls_ca_file": ca}))
    gw = site.hosts["gw0"]
    args = gw_cmd.gateway_arguments(gw, site.hosts)
    assert args[-4:] == ["--tls-cert-path", "/etc/smg/tls.crt", "--tls-key-path", "/etc/smg/tls.key"]
    assert gw_cmd.flag_problems(args, "1.13.0") == [] and gw_cmd.gateway_problems(gw, site.hosts) == []
    assert not any("BEGIN" in arg for arg in args)  # paths, never the PEM
    assert "--ca-cert-paths" not in args  # the replicas serve plain HTTP here
    assert gateway_url(gw) == "https://10.0.0.100:8000"
    # smg's own option names, read from the wheel's argparse (roles/gateway/cli/1.13.0.json).
    assert {"--tls-cert-path", "--tls-key-path", "--ca-cert-paths"} <= set(gw_cmd.cli_options("1.13.0"))


def test_a_plain_gateway_gets_no_tls_option(inventory):
    site = load_site(_site(inventory))
    args = gw_cmd.gateway_arguments(site.hosts["gw0"], site.hosts)
    assert not [a for a in args if a.startswith(("--tls", "--ca-cert"))]
    assert gateway_url(site.hosts["gw0"]) == "http://10.0.0.100:8000"


def test_tls_replicas_are_workers_at_https_verified_with_their_ca(inventory, ca):
    tls = {**REPLICA_TLS, "serving_tls_ca_file": ca}
    site = load_site(_site(inventory, first=tls, second=tls))
    gw = site.hosts["gw0"]
    args = gw_cmd.gateway_arguments(gw, site.hosts)
    urls = args[args.index("--worker-urls") + 1 : args.index("--policy")]
    assert urls == ["https://10.0.0.1:30000", "https://10.0.0.2:30000"]  # NAME: ssh_hostname, as the probe asks
    assert args[args.index("--ca-cert-paths") + 1] == layout.GATEWAY_WORKERS_CA_FILE
    assert gw_cmd.flag_problems(args, "1.13.0") == []
    assert [worker_url(n) for n in replicas(site.hosts)] == urls  # what the checks and status expect listed


def test_some_replicas_in_tls_and_some_plain_are_taken_each_by_its_scheme(inventory, ca):
    """smg's one HTTP client sends each request by its URL's scheme: not refused."""
    site = load_site(_site(inventory, first={**REPLICA_TLS, "serving_tls_ca_file": ca}))
    args = gw_cmd.gateway_arguments(site.hosts["gw0"], site.hosts)
    assert "https://10.0.0.1:30000" in args and "http://10.0.0.2:30000" in args
    assert "--ca-cert-paths" in args


# -- refused in one line ------------------------------------------------------------------------


def test_a_gateway_certificate_without_its_key_is_refused_in_one_line(inventory):
    message = only_problem(_site(inventory, {**GATEWAY_PLAINTEXT, "gateway_tls_cert_secret": "gateway_tls_cert"}))
    assert_names(
        message,
        "host gw0: gateway_tls_cert_secret = 'gateway_tls_cert' without gateway_tls_key_secret",
        "expected both",
    )


def test_a_gateway_key_without_its_certificate_is_refused_in_one_line(inventory):
    message = only_problem(_site(inventory, {**GATEWAY_PLAINTEXT, "gateway_tls_key_secret": "gateway_tls_key"}))
    assert_names(
        message, "host gw0: gateway_tls_key_secret = 'gateway_tls_key' without gateway_tls_cert_secret", "expected both"
    )


def test_a_gateway_vault_key_the_vault_lacks_is_refused_in_one_line(inventory):
    message = only_problem(_site(inventory, {**GATEWAY_TLS, "gateway_tls_cert_secret": "other_cert"}))
    assert_names(message, "host gw0: gateway_tls_cert_secret = 'other_cert' names no secret in", "gateway_tls_cert")


def test_a_gateway_ca_file_must_hold_certificates_only(inventory, tmp_path):
    key_file = tmp_path / "key.pem"
    key_file.write_text(KEY_PEM + "\n")
    message = only_problem(_site(inventory, {**GATEWAY_TLS, "gateway_tls_ca_file": str(key_file)}))
    assert_names(message, "gateway_tls_ca_file", "holds a private key")


def test_replicas_with_different_cas_are_refused_in_one_line(inventory, ca, tmp_path):
    other = tmp_path / "other-ca.pem"
    other.write_text(make_tls_material(["10.0.0.2"]).ca_pem)
    first, second = {**REPLICA_TLS, "serving_tls_ca_file": ca}, {**REPLICA_TLS, "serving_tls_ca_file": str(other)}
    message = only_problem(_site(inventory, first=first, second=second))
    assert_names(
        message, f"host gpu2: serving_tls_ca_file = {str(other)!r} differs from host gpu1's", "one CA for every replica"
    )


def test_gateways_with_different_cas_are_refused_in_one_line(inventory, ca, tmp_path):
    path = _site(inventory, {**GATEWAY_TLS, "gateway_tls_ca_file": ca}, gateways=2)
    other = tmp_path / "other-ca.pem"
    other.write_text(make_tls_material(["10.0.0.101"]).ca_pem)
    path.write_text(path.read_text().replace(repr(ca), repr(str(other)), 1))  # gw0's
    message = only_problem(path)
    assert_names(message, "host gw1: gateway_tls_ca_file", "differs from host gw0's", "one CA for every gateway")


def test_gateway_tls_beyond_loopback_needs_no_plaintext_acknowledgement(inventory, ca):
    site = load_site(_site(inventory, {**GATEWAY_TLS, "gateway_tls_ca_file": ca}))
    assert site.hosts["gw0"].gateway.host == "0.0.0.0" and site.hosts["gw0"].gateway.plaintext_reason is None
    assert "gw0: WARNING" not in site.summary()


def test_a_plain_gateway_beyond_loopback_is_refused_naming_tls_as_a_way_out(inventory):
    message = only_problem(_site(inventory, {}))
    assert_names(
        message,
        "host gw0: gateway_host = '0.0.0.0' serves the gateway in plain HTTP",
        "gateway_tls_cert_secret and gateway_tls_key_secret (it then serves TLS)",
        "gateway_plaintext_acknowledged",
    )


# -- every client verifies the gateway with the CA ----------------------------------------------


def _tls_site(inventory, ca):
    tls = {**REPLICA_TLS, "serving_tls_ca_file": ca}
    return load_site(_site(inventory, {**GATEWAY_TLS, "gateway_tls_ca_file": ca}, first=tls, second=tls))


def test_clients_on_the_gateway_host_ask_https_with_the_ca(inventory, ca):
    from checks.gateway import request_command
    from inference_host.operations import status_script

    site = _tls_site(inventory, ca)
    gw = site.hosts["gw0"]
    base, tls = gateway_on_its_host(gw)
    assert base == "https://10.0.0.100:8000"  # the name its certificate covers
    assert tls == ["--cacert", layout.GATEWAY_TLS_FILES["ca"], "--connect-to", "::127.0.0.1:"]
    for command in (str(request_command(base, tls, "/workers")), str(status_script(site, gw))):
        assert "--cacert /etc/smg/tls-ca.crt" in command and "https://10.0.0.100:8000/workers" in command
        assert " -k " not in command and "--insecure" not in command
    bundle = load_site(_site(inventory, GATEWAY_TLS, name="bundle.py")).hosts["gw0"]
    assert gateway_on_its_host(bundle)[1][:2] == ["--cacert", layout.SYSTEM_CA_BUNDLE]
    plain = load_site(_site(inventory, name="plain.py")).hosts["gw0"]
    assert gateway_on_its_host(plain) == ("http://127.0.0.1:8000", [])


def test_the_gateway_check_verifies_with_the_ca(inventory, ca, monkeypatch):
    from argparse import Namespace

    from checks import bounded, server_checks
    from checks import gateway as gateway_check

    commands = []

    def run(host, command, what, **_):
        commands.append(str(command))
        return Namespace(rc=0, stdout='{"workers": []}\n' + server_checks.STATUS_MARKER + "200 0.01", stderr="")

    monkeypatch.setattr(bounded, "run", run)
    monkeypatch.setattr(bounded, "unanswered", lambda host, endpoint: None)
    site = _tls_site(inventory, ca)
    base, tls = gateway_on_its_host(site.hosts["gw0"])
    gateway_check.check(None, base, "kimi-k2.5", [], tls=tls)
    assert len(commands) == 2 and all("--cacert /etc/smg/tls-ca.crt" in c and "https://" in c for c in commands)


def test_the_rolling_drain_verifies_the_replica_and_the_gateways_with_their_cas(inventory, ca):
    from roles import serving

    site = _tls_site(inventory, ca)
    argv = serving.rolling_argv(site.hosts["gpu1"], site.hosts)
    engine_ca = layout.tls_files(site.hosts["gpu1"].serving.unit_name)["ca"]
    assert argv[1:5] == ["--worker-ca", engine_ca, "--gateway-ca", layout.REPLICA_GATEWAY_CA_FILE]
    assert "https://10.0.0.1:30000" in argv and "https://10.0.0.100:8000" in argv
    plain = load_site(_site(inventory, name="plain.py"))
    assert not [a for a in serving.rolling_argv(plain.hosts["gpu1"], plain.hosts) if a.endswith("-ca")]


def test_the_benchmark_through_the_gateway_verifies_it_with_the_gateways_ca(inventory, ca, monkeypatch):
    from argparse import Namespace

    from checks import bench, bench_workload, bounded

    path = _site(inventory, {**GATEWAY_TLS, "gateway_tls_ca_file": ca})
    target = bench._target(Namespace(inventory=str(path), host="gpu1", hosts=None, through_gateway=""))
    assert target["base_url"] == "https://10.0.0.100:8000" and target["tls_ca_file"] == layout.REPLICA_GATEWAY_CA_FILE
    scripts = []
    monkeypatch.setattr(
        bounded,
        "run",
        lambda host, command, what, **_: scripts.append(str(command)) or Namespace(rc=0, stdout="", stderr=""),
    )
    args = Namespace(concurrency=[1], min_prompts=1, prompts_per_stream=1, input_len=8, output_len=8)
    bench_workload.run_workload(None, target, args)
    [script] = scripts
    assert f"SSL_CERT_FILE={layout.REPLICA_GATEWAY_CA_FILE}" in script and "https://10.0.0.100:8000" in script
