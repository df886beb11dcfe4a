"""The command-line options of SpecForge's scripts at the pinned commit, captured from its source
with `ast` (no import: the scripts need torch and a GPU), so the job's commands are checked
against the real flags in the unit tests.

    uv run python -m roles.eagle3_training.specforge_cli /path/to/SpecForge.git [commit]

reads the scripts from a clone (bare or not) with `git show` and writes specforge-<commit>.cli.json
beside this file. SGLang backend options (--sglang-*) come from specforge/args.py's
SGLangBackendArgs.add_args, which prepare_hidden_states.py and train_eagle3.py call.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from roles.shared.argparse_source import add_argument_options as _add_argument_options
from roles.site.sections.eagle3_training import SPECFORGE_COMMIT

HERE = Path(__file__).resolve().parent
SCRIPTS = ("scripts/regenerate_train_data.py", "scripts/prepare_hidden_states.py", "scripts/train_eagle3.py")
SHARED_ARGS = "specforge/args.py"


def data_file(commit: str = SPECFORGE_COMMIT) -> Path:
    return HERE / f"specforge-{commit[:7]}.cli.json"


def capture(git_dir: str, commit: str = SPECFORGE_COMMIT) -> dict:
    def show(path: str) -> str:
        return subprocess.run(
            ["git", "--git-dir", git_dir, "show", f"{commit}:{path}"], check=True, capture_output=True, text=True
        ).stdout

    shared = _add_argument_options(show(SHARED_ARGS))
    table = {}
    for script in SCRIPTS:
        source = show(script)
        options = _add_argument_options(source)
        if "SGLangBackendArgs.add_args" in source:
            options.update({k: v for k, v in shared.items() if k.startswith("--sglang-")})
        table[script] = dict(sorted(options.items()))
    return {"specforge": commit, "scripts": table}


if __name__ == "__main__":
    git_dir = sys.argv[1]
    commit = sys.argv[2] if len(sys.argv) > 2 else SPECFORGE_COMMIT
    data_file(commit).write_text(json.dumps(capture(git_dir, commit), indent=1) + "\n")
    print(data_file(commit))
