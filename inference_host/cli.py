"""`inference-host`: one command for the operator, with a subcommand per job.

    uv run inference-host validate inventory/prod.py          # the site model, no host contacted
    uv run inference-host deploy inventory/prod.py --check    # pyinfra's dry run, with every file's diff
    uv run inference-host status inventory/prod.py            # what each host is doing now

The inventory is the first positional argument of every subcommand that reads one (the old
`--inventory FILE` is still accepted where the wrapped module took it). Exit status, the same for
every subcommand (docs/operations.md): 0 ok, 1 a check or verdict failed, 2 bad usage or invalid
input (nothing contacted), 3 a host or service could not be reached, 4 (accept only) every line
passed on a lab stand-in's answers. Output into a closed pipe
ends quietly. The subcommands that wrap an existing module (validate, preview, check, accept,
bench, vault, lock, lab) accept every option of that module; `-h` lists them.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from inference_host.pyinfra_run import pyinfra_argv, run_pyinfra
from roles.site.command_line import FAILED, OK, USAGE, OneLineParser

ROOT = Path(__file__).resolve().parent.parent
PROG = "inference-host"


# -- the modules each subcommand wraps -----------------------------------------------------------


def _validate(argv: list[str]) -> int:
    from validation import main

    return main(argv, prog=f"{PROG} validate")


def _preview(argv: list[str]) -> int:
    from roles.render import main

    return main(argv, prog=f"{PROG} preview")


def _check(argv: list[str]) -> int:
    from checks.__main__ import main

    return main(argv, prog=f"{PROG} check")


def _accept(argv: list[str]) -> int:
    from checks.acceptance import main

    return main(argv, prog=f"{PROG} accept")


def _bench(argv: list[str]) -> int:
    from checks.bench import main

    return main(argv, prog=f"{PROG} bench")


def _vault(argv: list[str]) -> int:
    from roles.site.vault import _main

    return _main(argv, prog=f"{PROG} vault")


def _lab(argv: list[str]) -> int:
    from lab.__main__ import main

    return main(argv, prog=f"{PROG} lab")


def _lock_engines(argv: list[str]) -> int:
    from roles.engine_envs.lock import main

    return main(argv, prog=f"{PROG} lock engines")


def _lock_gateway(argv: list[str]) -> int:
    from roles.gateway.lock import main

    return main(argv, prog=f"{PROG} lock gateway")


def _lock_eagle3(argv: list[str]) -> int:
    from roles.eagle3_training.lock import main

    return main(argv, prog=f"{PROG} lock eagle3")


def _lock_tools(argv: list[str]) -> int:
    from roles.shared.tool_locks import main

    return main(argv)


def _run_module(function: Callable[[list[str]], int], argv: list[str]) -> int:
    """A wrapped module's main, in this process: its SystemExit (argparse's --help, a usage error)
    becomes the status; the old usage status 64 reads as 2, the status this command documents."""
    try:
        code = function(argv)
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else USAGE)
        if done.code not in (None, 0) and not isinstance(done.code, int):
            print(done.code, file=sys.stderr)
    code = int(code or 0)
    return USAGE if code == 64 else code


def _module_help(function: Callable[[list[str]], int]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        function(["--help"])
    return out.getvalue()


# -- the inventory, given the same way everywhere -----------------------------------------------


def _inventory_arguments(parser: OneLineParser, old_flag: bool) -> None:
    parser.add_argument("inventory", nargs="?", help="inventory file, e.g. inventory/prod.py")
    if old_flag:
        parser.add_argument("--inventory", dest="inventory_flag", metavar="INVENTORY", help="the same, as a flag")


def _inventory(parser: OneLineParser, args, required: bool = True) -> str | None:
    given = [v for v in (args.inventory, getattr(args, "inventory_flag", None)) if v]
    if len(given) == 2 and given[0] != given[1]:
        parser.error(f"the inventory is given twice ({given[0]!r} and {given[1]!r}); give it once")
    if not given and required:
        parser.error("the inventory file is required, e.g. inventory/prod.py")
    return given[0] if given else None


# -- subcommands that wrap a module -------------------------------------------------------------

# name -> (module function, help line, takes the inventory, old --inventory flag, usage of the module)
WRAPPED = {
    "validate": (_validate, "validate the inventory (the site model; no host contacted)", True, False),
    "preview": (_preview, "write what the deploy would template, offline (roles.render)", True, False),
    "check": (_check, "run the health checks against the hosts (checks)", True, True),
    "accept": (_accept, "one acceptance report of what only the real machine shows", True, True),
    "bench": (_bench, "the benchmark (checks.bench)", True, True),
}


def _wrapped(name: str, args, rest: list[str], parser: OneLineParser) -> int:
    function, _, takes_inventory, old_flag = WRAPPED[name]
    optional = (name in ("check", "accept", "bench") and _has_hosts(rest)) or (
        name == "validate" and "--settings" in rest
    )
    inventory = _inventory(parser, args, required=not optional)
    if name == "validate":
        argv = ([inventory] if inventory else []) + rest + (["--json"] if args.json else [])
        return _run_module(function, argv)
    if name == "preview":
        assert inventory is not None  # required for preview
        return _run_module(function, [inventory, *rest])
    argv = (["--inventory", inventory] if inventory else []) + rest
    if name == "check" and args.json:
        return _check_json(argv)
    if name == "accept" and args.json:
        return _accept_json(argv)
    return _run_module(function, argv)


def _has_hosts(rest: list[str]) -> bool:
    return any(item == "--hosts" or item.startswith("--hosts=") for item in rest)


def _check_json(argv: list[str]) -> int:
    """The verdict tables go to stderr; stdout gets one JSON object: every host's report."""
    if any(a == "--report" or a.startswith("--report=") for a in argv):
        print(f"{PROG} check: error: --json prints the reports; leave --report out", file=sys.stderr)
        return USAGE
    with tempfile.TemporaryDirectory(prefix="inference-host-check-") as folder:
        with contextlib.redirect_stdout(sys.stderr):
            code = _run_module(_check, [*argv, "--report", folder + "/"])
        reports = [json.loads(p.read_text()) for p in sorted(Path(folder).glob("*.json"))]
    if code == USAGE:
        return code
    print(json.dumps({"status": code, "healthy": code == OK, "reports": reports}))
    return code


