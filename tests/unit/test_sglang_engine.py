"""roles/serving without a host: captured CLIs, rendered command line and unit. (The captured
CLIs and the patch queue against the real wheels from PyPI: tests/lab/test_sglang_release.py.)"""

from __future__ import annotations

import dataclasses
import shutil

import pytest

from roles.serving import command as cmd
from roles.shared import templates
from roles.site import PROJECT_ROOT, SiteError, load_site, load_stack
from tests.unit import systemd_verify

STACK = load_stack(PROJECT_ROOT / "inventory" / "stack.yml")
PROD = load_site(PROJECT_ROOT / "inventory" / "prod.py")
GPU_HOST = PROD.group("gpu_nodes")[0]


@pytest.mark.parametrize("stack_id", sorted(i for i, s in STACK.stacks.items() if s.engine == "sglang"))
def test_rendered_command_uses_only_real_flags(stack_id):
    stack = STACK.stacks[stack_id]
    host = dataclasses.replace(
        GPU_HOST,
        serving=GPU_HOST.serving.model_copy(
            update={
                "cuda_graph_max_bs": 160,
                "max_running_requests": 64,
                "chunked_prefill_size": 8192,
                "speculative": {"draft_model_path": "/models/eagle3"},
            }
        ),
    )
    args = cmd.server_arguments(host, PROD.hosts, stack)
    assert cmd.unknown_flags(args, stack.sglang) == []
    assert args[args.index("--tp-size") + 1] == str(GPU_HOST.gpu.count)
    assert "--config" in args  # the API key is in the --config file, not here
    assert not any("api-key" in a for a in args)
    assert args[args.index("--speculative-algorithm") + 1] == "EAGLE3"


def test_cuda_graph_flag_is_spelled_per_release():
    host = dataclasses.replace(GPU_HOST, serving=GPU_HOST.serving.model_copy(update={"cuda_graph_max_bs": 96}))
    old = cmd.server_arguments(host, PROD.hosts, STACK.stacks["sglang-0.5.9-cu128"])
    new = cmd.server_arguments(host, PROD.hosts, STACK.stacks["sglang-0.5.23-cu130"])
    assert "--cuda-graph-max-bs" in old and "--cuda-graph-max-bs-decode" not in old
    assert "--cuda-graph-max-bs-decode" in new and "--cuda-graph-max-bs" not in new


def test_a_renamed_flag_fails_validation():
    problems = cmd.unknown_flags(["--cuda-graph-max-bs", "8"], "0.5.23")
    assert problems == ["--cuda-graph-max-bs is not an option of sglang 0.5.23"]
    assert cmd.unknown_flags(["--speculative-algorithm", "MEDUSA"], "0.5.9")


def test_inventory_with_an_unknown_flag_stops_at_validation(tmp_path):
    inventory = tmp_path / "inventory"
    inventory.mkdir()
    shutil.copy(PROJECT_ROOT / "inventory/prod.py", inventory / "prod.py")
    shutil.copy(PROJECT_ROOT / "inventory/secrets.vault.yml", inventory / "secrets.vault.yml")
    # A stack whose release has no captured CLI cannot be validated: it must say so.
    text = (PROJECT_ROOT / "inventory/stack.yml").read_text().replace('sglang: "0.5.9"', 'sglang: "0.5.8"')
    (inventory / "stack.yml").write_text(text)
    with pytest.raises(SiteError) as error:
        load_site(inventory / "prod.py")
    assert "no captured command line for sglang 0.5.8" in str(error.value)


def test_multi_node_flags_come_from_the_inventory():
    head = dataclasses.replace(GPU_HOST, serving=GPU_HOST.serving.model_copy(update={"topology": "tensor_parallel"}))
    second = dataclasses.replace(head, name="node2.example.internal")
    hosts = {head.name: head, second.name: second}
    args = cmd.server_arguments(second, hosts, STACK.active)
    assert args[args.index("--nnodes") + 1] == "2"
    assert args[args.index("--tp-size") + 1] == str(2 * GPU_HOST.gpu.count)
    assert args[args.index("--node-rank") + 1] == "1"
    assert args[args.index("--dist-init-addr") + 1] == f"{GPU_HOST.name}:50000"
    assert "--nnodes" not in cmd.server_arguments(GPU_HOST, {GPU_HOST.name: GPU_HOST}, STACK.active)


def _render(name: str, **kwargs) -> str:
    return templates.render(f"roles/serving/templates/{name}", **kwargs)


def _unit_kwargs(host=GPU_HOST, stack=STACK.active):
    from roles import serving

    return serving.unit_text_kwargs(host, stack, PROD)


def test_unit_has_the_required_settings():
    text = _render("inference-engine.service.j2", **_unit_kwargs())
    from roles import serving

    env = serving.config_dir(GPU_HOST, STACK.active, PROD)
    for line in (
        "Type=exec",
        "User=inference",
        "Group=inference",
        "WorkingDirectory=/var/lib/inference-engine",
        "ReadWritePaths=/var/lib/inference-engine /var/log/inference-engine",
        f"EnvironmentFile={env}/inference-engine.env",
        f"ExecStart={env}/launch",
        "TimeoutStartSec=1200",
        "Restart=on-failure",
        "LimitMEMLOCK=infinity",
        "LimitNOFILE=1048576",
        "After=network-online.target nvidia-persistenced.service",
        "StartLimitBurst=3",
        "ExecStartPost=/usr/local/libexec/inference-host/inference-engine-wait-ready"
        " http://127.0.0.1:30000/health_generate 1100",
    ):
        assert line in text.splitlines() or any(row.startswith(line) for row in text.splitlines()), line
    assert (
        "ExecStartPre=+/usr/local/libexec/inference-host/inference-engine-cleanup inference inference-engine.service"
        in text
    )
    assert (
        "ExecStopPost=+/usr/local/libexec/inference-host/inference-engine-cleanup inference inference-engine.service"
        in text
    )


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze is not installed")
def test_unit_passes_systemd_analyze_verify(tmp_path):
    unit = _render("inference-engine.service.j2", **_unit_kwargs())
    assert systemd_verify.verify({"/etc/systemd/system/inference-engine.service": unit}, tmp_path) == []


def test_env_file_nccl_settings():
    from roles import serving

    text = _render("inference-engine.env.j2", **serving.env_file_kwargs(GPU_HOST, STACK.active))
    assert "NCCL_P2P_LEVEL=SYS" in text and "NCCL_IB_DISABLE=1" in text and "NCCL_DEBUG=WARN" in text
    assert "SGLANG_ENABLE_JIT_DEEPGEMM=0" in text.splitlines() and "NCCL_P2P_DISABLE" not in text
    assert "SGL_ENABLE_JIT_DEEPGEMM" not in text
    off = dataclasses.replace(
        GPU_HOST,
        nccl=GPU_HOST.nccl.model_copy(
            update={"p2p_level": "off", "min_nchannels": 8, "debug": "INFO", "debug_subsys": "INIT,P2P"}
        ),
    )
    text = _render("inference-engine.env.j2", **serving.env_file_kwargs(off, STACK.active))
    assert "NCCL_P2P_DISABLE=1" in text and "NCCL_P2P_LEVEL" not in text
    assert "NCCL_MIN_NCHANNELS=8" in text and "NCCL_DEBUG_SUBSYS=INIT,P2P" in text
