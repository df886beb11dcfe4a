"""roles/serving: the engine's command line and unit (serving_*), and its speculative drafter."""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from roles.site.fields import (
    DNS_NAME_RE,
    HostFolder,
    IpAddress,
    OptionValue,
    PlaintextReason,
    SecretName,
    Section,
    ServiceUnitName,
    check,
    is_ip,
    one_of,
    positive,
    tcp_port,
)
from roles.site.sections.base import CaFile
from roles.site.sections.serving_env import ENV_NAME_RE, _extra_env

# A tenant's name: smg's tenant id (--tenant-api-key TENANT:KEY, split at the first ':') and a
# JSON key of the engine's tenant-keys file; lower case, no ':' nor white space.
TENANT_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,31}$")


class SpeculativeSettings(BaseModel):
    """serving_speculative: an EAGLE/EAGLE-3 drafter (checked per release by
    roles/serving/speculative.py). draft_config / target_config: copies of the drafter's and the
    target's config.json on the control machine, relative to the inventory file."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    draft_model_path: str = Field(description=("The drafter's directory on the host (--speculative-draft-model-path)."))
    algorithm: Annotated[str, one_of("EAGLE", "EAGLE3")] = Field(
        "EAGLE3", description=("--speculative-algorithm: EAGLE or EAGLE3.")
    )
    num_steps: int = Field(3, description="--speculative-num-steps: draft steps per round.")
    eagle_topk: int = Field(
        1, description=("--speculative-eagle-topk: branches per draft step (vLLM drafts a chain: 1).")
    )
    num_draft_tokens: int = Field(
        4, description=("--speculative-num-draft-tokens; with eagle_topk 1 it must be num_steps + 1.")
    )
    spec_v2: bool = Field(
        False,
        description=(
            "SGLANG_ENABLE_SPEC_V2: keeps the overlap scheduler on with EAGLE (off by default in 0.5.9/0.5.10)."
        ),
    )
    draft_config: str | None = Field(
        None, description=("Copy of the drafter's config.json on the control machine, relative to the inventory file.")
    )
    target_config: str | None = Field(
        None, description=("Copy of the target's config.json on the control machine, relative to the inventory file.")
    )


class ServingSettings(Section):
    """roles/serving: the SGLang server's command line and unit."""

    PREFIX: ClassVar[str] = "serving_"

    @property
    def tls_enabled(self) -> bool:
        """Whether the engine serves TLS: serving_tls_cert_secret and serving_tls_key_secret both set."""
        return bool(self.tls_cert_secret and self.tls_key_secret)

    @property
    def plaintext_reason(self) -> str | None:
        """serving_plaintext_acknowledged where the engine serves plain HTTP (no TLS), else None."""
        return None if self.tls_enabled else self.plaintext_acknowledged

    unit_name: ServiceUnitName = Field(
        "inference-engine",
        description=("Name of the engine's systemd unit (<name>.service) and of its env and secret-argument files."),
    )
    model_path: HostFolder = Field(
        "/models/Kimi-K2.5",
        description=(
            "The model directory the engine loads (--model-path); also where roles/weights puts the weights by default."
        ),
    )
    served_model_name: OptionValue = Field(
        "kimi-k2.5", description=("The model name clients ask for (--served-model-name).")
    )
    host: IpAddress = Field(
        "127.0.0.1",
        description=(
            "Address the engine binds (--host); a wildcard bind is probed on loopback. Behind a "
            "gateway it may not be loopback."
        ),
    )
    port: Annotated[int, tcp_port] = Field(30000, description="The engine's HTTP port (--port).")
    trust_remote_code: bool = Field(
        True,
        description=(
            "--trust-remote-code: Kimi-K2.5's tokenizer is Python code in the model folder "
            "(tokenization_kimi.py, named by tokenizer_config.json's auto_map); it runs as the service"
            " user inside the sandbox. False for a model without custom code."
        ),
    )
    attention_backend: Annotated[str, one_of("triton", "flashinfer", "fa3", "flashmla", "trtllm_mla")] | None = Field(
        None,
        description=("SGLang's --attention-backend; None: the pinned release's safe default for the GPU architecture."),
    )
    mem_fraction_static: Annotated[float, check(lambda v: 0.1 <= v <= 0.99, "a fraction from 0.1 to 0.99")] = Field(
        0.8,
        description=(
            "SGLang's --mem-fraction-static: the share of each GPU's memory for weights and KV cache. At most"
            " what leaves the pinned release's own reserve for activations and CUDA graphs (refused above it,"
            " docs/serving-memory.md); 0.8 leaves it for every pinned release on a 96 GB card, with or"
            " without a drafter."
        ),
    )
    model_config_json: str | None = Field(
        None,
        description=(
            "Copy of the served model's config.json on the control machine, relative to the inventory file:"
            " the KV cache the pinned SGLang release will size and its own mem_fraction_static for the card"
            " are computed from it before any host is touched (docs/serving-memory.md). None:"
            " serving_speculative's target_config, else no KV estimate (the reserve check then assumes an"
            " MLA model's prefill graphs, the larger)."
        ),
    )
    cuda_graph_max_bs: Annotated[int, positive] | None = Field(
        None,
        description=(
            "Largest batch captured in CUDA graphs (--cuda-graph-max-bs, spelled per release); None: SGLang's default."
        ),
    )
    max_running_requests: Annotated[int, positive] | None = Field(
        None,
        description=(
            "--max-running-requests (vLLM: --max-num-seqs); None: the engine's default (with a drafter"
            " SGLang caps it at 48, rendered explicitly)."
        ),
    )
    context_length: Annotated[int, positive] | None = Field(
        None,
        description=(
            "--context-length; None: the model's (262144 for Kimi-K2.5). With a drafter, context_length x"
            " max_running_requests must fit the KV cache estimated from the models' config.json"
            " (docs/serving-memory.md)."
        ),
    )
    chunked_prefill_size: Annotated[int, positive] | None = Field(
        None, description=("--chunked-prefill-size; None: SGLang's default.")
    )
    watchdog_timeout: Annotated[int, positive] = Field(
        600,
        description=(
            "--watchdog-timeout in seconds: a forward batch running longer crashes the server, so a hang ends."
        ),
    )
    drain_timeout_s: Annotated[int, check(lambda v: 1 <= v <= 3600, "1 to 3600 seconds")] = Field(
        300,
        description=(
            "Behind a gateway, a rolling switch takes the replica out, then waits up to this long until"
            " nothing is in flight to it (smg's count and the engine's running and waiting gauges) before"
            " restarting it; smg's drain settle time is the same."
        ),
    )
    enable_metrics: bool = Field(
        True, description=("--enable-metrics: Prometheus /metrics, read by the server health suite and the benchmark.")
    )
    api_key_secret: SecretName | None = Field(
        None,
        description=(
            "Vault key (named *api_key) of the engine's client key, --api-key: the data plane only; it"
            " reaches the engine in a 0600 --config file, never a command line. Shared by every replica"
            " behind a gateway, which sends it to them (docs/security.md#keys-and-their-roles)."
        ),
    )
    admin_api_key_secret: SecretName | None = Field(
        None,
        description=(
            "Vault key (named *api_key) of SGLang's --admin-api-key: the admin routes (/flush_cache,"
            " /update_weights_from_disk, /pause_generation, ...) take it and no longer the client key;"
            " required on SGLang with serving_api_key_secret; vLLM 0.16.0 has no such option."
        ),
    )
    tenant_api_key_secrets: Annotated[
        dict[str, SecretName],
        check(
            lambda v: all(TENANT_NAME_RE.match(k) for k in v),
            "{tenant: vault key} with tenant names of 1 to 32 characters: a-z, 0-9 and '-', not first",
        ),
    ] = Field(
        {},
        description=(
            "Client keys per tenant: {tenant: vault key (named *api_key)}, each opening the data plane as"
            " serving_api_key_secret does (SGLang: a patch reads them from a 0600 file; vLLM: more --api-key"
            " values; smg: --tenant-api-key). Add a tenant's new key before removing the old one: the overlap a"
            " rotation needs. The same on every replica behind a gateway (docs/security.md#keys-and-their-roles)."
        ),
    )
    plaintext_acknowledged: PlaintextReason | None = Field(
        None,
        description=(
            "Why the engine may serve plain HTTP beyond loopback here (the bearer key and the prompts"
            " cross the network in clear): required when serving_host is not a loopback address;"
            " docs/security.md#tls. None: serving_host must be loopback."
        ),
    )
    tls_cert_secret: SecretName | None = Field(
        None,
        description=(
            "Vault key of the engine's TLS certificate (PEM, the chain from the server's own): with"
            " serving_tls_key_secret the engine serves HTTPS (--ssl-certfile; SGLang 0.5.10+, vLLM), and"
            " serving_host may leave loopback without serving_plaintext_acknowledged (docs/security.md#tls)."
        ),
    )
    tls_key_secret: SecretName | None = Field(
        None,
        description=(
            "Vault key of the private key of serving_tls_cert_secret (PEM, unencrypted), --ssl-keyfile: a"
            " 0600 file of the service user, never on a command line."
        ),
    )
    tls_ca_file: CaFile | None = Field(
        None,
        description=(
            "Local PEM file of the CA that signed serving_tls_cert_secret, uploaded 0644 beside it: the"
            " checks and the benchmark verify the engine's certificate with it. None: the host's CA bundle."
        ),
    )
    hf_token_secret: SecretName | None = Field(
        None,
        description=(
            "Vault key of the Hugging Face token (gated or private repositories), installed as a 0600 "
            "file where the weights are downloaded."
        ),
    )
    speculative: dict[str, Any] | None = Field(
        None,
        description=(
            "An EAGLE/EAGLE-3 drafter: {draft_model_path, algorithm, num_steps, eagle_topk, "
            "num_draft_tokens, spec_v2, draft_config, target_config}; checked per release "
            "(docs/speculative-decoding.md)."
        ),
    )
    topology: Annotated[str, one_of("replicas", "tensor_parallel")] = Field(
        "replicas",
        description=(
            "What several gpu nodes are: 'replicas' (each serves a whole copy, behind the gateways "
            "when there are any) or 'tensor_parallel' (all form one server, ranks in inventory order, "
            "rank 0 serves the API)."
        ),
    )
    dist_init_host: (
        Annotated[str, check(lambda v: is_ip(v) or DNS_NAME_RE.match(v) is not None, "a DNS name or an IP address")]
        | None
    ) = Field(
        None,
        description=(
            "tensor_parallel: where the other ranks reach rank 0's torch.distributed store "
            "(--dist-init-addr); None: rank 0's ssh_hostname, else its inventory name."
        ),
    )
    dist_init_port: Annotated[int, tcp_port] = Field(50000, description=("tensor_parallel: port of --dist-init-addr."))
    launch_command: list[str] | None = Field(
        None,
        description=(
            "The engine's launcher instead of <env>/bin/python -m sglang.launch_server; only the lab "
            "sets it (the stand-in server). Leave unset in production."
        ),
    )
    ready_timeout: Annotated[int, check(lambda v: 5 <= v <= 1190, "5 to 1190 seconds")] = Field(
        1100,
        description=(
            "Seconds the readiness wait (/health_generate, vLLM /health) allows after a start; below "
            "the unit's TimeoutStartSec of 1200 s."
        ),
    )
    extra_env: Annotated[
        dict[str, str],
        check(
            lambda v: all(ENV_NAME_RE.match(k) for k in v),
            "{NAME: value} with environment variable names ([A-Za-z_][A-Za-z0-9_]*)",
        ),
        AfterValidator(_extra_env),
    ] = Field(
        {},
        description=(
            "More variables for the engine's EnvironmentFile (0640, the checks' group's), one NAME=value line each: a"
            " name is an environment variable name (a space or '=' in it would write another one)."
            " Refused: a variable a setting already sets (NCCL_P2P_LEVEL: nccl_p2p_level, HF_TOKEN,"
            " HF_HOME, the API key, ...), one that changes what code runs (LD_PRELOAD, LD_LIBRARY_PATH,"
            " PYTHONPATH, PATH, ...), and a secret (a value like hf_... or sk-..., a name like *_TOKEN or"
            " *_KEY): secrets go in the vault."
        ),
    )
    custom_all_reduce_pcie: bool = Field(
        False,
        description=(
            "All-reduce over PCIe P2P instead of NCCL, per release: sglang 0.5.21+ upstream's "
            "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE, 0.5.9 patch 0001. Check the sum (health suite) and "
            "measure (benchmark) first."
        ),
    )
