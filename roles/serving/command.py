"""The engine server's command line, rendered from typed settings for the pinned release of
the stack's engine (SGLang or vLLM), and checked against that release's real CLI
(roles/serving/cli/<version>.json for sglang, cli/vllm-<version>.json for vllm, captured
from the real wheels by roles.serving.cli_capture) while the inventory is validated."""

from __future__ import annotations

import json
from functools import cache

from roles.serving.cli_capture import data_file
from roles.serving.speculative import effective_max_running_requests, speculative_arguments
from roles.shared.layout import secret_args_link, tls_files
from roles.site import EngineStack, HostSettings, address_of

# Settings whose flag was renamed between releases: the first spelling the pinned release
# knows is used (--cuda-graph-max-bs became --cuda-graph-max-bs-decode by 0.5.23).
SPELLINGS = {
    "cuda_graph_max_bs": ("--cuda-graph-max-bs", "--cuda-graph-max-bs-decode"),
    "tp_size": ("--tp-size", "--tensor-parallel-size"),
}

# Safe attention backend per release when serving_attention_backend is unset
# (docs/upstream.md, "SGLang"): flashinfer hung the server on SM120 in the 0.5.9 line and MLA
# prefill routed to trtllm_mla fails on SM120 in 0.5.10 (#24633), so triton, the backend
# that worked, is the default everywhere until a newer release is measured on the target.
DEFAULT_ATTENTION_BACKEND = "triton"

# The API key goes in a YAML file passed with --config (0600, read by the service user), so it
# is not in /proc/<pid>/cmdline; SGLang reads no environment variable for it. Each release has
# its own (roles/serving); roles/shared/layout.secret_args_link is the stable name.


class CliError(Exception):
    pass


@cache
def cli_options(version: str, engine: str = "sglang") -> dict:
    path = data_file(version, engine)
    if not path.is_file():
        how = (
            f"`uv run python -m roles.serving.cli_capture {version}`"
            if engine == "sglang"
            else f"`uv run python -m roles.serving.cli_capture --vllm ENV/bin/python` (ENV: an"
            f" environment with vllm {version} or vllm-cpu {version})"
        )
        raise CliError(
            f"no captured command line for {engine} {version} ({path.name} is missing); expected one made by {how}"
        )
    return json.loads(path.read_text())


def _spelling(setting: str, version: str) -> str:
    options = cli_options(version)["options"]
    for flag in SPELLINGS[setting]:
        if flag in options:
            return flag
    raise CliError(
        f"sglang {version} has none of {', '.join(SPELLINGS[setting])} for serving_{setting};"
        " expected a release whose CLI was captured with one of these spellings"
    )


def engine_group(settings: HostSettings, hosts: dict[str, HostSettings]) -> list[HostSettings]:
    """The gpu nodes that form one SGLang server with this one, in inventory order (= ranks):
    all gpu nodes with serving_topology = "tensor_parallel", else the node alone (a replica)."""
    if settings.serving.topology != "tensor_parallel":
        return [settings]
    return [h for h in hosts.values() if h.in_group("gpu_nodes")]


def node_topology(settings: HostSettings, hosts: dict[str, HostSettings]) -> tuple[int, int, int, str]:
    """(tp_size, nnodes, node_rank, dist-init address) of a gpu node.

    sglang 0.5.9 (srt/entrypoints/engine.py, _launch_scheduler_processes) gives each node
    tp_size // nnodes GPUs, ranks node_rank * that upward: --tp-size is the whole group's
    GPU count, not the node's (server_args.py asserts tp_size % nnodes == 0). Rank 0 hosts
    torch.distributed's store at --dist-init-addr, which every other node must reach."""
    group = engine_group(settings, hosts)
    head = group[0]
    host = head.serving.dist_init_host or address_of(head)
    if ":" in host:  # IPv6: sglang splits "[addr]:port" (server_args.py, configure_ipv6)
        host = f"[{host}]"
    tp_size = sum(node.gpu.count for node in group)
    rank = [node.name for node in group].index(settings.name)
    return tp_size, len(group), rank, f"{host}:{head.serving.dist_init_port}"


