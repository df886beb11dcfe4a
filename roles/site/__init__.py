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
table (the README's settings table), __main__ (the command line).

Host data keys are flat and prefixed by the section they belong to (``serving_port``,
``nccl_p2p_level``); a key that belongs to no section is an error, so a typo never passes
silently. Roles added later extend the model by adding a section class to ``SECTIONS``.
"""

from roles.site.current import current_host, current_site, secret_value
from roles.site.errors import SiteError
from roles.site.loading import load_site, site_from_inventory
from roles.site.schema import (
    PROJECT_ROOT,
    SECTIONS,
    BaseSettings,
    BuildSettings,
    CudaSettings,
    DockerSettings,
    Eagle3TrainingSettings,
    GatewaySettings,
    GpuSettings,
    GuestSettings,
    HealthSettings,
    HostSettings,
    NcclSettings,
    NvidiaDriverSettings,
    ProxmoxSettings,
    ServingSettings,
    SglangSettings,
    Site,
    SpeculativeSettings,
    VllmSettings,
    WeightsSettings,
    address_of,
    build_host,
)
from roles.site.placement import engine_reads_hub_token, node_sysctl, own_sysctl, sysctl_conflicts
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
    "KernelPackage", "NcclSettings", "NvidiaDriverSettings", "ProxmoxSettings", "ServingSettings",
    "SglangSettings", "Site", "SiteError", "SpeculativeSettings", "Stack", "VllmSettings", "address_of",
    "build_host", "current_host", "current_site", "load_site", "load_stack",
    "secret_value", "settings_table", "site_from_inventory", "testinfra_url", "connection_data",
    "WeightSet", "WeightsSettings", "served_weight_manifests", "weight_sets_kept_by",
    "weight_sets_of", "weights_mount_points", "engine_reads_hub_token", "node_sysctl", "own_sysctl",
    "sysctl_conflicts",
]


def __getattr__(name: str):
    if name == "require_valid_inventory":
        # The hook lives above the model so that it can register the roles' checks.
        raise ImportError("require_valid_inventory moved: `from validation import require_valid_inventory`"
                          " (validation.py at the project root)")
    raise AttributeError(f"module 'roles.site' has no attribute {name!r}")
