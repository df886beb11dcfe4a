"""STAND-IN part: the start-up line in which SGLang logs its server arguments.

The real server logs every resolved argument once at start, into the unit's journal:

- sglang 0.5.9, srt/entrypoints/engine.py (_launch_subprocesses, after configure_logger):
      logger.info(f"{server_args=}")
  i.e. `server_args=ServerArgs(model_path=..., ...)`, the repr of the ServerArgs dataclass of
  srt/server_args.py: every field whose `repr` is not False, in declaration order.
- sglang 0.5.23, same file:
      logger.info(f"server_args={_server_args_for_logging(server_args)}")
  i.e. the dict of resolved fields (ServerArgs.resolved_dict, in the order of
  srt/arg_groups/field_order.py) passed through _server_args_for_logging, which redacts only
  watermark secrets in that release.
- both: srt/utils/common.py configure_logger: format "[%(asctime)s] %(message)s", datefmt
  "%Y-%m-%d %H:%M:%S", level from --log-level (default info), on stderr.

The stand-in cannot import the real ServerArgs (it needs torch and the GPU stack), so it reads
the installed, patched wheel's own source: for 0.5.9 it rebuilds the dataclass's fields (name,
literal default, repr flag) from server_args.py; for 0.5.23 it executes the wheel's own
_server_args_for_logging. A patch that keeps the API key out of the real log therefore keeps
it out of the stand-in's too, and a missing patch leaks it here exactly as it would there.
Values are the parsed command line (plus --config) over the source's literal defaults; the
real server also resolves many defaults at start, which the stand-in does not reproduce.

After the weights load, the real server logs the KV pool it allocated (srt/mem_cache/memory_pool.py
KVCache._finalize_allocation_log, 0.5.9, 0.5.10 and 0.5.23, logger sglang.srt.mem_cache.memory_pool):
"KV Cache is allocated. #tokens: N, KV size: X GB" (0.5.23: "... is allocated. dtype: D, #tokens: ...").
The stand-in runs that method from the installed wheel's source, so the wording is the release's;
the figures are not a GPU's: STANDIN_KV_TOKENS tokens (or --max-total-tokens) of a bf16 MLA cell
of Kimi-K2.5's shape. The deploy's health check reads this line (roles/shared/sglang_kv_log.py).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import logging
from pathlib import Path
from typing import Any

LOG_FORMAT = "[%(asctime)s] %(message)s"
LOG_DATEFMT = "%Y-%m-%d %H:%M:%S"
# srt/sampling/watermarking/core.py (0.5.23): the only fields the release itself redacts.
WATERMARK_SECRET_FIELD_NAMES = frozenset({"watermark_key", "watermark_key_b", "watermark_config"})

logger = logging.getLogger("sglang.srt.entrypoints.engine")
# No GPU to size a pool from: the token count the stand-in reports, and Kimi-K2.5's MLA cell
# ((kv_lora_rank 512 + qk_rope_head_dim 64) x 61 layers x 2 B) to give it a size.
STANDIN_KV_TOKENS = 65536
STANDIN_CELL_BYTES = (512 + 64) * 61 * 2


def sglang_source() -> Path:
    """The installed sglang package folder, found without importing it."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("sglang is not installed in this interpreter")
    return Path(list(spec.submodule_search_locations)[0])


def configure_logger(log_level: str | None) -> None:
    logging.basicConfig(
        level=getattr(logging, (log_level or "info").upper()), format=LOG_FORMAT, datefmt=LOG_DATEFMT, force=True
    )


def _literal(node: ast.AST | None) -> Any:
    if node is None:
        return None
    try:
        return ast.literal_eval(node)
    except ValueError:
        return None  # a computed default (envs.X.get(), a call): resolved at start upstream


def _typed(value: Any, default: Any) -> Any:
    """argparse gives strings; ServerArgs holds the annotated types."""
    if isinstance(value, str) and isinstance(default, bool):
        return value.lower() in ("1", "true", "yes")
    for kind in (int, float):
        if isinstance(value, str) and isinstance(default, kind) and not isinstance(default, bool):
            try:
                return kind(value)
            except ValueError:
                return value
    return value


def _value(name: str, default: Any, given: dict[str, Any]) -> Any:
    value = given.get(name)
    if value is None or value is False:  # not on the command line: the release's default
        return default
    return _typed(value, default)