def _accept_json(argv: list[str]) -> int:
    out = None
    for i, item in enumerate(argv):
        if item == "--out" and i + 1 < len(argv):
            out = argv[i + 1]
        elif item.startswith("--out="):
            out = item.split("=", 1)[1]
    if out is None:
        out = str(Path("reports") / f"acceptance-{time.strftime('%Y%m%d-%H%M%S')}")
        argv = [*argv, "--out", out]
    with contextlib.redirect_stdout(sys.stderr):
        code = _run_module(_accept, argv)
    report = Path(out) / "report.json"
    if code != USAGE and report.is_file():
        print(report.read_text().strip())
    return code


# -- deploy ---------------------------------------------------------------------------------------


def deploy_refusal(inventory: str, limit: list[str]) -> str | None:
    """Why the deploy must not start (one line), before pyinfra runs: pyinfra reads a path that
    is not a file as a host name or a module, and a --limit that matches nothing as no hosts, and
    both end in an empty run that exits 0 (pyinfra_cli/inventory.py, 3.10)."""
    path = ROOT / inventory
    if not path.exists():
        return f"{inventory}: no such inventory file; e.g. inventory/prod.py"
    if not path.is_file():
        return f"{inventory}: not an inventory file (a folder?); e.g. inventory/prod.py"
    if not limit:
        return None
    from fnmatch import fnmatch

    from roles.site import SiteError, load_site

    try:
        site = load_site(inventory)
    except SiteError:
        return None  # pyinfra's load runs the same validation and prints every problem (exit 2)
    groups = {group for host in site.hosts.values() for group in host.groups}
    for name in limit:  # pyinfra: a group's name, else a host name pattern (pyinfra_cli/util.py)
        if name not in groups and not any(fnmatch(host, name) for host in site.hosts):
            return (
                f"--limit {name!r} matches no host or group of {inventory}; hosts: {', '.join(site.hosts)};"
                f" groups: {', '.join(sorted(groups))}"
            )
    return None


