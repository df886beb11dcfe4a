"""Read argparse options from Python source with `ast`, without importing it (the engines'
modules need torch and a GPU). Used by the SGLang CLI capture (roles/serving/cli_capture.py)
and the SpecForge one (roles/eagle3_training/specforge_cli.py)."""

from __future__ import annotations

import ast

FLAG_ACTIONS = {"store_true", "store_false", "store_const", "count", "help", "version"}


def literal(node):
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None


def option(takes_value: bool, choices) -> dict:
    if not (isinstance(choices, (list, tuple)) and all(isinstance(c, (str, int, float)) for c in choices)):
        choices = None
    return {"takes_value": takes_value, "choices": list(choices) if choices else None}


def add_argument_options(source: str) -> dict[str, dict]:
    """Every `*.add_argument("--x", ...)` call with literal option strings."""
    options = {}
    for node in ast.walk(ast.parse(source)):
        if not (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument"
        ):
            continue
        names = [literal(a) for a in node.args]
        names = [n for n in names if isinstance(n, str) and n.startswith("-")]
        if not names:
            continue
        keywords = {k.arg: k.value for k in node.keywords if k.arg}
        action = keywords.get("action")
        action_name = literal(action) if action is not None else None
        if action is not None and action_name is None:
            # A custom Action class: Deprecated*StoreTrue / *StoreConst take no value.
            text = ast.unparse(action)
            takes_value = not any(word in text for word in ("StoreTrue", "StoreFalse", "StoreConst"))
        else:
            takes_value = action_name not in FLAG_ACTIONS
        nargs = literal(keywords["nargs"]) if "nargs" in keywords else None
        if nargs == 0:
            takes_value = False
        choices = literal(keywords["choices"]) if "choices" in keywords else None
        for name in names:
            options[name] = option(takes_value, choices)
    return options
