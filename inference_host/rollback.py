"""`inference-host rollback` (docs/operations.md): the stack file's `active` set back to a stack
every gpu node still keeps, then the deploy, health-gated like an upgrade."""

from __future__ import annotations

import re
import sys
import time

from inference_host.operations import run_everywhere, seconds_option, sections_script, split_sections, time_bounded
from inference_host.site_load import load as _load
from roles.shared.shell import sh
from roles.site.command_line import FAILED, OK, UNREACHABLE, USAGE

_ACTIVE_LINE = re.compile(r"^active:[ \t]*(?P<id>[^\s#]+)(?P<rest>.*)$", re.MULTILINE)


def with_active(stack_text: str, stack_id: str) -> str:
    """The stack file's text with `active:` set to stack_id, its comments and layout kept (the
    file is the operator's: a YAML round trip would drop the comments). Read back with the site
    model's own loader before it is written (rollback does)."""
    matches = list(_ACTIVE_LINE.finditer(stack_text))
    if len(matches) != 1:
        raise ValueError(f"expected one top-level `active:` line, found {len(matches)}")
    match = matches[0]
    return stack_text[: match.start()] + f"active: {stack_id}{match.group('rest')}" + stack_text[match.end() :]


def kept_environments(inventory: str, nodes, timeout_s: float) -> dict[str, list[str]]:
    """gpu node -> the environments kept under <install_root>/envs, newest first (bounded)."""
    scripts = {
        n.name: sections_script({"kept": time_bounded(sh("ls -1t -- {envs}", envs=n.base.install_root + "/envs"))})
        for n in nodes
    }
    answers = run_everywhere(inventory, scripts, timeout_s)
    kept = {}
    for node in nodes:
        answer = answers[node.name]
        if "error" in answer:
            raise ConnectionError(f"{node.name}: {answer['error']}")
        text, code = split_sections(answer["stdout"]).get("kept", ("", None))
        kept[node.name] = [line.strip() for line in text.splitlines() if line.strip()] if code == 0 else []
    return kept


def rollback_target(active: str, stacks: list[str], kept: dict[str, list[str]], named: str | None) -> str:
    """The stack to go back to: `named`, else the newest environment of another stack kept on the
    first gpu node; it must be kept on every gpu node (a rollback installs nothing). ValueError
    says why there is none."""

    def stack_of(env: str) -> str:
        return env.rpartition("-")[0]

    if named is not None:
        if named not in stacks:
            raise ValueError(f"no stack {named!r} in the stack file; stacks: {', '.join(stacks)}")
        if named == active:
            raise ValueError(f"{named} is already the active stack; nothing to roll back to")
        target = named
    else:
        first = next(iter(kept.values()), [])
        previous = [stack_of(env) for env in first if stack_of(env) in stacks and stack_of(env) != active]
        if not previous:
            raise ValueError(
                f"no environment of another stack is kept on {next(iter(kept), 'the gpu nodes')}"
                f" (kept: {', '.join(first) or 'none'}); name one with --to, which deploys it like an upgrade"
            )
        target = previous[0]
    missing = [node for node, envs in kept.items() if target not in {stack_of(env) for env in envs}]
    if missing:
        raise ValueError(
            f"{target} is not kept on {', '.join(missing)}: that is an upgrade, not a rollback"
            f" (set active: {target} in the stack file and deploy)"
        )
    return target


def rollback(args, parser) -> int:
    """stack.yml's `active` set back, then the deploy: the engine's preflight, the health-gated
    switch and, behind gateways, the rolling switch one replica at a time, as for an upgrade. A
    failed deploy puts the file back (the switch itself already kept the old release serving)."""
    from pathlib import Path

    from roles.site import SiteError
    from roles.site.stack import load_stack

    site = _load(parser, args.inventory)
    nodes = site.group("gpu_nodes")
    if not nodes:
        parser.error(f"{args.inventory} has no gpu_nodes: nothing serves, nothing to roll back")
    try:
        kept = kept_environments(args.inventory, nodes, args.timeout)
    except ConnectionError as error:
        print(f"inference-host rollback: {error}; nothing changed", file=sys.stderr)
        return UNREACHABLE
    active = site.stack.active.id
    try:
        target = rollback_target(active, list(site.stack.stacks), kept, args.to)
    except ValueError as error:
        parser.error(str(error))
    stack_file = Path(site.stack.path)
    before = stack_file.read_text(encoding="utf-8")
    after = with_active(before, target)
    stack_file.write_text(after, encoding="utf-8")
    try:
        if load_stack(stack_file).active.id != target:
            raise SiteError([f"{stack_file}: active did not read back as {target}"])
    except SiteError as error:
        stack_file.write_text(before, encoding="utf-8")
        print(f"inference-host rollback: {error.problems[0]}; the file is as it was", file=sys.stderr)
        return USAGE
    print(
        f"rollback: {stack_file} active: {active} -> {target}; deploying"
        " (preflight, health gate, one replica at a time)"
    )
    from inference_host.pyinfra_run import pyinfra_argv, run_pyinfra

    started = time.monotonic()
    code = run_pyinfra(pyinfra_argv(args.inventory, False, True, [], []))
    if code != 0:
        stack_file.write_text(before, encoding="utf-8")
        if code == UNREACHABLE:
            print(f"inference-host rollback: {stack_file} says active: {active} again", file=sys.stderr)
            return UNREACHABLE
        print(
            f"inference-host rollback: the deploy failed (exit {code}); {stack_file} says active: {active} again."
            " The switch keeps the release that served when the new one fails its gate; read the deploy's"
            " output above, then `inference-host status`",
            file=sys.stderr,
        )
        return FAILED
    print(f"rolled back to {target} in {time.monotonic() - started:.0f} s; commit {stack_file} (active: {target})")
    return OK


def add_rollback_parser(commands) -> None:
    sub = commands.add_parser(
        "rollback",
        help="back to the previous stack still kept on the hosts (or --to STACK), health-gated",
        description="Set the stack file's `active` to the previous stack whose environment every gpu node "
        "still keeps (or --to STACK), then deploy: the same preflight, health gate and, behind gateways, "
        "the rolling switch as an upgrade. A failed deploy puts the stack file back.",
    )
    sub.add_argument("inventory", help="inventory file, e.g. inventory/prod.py")
    sub.add_argument("--to", metavar="STACK", help="the stack id to go back to (default: the previous one kept)")
    sub.add_argument(
        "--timeout", type=seconds_option, default=10.0, metavar="SECONDS", help="wait this long for a node's list (10)"
    )
    sub.set_defaults(run=rollback)
