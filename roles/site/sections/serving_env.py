"""serving_extra_env's rules: which variables the engine's environment file may not take from
it (roles/site/sections/serving.py holds the setting)."""

from __future__ import annotations

import re

from pydantic_core import PydanticCustomError

ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# Variables the project's own environment file or command line already sets from a setting
# (roles/serving/templates/inference-engine.env.j2, roles/shared/nccl.py, roles/serving/command.py):
# a second line in serving_extra_env, written after the project's, would win (systemd keeps the
# last assignment of an EnvironmentFile=) and bypass that setting's own rule (nccl_p2p_level's
# one-of), or put a secret in the clear. Name -> the setting that sets it.
OWNED_ENV = {
    "NCCL_P2P_LEVEL": "nccl_p2p_level",
    "NCCL_P2P_DISABLE": "nccl_p2p_level ('off')",
    "NCCL_IB_DISABLE": "nccl_ib_disable",
    "NCCL_IB_HCA": "nccl_ib_hca",
    "NCCL_SOCKET_IFNAME": "nccl_socket_ifname",
    "NCCL_DEBUG": "nccl_debug",
    "NCCL_DEBUG_SUBSYS": "nccl_debug_subsys",
    "NCCL_MIN_NCHANNELS": "nccl_min_nchannels",
    # The token is a vault secret installed as $HF_HOME/token (0600); HF_HOME is under base_data_dir.
    "HF_TOKEN": "serving_hf_token_secret",
    "HUGGING_FACE_HUB_TOKEN": "serving_hf_token_secret",
    "HF_TOKEN_PATH": "serving_hf_token_secret",
    "HF_HOME": "base_data_dir (HF_HOME is <base_data_dir>/.cache/huggingface)",
    "TORCHINDUCTOR_CACHE_DIR": "base_data_dir (the cache is <base_data_dir>/.cache/torchinductor)",
    # The API key reaches the engine in a 0600 --config file; vLLM also reads VLLM_API_KEY
    # (vllm/entrypoints/openai/api_server.py), which would set a second key beside it.
    "VLLM_API_KEY": "serving_api_key_secret",
    "SGLANG_API_KEY": "serving_api_key_secret",
    "OPENAI_API_KEY": "serving_api_key_secret",
    # Where SGLang's tenant-keys patch reads the tenants' keys (roles/serving/keys.py).
    "INFERENCE_HOST_TENANT_API_KEYS_FILE": "serving_tenant_api_key_secrets",
    # vLLM takes VLLM_PORT as the first of its internal ports (vllm/envs.py), not the API port.
    "VLLM_PORT": "serving_port (the HTTP port; VLLM_PORT is vLLM's internal one and collides with it)",
    "SGLANG_ENABLE_SPEC_V2": "serving_speculative's spec_v2",
    "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "serving_custom_all_reduce_pcie",
    "SGLANG_CUSTOM_AR_ALLOW_PCIE": "serving_custom_all_reduce_pcie",
    "SGLANG_ENABLE_JIT_DEEPGEMM": "gpu_arch (off on sm120, which has no DeepGEMM kernels)",
    "VLLM_NO_USAGE_STATS": "nothing: the project always sets it (no usage reports)",
    "VLLM_DO_NOT_TRACK": "nothing: the project always sets it (no usage reports)",
    "PYTHONUNBUFFERED": "nothing: the project always sets it (the journal gets each line as written)",
}

# Variables that change what code runs: the dynamic loader's (LD_PRELOAD and LD_AUDIT load a
# library into every process, LD_LIBRARY_PATH and GCONV_PATH pick other libraries, ld.so(8)),
# Python's (PYTHONPATH, PYTHONHOME, PYTHONUSERBASE, PYTHONPLATLIBDIR pick other modules,
# PYTHONSTARTUP and PYTHONBREAKPOINT run or import named code, python(1)), PATH (other
# binaries for the compilers and tools the engine spawns) and the shells' startup files (BASH_ENV,
# ENV). The engine runs exactly the locked environment the deploy built and checked;
# anything else is a new engine environment (a stack), not a variable.
CODE_ENV = (
    "LD_PRELOAD",
    "LD_AUDIT",
    "LD_LIBRARY_PATH",
    "GCONV_PATH",
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONUSERBASE",
    "PYTHONPLATLIBDIR",
    "PYTHONSTARTUP",
    "PYTHONBREAKPOINT",
    "PATH",
    "BASH_ENV",
    "ENV",
)


# Families of names that load code, whatever their exact name: the loaders' *_PRELOAD (LD_PRELOAD,
# and jemalloc's or a sanitizer's), CUDA's CUDA_INJECTION64_PATH (a library the CUDA driver loads
# into every CUDA process: NVIDIA's CUPTI docs) and the like (*INJECTION*), NCCL's *_PLUGIN
# (NCCL_NET_PLUGIN, NCCL_TUNER_PLUGIN, NCCL_PROFILER_PLUGIN: a shared library NCCL dlopens, NCCL's
# environment variable docs) and every PYTHON* variable (python(1): PYTHONWARNINGS imports the
# module a warning category names, PYTHONSTARTUP runs a file, ...). The engine's env file is also
# sourced by the health checks, which run as root: such a name there is code root runs.
# The project itself writes only PYTHONUNBUFFERED, which OWNED_ENV names first.
CODE_ENV_RE = re.compile(r"^(.*_PRELOAD|.*INJECTION.*|.*_PLUGIN|PYTHON.*)$", re.IGNORECASE)


# Variables that mount routes no key guards: vLLM 0.16.0 attaches its development routes
# (/sleep, /wake_up, /collective_rpc, /reset_prefix_cache, /pause, /update_weights, ...) only with
# VLLM_SERVER_DEV_MODE (vllm/entrypoints/serve/*/api_router.py, attach_router), and
# /v1/load_lora_adapter, which loads a file the caller names, only with
# VLLM_ALLOW_RUNTIME_LORA_UPDATING (serve/lora/api_router.py).
ROUTE_ENV = ("VLLM_SERVER_DEV_MODE", "VLLM_ALLOW_RUNTIME_LORA_UPDATING")


def _extra_env(value: dict[str, str]) -> dict[str, str]:
    owned = [f"{name} (set it with {OWNED_ENV[name]})" for name in value if name in OWNED_ENV]
    if owned:
        raise PydanticCustomError(
            "inference_host",
            "{valid}",
            {"valid": "no variable the project already sets from a setting: " + "; ".join(owned)},
        )
    code = [name for name in value if name in CODE_ENV or CODE_ENV_RE.match(name)]
    if code:
        raise PydanticCustomError(
            "inference_host",
            "{valid}",
            {
                "valid": f"no variable that changes what code runs ({', '.join(code)}; nor any *_PRELOAD,"
                " *INJECTION*, *_PLUGIN or PYTHON*): the engine runs the locked environment of its stack;"
                " change the stack instead"
            },
        )
    routes = [name for name in value if name.upper() in ROUTE_ENV]
    if routes:
        raise PydanticCustomError(
            "inference_host",
            "{valid}",
            {
                "valid": f"no variable that mounts the engine's development or adapter routes ({', '.join(routes)}):"
                " they change or load into the running engine, and vLLM asks no key there"
            },
        )
    return value
