"""The site model: every setting the roles need, typed, defaulted and validated once.

This module is the only reader of pyinfra's ``host.data``. The data flow is one way:

    inventory/<name>.py + group_data/*.py + inventory/stack.yml + the secrets vault
        -> Site (this module)  -> deploy.py -> roles/<name>

Validation runs before any host is contacted: every inventory file ends with
``require_valid_inventory(__file__)``, which pyinfra executes while it loads the inventory,
i.e. before it connects. The same check runs standalone:

    uv run python -m roles.site inventory/prod.py

Host data keys are flat and prefixed by the section they belong to (``serving_port``,
``nccl_p2p_level``); a key that belongs to no section is an error, so a typo never passes
silently. Roles added later extend the model by adding a section class to ``SECTIONS``.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
import sys
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Literal

import yaml

PROJECT_ROOT = Path(__file__).resolve().parent.parent

KNOWN_GROUPS = ("proxmox_hosts", "lxc_guests", "kvm_guests", "gpu_nodes", "builders")

# GPU architectures the project knows how to build for and check; the target is sm120.
GPU_ARCHS = {
    "sm80": "8.0",
    "sm86": "8.6",
    "sm89": "8.9",
    "sm90": "9.0",
    "sm100": "10.0",
    "sm120": "12.0",
}

# Kernel packages roles/wheels can build from source (docker/<package>.Dockerfile).
WHEEL_PACKAGES = ("flash-attn", "sgl-kernel")

# NCCL_P2P_LEVEL values from the NCCL environment documentation.
NCCL_P2P_LEVELS = ("LOC", "NVL", "PIX", "PXB", "PHB", "SYS")
NCCL_DEBUG_LEVELS = ("VERSION", "WARN", "INFO", "TRACE")

VERSION_RE = re.compile(r"^\d+(\.\d+){0,3}((a|b|rc)\d+)?(\.post\d+)?$")
DRIVER_VERSION_RE = re.compile(r"^\d{3}\.\d{2,3}(\.\d{2,3})?$")
PCI_ADDRESS_RE = re.compile(r"^(?:[a-f0-9]{4,}:)?[a-f0-9]{2}:[a-f0-9]{2}\.[a-f0-9]$")
UNIX_NAME_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
STACK_ID_RE = re.compile(r"^[a-z0-9][a-z0-9.+_-]{0,62}$")
SECRET_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
DNS_NAME_RE = re.compile(r"^[a-zA-Z0-9]([a-zA-Z0-9-]{0,62})(\.[a-zA-Z0-9]([a-zA-Z0-9-]{0,62}))*$")
# qemu-server src/PVE/QemuServer/Machine.pm (stable-bookworm), machine type pattern.
QEMU_MACHINE_RE = re.compile(
    r"(pc|pc(-i440fx)?-\d+(\.\d+)+(\+pve\d+)?(\.pxe)?|q35|pc-q35-\d+(\.\d+)+(\+pve\d+)?(\.pxe)?)")
# PVE 8 limits (pve-container LXC/Config.pm, qemu-server PCI.pm): dev0-255, mp0-255, hostpci0-15.
LXC_MAX_DEVICES, LXC_MAX_MOUNT_POINTS, KVM_MAX_HOSTPCI = 256, 256, 16


class SiteError(Exception):
    """One or more problems in the user's input, each naming file, field, value and remedy."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


# ----------------------------------------------------------------------------------------------
# Field checks: each returns None when the value is fine, else "what would be valid".


def _check(predicate: Callable[[Any], bool], valid: str) -> dict:
    return {"check": lambda value: None if predicate(value) else valid}


def _one_of(*choices) -> dict:
    return _check(lambda v: v in choices, "one of " + ", ".join(repr(c) for c in choices))


def _absolute_path() -> dict:
    return _check(lambda v: v.startswith("/") and ".." not in v.split("/"), "an absolute path")


def _positive() -> dict:
    return _check(lambda v: v > 0, "a number greater than 0")


def _unix_name() -> dict:
    return _check(UNIX_NAME_RE.match, "a lower-case Unix user/group name ([a-z_][a-z0-9_-]*)")


def _secret_name() -> dict:
    return _check(SECRET_NAME_RE.match, "a key of the secrets vault (letters, digits, _)")


def _pci_addresses() -> dict:
    return _check(
        lambda v: all(PCI_ADDRESS_RE.match(a) for a in v),
        "PCI addresses like 0000:01:00.0 (lower-case hex, domain optional)",
    )


# ----------------------------------------------------------------------------------------------
# Sections of host data. Field name = key without the prefix.


@dataclass(frozen=True)
class BaseSettings:
    """roles/base: packages, the service user, directories, kernel and limits tuning, uv."""

    PREFIX: typing.ClassVar[str] = "base_"

    service_user: str = field(default="sglang", metadata=_unix_name())
    service_group: str = field(default="sglang", metadata=_unix_name())
    install_root: str = field(default="/opt/sglang", metadata=_absolute_path())
    data_dir: str = field(default="/var/lib/sglang", metadata=_absolute_path())
    model_dir: str = field(default="/models", metadata=_absolute_path())
    log_dir: str = field(default="/var/log/sglang", metadata=_absolute_path())
    uv_dir: str = field(default="/opt/uv", metadata=_absolute_path())
    extra_packages: list[str] = field(default_factory=list)
    # Lessons from the target: automatic NUMA page migration hurts GPU-bound serving.
    sysctl: dict[str, str] = field(default_factory=lambda: {"kernel.numa_balancing": "0"})
    limit_nofile: int = field(default=1048576, metadata=_positive())
    limit_memlock: str = field(
        default="unlimited",
        metadata=_check(
            lambda v: v == "unlimited" or str(v).isdigit(), "'unlimited' or a number of KiB"
        ),
    )
    # Local PEM files trusted on the host in addition to the distro's CAs (TLS-inspecting proxy).
    extra_ca_certificates: list[str] = field(default_factory=list)
    # A PyPI mirror for air-gapped sites; None: pypi.org.
    pypi_index_url: str | None = field(
        default=None, metadata=_check(lambda v: v.startswith(("http://", "https://")), "an http(s) URL")
    )


@dataclass(frozen=True)
class GpuSettings:
    """What GPUs a gpu node has: used for tensor parallel size and by the health checks."""

    PREFIX: typing.ClassVar[str] = "gpu_"

    count: int = field(
        default=0, metadata=_check(lambda v: 0 <= v <= 16, "an integer from 0 to 16")
    )
    arch: str = field(default="sm120", metadata=_one_of(*GPU_ARCHS))
    model: str = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
    memory_gib: int = field(default=96, metadata=_positive())
    # PCI addresses as the node itself sees them (bare metal, LXC). Optional; when given
    # its length must equal count.
    addresses: list[str] = field(default_factory=list, metadata=_pci_addresses())

    @property
    def compute_capability(self) -> str:
        return GPU_ARCHS[self.arch]