def _deploy(args, rest: list[str], parser: OneLineParser) -> int:
    inventory = _inventory(parser, args)
    assert inventory is not None  # required: _inventory has said so in one line
    refusal = deploy_refusal(inventory, args.limit)
    if refusal:
        parser.error(refusal)
    return run_pyinfra(pyinfra_argv(inventory, args.check, args.yes, args.limit, rest))


# -- the parser -----------------------------------------------------------------------------------


class _HelpWithModule(OneLineParser):
    """-h shows this subcommand's own options, then those of the module it passes the rest to."""

    module_help: Callable[[], str] | None = None

    def format_help(self) -> str:
        text = super().format_help()
        if self.module_help:
            text += "\nevery other option is passed on; the module's own help:\n\n" + self.module_help()
        return text


def build_parser() -> OneLineParser:
    from inference_host import operations

    parser = OneLineParser(
        prog=PROG, description="One command for the operator of an inference-host site, a subcommand per job."
    )
    parser.epilog = (
        "exit status: 0 ok, 1 a check failed, 2 bad usage or input, 3 a host could not be reached,"
        " 4 accepted on lab stand-ins only"
    )
    parser.add_argument("--version", action="version", version=version())
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_HelpWithModule)

    for name, (function, help_text, _, old_flag) in WRAPPED.items():
        command = commands.add_parser(name, help=help_text, description=help_text)
        command.module_help = lambda function=function: _module_help(function)
        _inventory_arguments(command, old_flag)
        if name in ("validate", "check", "accept"):
            command.add_argument("--json", action="store_true", help="print the result as JSON on stdout")

    deploy = commands.add_parser(
        "deploy", help="converge the hosts (pyinfra); --check: a dry run with every file's diff"
    )
    deploy.description = (
        "Run the deploy: `pyinfra INVENTORY deploy.py`. With --check, pyinfra's dry run (--dry --diff): "
        "the facts are read from the real hosts and every change, with each file's diff, is printed; "
        "nothing is executed. Options after `--` go to pyinfra."
    )
    _inventory_arguments(deploy, False)
    deploy.add_argument("--check", action="store_true", help="dry run with diffs; changes nothing")
    deploy.add_argument("-y", "--yes", action="store_true", help="no prompt before executing")
    deploy.add_argument("--limit", action="append", default=[], metavar="HOST_OR_GROUP", help="only these (repeat)")

    vault = commands.add_parser("vault", help="the secrets vault: set, list, check, rename", add_help=False)
    vault.add_argument("-h", "--help", action="store_true", dest="vault_help", help="show the vault's help")

    lock = commands.add_parser("lock", help="make a committed lock (engines, gateway, eagle3, tools)")
    lock_kinds = lock.add_subparsers(dest="lock_kind", required=True, metavar="KIND", parser_class=_HelpWithModule)
    for kind, function, help_text in (
        ("engines", _lock_engines, "an engine stack's hashed lock (roles.engine_envs.lock)"),
        ("gateway", _lock_gateway, "the gateway's (smg) hashed lock (roles.gateway.lock)"),
        ("eagle3", _lock_eagle3, "the EAGLE-3 training job's lock (roles.eagle3_training.lock)"),
        ("tools", _lock_tools, "uv's, cuobjdump's, the weights tool's, the builders' locks (roles.shared.tool_locks)"),
    ):
        sub = lock_kinds.add_parser(kind, help=help_text, description=help_text, add_help=False)
        sub.module_help = lambda function=function: _module_help(function)
        sub.add_argument("-h", "--help", action="help", help="show this help message and exit")
        sub.set_defaults(lock_function=function)

    lab = commands.add_parser("lab", help="the lab's containers: up, down, status", add_help=False)
    lab.add_argument("-h", "--help", action="store_true", dest="lab_help", help="show the lab's help")

    operations.add_parsers(commands)
    from inference_host import rollback, rotate, teardown, trust

    rollback.add_rollback_parser(commands)
    rotate.add_rotate_parser(commands)
    teardown.add_teardown_parser(commands)
    trust.add_trust_parser(commands)
    return parser


