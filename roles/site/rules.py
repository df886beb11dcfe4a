"""Cross-host rules: checked once every host is typed (GPUs, guests, VMIDs, IOMMU groups, driver
versions, secrets). Rules that need a role's knowledge (the rendered server command line against
the release's CLI) are passed in from above the model as RoleChecks: see validation.py.
The rules by concern: rules_guests (guests, GPUs, IOMMU groups), rules_services (monitoring,
topology, ports), rules_secrets (references to the vault)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from roles.site.errors import shown
from roles.site.placement import guest_sysctl_problems, sysctl_conflicts
from roles.site.rules_guests import _check_addresses, _check_guest, _check_guest_ips, _check_iommu_groups
from roles.site.rules_paths import folder_problems, interpreter_problems
from roles.site.rules_secrets import _reference_problem, key_role_problems, mirror_credential_problems
from roles.site.rules_services import (
    GatewayCheck,
    _check_firewall,
    _check_monitoring,
    _check_ports,
    _check_topology,
    _check_unit_names,
)
from roles.site.rules_tls import check_engine_tls
from roles.site.schema import HostSettings
from roles.site.sections.serving import SpeculativeSettings
from roles.site.sections.ssh import host_key_problem
from roles.site.stack import EngineStack, Stack

# Checks that need a role's knowledge, passed in from above the model (validation.py's
# ROLE_CHECKS; the model imports no role). Each returns problems without the "file: host" prefix.
# engine: (gpu node, all hosts, active stack), e.g. the command line rendered for the pinned
#   release against that release's real CLI;
# gateway: (gateways host, all hosts);
# speculative: (gpu node, stack, folder of the inventory file, against which the drafter's and
#   target's config.json copies are found);
# memory: (gpu node, all hosts, stack, folder of the inventory file), on every gpu node;
# summary: the same arguments, lines shown beside a valid site (`inference-host validate`).
EngineCheck = Callable[[HostSettings, dict[str, HostSettings], EngineStack], list[str]]
SpeculativeCheck = Callable[[HostSettings, Stack, Path], list[str]]
MemoryCheck = Callable[[HostSettings, dict[str, HostSettings], Stack, Path], list[str]]


@dataclass(frozen=True)
class RoleChecks:
    """The role checks one validation runs; empty: the model's own rules only."""

    engine: tuple[EngineCheck, ...] = ()
    gateway: tuple[GatewayCheck, ...] = ()
    speculative: tuple[SpeculativeCheck, ...] = ()
    memory: tuple[MemoryCheck, ...] = ()
    summary: tuple[MemoryCheck, ...] = ()


NO_ROLE_CHECKS = RoleChecks()


