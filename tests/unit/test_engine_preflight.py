"""The engine preflight without an engine: the gate's command line, its place in the deploy, the
program's verdict logic, the GPU answers, the engine diff and the stack overrides that fixed
sglang 0.5.9's cuDNN. tests/lab/test_engine_preflight.py runs the program in the real stacks."""

from __future__ import annotations

import importlib.util
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from roles import render, serving
from roles.serving import preflight
from roles.serving.command import server_arguments
from roles.site import SiteError, load_site, load_stack
from roles.site import lock as stack_lock
from tests.unit.conftest import PROJECT_ROOT

PROD = load_site(PROJECT_ROOT / "inventory" / "prod.py")
LAB = load_site(PROJECT_ROOT / "inventory" / "lab.py")
HOST = PROD.group("gpu_nodes")[0]
LAB_HOST = LAB.group("gpu_nodes")[0]
SPEC = importlib.util.spec_from_file_location("engine_preflight", serving.PREFLIGHT_SOURCE)
program = importlib.util.module_from_spec(SPEC)
sys.modules["engine_preflight"] = program  # its dataclasses look their module up
SPEC.loader.exec_module(program)
answers = program._gpu_answers()  # preflight_gpu_answers.py, beside it here (never on a host)


def test_the_gate_runs_the_rendered_arguments_in_the_new_environment_as_the_service():
    command = shlex.split(serving.preflight_command(HOST, PROD.stack.active, PROD))
    paths = serving.config_paths(HOST, PROD.stack.active, PROD)
    assert command[:2] == ["systemd-run", "--quiet"] and "--wait" in command and "--pipe" in command
    assert f"User={HOST.base.service_user}" in command and f"EnvironmentFile={paths['env_file']}" in command
    engine = command.index(serving.PREFLIGHT_SCRIPT)
    assert command[engine - 1] == f"{serving.env_dir(HOST, PROD.stack.active, PROD)}/bin/python"
    # Exactly what the unit's launcher runs after `-m sglang.launch_server`.
    assert command[command.index("--", engine) + 1 :] == server_arguments(
        HOST, PROD.hosts, PROD.stack.active, secret_args_file=paths["secret_args"]
    )
    origin = command[command.index("--origin") + 1]
    assert origin.startswith("inventory/prod.py (host ") and "inventory/locks/sglang-0.5.9-cu128.txt" in origin


def test_the_lab_runs_vllms_preflight_and_says_why_not_sglangs():
    assert serving.preflight_command(LAB_HOST, LAB.stack.active, LAB) is None  # no torch in the subset
    vllm = LAB.stack.stacks["vllm-0.16.0-cu128"]
    assert "--engine vllm" in serving.preflight_command(LAB_HOST, vllm, LAB)


def test_the_preview_writes_the_gate_beside_the_files(tmp_path):
    written = render.render(PROD, tmp_path)[HOST.name]
    commands = tmp_path / HOST.name / render.COMMANDS  # the gate, in the deploy's order
    assert commands in written
    assert "\nsystemd-run --quiet --wait --pipe --collect --service-type=exec --unit=inference-host-preflight-" in (
        commands.read_text()
    )
    assert (
        tmp_path / HOST.name / serving.PREFLIGHT_SCRIPT.lstrip("/")
    ).read_text() == serving.PREFLIGHT_SOURCE.read_text()


def test_explicit_values_are_told_from_defaults():
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--tp-size", type=int, default=1)
    parser.add_argument("--max-running-requests", type=int, default=None)
    parser.add_argument("--enable-metrics", action="store_true")
    assert program._explicit(parser, ["--tp-size", "8", "--enable-metrics"]) == {"tp_size": 8, "enable_metrics": True}


def test_the_verdict_prints_the_engines_choices_and_refuses_a_changed_explicit_value(capsys):
    resolved = {"max_running_requests": 48, "tp_size": 8, "disable_overlap_schedule": True, "api_key": "k"}
    defaults = {"max_running_requests": None, "tp_size": 1, "disable_overlap_schedule": False, "api_key": None}
    chose = program._judge("sglang", resolved, defaults, {"tp_size": 8, "api_key": "k"}, ["check_server_args"], {})
    assert chose["overridden"] == {}
    assert set(chose["chosen"]) == {"max_running_requests", "disable_overlap_schedule"}
    changed = program._judge("sglang", resolved, defaults, {"max_running_requests": 64}, ["check_server_args"], {})
    assert changed["overridden"] == {"max_running_requests": {"given": 64, "engine": 48}}
    program._print({"engine": "sglang", "ok": False, **changed}, "inventory/x.py (host h)")
    err = capsys.readouterr().err
    assert "PREFLIGHT REFUSED: the command line sets max_running_requests = 64, SGLang would run with 48" in err
    assert "inventory/x.py (host h)" in err


