"""The inventory's validation hook: the layer above the site model and the roles.

Every inventory file ends with ``require_valid_inventory(__file__)``. Importing this module
registers the checks that need a role's knowledge with the model (which imports no role):
the SGLang command line rendered for the pinned release, checked against that release's real
CLI (roles/serving), the gateway's command line against smg's (roles/gateway), and the active stack's resolution (roles/sglang, under pyinfra only).
"""

from __future__ import annotations

import sys

from roles.gateway.command import gateway_problems
from roles.serving.command import command_problems
from roles.sglang.stack_check import require_consistent_stack
from roles.site import Site, loading, rules


def _consistent_stack(site: Site) -> None:
    if site.group("gpu_nodes"):
        require_consistent_stack(site.stack.active)


rules.register_engine_check(command_problems)
rules.register_gateway_check(gateway_problems)
loading.register_deploy_check(_consistent_stack)


def require_valid_inventory(inventory_file: str) -> None:
    """Called at the end of every inventory file: stop before pyinfra connects to anything.

    The file's groups are read from its globals (the caller's frame), so the file runs once."""
    loading.require_valid_inventory(inventory_file, sys._getframe(1).f_globals)
