"""serving_topology: replicas behind SGLang's model gateway, or one tensor-parallel server
across nodes; the preview, the flags of each release, the gateway's command line and verdict."""

from __future__ import annotations

import dataclasses
import json
import shlex
from pathlib import Path

import pytest

from checks import gateway as gateway_health
from checks.server_checks import HttpAnswer
from roles import render
from roles import serving as serving_role
from roles.gateway import command as gateway_command
from roles.gateway import templates as gateway_templates
from roles.serving import command as cmd
from roles.shared.replicas import replicas, worker_url
from roles.site import SiteError, load_site
from tests.unit.conftest import (
    ADMIN,
    CLIENT_KEY,
    CONTROL,
    GATEWAY_PLAINTEXT,
    PROJECT_ROOT,
    ROLE_KEYS,
    SERVING_PLAINTEXT,
)

DATA = Path(__file__).parent / "data" / "smg"
TP = {"gpu_count": 8, "serving_topology": "tensor_parallel", "nccl_ib_disable": True, "nccl_socket_ifname": "ens1f0"}


def _tp_inventory(inventory, **extra):
    return inventory.groups(
        gpu_nodes=[
            ("node-a", {**TP, "ssh_hostname": "10.0.0.11", **extra}),
            ("node-b", {**TP, "ssh_hostname": "10.0.0.12", **extra}),
        ]
    )


def _launch_args(out: Path, host: str) -> list[str]:
    launcher = next((out / host).rglob("serving/launch"))
    line = next(ln for ln in launcher.read_text().splitlines() if "sglang" in ln and "--tp-size" in ln)
    return shlex.split(line.removeprefix("exec "))