def version() -> str:
    """The project's version and the commit this checkout is at (when git can say)."""
    import tomllib

    number = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    try:
        commit = subprocess.run(
            ["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        commit = ""
    return f"{PROG} {number}" + (f" ({commit})" if commit else "")


def _unknown_command(parser: OneLineParser, argv: list[str]) -> None:
    """A mistyped subcommand (or lock kind) is one line with the nearest names (difflib)."""
    import difflib

    def refuse(prog: str, word: str, choices: list[str]) -> None:
        near = difflib.get_close_matches(word, choices, n=2, cutoff=0.6)
        hint = f"; did you mean {' or '.join(near)}?" if near else ""
        print(f"{prog}: error: unknown command {word[:40]!r}{hint} (commands: {', '.join(choices)})", file=sys.stderr)
        raise SystemExit(USAGE)

    assert parser._subparsers is not None
    choices = parser._subparsers._group_actions[0].choices  # argparse keeps them here (3.11-3.13)
    assert isinstance(choices, dict)
    if argv and not argv[0].startswith("-") and argv[0] not in choices:
        refuse(PROG, argv[0], list(choices))
    if len(argv) > 1 and argv[0] == "lock" and not argv[1].startswith("-"):
        kinds = ["engines", "gateway", "eagle3", "tools"]
        if argv[1] not in kinds:
            refuse(f"{PROG} lock", argv[1], kinds)


def main(argv: list[str] | None = None) -> int:
    """The command's status (the console script runs it through run_command: a closed pipe, a
    Ctrl-C and any locale handled at the edge)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    _unknown_command(parser, argv)
    if argv and argv[0] in ("vault", "lab"):  # the module parses its own subcommands
        function = _vault if argv[0] == "vault" else _lab
        with _in_root():
            return _run_module(function, argv[1:])
    pass_through = None
    if "--" in argv:
        at = argv.index("--")
        argv, pass_through = argv[:at], argv[at + 1 :]
    args, rest = parser.parse_known_args(argv)
    command = args.command
    if rest and (command not in WRAPPED and command != "lock"):
        _subparser(parser, command).error(f"unrecognized arguments: {' '.join(rest)}")
    rest += pass_through or []
    if command in ("validate", "preview", "check", "accept", "bench", "deploy", "lock") or hasattr(args, "run"):
        _absolute_inventory(args)
    with _in_root():
        if command in WRAPPED:
            return _wrapped(command, args, rest, _subparser(parser, command))
        if command == "deploy":
            return _deploy(args, rest, _subparser(parser, command))
        if command == "lock":
            return _run_module(args.lock_function, rest)
        return args.run(args, _subparser(parser, command))


def _subparser(parser: OneLineParser, name: str) -> OneLineParser:
    groups = parser._subparsers._group_actions if parser._subparsers else []  # argparse keeps them here (3.11-3.13)
    for action in groups:
        choices = action.choices
        if isinstance(choices, dict) and name in choices:
            return choices[name]
    return parser


# The command works from the project root (pyinfra reads group_data/ and config.py from its
# working folder, the inventories import validation.py): an inventory named relative to the folder
# the operator is in is made absolute first; other paths (--out, --report) are relative to the root.
_STARTED_IN = Path.cwd()


def _absolute_inventory(args) -> None:
    for key in ("inventory", "inventory_flag"):
        value = getattr(args, key, None)
        if value:
            path = (_STARTED_IN / value).resolve()
            try:
                setattr(args, key, str(path.relative_to(ROOT)))
            except ValueError:
                setattr(args, key, str(path))


@contextlib.contextmanager
def _in_root():
    before = os.getcwd()
    os.chdir(ROOT)
    try:
        yield
    finally:
        os.chdir(before)


__all__ = ["main", "build_parser", "pyinfra_argv", "FAILED"]