def server_arguments(
    settings: HostSettings, hosts: dict[str, HostSettings], stack: EngineStack, secret_args_file: str | None = None
) -> list[str]:
    """Arguments after the engine's launcher (no secret among them); the API key is read from
    secret_args_file (default: the stable name, layout.secret_args_link)."""
    if stack.engine == "vllm":
        return vllm_arguments(settings, hosts, stack, secret_args_file)
    serving, version = settings.serving, stack.sglang
    assert version is not None  # an SGLang stack pins sglang (the stack file's rules)
    tp_size, nnodes, rank, init_addr = node_topology(settings, hosts)
    args = [
        "--model-path",
        serving.model_path,
        "--served-model-name",
        serving.served_model_name,
        _spelling("tp_size", version),
        str(tp_size),
        "--host",
        serving.host,
        "--port",
        str(serving.port),
        "--attention-backend",
        serving.attention_backend or DEFAULT_ATTENTION_BACKEND,
        "--mem-fraction-static",
        f"{serving.mem_fraction_static:g}",
        "--watchdog-timeout",
        str(serving.watchdog_timeout),
    ]
    if serving.trust_remote_code:
        args.append("--trust-remote-code")
    if serving.cuda_graph_max_bs is not None:
        args += [_spelling("cuda_graph_max_bs", version), str(serving.cuda_graph_max_bs)]
    running = effective_max_running_requests(serving.max_running_requests, serving.speculative)
    if running is not None:  # with a drafter always said, so the unit shows SGLang's cap
        args += ["--max-running-requests", str(running)]
    if serving.context_length is not None:
        args += ["--context-length", str(serving.context_length)]
    if serving.chunked_prefill_size is not None:
        args += ["--chunked-prefill-size", str(serving.chunked_prefill_size)]
    if serving.enable_metrics:
        args.append("--enable-metrics")
    if settings.speculative:
        args += speculative_arguments(settings.speculative)
    if nnodes > 1:
        args += ["--nnodes", str(nnodes), "--node-rank", str(rank), "--dist-init-addr", init_addr]
    if serving.api_key_secret or serving.admin_api_key_secret:
        args += ["--config", secret_args_file or secret_args_link(serving.unit_name)]
    return args + tls_arguments(settings, version)


# SGLang 0.5.10 (srt/server_args.py) and 0.5.23 (srt/arg_groups/fields/serving.py) and vLLM 0.16.0
# (its captured CLI) take the same two options and hand them to uvicorn; SGLang 0.5.9 has none.
TLS_OPTIONS = ("--ssl-certfile", "--ssl-keyfile")


def serves_tls(version: str, engine: str = "sglang") -> bool:
    """Whether the release's captured CLI has --ssl-certfile and --ssl-keyfile."""
    return all(flag in cli_options(version, engine)["options"] for flag in TLS_OPTIONS)


def tls_arguments(settings: HostSettings, version: str, engine: str = "sglang") -> list[str]:
    """--ssl-certfile/--ssl-keyfile with the paths of the 0600 files roles/serving writes (the
    key itself never on the command line); nothing without serving_tls_* or on a release that has
    no such option (command_problems refuses that in one line)."""
    if not settings.serving.tls_enabled or not serves_tls(version, engine):
        return []
    paths = tls_files(settings.serving.unit_name)
    return ["--ssl-certfile", paths["cert"], "--ssl-keyfile", paths["key"]]


# vLLM: the launcher both builds run (`vllm serve` is this module's run_server behind a
# console script; vllm 0.16.0 vllm/entrypoints/openai/api_server.py __main__ parses the same
# make_arg_parser options, less the positional model, so the model goes in as --model). The
# CPU build's `vllm` script cannot find a distribution named "vllm" (it is vllm-cpu), so one
# launcher for both keeps the lab's command line the target's.
VLLM_LAUNCHER = ["{env}/bin/python", "-m", "vllm.entrypoints.openai.api_server"]

# Attention backend per GPU architecture when vllm_attention_backend is unset. Kimi-K2.5 is an
# MLA model; in vllm 0.16.0 (v1/attention/backends/mla/*.py supports_compute_capability)
# FLASH_ATTN_MLA needs compute capability 9.x, FLASHMLA 9.x/10.x, FLASHINFER_MLA and
# CUTLASS_MLA 10.x; TRITON_MLA runs on any, so it is the one backend for SM120. vLLM's CPU
# build ignores the choice (its journal: "Cannot use AttentionBackendEnum.TRITON_MLA backend on
# CPU.", vllm/platforms/cpu.py) and uses CPU_ATTN.
VLLM_DEFAULT_ATTENTION_BACKEND = {"sm120": "TRITON_MLA"}


