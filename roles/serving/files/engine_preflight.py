"""The engine's own start-up validation, run in an engine environment before the deploy points
the service at it (roles/serving: the preflight gate; roles/render --engine-diff: the preview).

    <env>/bin/python engine_preflight.py --engine sglang [--report FILE] [--answer-gpus JSON] -- ARGS

ARGS are the rendered arguments after the launcher (`-m sglang.launch_server` or
`-m vllm.entrypoints.openai.api_server`). It runs what the release runs before it loads a
weight, in the release's own code, and nothing after (but the one vLLM lookup below):

- SGLang (0.5.9 - 0.5.23: sglang/launch_server.py, srt/entrypoints/engine.py
  _launch_subprocesses): prepare_server_args(argv) (argument parsing, the --config merge and
  ServerArgs.__post_init__, which resolves every setting from the model config and the GPUs),
  the engine's _set_envs_and_config (its kernel-package version asserts), check_server_args(),
  load_plugins() (first), resolve_once() and resolve_auto_parsers() where the release has them
  (0.5.23), and the model config through the release's own ModelConfig (its model classes, the
  multimodal test that decides the cuDNN check). With --mem-fraction-static given, the same
  command line once more without it: the fraction the release would choose itself, reported.
  Then the tokenizer manager's own loads from the weights' files: the tokenizer (or the
  multimodal processor and the tokenizer inside it) and the chat template, rendered once.
- vLLM (0.16.0: vllm/entrypoints/openai/api_server.py __main__, setup_server and
  build_async_engine_client_from_engine_args): cli_env_setup, make_arg_parser, parse_args,
  validate_parsed_serve_args, the parser plugins and validate_api_server_args,
  AsyncEngineArgs.from_cli_args and create_engine_config; and, early, the engine core's
  reasoning-parser lookup, the one check 0.16.0 runs only after the weights load; then
  AsyncLLM's InputProcessor (tokenizer, multimodal processor, generation config) and the chat
  template as the chat endpoint resolves it, rendered once.

It prints the engine's own refusal and exits 1, or prints which settings the engine chose on
its own (exit 0), and refuses (exit 1) where it changed a value the command line gave
explicitly. --report writes the whole verdict as JSON. Secrets (the --config file's api-key)
never reach the output: every field named like a key, token or secret is shown as "***".

--no-tokenizer is for a model folder of config files only (the preview, the project's tests):
the tokenizer, processor and chat template need the weights' tokenizer files, and the host's
gate, which has the weights, loads them. --answer-gpus is for machines without the target's
GPUs (the preview on the control machine, the project's tests): the few questions the release
asks the GPUs are answered from the inventory, and nothing else is substituted (the CUDA and
cuDNN versions are the environment's own, read from its torch and libcudnn). Neither is ever
passed on the host that serves.
Standard library only until the engine is imported.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import re
import sys
import traceback
from pathlib import Path

# api_key, admin_api_key, hf_token, ssl_keyfile_password ...; not max_total_tokens.
SECRET_NAME = re.compile(r"(^|_)(api_key|secret|password)($|_)|(^|_)(hf_)?token$", re.IGNORECASE)
REDACTED = "***"
# What an operator reads first: the settings the engines resolve on their own that change the
# server's capacity or speed (the engine diff shows every field; these lead).
WATCHED = {
    "sglang": [
        "max_running_requests",
        "disable_overlap_schedule",
        "attention_backend",
        "prefill_attention_backend",
        "decode_attention_backend",
        "mem_fraction_static",
        "chunked_prefill_size",
        "context_length",
        "cuda_graph_max_bs",
        "disable_cuda_graph",
        "disable_piecewise_cuda_graph",
        "enable_piecewise_cuda_graph",
        "enforce_piecewise_cuda_graph",
        "piecewise_cuda_graph_max_tokens",
        "cuda_graph_config.decode.max_bs",
        "cuda_graph_config.prefill.backend",
        "cuda_graph_config.prefill.max_bs",
        "moe_runner_backend",
        "sampling_backend",
        "page_size",
        "speculative_algorithm",
        "speculative_num_draft_tokens",
    ],
    "vllm": [
        "max_num_seqs",
        "max_model_len",
        "max_num_batched_tokens",
        "enforce_eager",
        "dtype",
        "gpu_memory_utilization",
        "block_size",
        "attention_backend",
        "tensor_parallel_size",
        "cudagraph_mode",
        "enable_chunked_prefill",
        "enable_prefix_caching",
    ],
}


class Refused(Exception):
    """The engine refused the command line; the message is the engine's own."""