@dataclass(frozen=True)
class NcclSettings:
    """NCCL environment for a PCIe-only, two-socket host (reference/serving.md)."""

    PREFIX: typing.ClassVar[str] = "nccl_"

    # SYS lets P2P cross the socket link; the default (PXB) sends cross-socket pairs
    # through host memory. "off" sets NCCL_P2P_DISABLE=1 instead.
    p2p_level: str = field(default="SYS", metadata=_one_of(*NCCL_P2P_LEVELS, "off"))
    ib_disable: bool = True
    debug: str = field(default="WARN", metadata=_one_of(*NCCL_DEBUG_LEVELS))
    debug_subsys: str | None = None
    min_nchannels: int | None = field(default=None, metadata=_positive())


@dataclass(frozen=True)
class SpeculativeSettings:
    """serving_speculative: an EAGLE-3 drafter served beside the target (roles/serving/speculative.py
    checks it per release). draft_config / target_config: copies of the drafter's and the target's
    config.json on the control machine, relative to the inventory file."""

    draft_model_path: str
    algorithm: str = "EAGLE3"
    num_steps: int = 3
    eagle_topk: int = 1
    num_draft_tokens: int = 4
    # SGLANG_ENABLE_SPEC_V2: keeps the overlap scheduler on with EAGLE (off by default in 0.5.9/0.5.10).
    spec_v2: bool = False
    draft_config: str | None = None
    target_config: str | None = None


@dataclass(frozen=True)
class ServingSettings:
    """roles/serving: the SGLang server's command line and unit."""

    PREFIX: typing.ClassVar[str] = "serving_"

    unit_name: str = field(
        default="sglang",
        metadata=_check(re.compile(r"^[a-zA-Z0-9_.@-]+$").match, "a systemd unit name"),
    )
    model_path: str = field(default="/models/Kimi-K2.5", metadata=_absolute_path())
    served_model_name: str = "kimi-k2.5"
    host: str = field(
        default="127.0.0.1",
        metadata=_check(lambda v: _is_ip(v), "an IP address to bind (127.0.0.1, 0.0.0.0, ...)"),
    )
    port: int = field(default=30000, metadata=_check(lambda v: 1 <= v <= 65535, "1 to 65535"))
    trust_remote_code: bool = True
    # None: the per-version safe default of the pinned stack applies.
    attention_backend: str | None = field(
        default=None, metadata=_one_of("triton", "flashinfer", "fa3", "flashmla", "trtllm_mla")
    )
    mem_fraction_static: float = field(
        default=0.92, metadata=_check(lambda v: 0.1 <= v <= 0.99, "a fraction from 0.1 to 0.99")
    )
    cuda_graph_max_bs: int | None = field(default=None, metadata=_positive())
    max_running_requests: int | None = field(default=None, metadata=_positive())
    chunked_prefill_size: int | None = field(default=None, metadata=_positive())
    watchdog_timeout: int = field(default=600, metadata=_positive())
    enable_metrics: bool = True
    api_key_secret: str | None = field(default=None, metadata=_secret_name())
    hf_token_secret: str | None = field(default=None, metadata=_secret_name())
    # Optional EAGLE-3 drafter: {"draft_model_path": ..., "num_steps": 3, ...}
    speculative: dict[str, Any] | None = None
    dist_init_port: int = field(
        default=50000, metadata=_check(lambda v: 1 <= v <= 65535, "1 to 65535")
    )
    # None: `<install_root>/current/bin/python -m sglang.launch_server`. The lab points it at
    # the stand-in server (tests/standins/sglang_server); production leaves it unset.
    launch_command: list[str] | None = None
    # Bound of the readiness wait on /health_generate after a (re)start; below the unit's
    # TimeoutStartSec (1200 s: a ~10 minute model load).
    ready_timeout: int = field(default=1100, metadata=_check(lambda v: 5 <= v <= 1190, "5 to 1190 seconds"))
    # Extra variables for the engine's EnvironmentFile (mode 0600).
    extra_env: dict[str, str] = field(default_factory=dict)
    # Patch 0001 (sglang 0.5.9): custom all-reduce on >2 PCIe-only GPUs; measure before enabling.
    custom_all_reduce_pcie: bool = False

    @property
    def secret_args_file(self) -> str:
        """The 0600 SGLang --config file holding {"api-key": ...}: roles/serving writes it,
        the health checks read the key from it on the host."""
        return f"/etc/sglang/{self.unit_name}-secret-args.yaml"


@dataclass(frozen=True)
class SglangSettings:
    """roles/sglang: one uv environment per stack under <base_install_root>/envs/<stack id>."""

    PREFIX: typing.ClassVar[str] = "sglang_"

    # "no-gpu-deps" (lab only): the real sglang wheel with --no-deps; torch, kernels and the
    # other CUDA-only packages are left out because nothing here has a GPU.
    install_mode: str = field(default="full", metadata=_one_of("full", "no-gpu-deps"))
    # None: uv's managed CPython of the stack's `python` pin; a path: that interpreter.
    python: str | None = field(default=None, metadata=_absolute_path())


@dataclass(frozen=True)
class BuildSettings:
    """roles/wheels on builders: kernel wheel builds in Docker."""

    PREFIX: typing.ClassVar[str] = "build_"

    # None: computed from the builder's real memory and cores.
    max_jobs: int | None = field(default=None, metadata=_positive())
    nvcc_threads: int | None = field(default=None, metadata=_positive())
    wheelhouse_dir: str = field(default="/var/lib/inference-host/wheelhouse", metadata=_absolute_path())
    # None: NVIDIA's CUDA devel image for the active stack's CUDA version.
    base_image: str | None = None
    # Package -> local source tree built instead of the pinned upstream release (as given).
    source_overrides: dict[str, str] = field(default_factory=dict, metadata=_check(
        lambda v: set(v) <= set(WHEEL_PACKAGES), "keys from: " + ", ".join(WHEEL_PACKAGES)))
    with_torch: bool = True  # False only for sources that need no torch (the lab's test ext)
    timeout_minutes: int = field(default=720, metadata=_positive())
    # False: this builder compiles no kernel wheel (the engine takes PyPI's, or another
    # builder's wheelhouse); its Docker engine is still managed.
    kernel_wheels: bool = True
    # Packages rebuilt even when the wheelhouse has them: --data 'build_force=["flash-attn"]'
    force: list[str] = field(default_factory=list, metadata=_check(
        lambda v: set(v) <= set(WHEEL_PACKAGES), "names from: " + ", ".join(WHEEL_PACKAGES)))


