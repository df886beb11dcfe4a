"""The site model: every setting the roles need, typed, defaulted and validated once.

It is the only reader of pyinfra's ``host.data`` and imports no role (tests/unit/test_layout.py
checks the import graph). The data flow is one way:

    inventory/<name>.py + group_data/*.py + inventory/stack.yml + the secrets vault
        -> Site (this package) -> deploy.py -> roles/<name>

Validation runs before any host is contacted: every inventory file ends with
``require_valid_inventory(__file__, globals())`` from validation.py (the layer above the model and
the roles, which passes the roles' own checks, its ROLE_CHECKS, to the validation), and pyinfra
executes it while it loads the inventory, i.e. before it connects. An older inventory that
imports it from here is refused in one line naming the new import (errors.MOVED_NAMES). The same
check runs standalone:

    uv run inference-host validate inventory/prod.py

Modules: sections (each role's settings section, one module each, and SECTIONS), fields (the
rules a setting is written with), grammars (paths, unit names, apt packages, sysctl lines),
credentials (credential shapes, detect-secrets), schema (HostSettings, Site, typing one host's data), stack (the
stack file), lock (the stacks' locks: format, place, staleness), rules (cross-host rules; rules_guests,
rules_services and rules_secrets by concern), weights
(where each model's files live), loading (inventory -> Site, the validation core), current
(deploy-time access), vault (the ansible-vault secrets file), testinfra (how the checks reach a
host), table (the settings reference, docs/settings.md), __main__ (the command line).

Host data keys are flat and prefixed by the section they belong to (``serving_port``,
``nccl_p2p_level``); a key that belongs to no section is an error, so a typo never passes
silently. A role added later extends the model with a module in sections/ and its class in
``SECTIONS`` (roles/site/sections/__init__.py).
"""

import warnings

from roles.site.current import current_host, current_site, secret_value
from roles.site.errors import SiteError
from roles.site.loading import load_site, site_from_inventory
from roles.site.placement import (
    engine_reads_hub_token,
    exporter_bind,
    firewalled,
    node_sysctl,
    own_sysctl,
    sysctl_conflicts,
)
from roles.site.schema import PROJECT_ROOT, SECTIONS, HostSettings, Site, address_of, build_host
from roles.site.sections.base import BaseSettings
from roles.site.sections.build import BuildSettings
from roles.site.sections.cuda import CudaSettings
from roles.site.sections.docker import DockerSettings
from roles.site.sections.eagle3_training import Eagle3TrainingSettings
from roles.site.sections.engine import EngineSettings
from roles.site.sections.firewall import FirewallSettings
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
    "PROJECT_ROOT",
    "SECTIONS",
    "BaseSettings",
    "BuildSettings",
    "CudaSettings",
    "DockerSettings",
    "GatewaySettings",
    "Eagle3TrainingSettings",
    "EngineSettings",
    "FirewallSettings",
    "EngineStack",
    "GpuSettings",
    "GuestSettings",
    "HealthSettings",
    "HostSettings",
    "KernelPackage",
    "MonitoringSettings",
    "NcclSettings",
    "NvidiaDriverSettings",
    "ProxmoxSettings",
    "ServingSettings",
    "SglangSettings",
    "Site",
    "SiteError",
    "SpeculativeSettings",
    "Stack",
    "VllmSettings",
    "address_of",
    "exporter_bind",
    "firewalled",
    "build_host",
    "current_host",
    "current_site",
    "load_site",
    "load_stack",
    "secret_value",
    "settings_table",
    "site_from_inventory",
    "testinfra_url",
    "connection_data",
    "WeightSet",
    "WeightsSettings",
    "served_weight_manifests",
    "weight_sets_kept_by",
    "weight_sets_of",
    "weights_mount_points",
    "engine_reads_hub_token",
    "node_sysctl",
    "own_sysctl",
    "sysctl_conflicts",
]


# (At the end of this package's import, which is before runpy's check.)
# `python -m roles.site.vault` runs a module this package has already imported (loading reads
# the vault's key names), so runpy warns on every call that it runs it a second time as
# __main__. Here that is harmless (the module defines functions only): the warning is silenced
# for this one module, by its exact text (CPython 3.11 Lib/runpy.py _get_module_details).
warnings.filterwarnings(
    "ignore",
    category=RuntimeWarning,
    message=r"'roles\.site\.vault' found in sys\.modules after import of package 'roles\.site'",
)
