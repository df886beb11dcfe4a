"""The schema of host data: one section class per role, HostSettings (one host) and Site (all).

Host data keys are flat and prefixed by the section they belong to (``serving_port``,
``nccl_p2p_level``); a key that belongs to no section is an error, so a typo never passes
silently. Roles added later extend the model by adding a section class to ``SECTIONS``.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from roles.site.errors import closest
from roles.site.stack import DRIVER_VERSION_RE, Stack

PROJECT_ROOT = Path(__file__).resolve().parents[2]

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

# Kernel packages roles/wheels can build from source (roles/wheels/docker/<package>.Dockerfile).
WHEEL_PACKAGES = ("flash-attn", "sgl-kernel")

# NCCL_P2P_LEVEL values from the NCCL environment documentation.
NCCL_P2P_LEVELS = ("LOC", "NVL", "PIX", "PXB", "PHB", "SYS")
NCCL_DEBUG_LEVELS = ("VERSION", "WARN", "INFO", "TRACE")

PCI_ADDRESS_RE = re.compile(r"^(?:[a-f0-9]{4,}:)?[a-f0-9]{2}:[a-f0-9]{2}\.[a-f0-9]$")
UNIX_NAME_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
SECRET_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
DNS_NAME_RE = re.compile(r"^[a-zA-Z0-9]([a-zA-Z0-9-]{0,62})(\.[a-zA-Z0-9]([a-zA-Z0-9-]{0,62}))*$")
# qemu-server src/PVE/QemuServer/Machine.pm (stable-bookworm), machine type pattern.
QEMU_MACHINE_RE = re.compile(
    r"(pc|pc(-i440fx)?-\d+(\.\d+)+(\+pve\d+)?(\.pxe)?|q35|pc-q35-\d+(\.\d+)+(\+pve\d+)?(\.pxe)?)")
# PVE 8 limits (pve-container LXC/Config.pm, qemu-server PCI.pm): dev0-255, mp0-255, hostpci0-15.
LXC_MAX_DEVICES, LXC_MAX_MOUNT_POINTS, KVM_MAX_HOSTPCI = 256, 256, 16


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
    """serving_speculative: an EAGLE-3 drafter served beside the target (checked per release by
    roles/serving/speculative.py). draft_config / target_config: copies of the drafter's and the
    target's config.json on the control machine, relative to the inventory file."""

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


# SpecForge (sgl-project/SpecForge) commit the drafter training job runs: the last main commit
# pinning sglang 0.5.9 / torch 2.9.1 / transformers 4.57.1 (2026-06-28; the next pins 0.5.14).
SPECFORGE_COMMIT = "82951a9711c8c9bf9e146e426b2e956d9798ddc7"


@dataclass(frozen=True)
class Eagle3TrainingSettings:
    """roles/eagle3_training: the EAGLE-3 drafter training job (SpecForge), laid down by the
    deploy and started by the user (systemctl start inference-host-eagle3-<step>)."""

    PREFIX: typing.ClassVar[str] = "eagle3_training_"

    enabled: bool = False
    # Data, hidden states and checkpoints: on a disk with room (the job computes the budget).
    work_dir: str = field(default="/var/lib/inference-host/eagle3", metadata=_absolute_path())
    # "full": SpecForge's locked environment; "no-gpu-deps" (lab only): the packages of the
    # steps that need no GPU.
    env_mode: str = field(default="full", metadata=_one_of("full", "no-gpu-deps"))
    # Git repository of SpecForge (a mirror when air-gapped) and the commit the job runs.
    specforge_repo: str = "https://github.com/sgl-project/SpecForge.git"
    specforge_commit: str = field(default=SPECFORGE_COMMIT, metadata=_check(
        re.compile(r"^[0-9a-f]{40}$").match, "a full 40-character git commit id"))
    # The locked environment (roles/eagle3_training/files/specforge-<lock>.lock.txt): SpecForge's
    # dependencies at that commit, resolved once.
    specforge_lock: str = field(default=SPECFORGE_COMMIT[:7], metadata=_check(
        re.compile(r"^[0-9a-f]{7}$").match, "the 7-character commit prefix of a committed lock file"))
    # Prompts: {"repo": "<HF dataset>", "revision": "<40-hex commit>", "file": "<path in it>"}
    # (pinned by revision) or {"path": "/data/prompts.jsonl", "sha256": "<64 hex>"}.
    dataset: dict[str, str] = field(default_factory=dict, metadata=_check(
        lambda v: not v or (set(v) == {"repo", "revision", "file"} and re.match(r"^[0-9a-f]{40}$", v["revision"]))
        or (set(v) == {"path", "sha256"} and v["path"].startswith("/") and re.match(r"^[0-9a-f]{64}$", v["sha256"])),
        "{'repo': ..., 'revision': '<40-hex commit>', 'file': ...} or {'path': '/...', 'sha256': '<64 hex>'}"))
    samples: int = field(default=50000, metadata=_positive())
    max_length: int = field(default=2048, metadata=_positive())
    chat_template: str = "kimi-k2-instruct"      # SpecForge specforge/data/template.py
    regenerate_concurrency: int = field(default=32, metadata=_positive())
    regenerate_max_tokens: int = field(default=2048, metadata=_positive())
    num_epochs: int = field(default=1, metadata=_positive())
    learning_rate: float = field(default=1e-4, metadata=_positive())
    # SpecForge saves a checkpoint every save_interval steps and keeps them all (disk budget).
    save_interval: int = field(default=5000, metadata=_positive())
    # The exported drafter: the directory --speculative-draft-model-path loads.
    export_dir: str = field(default="/models/Kimi-K2.5-eagle3-trained", metadata=_absolute_path())


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
    Eagle3TrainingSettings,
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
    eagle3_training: Eagle3TrainingSettings = Eagle3TrainingSettings()
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
        return len(nodes), names.index(host_name), f"{address_of(head)}:{head.serving.dist_init_port}"

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


def address_of(host: HostSettings) -> str:
    return host.name.split("@", 1)[-1].split("/")[-1]


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
            f"{closest(key, list(known) + list(SITE_KEYS))} (valid keys are listed in README.md"
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
        eagle3_training=sections[Eagle3TrainingSettings],
        invalid_keys=frozenset(invalid),
    )