@dataclass(frozen=True)
class GuestSettings:
    """A Proxmox guest (LXC or KVM) that receives GPUs."""

    PREFIX: typing.ClassVar[str] = "guest_"

    vmid: int | None = field(
        default=None, metadata=_check(lambda v: 100 <= v <= 999999999, "an integer >= 100")
    )
    node: str | None = None  # inventory name of the Proxmox host that runs it
    gpu_addresses: list[str] = field(default_factory=list, metadata=_pci_addresses())
    cores: int = field(default=64, metadata=_positive())
    memory_mib: int = field(default=512 * 1024, metadata=_positive())
    disk_gib: int = field(default=500, metadata=_positive())
    storage: str = "local-lvm"
    unprivileged: bool = True
    features: list[str] = field(
        default_factory=lambda: ["nesting", "keyctl"],
        metadata=_check(
            lambda v: set(v) <= {"nesting", "keyctl", "fuse", "mknod", "mount", "force_rw_sys"},
            "features from: nesting, keyctl, fuse, mknod, mount, force_rw_sys",
        ),
    )
    # Network and storage of the guest (LXC net0 / KVM net0 on this bridge).
    hostname: str | None = field(default=None, metadata=_check(DNS_NAME_RE.match, "a DNS name"))
    bridge: str = field(default="vmbr0", metadata=_check(re.compile(r"^[-_.\w]+$").match, "a bridge name"))
    ip: str = field(default="dhcp", metadata=_check(
        lambda v: v in ("dhcp", "manual") or _is_cidr(v), "'dhcp', 'manual' or an IPv4/CIDR"))
    gateway: str | None = field(default=None, metadata=_check(lambda v: _is_ip(v), "an IPv4 address"))
    # LXC only: the OS template volume and host directories bind-mounted as mp0, mp1, ...
    template: str = field(
        default="local:vztmpl/ubuntu-24.04-standard_24.04-2_amd64.tar.zst",
        metadata=_check(re.compile(r"^[a-zA-Z][\w.-]*:vztmpl/[^/\s,]+$").match,
                        "a template volume like local:vztmpl/ubuntu-24.04-standard_24.04-2_amd64.tar.zst"),
    )
    mount_points: dict[str, str] = field(default_factory=dict, metadata=_check(
        lambda v: all(k.startswith("/") and m.startswith("/") for k, m in v.items()),
        "{host path: path in the guest}, both absolute"))
    # KVM only. Large-BAR GPUs (96 GB) need cpu host (the host's physical address bits) and OVMF.
    machine: str = field(default="q35", metadata=_check(QEMU_MACHINE_RE.fullmatch, "q35, pc, pc-q35-8.1, ..."))
    bios: str = field(default="ovmf", metadata=_one_of("ovmf", "seabios"))
    cpu: str = field(default="host", metadata=_check(re.compile(r"^[\w.+-]+(,phys-bits=(host|\d+))?$").match,
                                                    "a CPU type like host or x86-64-v3,phys-bits=host"))
    pcie: bool = True
    x_vga_addresses: list[str] = field(default_factory=list, metadata=_pci_addresses())
    # OVMF's 64-bit MMIO window in MB (args: -fw_cfg name=opt/ovmf/X-PciMmio64Mb); None: OVMF's own.
    mmio_window_mb: int | None = field(default=None, metadata=_positive())
    # The userspace driver inside an LXC guest; None: the stack's nvidia_driver.version.
    driver_version: str | None = field(default=None, metadata=_check(DRIVER_VERSION_RE.match, "a full driver version like 580.95.05"))


@dataclass(frozen=True)
class ProxmoxSettings:
    """roles/proxmox_host: the bare-metal node."""

    PREFIX: typing.ClassVar[str] = "proxmox_"

    gpu_addresses: list[str] = field(default_factory=list, metadata=_pci_addresses())
    boot_loader: str = field(default="auto", metadata=_one_of("auto", "grub", "systemd-boot"))
    cpu_vendor: str = field(default="auto", metadata=_one_of("auto", "intel", "amd"))
    # IOMMU group of each GPU (`find /sys/kernel/iommu_groups/ -type l`); Proxmox hands a whole
    # group to vfio-pci, so GPUs of one group must go to one guest.
    iommu_groups: dict[str, int] = field(default_factory=dict, metadata=_check(
        lambda v: all(PCI_ADDRESS_RE.match(k) for k in v), "{PCI address: group number}"))
    # The host kernel module version; None: the stack's nvidia_driver.version.
    driver_version: str | None = field(default=None, metadata=_check(DRIVER_VERSION_RE.match, "a full driver version like 580.95.05"))
    # Install the NVIDIA driver on the node when an LXC guest has GPUs (roles/nvidia_driver).
    host_driver: bool = True
    # Where the driver lists its GPUs (<dir>/gpus/<address>/information); only the lab moves it.
    nvidia_proc_dir: str = field(default="/proc/driver/nvidia", metadata=_absolute_path())


HEALTH_SUITES = ("gpu", "interconnect", "service", "server")


@dataclass(frozen=True)
class HealthSettings:
    """tests/infra: what the health checks demand beyond the host's own description."""

    PREFIX: typing.ClassVar[str] = "health_"

    # Suites run as the last step of every deploy (roles/health); [] turns that off.
    after_deploy: list[str] = field(
        default_factory=lambda: list(HEALTH_SUITES),
        metadata=_check(lambda v: set(v) <= set(HEALTH_SUITES), "a list from: " + ", ".join(HEALTH_SUITES)),
    )
    # The engine environment's python (torch) for the CUDA and all-reduce checks;
    # None: <base_install_root>/current/bin/python (the active stack, roles/sglang).
    engine_python: str | None = field(default=None, metadata=_absolute_path())
    # All-reduce across all GPUs: a timeout catches a P2P deadlock, a floor a slow path.
    allreduce_timeout_s: int = field(default=120, metadata=_positive())
    allreduce_min_busbw_gbps: float = field(default=10.0, metadata=_positive())
    allreduce_size_mib: int = field(default=256, metadata=_positive())
    server_timeout_s: int = field(default=20, metadata=_positive())  # /health answers within
    max_unit_restarts: int = field(default=0, metadata=_check(lambda v: v >= 0, "an integer >= 0"))
    # With serving_speculative: the drafter's accept length must reach this (1.0: never accepted).
    min_accept_length: float = field(default=1.5, metadata=_check(lambda v: v >= 1.0, "a number >= 1.0"))
def _url() -> dict:
    return _check(lambda v: re.match(r"^https?://[^\s/]+(/\S*)?$", v) is not None,
                  "an http(s) URL without trailing spaces")


def _docker_size() -> dict:
    return _check(lambda v: re.match(r"^\d+[bkmg]?$", v, re.IGNORECASE) is not None,
                  "a size like 64m, 1g (a number with an optional b/k/m/g unit)")


@dataclass(frozen=True)
class NvidiaDriverSettings:
    """roles/nvidia_driver. Its mode follows the groups: userspace-only in lxc_guests, else full."""

    PREFIX: typing.ClassVar[str] = "nvidia_driver_"

    # False: a kernel module older than the installed driver is reported as "reboot required";
    # True: the host is rebooted and the deploy waits for it to come back.
    allow_reboot: bool = False
    reboot_timeout: int = field(default=900, metadata=_positive())


@dataclass(frozen=True)
class CudaSettings:
    """roles/cuda and the driver packages: NVIDIA's CUDA apt repository (a mirror when air-gapped)."""

    PREFIX: typing.ClassVar[str] = "cuda_"

    # The distro's repository is <repo_url>/<ubuntu2404|debian12>/x86_64/.
    repo_url: str = field(default="https://developer.download.nvidia.com/compute/cuda/repos",
                          metadata=_url())
    keyring_version: str = field(default="1.1-1", metadata=_check(
        re.compile(r"^\d+\.\d+-\d+$").match, "a cuda-keyring package version like 1.1-1"))


