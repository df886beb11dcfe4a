"""Preview what the deploy would write and run, like `helm template`, contacting no host:

    uv run python -m roles.render INVENTORY --out DIR

The preview is the deploy, recorded: deploy.py (the role table, roles/composition.py) runs
under pyinfra against hosts that answer from a stated state (roles/stated_state.py: a freshly
installed host of each kind) and record instead of contacting anything (roles/recording.py).
For every host of the inventory, each file the operations upload is written under
DIR/<host>/<path on the host> (a file uploaded twice as its last upload), every command they
would run, in order, to DIR/<host>/inference-host-commands/deploy.sh (a secret at its
destination, not at the root-only folder it is uploaded to first), and the state assumed
for the host to DIR/<host>/inference-host-preview.txt. Secrets are never decrypted: every
secret reads `***` (a login:password one `***:***`), so no vault password is needed and no
secret value can reach DIR.

The inventory is validated first (same messages and checks as the deploy's hook,
validation.py); exit 2 on problems. No role has a preview of its own: a role added to the
table is previewed as it deploys.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import validation
from roles import recording, stated_state
from roles.shared import secret_files
from roles.site import HostSettings, Site, SiteError, load_site
from roles.site.command_line import OneLineParser
from roles.site.current import STATED_SECRETS
from roles.site.errors import output_path_problem, print_problems

COMMANDS = "inference-host-commands/deploy.sh"
STATE_NOTE = "inference-host-preview.txt"


def record(site: Site, inventory_file: str) -> dict[str, recording.Recording]:
    """The deploy of every host of the site, recorded against the stated state."""
    STATED_SECRETS.clear()
    STATED_SECRETS.update(stated_state.secrets(site))
    try:
        return recording.record_deploy(
            inventory_file, lambda name: stated_state.answers(site.hosts[name], site), stated_state.LOCAL
        )
    finally:
        STATED_SECRETS.clear()


def files_of(host: recording.Recording, settings: HostSettings) -> dict[str, str | bytes]:
    """The preview's files of one host: path (relative to DIR/<host>) -> content."""
    commands = host.commands()
    files = {_destination(path, commands).lstrip("/"): text for path, text in host.uploads().items()}
    files[COMMANDS] = "".join(f"{command}\n" for command in commands)
    files[STATE_NOTE] = stated_state.description(settings)
    return files


def _destination(path: str, commands: list[str]) -> str:
    """Where an upload ends: a secret is uploaded to a root-only folder under the SHA-1 of its
    destination, which the next command installs it at (roles/shared/secret_files.py)."""
    if not path.startswith(f"{secret_files.UPLOAD_DIR}/"):
        return path
    for command in commands:
        if path in command:
            for word in shlex.shlex(command, posix=True, punctuation_chars=True):
                if secret_files.staged_path(word) == path:
                    return word
    return path


def write(recorded: dict[str, recording.Recording], site: Site, out: Path) -> dict[str, list[Path]]:
    written: dict[str, list[Path]] = {}
    for name, host in recorded.items():
        written[name] = []
        for path, content in files_of(host, site.hosts[name]).items():
            target = out / name / path
            target.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, bytes):
                target.write_bytes(content)
            else:
                target.write_text(content)
            written[name].append(target)
    return written


def render(site: Site, out: Path) -> dict[str, list[Path]]:
    return write(record(site, site.inventory_file), site, out)


def engine_diff(site: Site, other_id: str, model_dir: Path, draft_dir: Path | None, python: str | None) -> str:
    """Each gpu node's engine settings as the engine itself resolves them, on the active stack
    and on other_id, side by side (roles/serving/preflight.py runs the engines' own code)."""
    from roles.serving import preflight

    if other_id not in site.stack.stacks:
        raise SiteError(
            [f"--engine-diff {other_id}: no such stack in {site.stack.file}; stacks: {', '.join(site.stack.stacks)}"]
        )
    if not (model_dir / "config.json").is_file():
        raise SiteError(
            [
                f"--model-dir {model_dir}: no config.json there; give a folder with the model's"
                " config files (the Hub repository's *.json and *.py, no weights)"
            ]
        )
    nodes = [(site, settings) for settings in site.group("gpu_nodes")]
    before = preflight.run_many(site.stack.active, nodes, model_dir, draft_dir, python)
    after = preflight.run_many(site.stack.stacks[other_id], nodes, model_dir, draft_dir, python)
    return "\n".join(preflight.diff_text(old, new) for old, new in zip(before, after, strict=True))


def main(argv: list[str] | None = None, prog: str = "python -m roles.render") -> int:
    parser = OneLineParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("inventory", help="inventory file, e.g. inventory/prod.py")
    parser.add_argument("--out", type=Path, help="folder for DIR/<host>/<path on the host>")
    parser.add_argument(
        "--engine-diff",
        metavar="STACK",
        help="show each gpu node's engine settings, resolved by the engine's own start-up code,"
        " on the active stack and on STACK (installs both stacks' locks on this machine)",
    )
    parser.add_argument(
        "--model-dir", type=Path, help="with --engine-diff: the model's config files (config.json, configuration_*.py)"
    )
    parser.add_argument("--draft-model-dir", type=Path, help="with --engine-diff: the EAGLE-3 drafter's config.json")
    parser.add_argument("--python", help="with --engine-diff: the CPython of the stacks' version to install with")
    args = parser.parse_args(argv)
    if not args.out and not args.engine_diff:
        parser.error("give --out DIR (the files) or --engine-diff STACK (the engine's settings)")
    if args.engine_diff and not args.model_dir:
        parser.error("--engine-diff needs --model-dir (the model's config files)")
    try:
        site = load_site(args.inventory, validation.ROLE_CHECKS)  # the deploy's hook's checks
        if args.out:
            problem = output_path_problem("--out", args.out, folder=True)
            if problem:
                raise SiteError([problem])
        if args.engine_diff:
            print(engine_diff(site, args.engine_diff, args.model_dir, args.draft_model_dir, args.python), end="")
    except SiteError as error:
        print_problems(error)
        return 2
    if args.out:
        for host, paths in write(record(site, args.inventory), site, args.out).items():
            print(f"{host}: {len(paths)} file(s) under {args.out / host}")
    return 0


if __name__ == "__main__":
    from roles.site.command_line import run_command

    run_command(main, "python -m roles.render")