def _dataclass_fields(source: Path) -> list[tuple[str, Any, bool]]:
    """(name, literal default, repr) of each field of 0.5.9's ServerArgs dataclass."""
    tree = ast.parse(source.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ServerArgs")
    fields = []
    for node in cls.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        default, show = node.value, True
        if (
            isinstance(node.value, ast.Call)
            and getattr(node.value.func, "attr", getattr(node.value.func, "id", "")) == "field"
        ):
            keywords = {k.arg: k.value for k in node.value.keywords}
            default = keywords.get("default")
            show = _literal(keywords["repr"]) is not False if "repr" in keywords else True
        fields.append((node.target.id, _literal(default), show))
    return fields


def _log_0_5_9(root: Path, given: dict[str, Any]) -> None:
    spec = _dataclass_fields(root / "srt/server_args.py")
    ServerArgs = dataclasses.make_dataclass(  # the real class's name, in the log
        "ServerArgs", [(name, Any, dataclasses.field(default=None, repr=show)) for name, _, show in spec]
    )
    server_args = ServerArgs(**{name: _value(name, default, given) for name, default, _ in spec})
    logger.info(f"{server_args=}")


class _ResolvedArgs:
    """What _server_args_for_logging needs of 0.5.23's ServerArgs: resolved_dict()."""

    def __init__(self, values: dict[str, Any]):
        self._values = values

    def resolved_dict(self) -> dict[str, Any]:
        return dict(self._values)


def _redact_watermark_secrets(value: Any, *, in_watermark_config: bool = False) -> Any:
    """0.5.23's redact_watermark_secrets for the plain dicts and scalars the stand-in has."""
    if isinstance(value, dict):
        return {
            key: (
                "<redacted>"
                if key in WATERMARK_SECRET_FIELD_NAMES or (in_watermark_config and key in {"key", "key_b"})
                else _redact_watermark_secrets(item, in_watermark_config=in_watermark_config or key == "watermark")
            )
            for key, item in value.items()
        }
    return value


def _field_defaults(fields_dir: Path) -> dict[str, Any]:
    defaults: dict[str, Any] = {}
    for path in sorted(fields_dir.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                defaults.setdefault(node.target.id, _literal(node.value))
    return defaults


def _logging_function(engine: Path):
    """The wheel's own _server_args_for_logging, compiled from its (patched) source."""
    tree = ast.parse(engine.read_text())
    function = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_server_args_for_logging")
    module = ast.Module(
        body=[ast.ImportFrom(module="__future__", names=[ast.alias("annotations")], level=0), function], type_ignores=[]
    )
    namespace = {"redact_watermark_secrets": _redact_watermark_secrets}
    exec(compile(ast.fix_missing_locations(module), str(engine), "exec"), namespace)
    return namespace["_server_args_for_logging"]


def _log_resolved(root: Path, given: dict[str, Any]) -> None:
    order_tree = ast.parse((root / "srt/arg_groups/field_order.py").read_text())
    order = next(
        _literal(n.value)
        for n in order_tree.body
        if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "POSITIONAL_FIELD_ORDER"
    )
    defaults = _field_defaults(root / "srt/arg_groups/fields")
    names = list(order) + [name for name in given if name not in order]
    server_args = _ResolvedArgs({name: _value(name, defaults.get(name), given) for name in names})
    _server_args_for_logging = _logging_function(root / "srt/entrypoints/engine.py")
    logger.info(f"server_args={_server_args_for_logging(server_args)}")


def log_server_args(given: dict[str, Any]) -> None:
    """Log the start-up line of the installed release, from parsed arguments (dest -> value)."""
    root = sglang_source()
    configure_logger(given.get("log_level"))
    if (root / "srt/arg_groups/field_order.py").is_file():
        _log_resolved(root, given)
    else:
        _log_0_5_9(root, given)


def log_kv_allocation(given: dict[str, Any]) -> None:
    """The release's own KV allocation line, as its memory pool logs it once the weights are in."""
    root = sglang_source()
    tree = ast.parse((root / "srt/mem_cache/memory_pool.py").read_text())
    kvcache = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "KVCache")
    method = next(n for n in kvcache.body if isinstance(n, ast.FunctionDef) and n.name == "_finalize_allocation_log")
    for arg in method.args.args:
        arg.annotation = None
    namespace: dict[str, Any] = {"GB": 1 << 30, "logger": logging.getLogger("sglang.srt.mem_cache.memory_pool")}
    exec(compile(ast.Module([method], []), str(root / "srt/mem_cache/memory_pool.py"), "exec"), namespace)
    tokens = int(given.get("max_total_tokens") or STANDIN_KV_TOKENS)  # argparse gives the flag as a string
    pool = _Pool(tokens * STANDIN_CELL_BYTES)
    namespace["_finalize_allocation_log"](pool, tokens)


class _Pool:
    """What _finalize_allocation_log reads of an MLA pool (one KV buffer, no allocation label)."""

    allocation_label = None
    post_capture_active = False
    dtype = "torch.bfloat16"

    def __init__(self, size_bytes: int):
        self._size = size_bytes

    def get_kv_size_bytes(self) -> int:
        return self._size