DOCKER_OWNED_KEYS = {"data-root", "log-driver", "log-opts", "default-shm-size", "runtimes"}


@dataclass(frozen=True)
class DockerSettings:
    """roles/docker_engine on builders: the engine, its daemon.json and the NVIDIA container toolkit."""

    PREFIX: typing.ClassVar[str] = "docker_"

    # "docker": Docker's repository (docker-ce, docker-buildx-plugin); "distro": the distro's docker.io.
    source: str = field(default="docker", metadata=_one_of("docker", "distro"))
    # Docker's repository is <repo_url>/<ubuntu|debian>, its key <repo_url>/<ubuntu|debian>/gpg.
    repo_url: str = field(default="https://download.docker.com/linux", metadata=_url())
    nvidia_toolkit_repo_url: str = field(
        default="https://nvidia.github.io/libnvidia-container/stable/deb", metadata=_url())
    nvidia_toolkit_key_url: str = field(
        default="https://nvidia.github.io/libnvidia-container/gpgkey", metadata=_url())
    data_root: str = field(default="/var/lib/docker", metadata=_absolute_path())
    log_max_size: str = field(default="100m", metadata=_docker_size())
    log_max_file: int = field(default=3, metadata=_positive())
    default_shm_size: str = field(default="1g", metadata=_docker_size())
    # More daemon.json keys (registry mirrors, "iptables": false in a container, ...); the keys
    # above and "runtimes" (nvidia-ctk's) are owned by the role and cannot be set here.
    daemon_extra: dict[str, Any] = field(default_factory=dict, metadata=_check(
        lambda v: not set(v) & DOCKER_OWNED_KEYS,
        "daemon.json keys other than " + ", ".join(sorted(DOCKER_OWNED_KEYS))))
    # Users allowed to use the engine (group docker: root-equivalent, so empty by default).
    # False: the builder's Docker engine is installed and configured outside this project
    # (roles/wheels only uses it); True: roles/docker_engine converges it.
    manage_engine: bool = True
    users: list[str] = field(default_factory=list, metadata=_check(
        lambda v: all(UNIX_NAME_RE.match(u) for u in v), "lower-case Unix user names"))


SECTIONS: tuple[type, ...] = (
    BaseSettings,
    GpuSettings,
    NcclSettings,
    ServingSettings,
    BuildSettings,
    GuestSettings,
    ProxmoxSettings,
    HealthSettings,
    SglangSettings,
    NvidiaDriverSettings,
    CudaSettings,
    DockerSettings,
)

# Keys that are not role settings: where the stack and secrets live.
SITE_KEYS = {
    "stack_file": "path of the stack file, relative to the inventory (default: stack.yml)",
    "secrets_file": "path of the ansible-vault file, relative to the inventory",
}


def _is_cidr(value: str) -> bool:
    try:
        return "/" in value and bool(ipaddress.ip_interface(value))
    except ValueError:
        return False


