"""The inventory's validation hook: the layer above the site model and the roles.

Every inventory file ends with ``require_valid_inventory(__file__, globals())``. It runs the model's own
rules and ROLE_CHECKS, the checks that need a role's knowledge (the model imports no role):
the SGLang command line rendered for the pinned release, checked against that release's real
CLI (roles/serving), the gateway's command line against smg's (roles/gateway), the
speculative decoding settings with the drafter's config against the target's, per release
(roles/serving/speculative.py), the GPU memory the pinned release will need at start-up against
serving_mem_fraction_static (roles/serving/memory.py), the EAGLE-3 training job's settings and its SpecForge lock
(roles/eagle3_training/checks.py), and that the engine's unit and environment file can hold the
host's values as systemd reads them back (roles/serving.systemd_problems). Importing this module
registers nothing: the same list is passed to every validation (roles/render.py passes it too;
`inference-host validate FILE` (this module's main) passes it whether or not the file calls require_valid_inventory;
load_site without checks runs the list the file's own call names). The stacks'
locks are the model's own check (roles/site/lock.py: local files only, no network);
`python -m roles.engine_envs.lock` makes them (`python -m roles.eagle3_training.lock` the job's).

    uv run inference-host validate INVENTORY [--json]   (the same: uv run python -m validation INVENTORY)

Exit status 0 valid, 2 invalid (one line per problem) or bad usage.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from roles.eagle3_training.checks import training_problems
from roles.gateway.command import gateway_problems
from roles.serving import systemd_problems
from roles.serving.command import command_problems
from roles.serving.memory import memory_lines, memory_problems
from roles.serving.speculative import speculative_problems
from roles.site import SiteError, loading
from roles.site.command_line import OneLineParser, run_command
from roles.site.errors import display, print_problems
from roles.site.loading import load_site
from roles.site.rules import RoleChecks
from roles.site.table import settings_reference

ROLE_CHECKS = RoleChecks(
    engine=(command_problems, training_problems, systemd_problems),
    gateway=(gateway_problems,),
    speculative=(speculative_problems,),
    memory=(memory_problems,),
    summary=(memory_lines,),
)


def require_valid_inventory(inventory_file: str, groups: dict | None = None) -> None:
    """Called at the end of every inventory file as ``require_valid_inventory(__file__, globals())``:
    stop before pyinfra connects to anything. The file hands over its own globals (its groups),
    so the file runs once and nothing reads the caller's frame."""
    if groups is None:
        # The one-argument form of earlier versions read the caller's frame (sys._getframe):
        # refused in one line that says what to write, before anything is contacted.
        print_problems(
            SiteError(
                [
                    f"{display(Path(inventory_file))}: require_valid_inventory(__file__) is given no"
                    " groups; write require_valid_inventory(__file__, globals())"
                ]
            )
        )
        raise SystemExit(2)
    loading.require_valid_inventory(inventory_file, groups, ROLE_CHECKS)


def _parser(prog: str) -> OneLineParser:
    parser = OneLineParser(
        prog=prog, description="Validate an inventory: the site model and the roles' checks; no host contacted."
    )
    parser.add_argument("inventory", nargs="?", help="inventory file, e.g. inventory/prod.py")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object on stdout")
    parser.add_argument("--settings", action="store_true", help="print the settings reference instead")
    return parser


def main(argv: list[str], prog: str = "python -m validation") -> int:
    parser = _parser(prog)
    args = parser.parse_args(argv)
    if args.settings:
        print(settings_reference(), end="")
        return 0
    if not args.inventory:
        parser.error("the inventory file is required, e.g. inventory/prod.py")
    try:
        site = load_site(args.inventory, ROLE_CHECKS)
    except SiteError as site_error:
        if args.json:
            print(json.dumps({"inventory": args.inventory, "valid": False, "problems": site_error.problems}))
        else:
            print_problems(site_error)
        return 2
    memory = _memory_lines(site)
    if args.json:
        data = site.summary_data()
        for name, lines in memory.items():
            data["hosts"][name]["memory"] = lines
        print(json.dumps(data))
    else:
        print(site.summary())
        for name, lines in memory.items():
            print("\n".join(f"  {name}: {line}" for line in lines))
    return 0


def _memory_lines(site) -> dict[str, list[str]]:
    """Per gpu node, the roles' lines beside a valid site (ROLE_CHECKS.summary): the inventory's
    mem_fraction_static beside the one the pinned SGLang release would choose for the card, and
    the KV estimate (roles/serving/memory.py)."""
    inventory_dir = Path(site.inventory_file).parent
    found = {}
    for host in site.hosts.values():
        if host.in_group("gpu_nodes"):
            lines = [line for show in ROLE_CHECKS.summary for line in show(host, site.hosts, site.stack, inventory_dir)]
            if lines:
                found[host.name] = lines
    return found


if __name__ == "__main__":
    run_command(lambda: main(sys.argv[1:]), "python -m validation")
