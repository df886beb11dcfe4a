"""The inventory's validation hook: the layer above the site model and the roles.

Every inventory file ends with ``require_valid_inventory(__file__)``. It runs the model's own
rules and ROLE_CHECKS, the checks that need a role's knowledge (the model imports no role):
the SGLang command line rendered for the pinned release, checked against that release's real
CLI (roles/serving), the gateway's command line against smg's (roles/gateway), the
speculative decoding settings with the drafter's config against the target's, per release
(roles/serving/speculative.py), and the EAGLE-3 training job's settings and its SpecForge lock
(roles/eagle3_training/checks.py). Importing this module registers nothing: the same list is
passed to every validation (roles/render.py passes it too; `python -m roles.site FILE` and
load_site run the list the file's own call names). The stacks' locks are the model's own check
(roles/site/lock.py: local files only, no network); `python -m roles.engine_envs.lock` makes them
(`python -m roles.eagle3_training.lock` the job's).
"""

from __future__ import annotations

import sys

from roles.eagle3_training.checks import training_problems
from roles.gateway.command import gateway_problems
from roles.serving.command import command_problems
from roles.serving.speculative import speculative_problems
from roles.site import loading
from roles.site.rules import RoleChecks

ROLE_CHECKS = RoleChecks(
    engine=(command_problems, training_problems),
    gateway=(gateway_problems,),
    speculative=(speculative_problems,),
)


def require_valid_inventory(inventory_file: str) -> None:
    """Called at the end of every inventory file: stop before pyinfra connects to anything.

    The file's groups are read from its globals (the caller's frame), so the file runs once."""
    loading.require_valid_inventory(inventory_file, sys._getframe(1).f_globals, ROLE_CHECKS)
