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

from roles.site.command_line import OneLineParser, quiet_on_closed_pipe
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
    print(json.dumps(site.summary_data()) if args.json else site.summary())
    return 0


if __name__ == "__main__":
    quiet_on_closed_pipe()
    raise SystemExit(main(sys.argv[1:]))