LOAD_TOKENIZER = True  # main() clears it for --no-tokenizer


def main(argv: list[str]) -> int:
    global LOAD_TOKENIZER
    options, engine_argv = _parse(argv)
    LOAD_TOKENIZER = not options.no_tokenizer
    captured = _capture_logs()
    if options.answer_gpus:
        try:
            _gpu_answers().answer_gpus(json.loads(options.answer_gpus))
        except RuntimeError as error:  # the stand-in answers could not be installed
            print(f"engine preflight: --answer-gpus: {error}", file=sys.stderr)
            return 2
    if options.batch:
        return _batch(options, captured)
    return _one(options.engine, engine_argv, options.report, options.origin, captured)


def _batch(options: argparse.Namespace, captured: _Captured) -> int:
    """Several command lines in one process (the preview and the tests: importing an engine
    costs half a minute). Each item {"argv", "env", "report"} runs with the process
    environment plus its own env file's values, restored afterwards."""
    status, base = 0, dict(os.environ)
    for item in json.loads(Path(options.batch).read_text()):
        os.environ.clear()
        os.environ.update({**base, **item.get("env", {})})
        captured.lines = []
        status |= _one(options.engine, item["argv"], item["report"], item.get("origin", ""), captured)
    os.environ.clear()
    os.environ.update(base)
    return status


def _one(engine: str, engine_argv: list[str], report: str | None, origin: str, captured: _Captured) -> int:
    options = argparse.Namespace(engine=engine, report=report, origin=origin)
    verdict = {"engine": options.engine, "ok": False}
    try:
        verdict.update(VALIDATORS[options.engine](engine_argv))
        verdict["ok"] = not verdict["overridden"]
    except Refused as refused:
        verdict["refusal"] = str(refused)
    except SystemExit as exit_:  # argparse: the release's own usage error, already printed
        verdict["refusal"] = f"the release's argument parser exited with status {exit_.code}"
    except Exception as error:  # the engine's own assertion or error, with its message
        verdict["refusal"] = _engine_message(error)
    verdict["logged"] = captured.lines
    _print(verdict, options.origin)
    if options.report:
        Path(options.report).write_text(json.dumps(_redacted(verdict), indent=1, sort_keys=True, default=str) + "\n")
    return 0 if verdict["ok"] else 1


