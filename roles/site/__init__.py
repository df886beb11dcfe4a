"""The site model: every setting the roles need, typed, defaulted and validated once.

It is the only reader of pyinfra's ``host.data`` and imports no role (tests/unit/test_layout.py
checks the import graph). The data flow is one way:

    inventory/<name>.py + group_data/*.py + inventory/stack.yml + the secrets vault
        -> Site (this package) -> deploy.py -> roles/<name>

Validation runs before any host is contacted: every inventory file ends with
``require_valid_inventory(__file__)`` from validation.py (the layer above the model and the
roles, which registers the roles' own checks), and pyinfra executes it while it loads the
inventory, i.e. before it connects. The same check runs standalone:

    uv run python -m roles.site inventory/prod.py

Modules: schema (the setting sections, HostSettings, Site), stack (the stack file), lock (the
stacks' locks: format, place, staleness), rules
(cross-host rules), weights (where each model's files live), loading (inventory -> Site, the validation core), current (deploy-time
access), vault (the ansible-vault secrets file), testinfra (how the checks reach a host),
table (the settings reference, docs/settings.md), __main__ (the command line).

Host data keys are flat and prefixed by the section they belong to (``serving_port``,
``nccl_p2p_level``); a key that belongs to no section is an error, so a typo never passes
silently. Roles added later extend the model by adding a section class to ``SECTIONS``.
"""

import warnings

from roles.site.current import current_host, current_site, secret_value
from roles.site.errors import SiteError
from roles.site.loading import load_site, site_from_inventory
from roles.site.placement import engine_reads_hub_token, node_sysctl, own_sysctl, sysctl_conflicts
from roles.site.schema import PROJECT_ROOT, SECTIONS, HostSettings, Site, address_of, build_host
from roles.site.sections.base import BaseSettings
from roles.site.sections.build import BuildSettings
from roles.site.sections.cuda import CudaSettings
from roles.site.sections.docker import DockerSettings
from roles.site.sections.eagle3_training import Eagle3TrainingSettings
from roles.site.sections.gateway import GatewaySettings
from roles.site.sections.gpu import GpuSettings
from roles.site.sections.guest import GuestSettings
from roles.site.sections.health import HealthSettings
from roles.site.sections.monitoring import MonitoringSettings
from roles.site.sections.nccl import NcclSettings
from roles.site.sections.nvidia_driver import NvidiaDriverSettings
from roles.site.sections.proxmox import ProxmoxSettings
from roles.site.sections.serving import ServingSettings, SpeculativeSettings
from roles.site.sections.sglang import SglangSettings
from roles.site.sections.vllm import VllmSettings
from roles.site.sections.weights import WeightsSettings
from roles.site.stack import EngineStack, KernelPackage, Stack, load_stack
from roles.site.table import settings_table
from roles.site.testinfra import connection_data, testinfra_url
from roles.site.weights import (
    WeightSet,
    served_weight_manifests,
    weight_sets_kept_by,
    weight_sets_of,
    weights_mount_points,
)

__all__ = [
    "PROJECT_ROOT", "SECTIONS", "BaseSettings", "BuildSettings", "CudaSettings", "DockerSettings", "GatewaySettings",
    "Eagle3TrainingSettings", "EngineStack", "GpuSettings", "GuestSettings", "HealthSettings", "HostSettings",
    "KernelPackage", "MonitoringSettings", "NcclSettings", "NvidiaDriverSettings", "ProxmoxSettings", "ServingSettings",
    "SglangSettings", "Site", "SiteError", "SpeculativeSettings", "Stack", "VllmSettings", "address_of",
    "build_host", "current_host", "current_site", "load_site", "load_stack",
    "secret_value", "settings_table", "site_from_inventory", "testinfra_url", "connection_data",
    "WeightSet", "WeightsSettings", "served_weight_manifests", "weight_sets_kept_by",
    "weight_sets_of", "weights_mount_points", "engine_reads_hub_token", "node_sysctl", "own_sysctl",
    "sysctl_conflicts",
]


def __getattr__(name: str):
    if name == "require_valid_inventory":
        # The hook lives above the model so that it can register the roles' checks: an old
        # inventory is refused in one line. Our loaders print an ImportError as FILE:LINE;
        # under pyinfra's CLI (which prints a traceback for any Exception from an inventory)
        # the line is printed here and SystemExit, which pyinfra does not wrap, ends the run.
        import sys

        moved = ("ImportError: require_valid_inventory moved: write"
                 " `from validation import require_valid_inventory` (validation.py at the project root)")
        import pyinfra

        if getattr(pyinfra, "is_cli", False):
            caller = sys._getframe(1)
            while caller.f_back and caller.f_code.co_filename.startswith("<frozen"):
                caller = caller.f_back  # importlib's own frames
            print(f"inference-host: 1 problem(s) in the inventory; no host was contacted:\n"
                  f"  - {caller.f_code.co_filename}:{caller.f_lineno}: {moved}", file=sys.stderr)
            raise SystemExit(2)
        raise ImportError(moved.removeprefix("ImportError: "))
    raise AttributeError(f"module 'roles.site' has no attribute {name!r}")


# (At the end of this package's import, which is before runpy's check.)
# `python -m roles.site.vault` runs a module this package has already imported (loading reads
# the vault's key names), so runpy warns on every call that it runs it a second time as
# __main__. Here that is harmless (the module defines functions only): the warning is silenced
# for this one module, by its exact text (CPython 3.11 Lib/runpy.py _get_module_details).
warnings.filterwarnings("ignore", category=RuntimeWarning,
                        message=r"'roles\.site\.vault' found in sys\.modules after import of package 'roles\.site'")