def speculative_config(settings: HostSettings) -> dict | None:
    """serving_speculative as vLLM's --speculative-config (vllm/config/speculative.py): an
    EAGLE-3 drafter proposes num_steps tokens per step (vLLM's num_speculative_tokens; its
    EAGLE proposer drafts a chain, so SGLang's topk/draft-token tree settings do not apply)."""
    spec = settings.speculative
    if spec is None:
        return None
    method = {"EAGLE3": "eagle3", "EAGLE": "eagle"}.get(spec.algorithm, spec.algorithm.lower())
    return {"method": method, "model": spec.draft_model_path, "num_speculative_tokens": spec.num_steps}


def vllm_tensor_parallel_size(settings: HostSettings) -> int:
    """One shard per GPU; the CPU build (vllm_install_mode = "cpu", the lab) serves on the
    host's CPUs, which are not the GPUs the inventory describes: one shard."""
    return 1 if settings.vllm.install_mode == "cpu" else settings.gpu.count


def vllm_arguments(
    settings: HostSettings, hosts: dict[str, HostSettings], stack: EngineStack, secret_args_file: str | None = None
) -> list[str]:
    """Arguments after `python -m vllm.entrypoints.openai.api_server`, from the typed settings."""
    serving, vllm = settings.serving, settings.vllm
    args = [
        "--model",
        serving.model_path,
        "--served-model-name",
        serving.served_model_name,
        "--tensor-parallel-size",
        str(vllm_tensor_parallel_size(settings)),
        "--host",
        serving.host,
        "--port",
        str(serving.port),
        "--gpu-memory-utilization",
        f"{vllm.gpu_memory_utilization:g}",
        # GET /load then counts each request for its whole HTTP lifetime, whatever path it came
        # by (entrypoints/utils.py load_aware_call, openai/basic/api_router.py; vllm 0.16.0): the
        # rolling drain waits on it (docs/rolling-upgrades.md). Without the flag /load reads 0.
        "--enable-server-load-tracking",
    ]
    backend = vllm.attention_backend or VLLM_DEFAULT_ATTENTION_BACKEND.get(settings.gpu.arch)
    if backend:
        args += ["--attention-backend", backend]
    if vllm.max_model_len is not None:
        args += ["--max-model-len", str(vllm.max_model_len)]
    if serving.max_running_requests is not None:
        args += ["--max-num-seqs", str(serving.max_running_requests)]
    if serving.trust_remote_code:
        args.append("--trust-remote-code")
    if vllm.enforce_eager:
        args.append("--enforce-eager")
    if vllm.dtype is not None:
        args += ["--dtype", vllm.dtype]
    # vllm 0.16.0's custom all-reduce (distributed/device_communicators/custom_all_reduce.py)
    # turns itself off on more than two GPUs without full NVLink, warning "specify
    # disable_custom_all_reduce=True explicitly". serving_custom_all_reduce_pcie = True is
    # refused above 2 GPUs (_vllm_problems).
    if not serving.custom_all_reduce_pcie:
        args.append("--disable-custom-all-reduce")
    spec = speculative_config(settings)
    if spec:
        args += ["--speculative-config", json.dumps(spec, separators=(",", ":"))]
    if serving.api_key_secret or serving.admin_api_key_secret:
        args += ["--config", secret_args_file or secret_args_link(serving.unit_name)]
    assert stack.vllm is not None  # a vLLM stack pins vllm
    return args + tls_arguments(settings, stack.vllm, "vllm")


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".")[:3])


# sglang 0.5.21 and later: upstream's PCIe all-reduce (FlashInfer's pcie_ipc_comm, world sizes
# 2/4/8, bf16, TP group; distributed/device_communicators/pcie_ipc_ar.py, read in 0.5.23).
UPSTREAM_PCIE_ALLREDUCE_SINCE = (0, 5, 21)
# Releases whose patch queue carries 0001-custom-all-reduce-pcie.patch.
PATCHED_PCIE_ALLREDUCE = ("0.5.9",)


def pcie_allreduce_env(version: str | None) -> dict[str, str]:
    """serving_custom_all_reduce_pcie = True, rendered for one release (empty: none exists, or
    no SGLang release)."""
    if version is None:
        return {}
    if _version(version) >= UPSTREAM_PCIE_ALLREDUCE_SINCE:
        return {"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1"}
    if version in PATCHED_PCIE_ALLREDUCE:
        return {"SGLANG_CUSTOM_AR_ALLOW_PCIE": "1"}
    return {}