def _parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(prog="engine_preflight.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=("sglang", "vllm"), required=True)
    parser.add_argument("--report", help="write the verdict as JSON to this file")
    parser.add_argument("--origin", default="", help="where the command line comes from (printed on refusal)")
    parser.add_argument(
        "--answer-gpus",
        help="JSON {count, name, memory_mib, capability}: answers for"
        " GPUs this machine does not have (preview and tests only)",
    )
    parser.add_argument("--batch", help="JSON file: a list of {argv, env, report, origin} to check in turn")
    parser.add_argument(
        "--no-tokenizer",
        action="store_true",
        help="the model folder holds its config files only (preview and tests only): the tokenizer,"
        " processor and chat template are not loaded",
    )
    if "--" not in argv:
        parser.error("the engine's arguments follow --")
    split = argv.index("--")
    return parser.parse_args(argv[:split]), argv[split + 1 :]


# --------------------------------------------------------------------------------------------
# SGLang


def validate_sglang(argv: list[str]) -> dict:
    """What launch_server runs before a weight loads, in the order the release runs it: 0.5.9
    and 0.5.10 resolve inside prepare_server_args (ServerArgs.__post_init__); 0.5.23 parses
    there and resolves in resolve_once(), which _launch_subprocesses calls first.
    0.5.23 also loads the installed plugins before it parses (launch_server.py `__main__`:
    load_plugins(), then prepare_server_args; a plugin can register a parser the --tool-call-parser
    and --reasoning-parser choices then accept, or hook ServerArgs), and resolves the parsers after
    check_server_args (engine.py _launch_subprocesses: resolve_auto_parsers, the "auto" parsers
    detected from the chat template). engine.py of 0.5.23 imports both names; 0.5.9 and 0.5.10
    have neither."""
    from sglang.srt import server_args as module
    from sglang.srt.entrypoints import engine

    steps = []
    if hasattr(engine, "load_plugins"):
        engine.load_plugins()
        steps.append("load_plugins")
    given = _given_sglang(module, argv)
    args = module.prepare_server_args(argv)
    steps.append("prepare_server_args")
    if hasattr(args, "resolve_once"):
        args.resolve_once()
        steps.append("resolve_once")
    if hasattr(engine, "_set_envs_and_config"):
        # The kernel-package version asserts and the environment the engine sets for itself.
        engine._set_envs_and_config(args)
        steps.append("_set_envs_and_config")
    args.check_server_args()
    steps.append("check_server_args")
    if hasattr(engine, "resolve_auto_parsers"):
        engine.resolve_auto_parsers(args)
        steps.append("resolve_auto_parsers")
    model, step = _sglang_model_config(args)
    steps.append(step)
    steps += _sglang_tokenizer_and_template(args, model) if LOAD_TOKENIZER else [NO_TOKENIZER]
    resolved = _flat(
        args.resolved_dict()
        if hasattr(args, "resolved_dict")
        else {name: getattr(args, name, None) for name in _record_defaults(type(args))}
    )
    defaults = _flat(_record_defaults(type(args)))
    hf_config = getattr(model, "hf_config", None)
    verdict = _judge(
        "sglang",
        resolved,
        defaults,
        given,
        steps,
        {
            "model_architecture": getattr(hf_config, "architectures", None),
            "is_multimodal": getattr(model, "is_multimodal", None),
        },
    )
    if "--mem-fraction-static" in argv:
        verdict["engine_default"] = {"mem_fraction_static": _sglang_own_fraction(module, argv)}
    return verdict


def _sglang_own_fraction(module, argv: list[str]) -> float | None:
    """The mem_fraction_static the release would choose itself on these GPUs: the same command
    line without --mem-fraction-static, resolved by the release's own code (0.5.9 / 0.5.10
    server_args.py _handle_gpu_memory_settings, 0.5.23 arg_groups/memory_hook.py), shown beside
    the rendered value. The inventory check holds the value to the release's reserve
    (roles/serving/memory.py); this is the release's own figure for the same card."""
    at = argv.index("--mem-fraction-static")
    args = module.prepare_server_args(argv[:at] + argv[at + 2 :])
    if hasattr(args, "resolve_once"):
        args.resolve_once()
    value = args.resolved_dict().get("mem_fraction_static") if hasattr(args, "resolved_dict") else None
    value = getattr(args, "mem_fraction_static", None) if value is None else value
    return None if value is None else float(value)


def _sglang_model_config(args):
    """The model config through the release's own ModelConfig and model classes."""
    if hasattr(args, "get_model_config"):  # 0.5.9, 0.5.10
        return args.get_model_config(), "get_model_config"
    from sglang.srt.arg_groups.overrides import model_config_of  # 0.5.23

    return model_config_of(args), "model_config_of"


NO_TOKENIZER = "tokenizer, processor and chat template not loaded (--no-tokenizer: config files only)"


def _sglang_tokenizer_and_template(args, model) -> list[str]:
    """What the tokenizer manager loads at start-up, before any GPU work, from the weights'
    files (0.5.9 and 0.5.23 tokenizer_manager.py init_tokenizer_and_processor): for a
    multimodal model the processor (AutoProcessor, through the release's processor wrapper)
    and the tokenizer inside it, else the tokenizer (get_tokenizer: AutoTokenizer); then the
    chat template (template_manager.py TemplateManager.initialize_templates: --chat-template,
    or one guessed from the model path, or the tokenizer's own), rendered once for one user
    message as the first chat request would. 0.5.23 reads these settings from its runtime
    context, which the engine publishes for the tokenizer first (engine.py publish(...,
    role="tokenizer")); so does this."""
    from sglang.srt.managers import tokenizer_manager as managers

    steps = []
    try:
        from sglang.srt import runtime_context
    except ImportError:  # 0.5.9, 0.5.10
        runtime_context = None
    if runtime_context is not None and hasattr(runtime_context, "publish"):
        runtime_context.publish(args, role="tokenizer")
        steps.append("publish(role=tokenizer)")
    if getattr(args, "skip_tokenizer_init", False):
        return [*steps, "skip_tokenizer_init: no tokenizer, processor or template loaded"]
    if getattr(model, "is_multimodal", False):
        if hasattr(managers, "get_processor_wrapper"):  # 0.5.23
            processor, step = managers.get_processor_wrapper(), "get_processor_wrapper"
        else:
            processor, step = managers._get_processor_wrapper(args), "_get_processor_wrapper"
        tokenizer = managers.get_tokenizer_from_processor(processor)
        steps += [step, "get_tokenizer_from_processor"]
    else:
        tokenizer = managers.get_tokenizer(
            args.tokenizer_path,
            tokenizer_mode=args.tokenizer_mode,
            trust_remote_code=args.trust_remote_code,
            revision=args.revision,
        )
        steps.append("get_tokenizer")
    try:
        from sglang.srt.managers.template_manager import TemplateManager  # 0.5.9, 0.5.10
    except ModuleNotFoundError:
        from sglang.srt.parser.template_manager import TemplateManager  # 0.5.23
    manager = argparse.Namespace(tokenizer=tokenizer, processor=None, server_args=args, model_config=model)
    TemplateManager().initialize_templates(
        tokenizer_manager=manager,
        model_path=args.model_path,
        chat_template=getattr(args, "chat_template", None),
        completion_template=getattr(args, "completion_template", None),
    )
    steps.append("TemplateManager.initialize_templates")
    steps.append(_render_chat_template(tokenizer, getattr(tokenizer, "chat_template", None)))
    return steps


def _render_chat_template(tokenizer, template) -> str:
    """One user message through the chat template, as the first chat request renders it
    (transformers' apply_chat_template): none at all, or one that does not render, fails every
    chat completion while /health answers."""
    if not template:
        raise Refused(
            "the model has no chat template (none in its tokenizer_config.json or chat_template.jinja, and"
            " no --chat-template): the server starts, but every /v1/chat/completions request fails;"
            " use weights that carry one (the project renders no --chat-template)"
        )
    tokenizer.apply_chat_template(
        [{"role": "user", "content": "Are you ready?"}],
        chat_template=template,
        tokenize=False,
        add_generation_prompt=True,
    )
    return "apply_chat_template"


def _record_defaults(cls) -> dict:
    """Field name -> default of a dataclass (0.5.9) or msgspec record (0.5.23's ServerArgs)."""
    try:
        import msgspec
    except ImportError:
        msgspec = None
    if msgspec is not None and isinstance(cls, type) and issubclass(cls, msgspec.Struct):
        return {
            f.name: _plain(
                f.default
                if f.default is not msgspec.NODEFAULT
                else f.default_factory()
                if f.default_factory is not msgspec.NODEFAULT
                else None
            )
            for f in msgspec.structs.fields(cls)
        }
    return {f.name: _plain(_field_default(f)) for f in dataclasses.fields(cls)}


def _plain(value):
    """A nested record default (0.5.23's CudaGraphConfig ...) as a dict, like resolved_dict."""
    try:
        import msgspec

        if isinstance(value, msgspec.Struct):
            return {k: _plain(v) for k, v in msgspec.structs.asdict(value).items()}
    except ImportError:
        pass
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return value


def _flat(values: dict, prefix: str = "") -> dict:
    """Nested records (0.5.23's cuda_graph_config.decode.max_bs ...) as dotted names."""
    flat = {}
    for name, value in values.items():
        if isinstance(value, dict) and value and all(isinstance(k, str) for k in value) and _is_record(value):
            flat.update(_flat(value, f"{prefix}{name}."))
        else:
            flat[f"{prefix}{name}"] = value
    return flat


def _is_record(value: dict) -> bool:
    return all(k.isidentifier() for k in value)


def _given_sglang(module, argv: list[str]) -> dict:
    """The values the command line (and its --config file) gave explicitly, as parsed: every
    option's default is replaced by a marker, so what is left was typed."""
    import importlib

    parser = argparse.ArgumentParser()
    module.ServerArgs.add_cli_args(parser)
    if "--config" in argv:
        for place in ("sglang.srt.server_args_config_parser", "sglang.srt.utils.server_args_config_parser"):
            try:
                merger = importlib.import_module(place).ConfigArgumentMerger
                break
            except ModuleNotFoundError:
                continue
        argv = merger(parser).merge_config_with_args(argv)
    return _explicit(parser, argv)


# --------------------------------------------------------------------------------------------
# vLLM


def validate_vllm(argv: list[str]) -> dict:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.entrypoints.utils import cli_env_setup
    from vllm.usage.usage_lib import UsageContext
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    cli_env_setup()
    parser = make_arg_parser(FlexibleArgumentParser(description="vLLM OpenAI-Compatible RESTful API server."))
    args = parser.parse_args(argv)
    validate_parsed_serve_args(args)
    steps = ["parse_args", "validate_parsed_serve_args", *_vllm_api_server_checks(args)]
    given = _explicit(make_arg_parser(FlexibleArgumentParser()), argv)
    engine_args = AsyncEngineArgs.from_cli_args(args)
    config = engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
    steps += ["AsyncEngineArgs.from_cli_args", "create_engine_config", *_vllm_reasoning_parser(config)]
    steps += _vllm_input_processor(args, config) if LOAD_TOKENIZER else [NO_TOKENIZER]
    resolved = _vllm_resolved(config, engine_args)
    defaults = {f.name: _field_default(f) for f in dataclasses.fields(AsyncEngineArgs)}
    return _judge(
        "vllm",
        resolved,
        defaults,
        given,
        steps,
        {"model_architecture": getattr(config.model_config, "architectures", None)},
    )


def _vllm_api_server_checks(args) -> list[str]:
    """What api_server.py's setup_server runs (via run_server) before the engine is built
    (vLLM 0.16.0, vllm/entrypoints/openai/api_server.py): the --tool-parser-plugin and
    --reasoning-parser-plugin files imported (where the path is longer than 3 characters, as
    there), then validate_api_server_args, which refuses a --tool-call-parser (with
    --enable-auto-tool-choice) or a reasoning parser in --structured-outputs-config the release
    has not registered. Nothing of setup_server after it (the socket, the signal handler) is a
    check."""
    from vllm.entrypoints.openai import api_server

    if not hasattr(api_server, "validate_api_server_args"):
        return []
    if args.tool_parser_plugin and len(args.tool_parser_plugin) > 3:
        api_server.ToolParserManager.import_tool_parser(args.tool_parser_plugin)
    if args.reasoning_parser_plugin and len(args.reasoning_parser_plugin) > 3:
        api_server.ReasoningParserManager.import_reasoning_parser(args.reasoning_parser_plugin)
    api_server.validate_api_server_args(args)
    return ["validate_api_server_args"]


def _vllm_reasoning_parser(config) -> list[str]:
    """The one parser check vLLM 0.16.0 leaves to the engine core, after the weights and the KV
    cache are loaded (v1/engine/core.py EngineCore.__init__ -> StructuredOutputManager,
    v1/structured_output/__init__.py): a --reasoning-parser reaches structured_outputs_config only
    in create_engine_config (engine/arg_utils.py), so validate_api_server_args did not see it.
    Its registry lookup, the release's own, runs here so that an unknown one stops the deploy
    before the switch rather than minutes after it."""
    from vllm.reasoning import ReasoningParserManager

    outputs = getattr(config, "structured_outputs_config", None)
    name = getattr(outputs, "reasoning_parser", None)
    if not name or getattr(config.model_config, "skip_tokenizer_init", False):
        return []
    plugin = getattr(outputs, "reasoning_parser_plugin", None)
    if plugin and len(plugin) > 3:  # as StructuredOutputManager does, before the lookup
        ReasoningParserManager.import_reasoning_parser(plugin)
    ReasoningParserManager.get_reasoning_parser(name)
    return ["ReasoningParserManager.get_reasoning_parser"]


def _vllm_input_processor(args, config) -> list[str]:
    """What AsyncLLM builds before it starts the engine core (vllm 0.16.0
    v1/engine/async_llm.py: InputProcessor(vllm_config)): the generation config, the
    multimodal processor and its budget for a multimodal model, and the renderer with the
    tokenizer (inputs/preprocess.py renderer_from_config), all from the weights' files. Then the
    chat template as the chat endpoint resolves it (api_server.py load_chat_template of
    --chat-template; renderers/hf.py resolve_chat_template: the given one, the processor's, the
    tokenizer's, a bundled fallback), rendered once for one user message; vLLM itself only logs a
    failure there ("Chat template warmup failed") and then fails every chat request."""
    from vllm.entrypoints.chat_utils import load_chat_template
    from vllm.renderers.hf import resolve_chat_template
    from vllm.v1.engine.input_processor import InputProcessor

    processor = InputProcessor(config)
    steps = ["InputProcessor"]
    if config.model_config.skip_tokenizer_init:
        return [*steps, "skip_tokenizer_init: no tokenizer or template loaded"]
    tokenizer = processor.get_tokenizer()
    template = resolve_chat_template(
        tokenizer, load_chat_template(args.chat_template), None, model_config=config.model_config
    )
    steps.append("resolve_chat_template")
    steps.append(_render_chat_template(tokenizer, template))
    return steps


def _vllm_resolved(config, engine_args) -> dict:
    """The engine arguments, with the values vLLM's config resolved written over them (the
    field names of EngineArgs, so that the command line's explicit values compare)."""
    resolved = {f.name: getattr(engine_args, f.name, None) for f in dataclasses.fields(engine_args)}
    sections = [config.model_config, config.cache_config, config.parallel_config, config.scheduler_config]
    for name in resolved:
        for section in sections:
            if section is not None and hasattr(section, name):
                resolved[name] = getattr(section, name)
                break
    resolved["dtype"] = str(config.model_config.dtype).removeprefix("torch.")
    compilation = getattr(config, "compilation_config", None)
    if compilation is not None and hasattr(compilation, "cudagraph_mode"):
        resolved["cudagraph_mode"] = str(compilation.cudagraph_mode)
    backend = getattr(getattr(config, "attention_config", None), "backend", None)
    if backend is not None:
        resolved["attention_backend"] = getattr(backend, "name", str(backend))
    return resolved


# --------------------------------------------------------------------------------------------
# The verdict


def _judge(engine: str, resolved: dict, defaults: dict, given: dict, steps: list[str], model: dict) -> dict:
    """Which settings the engine chose itself (printed) and which explicit ones it changed
    (a refusal: the inventory said one thing, the engine would run another)."""
    # A given "auto" asks the engine to decide: whatever it decides is what was asked for.
    overridden = {
        name: {"given": value, "engine": resolved[name]}
        for name, value in given.items()
        if name in resolved and value != "auto" and not _same(value, resolved[name])
    }
    chosen = {
        name: {"default": defaults.get(name), "engine": value}
        for name, value in resolved.items()
        if name not in given and name in defaults and not _same(defaults[name], value)
    }
    return {
        "steps": steps,
        "model": model,
        "resolved": resolved,
        "given": sorted(given),
        "chosen": chosen,
        "overridden": overridden,
        "watched": {name: resolved.get(name) for name in WATCHED[engine] if name in resolved},
    }


def _same(a, b) -> bool:
    """Equal as the engine means them: an enum by its name (vLLM's AttentionBackendEnum), a
    one-element list as its element (vLLM's served_model_name is nargs="+", resolved to str)."""
    a, b = _normal(a), _normal(b)
    if a == b:
        return True
    try:
        return type(b)(a) == b
    except (TypeError, ValueError):
        return str(a) == str(b)


def _normal(value):
    import enum

    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, (list, tuple)) and len(value) == 1:
        return _normal(value[0])
    return value


