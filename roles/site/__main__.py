"""The settings reference, from the site model alone:

    uv run python -m roles.site --settings > docs/settings.md

An inventory is validated above the model and the roles, with the roles' checks
(validation.py): `uv run inference-host validate INVENTORY`. This module imports no role and
nothing above the model (tests/unit/test_layout.py), so it cannot call an inventory valid
without those checks: given one, it says where to go, exit 2.
"""

from __future__ import annotations

import argparse
import sys

from roles.site.command_line import OneLineParser, run_command
from roles.site.table import settings_reference


def main(argv: list[str], prog: str = "python -m roles.site") -> int:
    parser = OneLineParser(prog=prog, description="The settings reference (docs/settings.md).")
    parser.add_argument("inventory", nargs="?", help=argparse.SUPPRESS)
    parser.add_argument("--settings", action="store_true", help="print the settings reference")
    args = parser.parse_args(argv)
    if args.inventory:
        parser.error(
            f"validate {args.inventory} with `uv run inference-host validate {args.inventory}`"
            " (the model and the roles' checks); this module prints only the settings reference"
        )
    if not args.settings:
        parser.error("expected --settings")
    print(settings_reference(), end="")
    return 0


if __name__ == "__main__":
    run_command(lambda: main(sys.argv[1:]), "python -m roles.site")