def _is_ip(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


# ----------------------------------------------------------------------------------------------
# The stack file: every version pin in one place.


@dataclass(frozen=True)
class KernelPackage:
    package: str
    version: str
    source: Literal["prebuilt", "build"] = "prebuilt"


@dataclass(frozen=True)
class EngineStack:
    """One consistent engine stack; an upgrade points `active` at another one."""

    id: str
    cuda: str
    python: str
    torch: str
    sglang: str
    kernel: KernelPackage
    flashinfer: str
    flash_attn: str | None = None
    flash_attn_source: Literal["build", "prebuilt", "none"] = "build"

    @property
    def cuda_major(self) -> int:
        return int(self.cuda.split(".")[0])


@dataclass(frozen=True)
class Stack:
    file: str
    uv: str
    driver_branch: str
    driver_version: str
    active: EngineStack
    stacks: dict[str, EngineStack]


STACK_FIELDS = {"uv", "nvidia_driver", "active", "stacks"}
DRIVER_FIELDS = {"branch", "version"}
ENGINE_FIELDS = {
    "cuda", "python", "torch", "sglang", "kernel", "flashinfer", "flash_attn", "flash_attn_source",
}
KERNEL_FIELDS = {"package", "version", "source"}


def load_stack(path: Path) -> Stack:
    problems: list[str] = []
    where = _display(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise SiteError([f"{where}: file not found; every inventory needs a stack file"]) from None
    except yaml.YAMLError as error:
        raise SiteError([f"{where}: not valid YAML: {error}"]) from None
    if not isinstance(raw, dict):
        raise SiteError([f"{where}: expected a mapping of uv, nvidia_driver, active, stacks"])

    def bad(field_name: str, value: Any, valid: str) -> None:
        problems.append(f"{where}: {field_name} = {value!r} is invalid; expected {valid}")

    def version(field_name: str, value: Any, pattern=VERSION_RE, valid="a version like 2.9.1"):
        if not isinstance(value, str) or not pattern.match(value):
            bad(field_name, value, f"{valid} (quoted string)")
            return "0"
        return value

    _unknown_keys(raw, STACK_FIELDS, "", where, problems)
    uv = version("uv", raw.get("uv"))
    driver = raw.get("nvidia_driver") or {}
    if not isinstance(driver, dict):
        bad("nvidia_driver", driver, "a mapping with branch and version")
        driver = {}
    _unknown_keys(driver, DRIVER_FIELDS, "nvidia_driver.", where, problems)
    branch = version("nvidia_driver.branch", driver.get("branch"), re.compile(r"^\d{3}$"),
                     "a driver branch like 580")
    driver_version = version("nvidia_driver.version", driver.get("version"), DRIVER_VERSION_RE,
                             "a full driver version like 580.95.05")
    if driver_version != "0" and branch != "0" and not driver_version.startswith(branch + "."):
        bad("nvidia_driver.version", driver_version, f"a version on branch {branch}")

    stacks: dict[str, EngineStack] = {}
    raw_stacks = raw.get("stacks")
    if not isinstance(raw_stacks, dict) or not raw_stacks:
        bad("stacks", raw_stacks, "a mapping of stack id -> pins, with at least one stack")
        raw_stacks = {}
    for stack_id, pins in raw_stacks.items():
        prefix = f"stacks.{stack_id}"
        if not isinstance(stack_id, str) or not STACK_ID_RE.match(stack_id):
            bad(prefix, stack_id, "a stack id of lower-case letters, digits, '.', '_', '-'")
            continue
        if not isinstance(pins, dict):
            bad(prefix, pins, "a mapping of pins")
            continue
        _unknown_keys(pins, ENGINE_FIELDS, prefix + ".", where, problems)
        kernel = pins.get("kernel")
        if not isinstance(kernel, dict):
            bad(prefix + ".kernel", kernel, "a mapping with package, version, source")
            kernel = {}
        _unknown_keys(kernel, KERNEL_FIELDS, prefix + ".kernel.", where, problems)
        if kernel.get("package") not in ("sgl-kernel", "sglang-kernel"):
            bad(prefix + ".kernel.package", kernel.get("package"), "'sgl-kernel' or 'sglang-kernel'")
        if kernel.get("source", "prebuilt") not in ("prebuilt", "build"):
            bad(prefix + ".kernel.source", kernel.get("source"), "'prebuilt' or 'build'")
        flash_attn = pins.get("flash_attn")
        if flash_attn is not None:
            version(prefix + ".flash_attn", flash_attn)
        if pins.get("flash_attn_source", "build") not in ("build", "prebuilt", "none"):
            bad(prefix + ".flash_attn_source", pins.get("flash_attn_source"),
                "'build', 'prebuilt' or 'none'")
        stacks[stack_id] = EngineStack(
            id=stack_id,
            cuda=version(prefix + ".cuda", pins.get("cuda"), re.compile(r"^\d+\.\d+$"),
                         "a CUDA major.minor like 12.8"),
            python=version(prefix + ".python", pins.get("python"), re.compile(r"^3\.\d+$"),
                           "a Python minor version like 3.12"),
            torch=version(prefix + ".torch", pins.get("torch")),
            sglang=version(prefix + ".sglang", pins.get("sglang")),
            kernel=KernelPackage(
                package=str(kernel.get("package")),
                version=version(prefix + ".kernel.version", kernel.get("version")),
                source=kernel.get("source", "prebuilt"),
            ),
            flashinfer=version(prefix + ".flashinfer", pins.get("flashinfer")),
            flash_attn=flash_attn,
            flash_attn_source=pins.get("flash_attn_source", "build"),
        )
    active_id = raw.get("active")
    if active_id not in stacks:
        bad("active", active_id, "the id of one of the stacks: " + ", ".join(stacks or ["(none)"]))
    if problems:
        raise SiteError(problems)
    return Stack(
        file=where,
        uv=uv,
        driver_branch=branch,
        driver_version=driver_version,
        active=stacks[active_id],
        stacks=stacks,
    )


# ----------------------------------------------------------------------------------------------
# Hosts and the whole site.


@dataclass(frozen=True)
class HostSettings:
    name: str
    groups: tuple[str, ...]
    base: BaseSettings
    gpu: GpuSettings
    nccl: NcclSettings
    serving: ServingSettings
    build: BuildSettings
    guest: GuestSettings
    proxmox: ProxmoxSettings
    sglang: SglangSettings
    nvidia_driver: NvidiaDriverSettings
    cuda: CudaSettings
    docker: DockerSettings
    health: HealthSettings = HealthSettings()
    # Keys already reported as invalid: cross-host rules skip them (one message per mistake).
    invalid_keys: frozenset[str] = frozenset()

    def valid(self, *keys: str) -> bool:
        return not (set(keys) & self.invalid_keys)

    def in_group(self, group: str) -> bool:
        return group in self.groups

    @property
    def driver_mode(self) -> Literal["full", "userspace"]:
        """An LXC guest uses its node's kernel module: it gets the userspace driver only."""
        return "userspace" if self.in_group("lxc_guests") else "full"

    @property
    def speculative(self) -> SpeculativeSettings | None:
        spec = self.serving.speculative
        return SpeculativeSettings(**spec) if spec else None


@dataclass(frozen=True)
class Site:
    inventory_file: str
    stack: Stack
    hosts: dict[str, HostSettings]
    secrets_file: str | None
    secret_names: frozenset[str]

    def group(self, name: str) -> list[HostSettings]:
        return [h for h in self.hosts.values() if h.in_group(name)]

    def gpu_node_rank(self, host_name: str) -> tuple[int, int, str]:
        """(nnodes, node_rank, dist-init address) for a multi-node deployment."""
        nodes = self.group("gpu_nodes")
        names = [n.name for n in nodes]
        head = nodes[0]
        return len(nodes), names.index(host_name), f"{_address_of(head)}:{head.serving.dist_init_port}"

    def summary(self) -> str:
        lines = [
            f"{self.inventory_file}: valid",
            f"  stack {self.stack.active.id} (sglang {self.stack.active.sglang}, "
            f"torch {self.stack.active.torch}, CUDA {self.stack.active.cuda}, "
            f"driver {self.stack.driver_version}, uv {self.stack.uv}) from {self.stack.file}",
        ]
        for host in self.hosts.values():
            detail = ", ".join(host.groups) or "no role group"
            if host.in_group("gpu_nodes"):
                detail += f"; {host.gpu.count} x {host.gpu.arch} GPU, serving {host.serving.served_model_name} on {host.serving.host}:{host.serving.port}"
            if host.guest.vmid is not None:
                detail += f"; vmid {host.guest.vmid} on {host.guest.node}, GPUs {', '.join(host.guest.gpu_addresses) or 'none'}"
            lines.append(f"  {host.name}: {detail}")
        lines.append(f"  secrets: {self.secrets_file or 'none'} ({len(self.secret_names)} keys)")
        return "\n".join(lines)


def _address_of(host: HostSettings) -> str:
    return host.name.split("@", 1)[-1].split("/")[-1]


def _unknown_keys(raw: dict, known: set, prefix: str, where: str, problems: list[str]) -> None:
    for key in raw:
        if key not in known:
            problems.append(
                f"{where}: unknown key {prefix}{key} = {raw[key]!r}; valid keys: "
                + ", ".join(sorted(prefix + k for k in known))
            )


def _display(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _pyinfra_keys() -> set[str]:
    """Keys pyinfra itself understands: connector data and global operation arguments."""
    try:
        from pyinfra.api.arguments import all_global_arguments
        from pyinfra.api.connectors import get_all_connectors
    except ImportError:  # tests/infra --expect on a machine without pyinfra: no such keys there
        return set()

    keys = {name for name, _ in all_global_arguments()}
    for connector in get_all_connectors().values():
        keys |= set(getattr(connector, "data_meta", {}) or {})
    return keys


def _convert(value: Any, annotation: Any) -> tuple[bool, Any]:
    """Check value against a field's annotation; returns (ok, value)."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return True, None
        return _convert(value, next(a for a in args if a is not type(None)))
    if origin is Literal:
        return value in args, value
    if origin is list:
        return isinstance(value, (list, tuple)) and all(
            _convert(v, args[0])[0] for v in value
        ), list(value) if isinstance(value, (list, tuple)) else value
    if origin is dict:
        if not isinstance(value, dict):
            return False, value
        return all(isinstance(k, str) for k in value) and all(
            args[1] is Any or _convert(v, args[1])[0] for v in value.values()
        ), dict(value)
    if annotation is bool:
        return isinstance(value, bool), value
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if annotation is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return ok, float(value) if ok else value
    if annotation is str:
        return isinstance(value, str), value
    return True, value


def _type_name(annotation: Any) -> str:
    text = str(annotation).replace("typing.", "")
    return {"<class 'int'>": "an integer", "<class 'str'>": "a string",
            "<class 'bool'>": "True or False", "<class 'float'>": "a number"}.get(text, text)


def _build_section(cls, data: dict, where: str, problems: list[str], invalid: set[str]):
    hints = typing.get_type_hints(cls)
    values = {}
    for f in dataclasses.fields(cls):
        key = cls.PREFIX + f.name
        if key not in data:
            continue
        value = data[key]
        ok, converted = _convert(value, hints[f.name])
        if not ok:
            problems.append(f"{where}: {key} = {value!r} is invalid; expected {_type_name(hints[f.name])}")
            invalid.add(key)
            continue
        check = f.metadata.get("check")
        valid = check(converted) if (check and converted is not None) else None
        if valid:
            problems.append(f"{where}: {key} = {value!r} is invalid; expected {valid}")
            invalid.add(key)
            continue
        values[f.name] = converted
    return cls(**values)


def _section_keys() -> dict[str, type]:
    return {cls.PREFIX + f.name: cls for cls in SECTIONS for f in dataclasses.fields(cls)}


def _closest(key: str, candidates) -> str:
    import difflib

    match = difflib.get_close_matches(key, list(candidates), n=1)
    return f"; did you mean {match[0]}?" if match else ""


def build_host(name: str, groups: tuple[str, ...], data: dict, where: str,
               problems: list[str]) -> HostSettings:
    """Typed settings of one host from its merged pyinfra data."""
    known = _section_keys()
    pyinfra_keys = _pyinfra_keys()
    for key, value in data.items():
        if key in known or key in SITE_KEYS or key in pyinfra_keys:
            continue
        problems.append(
            f"{where}: host {name}: unknown key {key} = {value!r}"
            f"{_closest(key, list(known) + list(SITE_KEYS))} (valid keys are listed in README.md"
            " under 'Settings')"
        )
    invalid: set[str] = set()
    sections = {
        cls: _build_section(cls, data, f"{where}: host {name}", problems, invalid) for cls in SECTIONS
    }
    return HostSettings(
        name=name,
        groups=groups,
        base=sections[BaseSettings],
        gpu=sections[GpuSettings],
        nccl=sections[NcclSettings],
        serving=sections[ServingSettings],
        build=sections[BuildSettings],
        guest=sections[GuestSettings],
        proxmox=sections[ProxmoxSettings],
        sglang=sections[SglangSettings],
        health=sections[HealthSettings],
        nvidia_driver=sections[NvidiaDriverSettings],
        cuda=sections[CudaSettings],
        docker=sections[DockerSettings],
        invalid_keys=frozenset(invalid),
    )


# ----------------------------------------------------------------------------------------------
# Cross-host rules: checked once all hosts are typed.


def _check_site(site_hosts: dict[str, HostSettings], where: str, secret_names, secrets_file,
                problems: list[str], stack: Stack | None = None) -> None:
    vmids: dict[int, str] = {}
    gpu_owner: dict[str, tuple[str, str]] = {}
    for host in site_hosts.values():
        here = f"{where}: host {host.name}"
        gpu = host.gpu
        if not host.valid("gpu_count", "gpu_addresses", "guest_gpu_addresses", "guest_vmid",
                          "guest_node", "guest_features", "guest_unprivileged", "serving_host",
                          "serving_api_key_secret", "serving_hf_token_secret", "serving_speculative"):
            continue  # its own message already names the mistake
        if host.in_group("gpu_nodes") and gpu.count < 1:
            problems.append(f"{here}: gpu_count = {gpu.count} is invalid; a gpu node needs an integer >= 1")
        if gpu.addresses and len(gpu.addresses) != gpu.count:
            problems.append(
                f"{here}: gpu_addresses lists {len(gpu.addresses)} GPUs but gpu_count = {gpu.count};"
                " expected as many addresses as GPUs"
            )
        _duplicates(gpu.addresses, f"{here}: gpu_addresses", problems)
        if host.in_group("gpu_nodes") and host.serving.host not in ("127.0.0.1", "::1") and not host.serving.api_key_secret:
            problems.append(
                f"{here}: serving_host = {host.serving.host!r} exposes the server beyond this host"
                " without serving_api_key_secret; expected an API key secret or serving_host = '127.0.0.1'"
            )
        for key in ("api_key_secret", "hf_token_secret"):
            ref = getattr(host.serving, key)
            if ref and ref not in secret_names:
                problems.append(
                    f"{here}: serving_{key} = {ref!r} names no secret in "
                    f"{secrets_file or '(no secrets_file set)'}; expected one of: "
                    + (", ".join(sorted(secret_names)) or "(the vault is empty or missing)")
                )
        speculative_problem = _speculative_problem(host.serving.speculative)
        if speculative_problem:
            problems.append(f"{here}: {speculative_problem}")
        elif host.in_group("gpu_nodes") and stack is not None:
            # Rendered per release and checked against that release's real CLI.
            from roles.serving.command import command_problems

            speculative = _speculative_problems(host, stack, where)
            # One message per mistake: a bad speculative value is named by its own check.
            problems.extend(f"{here}: {p}" for p in command_problems(host, site_hosts, stack.active)
                            if not (speculative and "--speculative-" in p))
            problems.extend(f"{here}: {p}" for p in speculative)
        is_guest = host.in_group("lxc_guests") or host.in_group("kvm_guests")
        if host.in_group("lxc_guests") and host.in_group("kvm_guests"):
            problems.append(f"{here}: in both lxc_guests and kvm_guests; expected one of them")
        if is_guest:
            _check_guest(host, here, site_hosts, vmids, gpu_owner, problems)
    _check_iommu_groups(site_hosts, gpu_owner, where, problems)


def _speculative_problems(host: HostSettings, stack: Stack, where: str) -> list[str]:
    """Per-release checks of the drafter and its config against the target's (roles/serving)."""
    if host.speculative is None:
        return []
    from roles.serving.command import CliError, cli_options
    from roles.serving.speculative import speculative_problems

    try:
        cli = cli_options(stack.active.sglang)
    except CliError:
        return []  # command_problems already says the release's CLI is missing
    return speculative_problems(host, stack, stack.active, cli, Path(where).parent)


def _speculative_problem(speculative: dict | None) -> str | None:
    if speculative is None:
        return None
    try:
        SpeculativeSettings(**speculative)  # the values are checked per release (roles/serving)
    except TypeError as error:
        return (
            f"serving_speculative = {speculative!r} is invalid ({error});"
            " expected {'draft_model_path': '/models/...', 'algorithm': 'EAGLE3',"
            " 'num_steps': 3, 'eagle_topk': 1, 'num_draft_tokens': 4, 'spec_v2': False,"
            " 'draft_config': '<drafter config.json>', 'target_config': '<target config.json>'}"
        )
    return None


def _check_guest(host: HostSettings, here: str, site_hosts, vmids, gpu_owner, problems) -> None:
    guest = host.guest
    if guest.vmid is None:
        problems.append(f"{here}: guest_vmid is missing; expected an integer >= 100, unique per node")
    elif guest.vmid in vmids:
        problems.append(
            f"{here}: guest_vmid = {guest.vmid} is already used by {vmids[guest.vmid]};"
            " expected a VMID unique across LXC and KVM guests"
        )
    else:
        vmids[guest.vmid] = host.name
    node = site_hosts.get(guest.node) if guest.node else None
    if node is None or not node.in_group("proxmox_hosts"):
        problems.append(
            f"{here}: guest_node = {guest.node!r} is not a host of the proxmox_hosts group; expected one of: "
            + (", ".join(h.name for h in site_hosts.values() if h.in_group("proxmox_hosts")) or "(none)")
        )
    kind = "lxc" if host.in_group("lxc_guests") else "kvm"
    for address in guest.gpu_addresses:
        if address in gpu_owner:
            other, other_kind = gpu_owner[address]
            why = ("; never to an LXC guest (host driver) and a KVM guest (vfio-pci) at once"
                   if other_kind != kind else "")
            problems.append(
                f"{here}: guest_gpu_addresses has {address}, already given to {other};"
                f" expected each GPU in at most one guest{why}"
            )
        gpu_owner[address] = (host.name, kind)
        if node is not None and address not in node.proxmox.gpu_addresses:
            problems.append(
                f"{here}: guest_gpu_addresses has {address}, which is not in {node.name}'s"
                f" proxmox_gpu_addresses; expected one of: {', '.join(node.proxmox.gpu_addresses) or '(none)'}"
            )
    if host.in_group("gpu_nodes") and len(guest.gpu_addresses) != host.gpu.count:
        problems.append(
            f"{here}: gpu_count = {host.gpu.count} but guest_gpu_addresses lists"
            f" {len(guest.gpu_addresses)} GPUs; expected as many addresses as GPUs"
        )
    if "keyctl" in guest.features and not guest.unprivileged:
        problems.append(
            f"{here}: guest_features has 'keyctl' with guest_unprivileged = False;"
            " expected keyctl only on unprivileged containers"
        )
    if kind == "lxc":
        _check_lxc_indices(host, here, problems)
    else:
        _check_kvm_passthrough(host, here, problems)


def _check_lxc_indices(host: HostSettings, here: str, problems: list[str]) -> None:
    # Each GPU takes a devN; nvidiactl, nvidia-uvm, nvidia-uvm-tools, nvidia-modeset and the
    # nvidia-caps nodes (at most 2) take up to 5 more.
    devices = len(host.guest.gpu_addresses) + 5 if host.guest.gpu_addresses else 0
    if devices > LXC_MAX_DEVICES:
        problems.append(f"{here}: guest_gpu_addresses needs dev0..dev{devices - 1};"
                        f" expected at most {LXC_MAX_DEVICES} device entries (dev0-dev255)")
    if len(host.guest.mount_points) > LXC_MAX_MOUNT_POINTS:
        problems.append(f"{here}: guest_mount_points has {len(host.guest.mount_points)} entries;"
                        f" expected at most {LXC_MAX_MOUNT_POINTS} (mp0-mp255)")


def _check_kvm_passthrough(host: HostSettings, here: str, problems: list[str]) -> None:
    guest = host.guest
    if len(guest.gpu_addresses) > KVM_MAX_HOSTPCI:
        problems.append(f"{here}: guest_gpu_addresses lists {len(guest.gpu_addresses)} GPUs;"
                        f" expected at most {KVM_MAX_HOSTPCI} per VM (hostpci0-hostpci15)")
    if guest.pcie and guest.gpu_addresses and not guest.machine.startswith(("q35", "pc-q35")):
        problems.append(f"{here}: guest_machine = {guest.machine!r} with guest_pcie = True;"
                        " expected a q35 machine (pcie=1 needs q35) or guest_pcie = False")
    if len(guest.x_vga_addresses) > 1:
        problems.append(f"{here}: guest_x_vga_addresses = {guest.x_vga_addresses!r};"
                        " expected at most one x-vga device per VM")
    for address in guest.x_vga_addresses:
        if address not in guest.gpu_addresses:
            problems.append(f"{here}: guest_x_vga_addresses has {address}, which is not in"
                            " guest_gpu_addresses; expected one of the guest's GPUs")
    # 16 GB and more of VRAM means a BAR beyond what a default CPU model and SeaBIOS map.
    if guest.gpu_addresses and host.gpu.memory_gib >= 16:
        if guest.cpu != "host" and "phys-bits=" not in guest.cpu:
            problems.append(f"{here}: guest_cpu = {guest.cpu!r} with {host.gpu.memory_gib} GB GPUs;"
                            " expected 'host' or a CPU type with phys-bits=host (large BARs)")
        if guest.bios != "ovmf":
            problems.append(f"{here}: guest_bios = {guest.bios!r} with {host.gpu.memory_gib} GB GPUs;"
                            " expected 'ovmf' (with an efidisk) for large BARs")


def _check_iommu_groups(site_hosts: dict[str, HostSettings], gpu_owner: dict, where: str,
                        problems: list[str]) -> None:
    """Proxmox binds a GPU's whole IOMMU group to vfio-pci: a group belongs to one guest."""
    for node in (h for h in site_hosts.values() if h.in_group("proxmox_hosts")):
        group_owner: dict[int, tuple[str, str]] = {}
        for address, group in node.proxmox.iommu_groups.items():
            if address not in gpu_owner:
                continue
            owner = gpu_owner[address][0]
            first = group_owner.setdefault(group, (owner, address))
            if first[0] != owner:
                problems.append(
                    f"{where}: host {owner}: guest_gpu_addresses has {address}, which shares IOMMU"
                    f" group {group} with {first[1]} of guest {first[0]} ({node.name}'s"
                    " proxmox_iommu_groups); expected all GPUs of one group in one guest"
                )


def _check_driver_match(site_hosts: dict[str, HostSettings], stack: Stack | None, where: str,
                        problems: list[str]) -> None:
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


def _duplicates(values: list[str], label: str, problems: list[str]) -> None:
    seen = set()
    for value in values:
        if value in seen:
            problems.append(f"{label} has {value} twice; expected each address once")
        seen.add(value)


# ----------------------------------------------------------------------------------------------
# Building the site from a pyinfra Inventory (deploy time) or an inventory file (CLI / load).


def site_from_inventory(inventory, inventory_file: str) -> Site:
    problems: list[str] = []
    where = _display(Path(inventory_file))
    file_group = Path(inventory_file).stem
    hosts: dict[str, HostSettings] = {}
    raw_data: dict[str, dict] = {}
    for group in inventory.groups:
        if group not in KNOWN_GROUPS and group not in (file_group, "all") and not group.startswith("@"):
            problems.append(
                f"{where}: unknown group {group!r}{_closest(group, KNOWN_GROUPS)}; valid groups: "
                + ", ".join(KNOWN_GROUPS)
            )
    for pyinfra_host in inventory:
        data = pyinfra_host.data.dict()
        raw_data[pyinfra_host.name] = data
        groups = tuple(g for g in KNOWN_GROUPS if pyinfra_host in inventory.get_group(g, []))
        hosts[pyinfra_host.name] = build_host(pyinfra_host.name, groups, data, where, problems)
    site_values = _site_values(raw_data, where, problems)
    stack = None
    try:
        stack = load_stack(Path(inventory_file).parent / site_values.get("stack_file", "stack.yml"))
    except SiteError as error:
        problems.extend(error.problems)
    secrets_file, secret_names = None, frozenset()
    if "secrets_file" in site_values:
        from roles import secrets

        secrets_file = str(Path(inventory_file).parent / site_values["secrets_file"])
        try:
            secret_names = frozenset(secrets.load(Path(secrets_file)))
        except secrets.SecretsError as error:
            problems.append(f"{where}: secrets_file = {site_values['secrets_file']!r}: {error}")
    _check_site(hosts, where, secret_names, secrets_file, problems, stack)
    _check_driver_match(hosts, stack, where, problems)
    if problems:
        raise SiteError(problems)
    return Site(
        inventory_file=where,
        stack=stack,
        hosts=hosts,
        secrets_file=secrets_file,
        secret_names=secret_names,
    )


def _site_values(raw_data: dict[str, dict], where: str, problems: list[str]) -> dict[str, str]:
    """stack_file / secrets_file must be the same for every host (they describe the site)."""
    values: dict[str, str] = {}
    for key in SITE_KEYS:
        seen = {data[key] for data in raw_data.values() if key in data}
        if len(seen) > 1:
            problems.append(f"{where}: {key} differs between hosts ({sorted(seen)}); expected one value")
        elif seen:
            value = seen.pop()
            if not isinstance(value, str):
                problems.append(f"{where}: {key} = {value!r} is invalid; expected a path string")
            else:
                values[key] = value
    return values


def _pyinfra_inventory(path: Path):
    """The Inventory pyinfra's CLI would build from this file (group_data included)."""
    from pyinfra.api import State
    from pyinfra.context import ctx_state
    from pyinfra_cli.inventory import make_inventory_from_files

    key = str(path.resolve())
    _VALIDATING.add(key)  # the file's own require_valid_inventory call must not recurse
    try:
        if ctx_state.isset():  # inside pyinfra: reuse its state
            return make_inventory_from_files(str(path), cwd=str(PROJECT_ROOT))
        with ctx_state.use(State()):
            return make_inventory_from_files(str(path), cwd=str(PROJECT_ROOT))
    finally:
        _VALIDATING.discard(key)


def load_site(inventory_file: str | os.PathLike) -> Site:
    """Load an inventory file exactly as pyinfra's CLI does (group_data included) and type it."""
    path = Path(inventory_file)
    if not path.is_file():
        raise SiteError([f"{inventory_file}: no such inventory file"])
    try:
        inventory = _pyinfra_inventory(path)
    except SiteError:
        raise
    except Exception as error:  # a Python error in the user's inventory or group data
        cause = getattr(error, "__cause__", None) or error
        raise SiteError([f"{_display(path)}: could not be loaded: {cause}"]) from error
    return site_from_inventory(inventory, str(path))


def testinfra_url(inventory_file: str | os.PathLike, host_name: str) -> str:
    """How testinfra reaches an inventory host (tests/infra): pyinfra's own connector, user, port."""
    data = _pyinfra_inventory(Path(inventory_file)).get_host(host_name).data
    if host_name.startswith("@docker/"):
        return "docker://" + host_name.removeprefix("@docker/")
    if host_name == "@local":
        return "local://"
    user = f"{data.get('ssh_user')}@" if data.get("ssh_user") else ""
    port = f":{data.get('ssh_port')}" if data.get("ssh_port") else ""
    return f"ssh://{user}{data.get('ssh_hostname') or host_name}{port}"


_VALIDATING: set[str] = set()
_LOADED_INVENTORY: list[str] = []


def require_valid_inventory(inventory_file: str) -> None:
    """Called at the end of every inventory file: stop before pyinfra connects to anything."""
    if str(Path(inventory_file).resolve()) in _VALIDATING:
        return  # we are the nested load done by load_site itself
    _LOADED_INVENTORY.append(str(inventory_file))
    try:
        site = load_site(inventory_file)
        if _under_pyinfra_cli():
            _require_decryptable(site)
            if site.group("gpu_nodes"):
                from roles.sglang.stack_check import require_consistent_stack

                require_consistent_stack(site.stack.active)
    except SiteError as error:
        _print_problems(error)
        raise SystemExit(2) from None


def _under_pyinfra_cli() -> bool:
    import pyinfra

    return bool(getattr(pyinfra, "is_cli", False))


def referenced_secrets(site: Site) -> set[str]:
    return {
        ref
        for host in site.hosts.values()
        for ref in (host.serving.api_key_secret, host.serving.hf_token_secret)
        if ref
    }


def _require_decryptable(site: Site) -> None:
    """A deploy needs the values: a wrong password stops it before any connection."""
    from roles import secrets

    names = referenced_secrets(site)
    if names:
        try:
            secrets.decrypt_all(Path(site.secrets_file), names)
        except secrets.SecretsError as error:
            raise SiteError([f"{site.inventory_file}: {error}"]) from None


def secret_value(name: str) -> str:
    """Plaintext of one secret, for a role that writes it into a 0600 file on the host."""
    from roles import secrets

    site = current_site()
    return secrets.decrypt_all(Path(site.secrets_file), [name])[name]


def _print_problems(error: SiteError) -> None:
    print(f"inference-host: {len(error.problems)} problem(s) in the inventory; no host was contacted:",
          file=sys.stderr)
    for problem in error.problems:
        print(f"  - {problem}", file=sys.stderr)


# ----------------------------------------------------------------------------------------------
# Deploy-time access (the only reader of host.data).


@cache
def _deploy_site(inventory_file: str) -> Site:
    from pyinfra import state

    return site_from_inventory(state.inventory, inventory_file)


def _inventory_file_of() -> str:
    """The inventory pyinfra loaded: recorded by require_valid_inventory as it ran."""
    if _LOADED_INVENTORY:
        return _LOADED_INVENTORY[-1]
    raise SiteError([
        "the inventory file did not call roles.site.require_valid_inventory(__file__);"
        " every inventory must end with it so that it is validated before connecting"
    ])


def inventory_file() -> str:
    """The inventory file of the running deploy (roles/health hands it to the checks)."""
    return _inventory_file_of()


def current_site() -> Site:
    return _deploy_site(_inventory_file_of())


def current_host() -> HostSettings:
    from pyinfra import host

    return current_site().hosts[host.name]


def settings_table() -> str:
    """Markdown table of every host-data key: the README's "Settings" section is checked against it."""
    hints_cache = {cls: typing.get_type_hints(cls) for cls in SECTIONS}
    rows = ["| key | type | default |", "|---|---|---|"]
    for cls in SECTIONS:
        for f in dataclasses.fields(cls):
            if f.default is not dataclasses.MISSING:
                default = f.default
            elif f.default_factory is not dataclasses.MISSING:
                default = f.default_factory()
            else:
                default = "(required)"
            kind = str(hints_cache[cls][f.name]).replace("typing.", "").replace("<class '", "").replace("'>", "").replace(" | ", " or ")
            rows.append(f"| `{cls.PREFIX}{f.name}` | {kind} | `{default!r}` |")
    for key, meaning in SITE_KEYS.items():
        rows.append(f"| `{key}` | str | {meaning} |")
    return "\n".join(rows)


if __name__ == "__main__":
    if sys.argv[1:] == ["--settings"]:
        print(settings_table())
        raise SystemExit(0)
    if len(sys.argv) != 2:
        print("usage: python -m roles.site inventory/<file>.py", file=sys.stderr)
        raise SystemExit(64)
    try:
        print(load_site(sys.argv[1]).summary())
    except SiteError as site_error:
        _print_problems(site_error)
        raise SystemExit(2) from None
