"""roles/serving's unit and environment, rendered without a host: per-release settings read
against the real wheels, the start limit, the probe URL, and the sandbox as systemd scores it."""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess

import pytest

from roles import serving
from roles.shared import templates
from roles.site import PROJECT_ROOT, load_site
from tests.unit import upstream_sources as upstream

PROD = load_site(PROJECT_ROOT / "inventory" / "prod.py")
HOST = PROD.group("gpu_nodes")[0]
STACKS = PROD.stack.stacks


def _render(name: str, **kwargs) -> str:
    return templates.render(f"roles/serving/templates/{name}", **kwargs)


def _with_serving(**changes):
    return dataclasses.replace(HOST, serving=HOST.serving.model_copy(update=changes))


def _wheel_text(version: str, path: str) -> str:
    return upstream.release_text("sglang", version, path)


@pytest.mark.parametrize("stack_id", sorted(i for i, s in STACKS.items() if s.engine == "sglang"))
def test_env_file_names_exist_in_the_release(stack_id):
    """Every SGLANG_* variable rendered for a release is one its srt/environ.py declares
    (the patched opt-in is checked against the patch that adds it)."""
    stack = STACKS[stack_id]
    host = _with_serving(custom_all_reduce_pcie=True)
    text = _render("inference-engine.env.j2", **serving.env_file_kwargs(host, stack))
    names = re.findall(r"^(SGL\w*)=", text, re.M)
    assert "SGLANG_ENABLE_JIT_DEEPGEMM" in names and "SGL_ENABLE_JIT_DEEPGEMM" not in names
    environ = _wheel_text(stack.sglang, "sglang/srt/environ.py")
    patches = "".join(
        p.read_text() for p in (PROJECT_ROOT / "roles/engine_envs/patches/sglang" / stack.sglang).glob("*.patch")
    )
    for name in names:
        assert re.search(rf"^\s+{name} = Env", environ, re.M) or f'"{name}"' in patches, name


def test_pcie_allreduce_is_one_setting_rendered_per_release():
    assert serving.pcie_allreduce_env("0.5.9") == {"SGLANG_CUSTOM_AR_ALLOW_PCIE": "1"}
    assert serving.pcie_allreduce_env("0.5.23") == {"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1"}
    assert serving.pcie_allreduce_env("0.5.10") == {}  # neither patch nor upstream support
    source = _wheel_text("0.5.23", "sglang/srt/distributed/device_communicators/pcie_ipc_ar.py")
    assert "_SUPPORTED_WORLD_SIZES = (2, 4, 8)" in source
    off = _render("inference-engine.env.j2", **serving.env_file_kwargs(HOST, STACKS["sglang-0.5.23-cu130"]))
    assert "PCIE" not in off and "CUSTOM_AR" not in off  # off by default


@pytest.mark.parametrize("stack_id", sorted(STACKS))
def test_torch_compiles_into_the_units_writable_home(stack_id):
    """torch.compile's cache (and the Triton kernels it generates) defaults to
    /tmp/torchinductor_<user> (torch/_inductor/runtime/cache_dir_utils.py), which PrivateTmp=yes
    empties at every start: the environment file moves it into the data directory, a path the
    unit may write, so a restart finds what the previous start compiled."""
    stack = STACKS[stack_id]
    text = _render("inference-engine.env.j2", **serving.env_file_kwargs(HOST, stack))
    assert re.findall(r"^TORCHINDUCTOR_CACHE_DIR=(.*)$", text, re.M) == [f"{HOST.base.data_dir}/.cache/torchinductor"]
    unit = _render("inference-engine.service.j2", **serving.unit_text_kwargs(HOST, stack, PROD))
    assert f"ReadWritePaths={HOST.base.data_dir} {HOST.base.log_dir}\n" in unit and "PrivateTmp=yes" in unit


@pytest.mark.parametrize(
    ("bind", "url"),
    [
        ("127.0.0.1", "http://127.0.0.1:30000/health_generate"),
        ("0.0.0.0", "http://127.0.0.1:30000/health_generate"),
        ("::1", "http://[::1]:30000/health_generate"),
        ("::", "http://[::1]:30000/health_generate"),
        ("10.0.0.5", "http://10.0.0.5:30000/health_generate"),
    ],
)
def test_probe_url(bind, url):
    assert serving.probe_url(_with_serving(host=bind)) == url


