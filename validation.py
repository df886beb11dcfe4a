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
`python -m roles.site FILE` passes it whether or not the file calls require_valid_inventory;
load_site without checks runs the list the file's own call names). The stacks'
locks are the model's own check (roles/site/lock.py: local files only, no network);
`python -m roles.engine_envs.lock` makes them (`python -m roles.eagle3_training.lock` the job's).
"""

from __future__ import annotations

from pathlib import Path

from roles.eagle3_training.checks import training_problems
from roles.gateway.command import gateway_problems
from roles.serving import systemd_problems
from roles.serving.command import command_problems
from roles.serving.memory import memory_lines, memory_problems
from roles.serving.speculative import speculative_problems
from roles.site import SiteError, loading
from roles.site.errors import display, print_problems
from roles.site.rules import RoleChecks

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
