"""uv run python -m roles.site INVENTORY | --settings (the reference, docs/settings.md)

The command line sits above the model and the roles (tests/unit/test_layout.py's COMPOSITION,
like roles/render.py): it runs validation.py's ROLE_CHECKS on every inventory, whether the file
ends with require_valid_inventory(__file__, globals()) or not, so an inventory that leaves the
call out is never called valid without the roles' checks."""

from __future__ import annotations

import sys

from roles.site.errors import SiteError, print_problems
from roles.site.loading import load_site
from roles.site.table import settings_reference
from validation import ROLE_CHECKS


def main(argv: list[str]) -> int:
    if argv in (["-h"], ["--help"]):
        print(
            "usage: python -m roles.site INVENTORY | --settings\n\n"
            "INVENTORY: check an inventory file without contacting a host and print its summary;\n"
            "--settings: print the settings reference (docs/settings.md)"
        )
        return 0
    if argv == ["--settings"]:
        print(settings_reference(), end="")
        return 0
    if len(argv) != 1:
        print("usage: python -m roles.site inventory/<file>.py", file=sys.stderr)
        return 64
    try:
        print(load_site(argv[0], ROLE_CHECKS).summary())
    except SiteError as site_error:
        print_problems(site_error)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