def test_start_limit_stops_a_loop_of_the_slowest_failing_starts():
    """Each start fails only when TimeoutStartSec runs out, the next comes RestartSec later:
    systemd must refuse the (burst + 1)-th within the interval."""
    text = _render("inference-engine.service.j2", **serving.unit_text_kwargs(HOST, PROD.stack.active, PROD))
    value = dict(re.findall(r"^(\w+)=(.*)$", text, re.M))
    start, restart = int(value["TimeoutStartSec"]), int(value["RestartSec"])
    burst, interval = int(value["StartLimitBurst"]), int(value["StartLimitIntervalSec"])
    assert HOST.serving.ready_timeout < start
    attempts = [n * (start + restart) for n in range(burst + 1)]
    assert attempts[burst] - attempts[0] < interval


def test_unit_starts_after_the_uvm_device_nodes():
    """NoNewPrivileges=yes keeps libcuda from running the setuid nvidia-modprobe that would make
    /dev/nvidia-uvm: the engine starts only after the unit roles/nvidia_driver installs for it."""
    from roles import nvidia_driver

    text = _render("inference-engine.service.j2", **serving.unit_text_kwargs(HOST, PROD.stack.active, PROD))
    value = {key: words.split() for key, words in re.findall(r"^(After|Wants)=(.*)$", text, re.M)}
    assert nvidia_driver.UVM_UNIT in value["After"] and nvidia_driver.UVM_UNIT in value["Wants"]
    assert "NoNewPrivileges=yes" in text.splitlines()


def test_unit_and_config_belong_to_one_release():
    old, new = STACKS["sglang-0.5.9-cu128"], STACKS["sglang-0.5.23-cu130"]
    text = _render("inference-engine.service.j2", **serving.unit_text_kwargs(HOST, old, PROD))
    env = serving.config_dir(HOST, old, PROD)
    assert env.startswith(f"/opt/inference-host/envs/{old.id}") and env.endswith("/serving")
    assert f"{env}/inference-engine.env" in text and f"{env}/launch" in text
    assert new.id not in text and "/current/" not in text
    assert serving.config_paths(HOST, old, PROD)["secret_args"] == f"{env}/inference-engine-secret-args.yaml"


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze is not installed")
def test_unit_sandbox_scores_ok_with_systemd_analyze_security(tmp_path):
    unit = tmp_path / "inference-engine.service"
    unit.write_text(_render("inference-engine.service.j2", **serving.unit_text_kwargs(HOST, PROD.stack.active, PROD)))
    result = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", "--no-pager", str(unit)], capture_output=True, text=True
    )
    score = re.search(r"Overall exposure level for inference-engine.service: ([\d.]+) (\w+)", result.stdout)
    assert score, result.stdout + result.stderr
    # 9.6 UNSAFE without the sandbox section; "OK" is systemd's band below 4.0.
    assert float(score.group(1)) < 4.0 and score.group(2) == "OK", result.stdout
    # The figure docs/engines-and-stacks.md quotes is the one measured here.
    doc = " ".join((PROJECT_ROOT / "docs" / "engines-and-stacks.md").read_text().split())
    quoted = re.search(r"scores the rendered unit ([\d.]+) \(OK\)", doc)
    assert quoted and quoted.group(1) == score.group(1), f"the document quotes {quoted and quoted.group(1)}"
    for line in (
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "PrivateTmp=yes",
        "ProtectHome=yes",
        f"ReadWritePaths={HOST.base.data_dir} {HOST.base.log_dir}",
    ):
        assert line in unit.read_text().splitlines()


def test_the_health_check_reads_the_tensor_parallel_size_of_the_launcher_the_deploy_writes():
    """The service check's parser on the launcher exactly as the deploy renders it, per engine."""
    from checks import service_parsers
    from roles.shared import templates

    for stack in (PROD.stack.active, PROD.stack.stacks["vllm-0.16.0-cu128"]):
        path, template, _, kwargs = serving.release_templates(HOST, stack, PROD)[1]
        assert path.endswith("/serving/launch")
        found = service_parsers.parse_launcher_parallelism(templates.render(template, **kwargs))
        assert (found.tp_size, found.nnodes) == (HOST.gpu.count, 1), stack.id
        assert found.flag == ("--tensor-parallel-size" if stack.engine == "vllm" else "--tp-size")