def _value(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_preview_of_two_tensor_parallel_nodes_uses_every_gpu_and_rank_0s_address(inventory, tmp_path):
    out = tmp_path / "preview"
    assert render.main([str(_tp_inventory(inventory)), "--out", str(out)]) == 0
    for rank, host in enumerate(("node-a", "node-b")):
        args = _launch_args(out, host)
        assert (_value(args, "--tp-size"), _value(args, "--nnodes")) == ("16", "2")
        assert _value(args, "--node-rank") == str(rank)
        assert _value(args, "--dist-init-addr") == "10.0.0.11:50000"  # rank 0's ssh_hostname
        env = next((out / host).rglob("serving/inference-engine.env")).read_text()
        assert "NCCL_IB_DISABLE=1" in env and "NCCL_SOCKET_IFNAME=ens1f0" in env and "TCP sockets" in env
        unit = next((out / host).rglob("serving/inference-engine.service")).read_text()
        # rank >= 1 runs sglang's dummy health server: ready = scheduler joined, restart to rejoin.
        assert (
            ("/health_generate " in unit, "Restart=on-failure" in unit)
            if rank == 0
            else ("/health " in unit, "Restart=always" in unit)
        ) == (True, True)


def test_explicit_init_host_and_ipv6(inventory):
    site = load_site(_tp_inventory(inventory, serving_dist_init_host="fd00::11"))
    assert cmd.node_topology(site.hosts["node-b"], site.hosts) == (16, 2, 1, "[fd00::11]:50000")


def test_replicas_keep_their_own_gpus_and_no_multi_node_flags(inventory):
    site = load_site(inventory.groups(gpu_nodes=[("a", {"gpu_count": 8}), ("b", {"gpu_count": 8})]))
    args = cmd.server_arguments(site.hosts["b"], site.hosts, site.stack.active)
    assert _value(args, "--tp-size") == "8" and "--nnodes" not in args and "--dist-init-addr" not in args


@pytest.mark.parametrize(
    "version",
    sorted(p.stem for p in (PROJECT_ROOT / "roles/serving/cli").glob("*.json") if not p.stem.startswith("vllm-")),
)
def test_every_rendered_flag_is_valid_for_each_captured_release(inventory, version):
    inventory.vault(engine_api_key=CLIENT_KEY, **ROLE_KEYS)
    site = load_site(
        _tp_inventory(
            inventory,
            serving_host="0.0.0.0",
            **SERVING_PLAINTEXT,
            serving_enable_metrics=True,
            serving_api_key_secret="engine_api_key",
            **ADMIN,
            secrets_file="secrets.vault.yml",
        )
    )
    stack = dataclasses.replace(site.stack.active, sglang=version)
    for host in site.hosts.values():
        assert cmd.unknown_flags(cmd.server_arguments(host, site.hosts, stack), version) == []


BAD = [
    ({"a": {**TP, "gpu_count": 8}, "b": {**TP, "gpu_count": 4}}, "same gpu_count on every gpu node"),
    (
        {
            "a": {"gpu_count": 8, "serving_topology": "tensor_parallel"},
            "b": {"gpu_count": 8, "serving_topology": "tensor_parallel"},
        },
        "nccl_ib_disable is unset",
    ),
    ({"a": {**TP}, "b": {"gpu_count": 8}}, "serving_topology differs between gpu nodes"),
    (
        {"a": {"gpu_count": 8, "serving_topology": "pipeline"}, "b": {"gpu_count": 8}},
        "serving_topology = 'pipeline' is invalid",
    ),
]


@pytest.mark.parametrize("hosts, message", BAD)
def test_bad_topology_is_refused_before_any_host(inventory, hosts, message):
    with pytest.raises(SiteError) as error:
        load_site(inventory.groups(gpu_nodes=list(hosts.items())))
    assert message in str(error.value)


def _gateway_site(inventory, node_data=None, gateway_data=None, name="gw.py"):
    inventory.vault(engine_api_key=CLIENT_KEY, other_key="o", **ROLE_KEYS)
    node = {
        "gpu_count": 8,
        "serving_host": "0.0.0.0",
        **SERVING_PLAINTEXT,
        "serving_api_key_secret": "engine_api_key",
        **ADMIN,
        "secrets_file": "secrets.vault.yml",
        **(node_data or {}),
    }
    return inventory.groups(
        name,
        gpu_nodes=[("a", {**node, "ssh_hostname": "10.0.0.1"}), ("b", {**node, "ssh_hostname": "10.0.0.2"})],
        gateways=[
            ("gw", {"secrets_file": "secrets.vault.yml", **CONTROL, **GATEWAY_PLAINTEXT, **(gateway_data or {})})
        ],
    )


def test_gateway_arguments_come_from_the_inventory_and_are_valid_for_smg(inventory, monkeypatch):
    monkeypatch.setenv("INFERENCE_HOST_VAULT_PASSWORD_FILE", "/nonexistent")
    site = load_site(_gateway_site(inventory))
    gateway = site.hosts["gw"]
    args = gateway_command.gateway_arguments(gateway, site.hosts)
    urls = args[args.index("--worker-urls") + 1 : args.index("--policy")]
    assert urls == ["http://10.0.0.1:30000", "http://10.0.0.2:30000"]  # wildcard bind: ssh_hostname
    assert _value(args, "--policy") == "cache_aware"
    assert gateway_command.flag_problems(args, gateway.gateway.version) == []
    planted = args + ["--policy", "fastest", "--no-such-flag"]
    problems = gateway_command.flag_problems(planted, gateway.gateway.version)
    assert any("--policy fastest is not one of" in p for p in problems)
    assert any("--no-such-flag is not an option of smg 1.13.0" in p for p in problems)
    unit = dict((path, kwargs) for path, _, _, kwargs in gateway_templates(gateway, site.hosts))
    kwargs = unit["/etc/systemd/system/smg.service"]
    assert kwargs["api_key_env"] == "INFERENCE_HOST_GATEWAY_KEY_FILE=/etc/smg/api-key"
    assert "api-key" not in kwargs["exec_start"]  # the key's file is named in the environment only


def test_gateway_rules(inventory):
    with pytest.raises(SiteError) as error:
        load_site(_gateway_site(inventory, {"serving_host": "127.0.0.1"}, name="loop.py"))
    assert "cannot be reached by the gateways group" in str(error.value)


def test_replicas_switch_through_the_gateway_one_at_a_time(inventory):
    site = load_site(_gateway_site(inventory))
    command, behind = serving_role.switch_command(site.hosts["b"], site.hosts, "inference-engine.service", "/c", "/e")
    assert behind == ["http://gw:8000"]
    assert command.startswith(
        "/usr/local/libexec/inference-host/inference-engine-rolling"
        " /etc/inference-host/engine/inference-engine-secret-args.yaml"
        " /etc/inference-host/engine/gateway-control-plane-api-key"
        " http://10.0.0.2:30000 300 kimi-k2.5 2 /var/lib/inference-host/serving/"
        "inference-engine.restart-pending http://gw:8000 -- "
    )
    assert command.endswith("inference-engine-switch inference-engine.service /c /e")
    alone = load_site(inventory.groups("alone.py", gpu_nodes=[("a", {"gpu_count": 8})]))
    assert serving_role.switch_command(alone.hosts["a"], alone.hosts, "u", "/c", "/e")[1] == []


def test_tensor_parallel_group_has_one_worker_rank_0(inventory):
    site = load_site(_tp_inventory(inventory))
    assert [worker_url(n) for n in replicas(site.hosts)] == ["http://127.0.0.1:30000"]


def _answer(status: int, body: str = "") -> HttpAnswer:
    return HttpAnswer(status, 0.1, body)


EXPECTED = ["http://127.0.0.1:31001", "http://127.0.0.1:31002"]


def test_verdict_on_smgs_recorded_answer_with_one_replica_down():
    verdict = gateway_health.judge(_answer(200, (DATA / "workers-one-down.json").read_text()), _answer(200), EXPECTED)
    assert verdict.status == "DEGRADED" and verdict.down == ("http://127.0.0.1:31002",)
    assert "1 of 2 replicas" in verdict.detail and "status not_ready" in verdict.detail


def test_verdict_healthy_failed_and_missing():
    workers = json.loads((DATA / "workers-one-down.json").read_text())
    for worker in workers["workers"]:
        worker.update(is_healthy=True, status="ready")
    healthy = gateway_health.judge(_answer(200, json.dumps(workers)), _answer(200), EXPECTED)
    assert healthy.status == "HEALTHY"
    assert gateway_health.judge(_answer(200, json.dumps(workers)), _answer(0), EXPECTED).status == "FAILED"
    missing = gateway_health.judge(_answer(200, json.dumps(workers)), _answer(200), EXPECTED + ["http://x:1"])
    assert missing.status == "DEGRADED" and "http://x:1 (not registered at the gateway)" in missing.detail


def test_benchmark_through_the_gateway_or_per_replica(inventory):
    from checks import bench

    path = str(_gateway_site(inventory, name="bench.py"))
    per_replica = bench._target(bench._arguments(["--inventory", path, "--host", "b"]))
    assert "base_url" not in per_replica and per_replica["name"] == "b"
    through = bench._target(bench._arguments(["--inventory", path, "--host", "b", "--through-gateway"]))
    assert through["base_url"] == "http://gw:8000" and through["label_host"] == "gw (gateway, from b)"
    with pytest.raises(SiteError) as error:
        bench._target(bench._arguments(["--inventory", path, "--through-gateway", "nope"]))
    assert "--through-gateway 'nope' is no host of the gateways group; expected one of: gw" in str(error.value)


@pytest.mark.skipif(not __import__("shutil").which("systemd-analyze"), reason="systemd-analyze is not installed")
def test_gateway_unit_passes_systemd_analyze_verify(inventory, tmp_path):
    from roles.shared import templates
    from tests.unit import systemd_verify

    site = load_site(_gateway_site(inventory, name="verify.py"))
    kwargs = dict((path, kw) for path, _, _, kw in gateway_templates(site.hosts["gw"], site.hosts))
    unit = templates.render("roles/gateway/templates/smg.service.j2", **kwargs["/etc/systemd/system/smg.service"])
    assert "Environment=INFERENCE_HOST_GATEWAY_KEY_FILE=/etc/smg/api-key" in unit
    assert systemd_verify.verify({"/etc/systemd/system/smg.service": unit}, tmp_path) == []


def test_health_expectations_know_the_rank(inventory):
    from checks.expectations import Expectations

    site = load_site(_tp_inventory(inventory))
    assert [Expectations.from_site(site, n).node_rank for n in ("node-a", "node-b")] == [0, 1]
    replicas_site = load_site(inventory.groups("r.py", gpu_nodes=[("a", {"gpu_count": 8}), ("b", {"gpu_count": 8})]))
    assert Expectations.from_site(replicas_site, "b").node_rank == 0


def test_smg_launch_fails_closed_without_the_key(tmp_path):
    import subprocess
    import sys

    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(PROJECT_ROOT), undefined=jinja2.StrictUndefined)
    text = env.get_template("roles/gateway/templates/smg-launch.j2").render(
        version="1.13.0", key_required=True, control_plane_key=False, tenant_keys=False, drain_settle_secs=300
    )
    # smg is not installed here: a stand-in module stops before launching anything.
    (tmp_path / "smg").mkdir()
    (tmp_path / "smg" / "__init__.py").write_text("")
    (tmp_path / "smg" / "launch_router.py").write_text(
        "class Args:\n    def __init__(self, argv):\n        self.argv = argv\n"
        "def parse_router_args(a):\n    return Args(a)\n"
        "def launch_router(a):\n    print('LAUNCH', a.argv, 'settle', a.drain_settle_secs)\n"
    )
    script = tmp_path / "smg-launch"
    script.write_text(text)
    run = subprocess.run(
        [sys.executable, str(script), "--port", "1"],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(tmp_path), "INFERENCE_HOST_GATEWAY_KEY_FILE": str(tmp_path / "none")},
    )
    assert run.returncode == 1 and "refusing to serve without it" in run.stderr and "LAUNCH" not in run.stdout
    (tmp_path / "creds").mkdir()
    (tmp_path / "creds" / "api-key").write_text("k\n")
    run = subprocess.run(
        [sys.executable, str(script), "--port", "1"],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(tmp_path), "INFERENCE_HOST_GATEWAY_KEY_FILE": str(tmp_path / "creds" / "api-key")},
    )
    assert run.returncode == 0 and "LAUNCH ['--port', '1', '--api-key', 'k'] settle 300" in run.stdout


