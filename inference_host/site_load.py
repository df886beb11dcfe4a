"""The site of an inventory for the operator's subcommands, or exit 2 with the model's own lines:
one place that status, drain, rollback, rotate, teardown and trust load it from (none of them
imports another for it)."""

from __future__ import annotations

from roles.site.command_line import USAGE


def load(parser, inventory: str):
    from roles.site import SiteError, load_site
    from roles.site.errors import print_problems

    try:
        return load_site(inventory)
    except SiteError as error:
        print_problems(error)
        raise SystemExit(USAGE) from None
