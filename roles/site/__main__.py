"""Validate an inventory: the site model, before any host is contacted.

    uv run python -m roles.site INVENTORY [--json]     (also: uv run inference-host validate INVENTORY)
    uv run python -m roles.site --settings             (the settings reference, docs/settings.md)

Exit status 0 valid, 2 invalid (one line per problem) or bad usage.

The command line sits above the model and the roles (tests/unit/test_layout.py's COMPOSITION,
like roles/render.py): it runs validation.py's ROLE_CHECKS on every inventory, whether the file
ends with require_valid_inventory(__file__, globals()) or not, so an inventory that leaves the
call out is never called valid without the roles' checks.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from roles.site.command_line import OneLineParser, run_command
from roles.site.errors import SiteError, print_problems
from roles.site.loading import load_site
from roles.site.table import settings_reference
from validation import ROLE_CHECKS


def _parser(prog: str) -> OneLineParser:
    parser = OneLineParser(prog=prog, description=__doc__.split("\n")[0])
    parser.add_argument("inventory", nargs="?", help="inventory file, e.g. inventory/prod.py")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object on stdout")
    parser.add_argument("--settings", action="store_true", help="print the settings reference instead")
    return parser


def main(argv: list[str], prog: str = "python -m roles.site") -> int:
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
    run_command(lambda: main(sys.argv[1:]), "python -m roles.site")