def unknown_flags(args: list[str], version: str, engine: str = "sglang") -> list[str]:
    """Problems with args against the captured CLI of <engine>==version."""
    options = cli_options(version, engine)["options"]
    problems = []
    index = 0
    while index < len(args):
        flag = args[index]
        option = options.get(flag)
        if option is None:
            problems.append(f"{flag} is not an option of {engine} {version}")
            following = args[index + 1] if index + 1 < len(args) else "--"
            index += 1 if following.startswith("--") else 2  # skip its value too
            continue
        if option["takes_value"]:
            value = args[index + 1] if index + 1 < len(args) else None
            if value is None:
                problems.append(f"{flag} needs a value")
            elif option["choices"] and value not in [str(c) for c in option["choices"]]:
                problems.append(f"{flag} {value} is not one of {option['choices']} in {engine} {version}")
            index += 2
        else:
            index += 1
    return problems


def command_problems(settings: HostSettings, hosts: dict[str, HostSettings], stack: EngineStack) -> list[str]:
    """Validation-time check: every flag rendered for this host exists in the pinned release."""
    engine, version = stack.engine, stack.version
    try:
        args = server_arguments(settings, hosts, stack)
        problems = unknown_flags(args, version, engine)
        if settings.serving.api_key_secret and not cli_options(version, engine)["config_file"]:
            problems.append(f"{engine} {version} has no --config file support to keep the API key off the command line")
        if settings.serving.admin_api_key_secret:
            # The --config file's admin-api-key becomes --admin-api-key (serving_admin_api_key_secret).
            problems += unknown_flags(["--admin-api-key", "x"], version, engine)
        if settings.serving.tls_enabled and not serves_tls(version, engine):
            problems.append(
                f"serving_tls_cert_secret with {engine} {version}, which has no TLS option of its own (no"
                " --ssl-certfile in its CLI); expected a stack with sglang 0.5.10+ or vLLM, or no serving_tls_*"
                " and serving_host = '127.0.0.1' reached through a TLS terminator of your own or an SSH tunnel"
                " (docs/security.md#tls)"
            )
    except CliError as error:
        return [f"stack {stack.id}: {error}"]
    help_command = "python -m sglang.launch_server --help" if engine == "sglang" else "vllm serve --help=all"
    found = [
        f"stack {stack.id}: {p}"
        if p.startswith("serving_tls_")
        else f"stack {stack.id}: the server command line is invalid: {p}; expected the flags of"
        f" `{help_command}` of {engine} {version}"
        for p in problems
    ]
    if engine == "vllm":
        return found + _vllm_problems(settings, stack)
    if settings.serving.custom_all_reduce_pcie and not pcie_allreduce_env(stack.sglang):
        found.append(
            f"stack {stack.id}: serving_custom_all_reduce_pcie = True, but sglang {stack.sglang}"
            " has no PCIe all-reduce; expected False, or sglang 0.5.9 (patch 0001) or 0.5.21+"
        )
    return found


def _vllm_problems(settings: HostSettings, stack: EngineStack) -> list[str]:
    found = []
    if settings.serving.custom_all_reduce_pcie and settings.gpu.count > 2:
        found.append(
            f"stack {stack.id}: serving_custom_all_reduce_pcie = True, but vllm {stack.vllm}'s"
            f" custom all-reduce runs on PCIe only with 2 GPUs (gpu_count = {settings.gpu.count});"
            " expected False"
        )
    backends = cli_options(stack.vllm, "vllm").get("attention_backends") or []
    backend = settings.vllm.attention_backend
    if backend and backends and backend not in backends:
        found.append(
            f"stack {stack.id}: vllm_attention_backend = {backend!r} is not a backend of"
            f" vllm {stack.vllm}; expected one of {', '.join(backends)}"
        )
    if settings.vllm.install_mode == "cpu" and not settings.vllm.cpu_overrides:
        found.append(
            f"stack {stack.id}: vllm_install_mode = 'cpu' needs vllm_cpu_overrides (PyPI's"
            " torch for the CPU build's +cpu pin); expected e.g. ['torch==2.10.0']"
        )
    return found
