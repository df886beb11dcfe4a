"""Entry point of the `inference-host` console script (inference_host/console-script/pyproject.toml).

It is installed editable, so this file stays in the repository:
<root>/inference_host/console-script/src/inference_host_console/__init__.py. The command runs
the project's own inference_host.cli from that root, whatever folder it is started in.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]


def main() -> int:
    if not (ROOT / "deploy.py").is_file() or not (ROOT / "inference_host" / "cli.py").is_file():
        print(
            f"inference-host: {ROOT} is not the inference-host repository this command was installed from;"
            " run `uv sync` in the repository",
            file=sys.stderr,
        )
        return 2
    sys.path.insert(0, str(ROOT))
    from inference_host.cli import main as cli_main
    from roles.site.command_line import run_command

    # `... | head` ends quietly, Ctrl-C is one line and 130, any locale prints
    run_command(lambda: cli_main(sys.argv[1:]), "inference-host")