def _explicit(parser: argparse.ArgumentParser, argv: list[str]) -> dict:
    marker = object()
    for action in parser._actions:
        if action.dest not in ("help", argparse.SUPPRESS):
            action.default = marker
    parsed = parser.parse_args(argv)
    return {name: value for name, value in vars(parsed).items() if value is not marker}


def _field_default(field: dataclasses.Field):
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        try:
            return field.default_factory()
        except Exception:
            return None
    return None


def _engine_message(error: BaseException) -> str:
    """The engine's own message, without terminal colours, with where it was raised."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(error)).strip() or type(error).__name__
    frames = traceback.extract_tb(error.__traceback__)
    where = next(
        (f"{Path(f.filename).as_posix().split('site-packages/')[-1]}:{f.lineno} in {f.name}" for f in reversed(frames)),
        "",
    )
    return f"{type(error).__name__}: {text}" + (f"\n    (raised at {where})" if where else "")


def _print(verdict: dict, origin: str) -> None:
    shown = _redacted(verdict)
    engine = {"sglang": "SGLang", "vllm": "vLLM"}[verdict["engine"]]
    if "refusal" in shown:
        print(f"PREFLIGHT REFUSED: {engine}'s own start-up checks refuse this command line:", file=sys.stderr)
        print("    " + shown["refusal"].replace("\n", "\n    "), file=sys.stderr)
        if origin:
            print(f"    the command line and environment come from: {origin}", file=sys.stderr)
        return
    print(f"preflight: {engine} accepts the command line ({', '.join(shown['steps'])})")
    for name, change in sorted(shown["chosen"].items()):
        if name in WATCHED[verdict["engine"]]:
            print(f"    {engine} sets {name} = {change['engine']!r} on its own (default {change['default']!r})")
    own = (shown.get("engine_default") or {}).get("mem_fraction_static")
    if own is not None:
        print(
            f"    {engine} would choose mem_fraction_static = {own:.3f} for these GPUs without"
            f" --mem-fraction-static; the command line sets {shown['resolved'].get('mem_fraction_static')!r}"
        )
    for name, change in sorted(shown["overridden"].items()):
        print(
            f"PREFLIGHT REFUSED: the command line sets {name} = {change['given']!r}, {engine} would run"
            f" with {change['engine']!r}",
            file=sys.stderr,
        )
    if shown["overridden"] and origin:
        print(f"    the command line comes from: {origin}", file=sys.stderr)


def _redacted(value, key: str = ""):
    if key and SECRET_NAME.search(key) and value not in (None, "", False):
        return REDACTED
    if isinstance(value, dict):
        return {k: _redacted(v, str(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_redacted(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


class _Captured(logging.Handler):
    """The engine's log records of level WARNING and above, for the report (they are printed
    by the engine's own handlers too)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname} {record.name}: {record.getMessage()}"[:2000])


def _gpu_answers():
    """preflight_gpu_answers.py, beside this file where the answers are wanted (the preview, the
    tests): the deploy installs only this program on a host, so nothing there can stand in for
    its GPUs. Loaded by path: this program runs as a script, not from a package."""
    import importlib.util

    path = Path(__file__).with_name("preflight_gpu_answers.py")
    if not path.is_file():
        raise RuntimeError(f"{path} is not here: the GPUs' answers are for machines without the target's GPUs")
    spec = importlib.util.spec_from_file_location("preflight_gpu_answers", path)
    assert spec and spec.loader  # a .py file's spec always has a loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    return module


def _capture_logs() -> _Captured:
    handler = _Captured()
    logging.getLogger().addHandler(handler)
    logging.captureWarnings(True)
    return handler


VALIDATORS = {"sglang": validate_sglang, "vllm": validate_vllm}

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