def smg_launch_with_a_fake_smg(tmp_path, **render_args) -> tuple[list[str], dict[str, str]]:
    """smg-launch rendered with render_args beside a fake `smg` package whose launch_router prints
    the argv it got ("LAUNCH [...]"), and the client key in a file: (the command, its environment)."""
    import sys

    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(PROJECT_ROOT), undefined=jinja2.StrictUndefined)
    text = env.get_template("roles/gateway/templates/smg-launch.j2").render(
        version="1.13.0", key_required=True, drain_settle_secs=5, **render_args
    )
    (tmp_path / "smg").mkdir()
    (tmp_path / "smg" / "__init__.py").write_text("")
    (tmp_path / "smg" / "launch_router.py").write_text(
        "class Args:\n    def __init__(self, argv):\n        self.argv = argv\n"
        "def parse_router_args(a):\n    return Args(a)\n"
        "def launch_router(a):\n    print('LAUNCH', a.argv)\n"
    )
    (tmp_path / "smg-launch").write_text(text)
    (tmp_path / "api-key").write_text("client\n")
    env_vars = {"PYTHONPATH": str(tmp_path), "INFERENCE_HOST_GATEWAY_KEY_FILE": str(tmp_path / "api-key")}
    return [sys.executable, str(tmp_path / "smg-launch"), "--port", "1"], env_vars