def check_site(
    site_hosts: dict[str, HostSettings],
    where: str,
    secret_names,
    secrets_file,
    problems: list[str],
    stack: Stack | None = None,
    checks: RoleChecks = NO_ROLE_CHECKS,
) -> None:
    vmids: dict[int, str] = {}
    gpu_owner: dict[str, tuple[str, str]] = {}
    for host in site_hosts.values():
        here = f"{where}: host {host.name}"
        gpu = host.gpu
        host_key = host_key_problem(host.ssh.strict_host_key_checking, host.ssh.host_key_checking_off_because)
        if host_key and host.valid("ssh_strict_host_key_checking", "ssh_host_key_checking_off_because"):
            problems.append(f"{here}: {host_key}")
        if not host.valid(
            "gpu_count",
            "guest_gpu_addresses",
            "guest_vmid",
            "guest_node",
            "guest_features",
            "guest_unprivileged",
            "serving_host",
            "serving_api_key_secret",
            "serving_hf_token_secret",
            "serving_speculative",
        ):
            continue  # its own message already names the mistake
        if host.in_group("gpu_nodes") and gpu.count < 1:
            problems.append(f"{here}: gpu_count = {gpu.count} is invalid; a gpu node needs an integer >= 1")
        if (
            host.in_group("gpu_nodes")
            and host.serving.host not in ("127.0.0.1", "::1")
            and not host.serving.api_key_secret
        ):
            problems.append(
                f"{here}: serving_host = {host.serving.host!r} exposes the server beyond this host"
                " without serving_api_key_secret; expected an API key secret or serving_host = '127.0.0.1'"
            )
        for key in ("api_key_secret", "hf_token_secret"):
            problem = _reference_problem(f"serving_{key}", getattr(host.serving, key), secret_names, secrets_file)
            if problem:
                problems.append(f"{here}: {problem}")
        if host.sglang.install_leave_out and host.sglang.install_mode == "full":
            problems.append(
                f"{here}: sglang_install_leave_out = {shown(host.sglang.install_leave_out)} with"
                " sglang_install_mode = 'full'; a full environment is the whole lock, expected"
                " no leave-out or sglang_install_mode = 'no-gpu-deps'"
            )
        speculative_problem = _speculative_problem(host.serving.speculative)
        if speculative_problem:
            problems.append(f"{here}: {speculative_problem}")
        elif host.in_group("gpu_nodes") and stack is not None:
            speculative = [
                p for check in checks.speculative if host.speculative for p in check(host, stack, Path(where).parent)
            ]
            # e.g. the command line rendered per release, checked against that release's real CLI;
            # a bad speculative value is named once, by its own check.
            for check in checks.engine:
                problems.extend(
                    f"{here}: {p}"
                    for p in check(host, site_hosts, stack.active)
                    if not (speculative and "--speculative-" in p)
                )
            problems.extend(f"{here}: {p}" for p in speculative)
            if not speculative:  # a drafter refused for its own reasons is not estimated too
                for memory_check in checks.memory:
                    problems.extend(f"{here}: {p}" for p in memory_check(host, site_hosts, stack, Path(where).parent))
        is_guest = host.in_group("lxc_guests") or host.in_group("kvm_guests")
        if host.in_group("lxc_guests") and host.in_group("kvm_guests"):
            problems.append(f"{here}: in both lxc_guests and kvm_guests; expected one of them")
        if is_guest:
            _check_guest(host, here, site_hosts, vmids, gpu_owner, problems)
        if host.in_group("proxmox_hosts"):
            problems.extend(f"{here}: {p}" for p in sysctl_conflicts(host, site_hosts))
        problems.extend(f"{here}: {p}" for p in folder_problems(host))
        problems.extend(f"{here}: {p}" for p in interpreter_problems(host))
        problems.extend(f"{here}: {p}" for p in guest_sysctl_problems(host))
        if host.valid("cuda_repo_url", "cuda_repo_credentials_secret", "base_pypi_index_url"):
            problems.extend(f"{here}: {p}" for p in mirror_credential_problems(host, secret_names, secrets_file))
    _check_iommu_groups(site_hosts, gpu_owner, where, problems)
    engine = stack.active.engine if stack is not None else None
    problems.extend(key_role_problems(site_hosts, where, secret_names, secrets_file, engine))
    _check_ports(site_hosts, where, problems)
    _check_unit_names(site_hosts, where, problems)
    _check_addresses(site_hosts, where, problems)
    _check_guest_ips(site_hosts, where, problems)
    _check_topology(site_hosts, where, problems, stack, checks.gateway)
    _check_monitoring(site_hosts, where, secret_names, secrets_file, problems, stack)
    _check_firewall(site_hosts, where, problems)
    check_engine_tls(site_hosts, where, secret_names, secrets_file, problems)


def _speculative_problem(speculative: dict | None) -> str | None:
    if speculative is None:
        return None
    try:
        SpeculativeSettings.model_validate(speculative)
    except ValidationError as error:
        reasons = "; ".join(_reason(detail) for detail in error.errors())
        return (
            f"serving_speculative = {shown(speculative)} is invalid ({reasons});"
            " expected {'draft_model_path': '/models/...', 'algorithm': 'EAGLE3',"
            " 'num_steps': 3, 'eagle_topk': 1, 'num_draft_tokens': 4, 'spec_v2': False,"
            " 'draft_config': '<drafter config.json>', 'target_config': '<target config.json>'}"
        )
    return None


def _reason(detail: ErrorDetails) -> str:
    """One pydantic error of serving_speculative as "algorithm 'MEDUSA': one of ..."."""
    where = ".".join(str(part) for part in detail["loc"])
    if detail["type"] == "missing":
        return f"{where} is missing"
    if detail["type"] == "extra_forbidden":
        return f"unknown key {where}"
    valid = detail["ctx"]["valid"] if detail["type"] == "inference_host" else detail["msg"]
    return f"{where} {shown(detail['input'])}: {valid}"


def check_driver_match(
    site_hosts: dict[str, HostSettings], stack: Stack | None, where: str, problems: list[str]
) -> None:
    """An LXC guest uses the node's kernel module: its userspace must be the same version."""
    default = stack.driver_version if stack else None
    for host in site_hosts.values():
        node = site_hosts.get(host.guest.node or "")
        if not (host.in_group("lxc_guests") and host.guest.gpu_addresses and node):
            continue
        guest_version = host.guest.driver_version or default
        node_version = node.proxmox.driver_version or default
        if guest_version != node_version:
            problems.append(
                f"{where}: host {host.name}: guest_driver_version = {guest_version!r} but {node.name}"
                f" runs {node_version!r} (proxmox_driver_version); expected exactly the host's"
                " driver version in an LXC guest"
            )