def test_secrets_never_reach_the_report():
    shown = program._redacted(
        {
            "resolved": {
                "api_key": "s3cret",
                "admin_api_key": "s3cret",
                "hf_token": "t",
                "max_total_tokens": 4096,
                "ssl_keyfile_password": "p",
            }
        }
    )
    assert shown["resolved"] == {
        "api_key": "***",
        "admin_api_key": "***",
        "hf_token": "***",
        "max_total_tokens": 4096,
        "ssl_keyfile_password": "***",
    }
    planted = program._redacted({"resolved": {"api_key": "s3cret"}}, "")
    assert "s3cret" not in json.dumps(planted)


def test_the_engines_message_loses_its_colours_and_names_where_it_was_raised():
    try:
        raise RuntimeError("\x1b[91m\x1b[1mCRITICAL WARNING: PyTorch 2.9.1 & CuDNN\x1b[0m")
    except RuntimeError as error:
        message = program._engine_message(error)
    assert message.startswith("RuntimeError: CRITICAL WARNING: PyTorch 2.9.1 & CuDNN")
    assert "raised at" in message and "\x1b" not in message


def test_nvidia_smi_answers_as_the_inventorys_gpus(tmp_path):
    script = tmp_path / "nvidia-smi"
    script.write_text(
        answers.NVIDIA_SMI_ANSWERS
        % {"count": 8, "name": "NVIDIA RTX PRO 6000 Blackwell Server Edition", "memory": 98304, "cap": "12.0"}
    )
    # sglang's get_nvgpu_memory_capacity and get_device_sm_nvidia_smi (srt/utils/common.py).
    memory = subprocess.run(
        ["sh", str(script), "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert memory == ["98304"] * 8
    capability = subprocess.run(
        ["sh", str(script), "--query-gpu=compute_cap", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert capability == ["12.0"] * 8
    refused = subprocess.run(["sh", str(script), "-q"], capture_output=True, text=True)
    assert refused.returncode == 2 and "answers --query-gpu only" in refused.stderr


def test_gpu_answers_come_from_the_inventory():
    """The card's memory as nvidia-smi reports it (SGLang's default fraction reads it), not 96 x 1024."""
    assert preflight.gpu_answers(HOST) == {
        "count": 8,
        "name": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
        "memory_mib": 97887,
        "capability": [12, 0],
    }


def test_the_rendered_environment_file_reaches_the_engine():
    values = preflight.env_file_values(serving.env_file_text(HOST, PROD.stack.active, PROD))
    assert values["NCCL_P2P_LEVEL"] == HOST.nccl.p2p_level and "NCCL_IB_DISABLE" in values
    assert not any(key.startswith("#") for key in values)


def test_the_preview_swaps_in_the_local_model_folders(tmp_path):
    args = preflight.render_arguments(HOST, PROD, PROD.stack.active, tmp_path / "m", None, tmp_path / "s.yaml")
    assert args[args.index("--model-path") + 1] == str(tmp_path / "m")
    assert args[args.index("--config") + 1] == str(tmp_path / "s.yaml")


def test_the_engine_diff_shows_what_changes_and_not_new_options_at_their_defaults():
    before = {
        "stack": "a",
        "host": "h",
        "ok": True,
        "resolved": {"max_running_requests": None, "random_seed": 1, "old_option": 3, "same": 1},
        "chosen": {},
        "given": [],
        "watched": {"max_running_requests": None},
    }
    after = {
        "stack": "b",
        "host": "h",
        "ok": True,
        "resolved": {"max_running_requests": 48, "random_seed": 2, "new_default": False, "new_set": 8192, "same": 1},
        "chosen": {"new_set": {"default": None, "engine": 8192}, "max_running_requests": {}},
        "given": [],
        "watched": {"max_running_requests": 48},
    }
    assert preflight.diff(before, after) == [("max_running_requests", None, 48), ("new_set", "(no such setting)", 8192)]
    assert "max_running_requests" in preflight.diff_text(before, after)


def test_an_unknown_stack_or_missing_model_config_is_one_line(tmp_path, capsys):
    assert render.main(["inventory/prod.py", "--engine-diff", "sglang-9.9", "--model-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--engine-diff sglang-9.9: no such stack in inventory/stack.yml; stacks: sglang-0.5.9-cu128" in err
    assert render.main(["inventory/prod.py", "--engine-diff", "sglang-0.5.23-cu130", "--model-dir", str(tmp_path)]) == 2
    assert "no config.json there" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        render.main(["inventory/prod.py", "--engine-diff", "sglang-0.5.23-cu130"])  # --model-dir missing


# --------------------------------------------------------------------------------------------
# Stack overrides (the cuDNN fix)


def test_0_5_9_overrides_torchs_cudnn_pin_with_the_reason_in_its_lock():
    stack = PROD.stack.stacks["sglang-0.5.9-cu128"]
    assert stack.override_requirements == ["nvidia-cudnn-cu12==9.16.0.29"]
    lock = PROD.stack.lock_text(stack.id)
    assert stack_lock.entries(lock)["nvidia-cudnn-cu12"] == "9.16.0.29"
    assert stack_lock.entries(lock)["torch"] == "2.9.1"
    assert f"{stack_lock.OVERRIDE_LINE}nvidia-cudnn-cu12==9.16.0.29 (sglang 0.5.9 refuses" in lock
    assert "/tmp/" not in lock  # no scratch path in `# via`: a re-lock is byte-identical


@pytest.mark.parametrize(
    "overrides, words",
    [
        ('{"nvidia-cudnn-cu12>=9.15": "why"}', "an exact requirement like nvidia-cudnn-cu12==9.16.0.29"),
        ('{"nvidia-cudnn-cu12==9.16.0.29": ""}', "the reason for the override"),
        ('["nvidia-cudnn-cu12==9.16.0.29"]', "a mapping of 'package==version' to the reason"),
    ],
)
def test_an_override_needs_an_exact_pin_and_a_reason(tmp_path, overrides, words):
    text = (PROJECT_ROOT / "inventory" / "stack.yml").read_text()
    start = text.index("    overrides:\n")
    end = text.index("\n\n", start)
    (tmp_path / "stack.yml").write_text(text[:start] + f"    overrides: {overrides}" + text[end:])
    with pytest.raises(SiteError) as caught:
        load_stack(tmp_path / "stack.yml")
    assert any(
        words in problem and "stacks.sglang-0.5.9-cu128.overrides" in problem for problem in caught.value.problems
    ), caught.value.problems


def test_stacks_without_overrides_keep_their_digest():
    """The digest adds overrides only where a stack has some: the other committed locks did
    not change when 0.5.9 got its override."""
    stack = PROD.stack.stacks["sglang-0.5.10-cu128"]
    assert stack.overrides == ()
    assert stack_lock.recorded_digest(PROD.stack.lock_text(stack.id)) == stack_lock.pins_digest(stack)


def test_an_override_the_resolution_lost_is_refused():
    from roles.engine_envs import lock as lock_command

    stack = PROD.stack.stacks["sglang-0.5.9-cu128"]
    body = PROD.stack.lock_text(stack.id).replace("nvidia-cudnn-cu12==9.16.0.29", "nvidia-cudnn-cu12==9.10.2.21")
    assert "it has 9.10.2.21" in lock_command.override_problem(stack, body)
    assert lock_command.override_problem(stack, PROD.stack.lock_text(stack.id)) is None


def test_a_relock_reads_the_committed_lock_as_preferences(tmp_path, monkeypatch):
    from roles.shared import lock_compile

    seen = {}

    def fake_compile(command, roots, what, python, fix, folder):
        seen["command"], seen["files"] = command, sorted(p.name for p in Path(folder).iterdir())
        Path(folder, "lock.txt").write_text("resolved\n")
        return ""

    monkeypatch.setattr(lock_compile, "_compile", fake_compile)
    body = lock_compile.resolve(["uv", "pip", "compile", "-"], ["a==1"], "x", "3.12", "fix", "old\n", ["b==2"])
    assert body == "resolved\n"
    assert seen["command"][-4:] == ["--overrides", "overrides.txt", "--output-file", "lock.txt"]
    assert seen["files"] == ["lock.txt", "overrides.txt"]


H200 = PROJECT_ROOT / "tests" / "unit" / "data" / "gpu" / "h200-1gpu-preflight"


def test_the_gpu_answers_have_the_shapes_a_real_gpu_gives(tmp_path):
    """The stand-in's nvidia-smi and torch answers, side by side with 1 x H200's (captured)."""
    script = tmp_path / "nvidia-smi"
    script.write_text(answers.NVIDIA_SMI_ANSWERS % {"count": 1, "name": "NVIDIA H200", "memory": 143771, "cap": "9.0"})

    def smi(*args: str) -> str:
        return subprocess.run(["sh", str(script), *args], capture_output=True, text=True, check=True).stdout

    assert (
        smi("--query-gpu=memory.total,compute_cap,name,index", "--format=csv,noheader")
        == (H200 / "smi-query.txt").read_text()
    )
    assert (
        smi("--query-gpu=memory.total", "--format=csv,noheader,nounits")
        == (H200 / "smi-memory-nounits.txt").read_text()
    )
    assert smi("--query-gpu=compute_cap", "--format=csv,noheader") == (H200 / "smi-cap.txt").read_text()
    real = json.loads((H200 / "torch-answers.json").read_text())
    fields = {f.name for f in answers.dataclasses.fields(answers._Properties)}
    assert fields <= set(real["properties"]), fields - set(real["properties"])  # only fields torch has


# --------------------------------------------------------------------------------------------
# The program against small stand-in engines (the real releases run in tests/lab): the start-up
# steps it runs, in the release's order, and what it asks the GPUs. Each module below copies
# only the names the program calls, with the behaviour cited beside it.

FAKE_VLLM = {
    "vllm/__init__.py": "",
    "vllm/engine/__init__.py": "",
    # 0.16.0 engine/arg_utils.py: --reasoning-parser reaches structured_outputs_config only in
    # create_engine_config ("Pass reasoning_parser into StructuredOutputsConfig").
    "vllm/engine/arg_utils.py": """
import dataclasses
from types import SimpleNamespace


@dataclasses.dataclass
class AsyncEngineArgs:
    model: str = "m"
    reasoning_parser: str = None
    structured_outputs_config: object = None

    @classmethod
    def from_cli_args(cls, args):
        return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})

    def create_engine_config(self, usage_context=None):
        if self.reasoning_parser:
            self.structured_outputs_config.reasoning_parser = self.reasoning_parser
        model = SimpleNamespace(model=self.model, dtype="bfloat16", architectures=["X"], skip_tokenizer_init=False)
        return SimpleNamespace(model_config=model, cache_config=None, parallel_config=None, scheduler_config=None,
                               structured_outputs_config=self.structured_outputs_config)
""",
    "vllm/entrypoints/__init__.py": "",
    "vllm/entrypoints/utils.py": "def cli_env_setup():\n    pass\n",
    "vllm/entrypoints/openai/__init__.py": "",
    "vllm/entrypoints/openai/cli_args.py": """
from types import SimpleNamespace


def make_arg_parser(parser):
    for flag in ("--model", "--tool-call-parser", "--tool-parser-plugin", "--reasoning-parser",
                 "--reasoning-parser-plugin", "--chat-template"):
        parser.add_argument(flag, default="m" if flag == "--model" else None)
    parser.add_argument("--enable-auto-tool-choice", action="store_true")
    parser.add_argument("--structured-outputs-config", default=SimpleNamespace(reasoning_parser=""))
    return parser


def validate_parsed_serve_args(args):  # 0.16.0 cli_args.py, its parser check
    if args.enable_auto_tool_choice and not args.tool_call_parser:
        raise TypeError("Error: --enable-auto-tool-choice requires --tool-call-parser")
""",
    # 0.16.0 tool_parsers/abstract_tool_parser.py, reasoning/abs_reasoning_parsers.py: the
    # registries, their plugin import and the reasoning lookup's message.
    "vllm/tool_parsers/__init__.py": """
import runpy


class ToolParserManager:
    registered = ["hermes", "kimi_k2"]

    @classmethod
    def list_registered(cls):
        return sorted(cls.registered)

    @classmethod
    def import_tool_parser(cls, plugin_path):
        runpy.run_path(plugin_path, init_globals={"ToolParserManager": cls})
""",
    "vllm/reasoning/__init__.py": """
import runpy

from vllm.tool_parsers import ToolParserManager


class ReasoningParserManager(ToolParserManager):
    registered = ["kimi_k2"]

    @classmethod
    def import_reasoning_parser(cls, plugin_path):
        runpy.run_path(plugin_path, init_globals={"ReasoningParserManager": cls})

    @classmethod
    def get_reasoning_parser(cls, name):
        if name in cls.registered:
            return object
        registered = ", ".join(cls.list_registered())
        raise KeyError(f"Reasoning parser '{name}' not found. Available parsers: {registered}")
""",
    # 0.16.0 api_server.py: setup_server imports the parser plugins, then runs this.
    "vllm/entrypoints/openai/api_server.py": """
from vllm.reasoning import ReasoningParserManager
from vllm.tool_parsers import ToolParserManager


def validate_api_server_args(args):
    valid_tool_parses = ToolParserManager.list_registered()
    if args.enable_auto_tool_choice and args.tool_call_parser not in valid_tool_parses:
        raise KeyError(
            f"invalid tool call parser: {args.tool_call_parser} "
            f"(chose from {{ {','.join(valid_tool_parses)} }})"
        )
    valid_reasoning_parsers = ReasoningParserManager.list_registered()
    if (
        reasoning_parser := args.structured_outputs_config.reasoning_parser
    ) and reasoning_parser not in valid_reasoning_parsers:
        raise KeyError(
            f"invalid reasoning parser: {reasoning_parser} "
            f"(chose from {{ {','.join(valid_reasoning_parsers)} }})"
        )
""",
    # 0.16.0 v1/engine/async_llm.py builds InputProcessor before the engine core; its renderer
    # loads the tokenizer from the weights' folder (here: fake_hf below, as transformers would).
    "vllm/v1/__init__.py": "",
    "vllm/v1/engine/__init__.py": "",
    "vllm/v1/engine/input_processor.py": """
from fake_hf import Tokenizer


class InputProcessor:
    def __init__(self, vllm_config):
        self.tokenizer = Tokenizer(vllm_config.model_config.model)

    def get_tokenizer(self):
        return self.tokenizer
""",
    "vllm/entrypoints/chat_utils.py": """
def load_chat_template(chat_template):  # 0.16.0: None stays None, a path is read
    if chat_template is None:
        return None
    with open(chat_template) as f:
        return f.read()
""",
    "vllm/renderers/__init__.py": "",
    "vllm/renderers/hf.py": """
def resolve_chat_template(tokenizer, chat_template, tools, *, model_config):
    return chat_template if chat_template is not None else tokenizer.chat_template
""",
    "vllm/usage/__init__.py": "",
    "vllm/usage/usage_lib.py": "class UsageContext:\n    OPENAI_API_SERVER = 'openai-api-server'\n",
    "vllm/utils/__init__.py": "",
    "vllm/utils/argparse_utils.py": (
        "import argparse\n\n\nclass FlexibleArgumentParser(argparse.ArgumentParser):\n    pass\n"
    ),
}

# SGLang 0.5.23's launch path in small: launch_server.py loads the plugins before it parses (a
# plugin may register a tool-call parser the argument's choices then take), engine.py
# _launch_subprocesses resolves "auto" parsers after check_server_args. The GPU questions are
# 0.5.9's ServerArgs.__post_init__ (get_device_memory_capacity -> nvidia-smi, the capability).
FAKE_SGLANG = {
    "sglang/__init__.py": "",
    "sglang/srt/__init__.py": "",
    "sglang/srt/server_args.py": """
import argparse
import dataclasses
import os
import subprocess
from types import SimpleNamespace

TOOL_CALL_PARSERS = ["kimi_k2", "qwen"]


@dataclasses.dataclass
class ServerArgs:
    model_path: str = "m"
    tool_call_parser: str = None
    gpu_memory_mib: int = None
    tokenizer_path: str = None
    tokenizer_mode: str = "auto"
    trust_remote_code: bool = False
    revision: str = None
    chat_template: str = None
    completion_template: str = None
    skip_tokenizer_init: bool = False
    mem_fraction_static: float = None

    @staticmethod
    def add_cli_args(parser):
        parser.add_argument("--model-path", default="m")
        parser.add_argument("--mem-fraction-static", type=float, default=None)
        parser.add_argument("--tool-call-parser", choices=["auto"] + TOOL_CALL_PARSERS, default=None)
        parser.add_argument("--chat-template", default=None)

    def __post_init__(self):
        self.tokenizer_path = self.tokenizer_path or self.model_path
        if self.mem_fraction_static is None:  # 0.5.9's own for a 97,887 MiB card, 8 GPUs, no drafter
            self.mem_fraction_static = round((97887 - 14848) / 97887, 3)
        if os.environ.get("FAKE_SGLANG_ASKS_GPUS"):
            import torch

            assert torch.cuda.is_available() and torch.cuda.device_count() == 8
            torch.cuda.get_device_capability()
            torch.cuda.get_device_properties(0).total_memory
            torch.cuda.mem_get_info()
            smi = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, check=True).stdout
            self.gpu_memory_mib = int(smi.split()[0])

    def check_server_args(self):
        pass

    def get_model_config(self):
        return SimpleNamespace(hf_config=None, is_multimodal=False)


def prepare_server_args(argv):
    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    return ServerArgs(**vars(parser.parse_args(argv)))
""",
    # 0.5.9 managers/tokenizer_manager.py and template_manager.py, the names the program calls.
    "sglang/srt/managers/__init__.py": "",
    "sglang/srt/managers/tokenizer_manager.py": """
from fake_hf import Tokenizer


def get_tokenizer(tokenizer_name, *, tokenizer_mode="auto", trust_remote_code=False, revision=None):
    return Tokenizer(tokenizer_name)


def _get_processor_wrapper(server_args):
    return Tokenizer(server_args.tokenizer_path)


def get_tokenizer_from_processor(processor):
    return processor
""",
    "sglang/srt/managers/template_manager.py": """
class TemplateManager:
    def initialize_templates(self, tokenizer_manager, model_path, chat_template=None, completion_template=None):
        if chat_template:  # _load_jinja_template
            with open(chat_template) as f:
                tokenizer_manager.tokenizer.chat_template = f.read()
""",
    "sglang/srt/entrypoints/__init__.py": "",
    "sglang/srt/entrypoints/engine.py": """
import os

from sglang.srt import server_args


def load_plugins():
    if os.environ.get("FAKE_SGLANG_PLUGIN"):
        server_args.TOOL_CALL_PARSERS.append(os.environ["FAKE_SGLANG_PLUGIN"])


def resolve_auto_parsers(args):
    if args.tool_call_parser == "auto":
        args.tool_call_parser = "kimi_k2"  # detected from the chat template
""",
}

# transformers' AutoTokenizer in small: reads tokenizer_config.json from the weights' folder
# (OSError when it is not there, as transformers says it), its chat_template rendered by jinja2's
# ImmutableSandboxedEnvironment as apply_chat_template does.
FAKE_HF = {
    "fake_hf.py": """
import json
import os

from jinja2.sandbox import ImmutableSandboxedEnvironment


class Tokenizer:
    def __init__(self, path):
        config = os.path.join(path, "tokenizer_config.json")
        if not os.path.isfile(config):
            raise OSError(f"Can't load tokenizer for '{path}'. Make sure '{path}' is the correct path to a"
                          " directory containing all relevant files for a PreTrainedTokenizerFast tokenizer.")
        with open(config) as f:
            self.chat_template = json.load(f).get("chat_template")
        self.name_or_path = path

    def apply_chat_template(self, messages, chat_template=None, tokenize=True, add_generation_prompt=False):
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        template = env.from_string(chat_template or self.chat_template)
        return template.render(messages=messages, add_generation_prompt=add_generation_prompt)
""",
}
TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}<|assistant|>"


def _weights(folder: Path, template: str | None = TEMPLATE) -> Path:
    """A weights folder's tokenizer files (tokenizer_config.json, with or without a template)."""
    folder.mkdir(parents=True, exist_ok=True)
    config = {"tokenizer_class": "PreTrainedTokenizerFast", **({"chat_template": template} if template else {})}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


# torch without a GPU or driver: every torch.cuda function the releases call, failing as a
# CUDA call would on a machine without one. Any call the program lets through shows up here.
FAKE_TORCH = {
    "torch/__init__.py": (
        "from . import cuda\nfrom types import SimpleNamespace\nversion = SimpleNamespace(cuda='12.8')\n"
    ),
    "torch/cuda.py": """
def _real(name):
    def call(*args, **kwargs):
        raise RuntimeError(f"a real CUDA call: torch.cuda.{name}")
    return call


for _name in ("is_available", "device_count", "current_device", "get_device_capability", "get_device_name",
              "get_device_properties", "mem_get_info", "is_initialized", "init", "set_device", "synchronize"):
    globals()[_name] = _real(_name)


def __getattr__(name):
    return _real(name)
""",
}


def _stand_ins(tmp_path: Path, *trees: dict) -> Path:
    root = tmp_path / "site"
    _weights(tmp_path / "m")  # the fakes' default model path, relative to the run's folder
    for tree in (FAKE_HF, *trees):
        for name, text in tree.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(text)
    return root


def _run(engine: str, site: Path, argv: list[str], tmp_path: Path, *options: str, **env: str):
    report = tmp_path / "report.json"
    done = subprocess.run(
        [
            sys.executable,
            str(serving.PREFLIGHT_SOURCE),
            "--engine",
            engine,
            "--report",
            str(report),
            *options,
            "--",
            *argv,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site), **env},
        cwd=tmp_path,
    )
    verdict = json.loads(report.read_text()) if report.exists() else {}
    return done, verdict


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--enable-auto-tool-choice", "--tool-call-parser", "kimi_k3"],
            "KeyError: 'invalid tool call parser: kimi_k3 (chose from { hermes,kimi_k2 })'",
        ),
        # 0.16.0 refuses this one only in EngineCore, after the weights and the KV cache
        # (v1/structured_output/__init__.py); the preflight asks the same registry before the switch.
        (
            ["--reasoning-parser", "deepseek_r9"],
            "KeyError: \"Reasoning parser 'deepseek_r9' not found. Available parsers: kimi_k2\"",
        ),
    ],
)
def test_vllm_refuses_a_parser_the_release_has_not_registered(tmp_path, argv, message):
    """api_server.py's validate_api_server_args runs before the engine is built (0.16.0)."""
    done, verdict = _run("vllm", _stand_ins(tmp_path, FAKE_VLLM), argv, tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert message in done.stderr and message in verdict["refusal"]


def test_vllm_imports_the_parser_plugin_before_it_checks_the_parser(tmp_path):
    plugin = tmp_path / "site_tool_parser.py"
    plugin.write_text("ToolParserManager.registered.append('site_parser')\n")
    argv = ["--enable-auto-tool-choice", "--tool-call-parser", "site_parser", "--tool-parser-plugin", str(plugin)]
    done, verdict = _run("vllm", _stand_ins(tmp_path, FAKE_VLLM), argv, tmp_path)
    assert done.returncode == 0, done.stderr
    assert verdict["steps"] == [
        "parse_args",
        "validate_parsed_serve_args",
        "validate_api_server_args",
        "AsyncEngineArgs.from_cli_args",
        "create_engine_config",
        "InputProcessor",
        "resolve_chat_template",
        "apply_chat_template",
    ]
    plugin.write_text("ReasoningParserManager.registered.append('site_reasoner')\n")
    argv = ["--reasoning-parser", "site_reasoner", "--reasoning-parser-plugin", str(plugin)]
    done, verdict = _run("vllm", _stand_ins(tmp_path, FAKE_VLLM), argv, tmp_path)
    assert done.returncode == 0, done.stderr
    assert verdict["steps"][-4] == "ReasoningParserManager.get_reasoning_parser"


def test_sglang_loads_its_plugins_before_parsing_and_resolves_auto_parsers(tmp_path):
    site = _stand_ins(tmp_path, FAKE_SGLANG)
    done, verdict = _run(
        "sglang", site, ["--tool-call-parser", "site_parser"], tmp_path, FAKE_SGLANG_PLUGIN="site_parser"
    )
    assert done.returncode == 0, done.stderr  # the release accepts the plugin's parser
    assert verdict["steps"][:2] == ["load_plugins", "prepare_server_args"]
    done, verdict = _run("sglang", site, ["--tool-call-parser", "auto"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert verdict["steps"][-5:] == [
        "resolve_auto_parsers",
        "get_model_config",
        "get_tokenizer",
        "TemplateManager.initialize_templates",
        "apply_chat_template",
    ]
    assert verdict["resolved"]["tool_call_parser"] == "kimi_k2"  # what the server will run with
    done, verdict = _run("sglang", site, ["--tool-call-parser", "site_parser"], tmp_path)
    assert done.returncode == 1 and "invalid choice: 'site_parser'" in done.stderr  # no such plugin


def test_the_releases_own_fraction_is_shown_beside_the_rendered_one(tmp_path):
    """The same command line without --mem-fraction-static, resolved by the release's own code:
    what it would choose for these GPUs (docs/serving-memory.md), not a refusal."""
    site = _stand_ins(tmp_path, FAKE_SGLANG)
    done, verdict = _run("sglang", site, ["--mem-fraction-static", "0.83"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert verdict["resolved"]["mem_fraction_static"] == 0.83
    assert verdict["engine_default"] == {"mem_fraction_static": 0.848}
    assert (
        "SGLang would choose mem_fraction_static = 0.848 for these GPUs without --mem-fraction-static;"
        " the command line sets 0.83"
    ) in done.stdout
    done, verdict = _run("sglang", site, [], tmp_path)
    assert "engine_default" not in verdict  # nothing rendered: the release's own is what runs


def test_with_gpu_answers_the_program_makes_no_cuda_call(tmp_path):
    """--answer-gpus (the preview, the tests) answers every torch.cuda question the releases ask
    before a weight loads; none reaches the driver. Without it (the host), the same questions go
    to torch.cuda itself: the program substitutes nothing there."""
    site = _stand_ins(tmp_path, FAKE_SGLANG, FAKE_TORCH)
    answers = json.dumps(
        {"count": 8, "name": "NVIDIA RTX PRO 6000 Blackwell Server Edition", "memory_mib": 98304, "capability": [12, 0]}
    )
    done, verdict = _run("sglang", site, [], tmp_path, "--answer-gpus", answers, FAKE_SGLANG_ASKS_GPUS="1")
    assert done.returncode == 0, done.stderr
    assert "a real CUDA call" not in done.stderr and verdict["resolved"]["gpu_memory_mib"] == 98304
    done, verdict = _run("sglang", site, [], tmp_path, FAKE_SGLANG_ASKS_GPUS="1")
    assert done.returncode == 1 and "a real CUDA call: torch.cuda.is_available" in verdict["refusal"]


def test_the_stand_ins_steps_are_the_releases_own():
    """The committed snapshots of each release's engine.py: 0.5.23's _launch_subprocesses loads
    the plugins and checks the arguments before it resolves the auto parsers; 0.5.9 and 0.5.10
    have neither name, so the program, which asks engine.py for them, runs neither there."""
    from tests.unit.upstream_sources import release_text

    text = release_text("sglang", "0.5.23", "sglang/srt/entrypoints/engine.py")
    assert "from sglang.srt.plugins import load_plugins\n" in text
    assert "from sglang.srt.parser.template_detection import resolve_auto_parsers\n" in text
    launch = text[text.index("def _launch_subprocesses(") :]
    order = [
        launch.index(step)
        for step in (
            "server_args.resolve_once()",
            "_set_envs_and_config(server_args)",
            "load_plugins()",
            "server_args.check_server_args()",
            "resolve_auto_parsers(server_args)",
        )
    ]
    assert order == sorted(order)
    for version in ("0.5.9", "0.5.10"):
        older = release_text("sglang", version, "sglang/srt/entrypoints/engine.py")
        assert "load_plugins" not in older and "resolve_auto_parsers" not in older


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_the_tokenizer_and_chat_template_load_from_the_weights_files(tmp_path, engine):
    """Both engines load the tokenizer (or processor) and the chat template from the weights'
    folder at start-up, before any GPU work (SGLang's tokenizer manager, vLLM's InputProcessor
    and its chat endpoint): a folder without tokenizer files is the engine's own refusal, a model
    without a chat template or with one that does not render is refused before the switch, and
    --chat-template supplies one."""
    site = _stand_ins(tmp_path, FAKE_SGLANG if engine == "sglang" else FAKE_VLLM)
    flag = "--model-path" if engine == "sglang" else "--model"
    done, verdict = _run(engine, site, [flag, str(tmp_path / "empty")], tmp_path)
    assert done.returncode == 1 and "OSError: Can't load tokenizer for" in verdict["refusal"], done.stderr
    bare = _weights(tmp_path / "bare", template=None)
    done, verdict = _run(engine, site, [flag, str(bare)], tmp_path)
    assert done.returncode == 1 and "the model has no chat template" in verdict["refusal"], done.stderr
    broken = _weights(tmp_path / "broken", template="{{ messages[0]['content'] | no_such_filter }}")
    done, verdict = _run(engine, site, [flag, str(broken)], tmp_path)
    assert done.returncode == 1 and "No filter named 'no_such_filter'" in verdict["refusal"], done.stderr
    template = tmp_path / "chat.jinja"
    template.write_text(TEMPLATE)
    done, verdict = _run(engine, site, [flag, str(bare), "--chat-template", str(template)], tmp_path)
    assert done.returncode == 0, done.stderr
    assert verdict["steps"][-1] == "apply_chat_template"


def test_a_config_only_folder_skips_the_tokenizer_when_told(tmp_path):
    """--no-tokenizer (the control machine's preview and the lab's release checks, whose model
    folders hold config files only) leaves the tokenizer and template out and says so; the
    host's gate never passes it."""
    site = _stand_ins(tmp_path, FAKE_VLLM)
    done, verdict = _run("vllm", site, ["--model", str(tmp_path / "empty")], tmp_path, "--no-tokenizer")
    assert done.returncode == 0, done.stderr
    assert verdict["steps"][-1].startswith("tokenizer, processor and chat template not loaded")
    assert "--no-tokenizer" not in serving.preflight_command(HOST, PROD.stack.active, PROD)


def test_a_host_has_no_gpu_answers_to_give(tmp_path):
    """The deploy installs engine_preflight.py alone: there, --answer-gpus is one clear refusal
    (exit 2), never answers that stand in for the host's own GPUs."""
    alone = tmp_path / "engine-preflight.py"
    alone.write_text(serving.PREFLIGHT_SOURCE.read_text())
    gpus = json.dumps({"count": 1, "name": "NVIDIA H200", "memory_mib": 143771, "capability": [9, 0]})
    done = subprocess.run(
        [sys.executable, str(alone), "--engine", "sglang", "--answer-gpus", gpus, "--", "--model-path", "/m"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"engine preflight: --answer-gpus: {tmp_path / 'preflight_gpu_answers.py'} is not here:"
        " the GPUs' answers are for machines without the target's GPUs"
    ]