def test_smg_launch_adds_the_control_plane_key_from_its_file(tmp_path):
    """The control-plane key as smg 1.13.0's id:name:role:key (role admin), read from its 0600
    file in-process; a missing file stops it, never serving with the control plane on the client key."""
    import subprocess

    command, env_vars = smg_launch_with_a_fake_smg(tmp_path, control_plane_key=True, tenant_keys=False)
    env_vars["INFERENCE_HOST_GATEWAY_CONTROL_PLANE_KEY_FILE"] = str(tmp_path / "control")
    run = subprocess.run(command, capture_output=True, text=True, env=env_vars)
    assert run.returncode == 1 and "control-plane key file cannot be read" in run.stderr and "LAUNCH" not in run.stdout
    (tmp_path / "control").write_text("cp\n")
    run = subprocess.run(command, capture_output=True, text=True, env=env_vars)
    assert run.returncode == 0, run.stderr
    assert (
        "LAUNCH ['--port', '1', '--api-key', 'client', '--control-plane-api-keys',"
        " 'inference-host:inference-host deploy:admin:cp']" in run.stdout
    )


def test_tensor_parallel_across_nodes_is_refused_for_a_vllm_stack(inventory):
    """Only SGLang's multi-node flags are rendered; two vLLM nodes would serve two unrelated
    single-node servers, so the inventory is refused before any host is touched."""
    inventory.edit_stack("active: sglang-0.5.9-cu128", "active: vllm-0.16.0-cu128")
    with pytest.raises(SiteError) as error:
        load_site(_tp_inventory(inventory))
    assert "serving_topology = 'tensor_parallel' across 2 gpu nodes needs an SGLang stack" in str(error.value)
    assert "vllm-0.16.0-cu128 is vllm" in str(error.value)


def test_a_restart_left_pending_runs_the_switch_with_nothing_changed():
    """inference-engine-rolling's exits 5 and 6 leave the pending file: the next deploy, in
    which no setting changes (the earlier one wrote them), must still run the switch."""
    same = {"linked": "/opt/e", "state": "active", "target": "/opt/e", "operations": ()}
    assert not serving_role.Switching(**same)()
    assert serving_role.Switching(**same, pending=True)()
    assert (
        serving_role.restart_pending_file("inference-engine")
        == "/var/lib/inference-host/serving/inference-engine.restart-pending"
    )
