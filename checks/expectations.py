"""What a healthy host looks like, from the site model, with overrides for a machine that is
in no inventory (a validation machine such as the 1 × H200 of tests/unit/data/gpu, a new box
before it is described).

    Expectations.from_site(load_site("inventory/prod.py"), "gpu-lxc.example.internal")
    Expectations.from_overrides(["gpu_count=1", "gpu_arch=sm90", "driver_version=580.159.04"])

Override keys are the inventory's own keys (gpu_count, gpu_arch, serving_port, health_...,
validated by the site model exactly as in an inventory) plus the pins that live in the stack
file: driver_version, engine_python. Bad keys or values stop the run with the site model's
message before any host is contacted.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path

from checks import gpu_models
from roles import site as site_model
from roles.shared import layout, nccl

PROJECT_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_STACK_FILE = PROJECT_ROOT / "inventory" / "stack.yml"

# The API key lives on the host in roles/serving's 0600 SGLang --config file; the server checks
# read it there, so the key never travels to the controller or onto a command line.

# Keys that are not host settings: pins of the stack file and where the checks find things.
EXTRA_KEYS = {
    "driver_version": "the exact NVIDIA driver version (default: inventory/stack.yml)",
    "api_key_file": 'the 0600 file holding the client key as {"api-key": KEY} (the periodic checks: their own copy)'
    f" (default: roles/serving's {layout.secret_args_link('<unit>')})",
    "engine": "the engine serving: sglang or vllm (default: the active stack's)",
    "tls_ca_file": "the host's CA file the engine's certificate is verified with, with serving_tls_*"
    f" (default: roles/serving's {layout.tls_files('<unit>')['ca']} with serving_tls_ca_file, else"
    f" {layout.SYSTEM_CA_BUNDLE})",
    "tls_server_name": "the name the engine's certificate covers, with serving_tls_* (default: the"
    " node's ssh_hostname, else its inventory name)",
}
ENGINES = ("sglang", "vllm")


def tls_ca_file(host: site_model.HostSettings) -> str:
    """Where on the host the CA the engine's certificate is verified with lives (roles/serving)."""
    return layout.tls_files(host.serving.unit_name)["ca"] if host.serving.tls_ca_file else layout.SYSTEM_CA_BUNDLE


