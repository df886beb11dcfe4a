"""Capture `smg launch`'s options from the real smg release (its Python parser, run with the
wheel installed: the options are plain argparse in smg/router_args.py RouterArgs.add_cli_args,
the parser smg/launch_router.py parse_router_args builds).

    uv run --no-project --with smg==1.13.0 python roles/gateway/cli_capture.py   # writes cli/1.13.0.json

The data file is committed; validation checks every rendered gateway flag against it.
"""

from __future__ import annotations

import argparse
import json
from importlib import metadata
from pathlib import Path

CLI_DIR = Path(__file__).resolve().parent / "cli"


def capture() -> dict:
    from smg.router_args import RouterArgs

    parser = argparse.ArgumentParser()
    RouterArgs.add_cli_args(parser, use_router_prefix=False)
    options = {}
    for action in parser._actions:
        for flag in action.option_strings:
            options[flag] = {
                "takes_value": action.nargs != 0,
                "many": action.nargs in ("*", "+"),
                "choices": list(action.choices) if action.choices else None,
            }
    return {"smg": metadata.version("smg"), "options": dict(sorted(options.items()))}


if __name__ == "__main__":
    # Run as a file in an environment holding smg and nothing of this project (see above): plain
    # argparse, so --help answers before smg is imported.
    argparse.ArgumentParser(
        prog="python roles/gateway/cli_capture.py",
        description="Capture `smg launch`'s options into roles/gateway/cli/<version>.json; run it with "
        "`uv run --no-project --with smg==VERSION python roles/gateway/cli_capture.py`.",
    ).parse_args()
    try:
        data = capture()
    except ImportError:
        raise SystemExit("smg is not installed here: run it with uv run --no-project --with smg==VERSION ...") from None
    path = CLI_DIR / f"{data['smg']}.json"
    path.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {path} ({len(data['options'])} options)")
