"""`inference-host rotate` (docs/operations.md): a new value of a secret into the vault, then onto
the hosts (a deploy). No value is printed or put on a command line."""

from __future__ import annotations

import sys
import time

from inference_host.site_load import load as _load
from roles.site.command_line import FAILED, OK, UNREACHABLE, USAGE


def _new_value(name: str) -> str:
    """The new value from stdin: typed without echo at a terminal, else the first line."""
    if sys.stdin.isatty():
        import getpass

        return getpass.getpass(f"new value of {name} (not echoed): ")
    return sys.stdin.readline().rstrip("\n")


def rotate(args, parser) -> int:
    """The vault's value replaced (roles/site/vault.py: encrypted, the file 0600), then the deploy
    writes it to every host that uses it (0600 files) and restarts what reads it, health-gated;
    behind gateways the replicas one at a time. No value is printed or put on a command line."""
    from pathlib import Path

    from inference_host.pyinfra_run import pyinfra_argv, run_pyinfra
    from roles.site.vault import SecretsError, new_value_problem, set_secret

    site = _load(parser, args.inventory)
    if not site.secrets_file:
        parser.error(f"{args.inventory} names no secrets file (secrets_file): nothing to rotate")
    names = sorted(site.secret_names or ())
    if args.secret not in names:
        parser.error(f"no secret {args.secret!r} in {site.secrets_file}; expected one of: {', '.join(names)}")
    value = _new_value(args.secret)
    if not value:
        parser.error("no new value on stdin; nothing written")
    path = Path(site.secrets_file)  # already beside the inventory (roles/site/loading.py)
    try:
        problem = new_value_problem(path, args.secret, value)
        if problem:  # never the value
            print(
                f"inference-host rotate: {path}: the new value of {args.secret} {problem}; nothing written",
                file=sys.stderr,
            )
            return USAGE
        set_secret(path, args.secret, value)
    except SecretsError as error:
        print(f"inference-host rotate: {path}: {error}; nothing written", file=sys.stderr)
        return USAGE
    print(f"rotate: {path}: {args.secret} replaced")
    if args.no_deploy:
        print(
            f"not deployed (--no-deploy): the hosts keep the old value until `inference-host deploy {args.inventory}`"
        )
        return OK
    started = time.monotonic()
    code = run_pyinfra(pyinfra_argv(args.inventory, False, True, [], []))
    if code != 0:
        print(
            f"inference-host rotate: the deploy failed (exit {code}); the vault holds the new value and some hosts"
            " may have it: fix what the deploy names and deploy again (to undo: rotate back to the old value)",
            file=sys.stderr,
        )
        return UNREACHABLE if code == UNREACHABLE else FAILED
    print(f"{args.secret} rotated on the hosts in {time.monotonic() - started:.0f} s")
    return OK


def add_rotate_parser(commands) -> None:
    sub = commands.add_parser(
        "rotate",
        help="a new value of a secret into the vault, then onto the hosts (a deploy)",
        description="Replace SECRET in the inventory's vault with a new value (typed without echo, or the "
        "first line of stdin), then deploy: every host that uses it gets the new 0600 file and what reads "
        "it restarts, health-gated (docs/operations.md says what clients see for the API key).",
    )
    sub.add_argument("inventory", help="inventory file, e.g. inventory/prod.py")
    sub.add_argument("secret", help="the vault key, e.g. engine_api_key, hf_token, monitoring_web_password")
    sub.add_argument("--no-deploy", action="store_true", help="only the vault; deploy later")
    sub.set_defaults(run=rotate)