@dataclass(frozen=True)
class Expectations:
    host_name: str
    gpu_count: int
    gpu_model: str
    compute_capability: str
    gpu_memory_gib: int
    driver_version: str
    engine_python: str
    unit_name: str
    service_user: str
    serving_host: str
    serving_port: int
    served_model_name: str
    api_key_configured: bool
    api_key_file: str
    enable_metrics: bool
    nccl_env: dict[str, str]
    allreduce_timeout_s: int
    allreduce_min_busbw_gbps: float
    allreduce_floor_source: str
    allreduce_size_mib: int
    gpu_link: str
    gpu_link_source: str
    min_temp_margin_c: int
    power_limit_w: float | None
    mig_enabled: bool
    min_memory_bandwidth_gbps: float | None
    memory_bandwidth_source: str
    needs_resizable_bar: bool
    env_file: str  # the unit's EnvironmentFile (roles/serving)
    launcher: str
    dcgm: bool
    server_timeout_s: int
    max_unit_restarts: int
    engine: str = "sglang"
    # vLLM's CPU build (vllm_install_mode = "cpu", the lab): one shard on the host's CPUs, whatever
    # GPUs nvidia-smi lists (roles/serving/command.py vllm_tensor_parallel_size).
    engine_on_cpu: bool = False
    source: str = field(default="", compare=False)  # where these came from, for messages
    # serving_topology = "tensor_parallel": this node's rank in the group (inventory order).
    # Rank >= 1 serves no API, only sglang's dummy health server (roles/serving, readiness_path).
    node_rank: int = 0
    # serving_tls_*: the engine serves HTTPS; the checks ask https://<tls_server_name> (the name its
    # certificate covers), connecting to the engine's own address, and verify with tls_ca_file.
    serving_tls: bool = False
    tls_server_name: str = ""
    tls_ca_file: str = layout.SYSTEM_CA_BUNDLE
    # Speculative decoding (checks/test_speculative.py)
    speculative: bool = False
    speculative_num_steps: int = 0
    min_accept_length: float = 0.0

    @property
    def metrics_exported(self) -> bool:
        """vLLM always serves /metrics; SGLang only with --enable-metrics."""
        return self.engine == "vllm" or self.enable_metrics

    @classmethod
    def from_host(
        cls,
        host: site_model.HostSettings,
        driver_version: str,
        source: str,
        extra: dict | None = None,
        engine: str = "sglang",
    ) -> Expectations:
        extra = extra or {}
        engine = extra.get("engine", engine)
        if engine not in ENGINES:
            raise site_model.SiteError([f"--expect engine={engine} is invalid; expected one of {', '.join(ENGINES)}"])
        link, link_source = gpu_models.expected_link(host.gpu.model, host.health.gpu_link)
        floor, floor_source = gpu_models.allreduce_floor(link, host.health.allreduce_min_busbw_gbps)
        membw, membw_source = gpu_models.memory_bandwidth_floor(host.gpu.model, host.health.min_memory_bandwidth_gbps)
        model = gpu_models.model(host.gpu.model)
        serving = layout.serving_files(host.base.install_root, host.serving.unit_name)
        return cls(
            host_name=host.name,
            gpu_count=host.gpu.count,
            gpu_model=host.gpu.model,
            compute_capability=host.gpu.compute_capability,
            gpu_memory_gib=host.gpu.memory_gib,
            driver_version=extra.get("driver_version", driver_version),
            engine_python=host.health.engine_python or f"{layout.current_link(host.base.install_root)}/bin/python",
            unit_name=host.serving.unit_name,
            service_user=host.base.service_user,
            serving_host=host.serving.host,
            serving_port=host.serving.port,
            served_model_name=host.serving.served_model_name,
            api_key_configured=host.serving.api_key_secret is not None,
            api_key_file=extra.get("api_key_file", layout.secret_args_link(host.serving.unit_name)),
            enable_metrics=host.serving.enable_metrics,
            # The dict roles/serving renders into the env file: the all-reduce check's fallback.
            nccl_env=nccl.environment(host.nccl),
            allreduce_timeout_s=host.health.allreduce_timeout_s,
            allreduce_min_busbw_gbps=floor,
            allreduce_floor_source=floor_source,
            gpu_link=link,
            gpu_link_source=link_source,
            min_temp_margin_c=host.health.min_temp_margin_c,
            power_limit_w=host.health.power_limit_w,
            mig_enabled=host.health.mig_enabled,
            min_memory_bandwidth_gbps=membw,
            memory_bandwidth_source=membw_source,
            needs_resizable_bar=bool(model and model.needs_resizable_bar),
            # The active release's own files, through `current` (roles/shared/layout). The
            # launcher holds the exact command line: the checks read --tp-size and
            # --disable-custom-all-reduce there.
            env_file=serving["env_file"],
            launcher=serving["launcher"],
            dcgm=host.nvidia_driver.dcgm,
            allreduce_size_mib=host.health.allreduce_size_mib,
            server_timeout_s=host.health.server_timeout_s,
            max_unit_restarts=host.health.max_unit_restarts,
            engine=engine,
            engine_on_cpu=engine == "vllm" and host.vllm.install_mode == "cpu",
            source=source,
            serving_tls=host.serving.tls_enabled,
            tls_server_name=extra.get("tls_server_name", site_model.address_of(host)),
            tls_ca_file=extra.get("tls_ca_file", tls_ca_file(host)),
            speculative=host.speculative is not None,
            speculative_num_steps=host.speculative.num_steps if host.speculative else 0,
            min_accept_length=host.health.min_accept_length,
        )

    @classmethod
    def from_site(cls, site: site_model.Site, host_name: str, overrides: list[str] | None = None) -> Expectations:
        if host_name not in site.hosts:
            raise site_model.SiteError(
                [f"{site.inventory_file}: no host {host_name!r}; expected one of: " + ", ".join(site.hosts)]
            )
        host = site.hosts[host_name]
        data, extra = _split_overrides(overrides or [])
        if data:
            host = _rebuild_host(host, data, f"--expect for {host_name}")
        source = site.inventory_file + (" with --expect " + " ".join(overrides) if overrides else "")
        expect = cls.from_host(host, site.stack.driver_version, source, extra, site.stack.active.engine)
        nodes = [h.name for h in site.group("gpu_nodes")]
        if host.serving.topology == "tensor_parallel" and host_name in nodes:
            expect = dataclasses.replace(expect, node_rank=nodes.index(host_name))
        return expect

    @classmethod
    def from_overrides(
        cls, overrides: list[str], host_name: str = "local", stack_file: Path = DEFAULT_STACK_FILE
    ) -> Expectations:
        """For a machine in no inventory: the defaults of a gpu node, then the overrides."""
        data, extra = _split_overrides(overrides)
        problems: list[str] = []
        host = site_model.build_host(host_name, ("gpu_nodes",), data, "--expect", problems)
        if problems:
            raise site_model.SiteError(problems)
        stack = site_model.load_stack(stack_file)
        driver = extra.get("driver_version") or stack.driver_version
        return cls.from_host(host, driver, "--expect " + " ".join(overrides), extra, stack.active.engine)


def _split_overrides(overrides: list[str]) -> tuple[dict, dict]:
    import yaml

    data, extra, problems = {}, {}, []
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            problems.append(f"--expect {item!r} is invalid; expected KEY=VALUE, e.g. gpu_count=8")
            continue
        value = yaml.safe_load(raw) if raw else raw  # 8 -> int, [a, b] -> list, like the inventory
        if isinstance(value, bool) and raw.lower() not in ("true", "false"):
            value = raw  # YAML 1.1 reads off/on/yes/no as booleans: nccl_p2p_level=off is a word
        if key in EXTRA_KEYS:
            if key == "driver_version" and not re.match(r"^\d+\.\d+(\.\d+)?$", raw):
                problems.append(
                    f"--expect driver_version={raw!r} is invalid; expected a driver version like 580.159.04"
                )
            elif not raw:
                problems.append(f"--expect {key}= is empty; expected {EXTRA_KEYS[key]}")
            extra[key] = str(raw)
        else:
            data[key] = value
    count = data.get("gpu_count")
    if "gpu_count" in data and not (isinstance(count, int) and not isinstance(count, bool) and count >= 1):
        problems.append(f"--expect gpu_count={count!r} is invalid; a gpu node needs an integer >= 1")
    if problems:
        raise site_model.SiteError(problems)
    return data, extra


def _rebuild_host(host: site_model.HostSettings, data: dict, where: str) -> site_model.HostSettings:
    """The inventory's host with some keys replaced, validated like the inventory itself."""
    current = {}
    for section in site_model.SECTIONS:
        values = getattr(host, section.PREFIX.rstrip("_"))  # HostSettings names it by its prefix
        for name in section.model_fields:
            current[section.PREFIX + name] = getattr(values, name)
    problems: list[str] = []
    rebuilt = site_model.build_host(host.name, host.groups, {**current, **data}, where, problems)
    if problems:
        raise site_model.SiteError(problems)
    return rebuilt
