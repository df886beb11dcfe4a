"""The stack file: every version pin in one place (inventory/stack.yml), loaded and checked."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from roles.site import lock
from roles.site.errors import SiteError, display, shown, unknown_keys

VERSION_RE = re.compile(r"^\d+(\.\d+){0,3}((a|b|rc)\d+)?(\.post\d+)?$")
DRIVER_VERSION_RE = re.compile(r"^\d{3}\.\d{2,3}(\.\d{2,3})?$")
STACK_ID_RE = re.compile(r"^[a-z0-9][a-z0-9.+_-]{0,62}$")
OVERRIDE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*==[0-9][A-Za-z0-9.+!_-]*$")


@dataclass(frozen=True)
class KernelPackage:
    package: str
    version: str
    source: Literal["prebuilt", "build"] = "prebuilt"


ENGINES = ("sglang", "vllm")


@dataclass(frozen=True)
class EngineStack:
    """One consistent engine stack; an upgrade points `active` at another one. `engine` says
    which server it runs: an SGLang stack pins sglang and its kernel package, a vLLM stack
    pins vllm (whose wheel carries its own kernels)."""

    id: str
    cuda: str
    python: str
    torch: str
    sglang: str | None
    kernel: KernelPackage | None
    flashinfer: str
    flash_attn: str | None = None
    flash_attn_source: Literal["build", "prebuilt", "none"] = "build"
    engine: Literal["sglang", "vllm"] = "sglang"
    vllm: str | None = None
    # Requirements that replace what the resolved packages pin (uv pip compile --overrides),
    # each with the reason the stack file gives: ((requirement, why), ...).
    overrides: tuple[tuple[str, str], ...] = ()

    @property
    def override_requirements(self) -> list[str]:
        return [requirement for requirement, _ in self.overrides]

    @property
    def cuda_major(self) -> int:
        return int(self.cuda.split(".")[0])

    @property
    def version(self) -> str:
        """The pinned release of the stack's engine (sglang or vllm)."""
        return self.vllm if self.engine == "vllm" else self.sglang

    @property
    def label(self) -> str:
        """`sglang 0.5.9`, `vllm 0.16.0`: the engine and its release, for messages."""
        return f"{self.engine} {self.version}"


# Distributions the monitoring packages are pinned for (the lab is Debian 12, the guests Ubuntu
# 24.04; the key is the ID and VERSION_ID of /etc/os-release, without the dot).
MONITORING_DISTROS = ("debian12", "ubuntu2404")
MONITORING_PACKAGES = ("prometheus", "prometheus-alertmanager", "prometheus-node-exporter")
# An exact apt version: [epoch:]upstream[-revision] (deb-version(7)).
APT_VERSION_RE = re.compile(r"^(\d+:)?[0-9][A-Za-z0-9.+~-]*$")


@dataclass(frozen=True)
class MonitoringPins:
    """roles/monitoring's package versions: the distribution's Prometheus packages per
    distribution (their versions differ), NVIDIA's DCGM exporter (one repository version)."""

    distro_packages: dict[str, dict[str, str]]
    dcgm_exporter: str

    def for_distro(self, distro: str) -> dict[str, str]:
        return self.distro_packages[distro]


@dataclass(frozen=True)
class Stack:
    file: str
    uv: str
    driver_branch: str
    driver_version: str
    active: EngineStack
    stacks: dict[str, EngineStack]
    # Absolute path of the stack file: its stacks' locks live beside it (roles/site/lock.py).
    path: str = ""
    # None: the stack file pins no monitoring packages (required with a monitors group).
    monitoring: MonitoringPins | None = None

    def lock_text(self, stack_id: str) -> str:
        return lock.unsealed(lock.lock_path(Path(self.path), stack_id).read_text())


STACK_FIELDS = {"uv", "nvidia_driver", "active", "stacks", "monitoring"}
DRIVER_FIELDS = {"branch", "version"}
ENGINE_FIELDS = {
    "engine", "cuda", "python", "torch", "sglang", "vllm", "kernel", "flashinfer", "flash_attn",
    "flash_attn_source", "overrides",
}
# Pins that belong to one engine only: a vLLM stack naming sglang's kernel is a mistake.
ENGINE_ONLY_FIELDS = {"sglang": {"vllm"}, "vllm": {"sglang", "kernel", "flash_attn"}}
KERNEL_FIELDS = {"package", "version", "source"}


def load_stack(path: Path) -> Stack:
    problems: list[str] = []
    where = display(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise SiteError([f"{where}: file not found; every inventory needs a stack file"]) from None
    except yaml.YAMLError as error:
        raise SiteError([f"{where}: not valid YAML: {error}"]) from None
    if not isinstance(raw, dict):
        raise SiteError([f"{where}: expected a mapping of uv, nvidia_driver, active, stacks"])

    def bad(field_name: str, value: Any, valid: str) -> None:
        problems.append(f"{where}: {field_name} = {shown(value)} is invalid; expected {valid}")

    def version(field_name: str, value: Any, pattern=VERSION_RE, valid="a version like 2.9.1"):
        if not isinstance(value, str) or not pattern.match(value):
            bad(field_name, value, f"{valid} (quoted string)")
            return "0"
        return value

    unknown_keys(raw, STACK_FIELDS, "", where, problems)
    uv = version("uv", raw.get("uv"))
    driver = raw.get("nvidia_driver") or {}
    if not isinstance(driver, dict):
        bad("nvidia_driver", driver, "a mapping with branch and version")
        driver = {}
    unknown_keys(driver, DRIVER_FIELDS, "nvidia_driver.", where, problems)
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
        unknown_keys(pins, ENGINE_FIELDS, prefix + ".", where, problems)
        engine = pins.get("engine", "sglang")
        if engine not in ENGINES:
            bad(prefix + ".engine", engine, "'sglang' or 'vllm'")
            continue
        for other in sorted(ENGINE_ONLY_FIELDS[engine] & set(pins)):
            bad(f"{prefix}.{other}", pins[other], f"no {other} pin in a stack of engine {engine}")
        kernel = None
        if engine == "sglang":
            raw_kernel = pins.get("kernel")
            if not isinstance(raw_kernel, dict):
                bad(prefix + ".kernel", raw_kernel, "a mapping with package, version, source")
                raw_kernel = {}
            unknown_keys(raw_kernel, KERNEL_FIELDS, prefix + ".kernel.", where, problems)
            if raw_kernel.get("package") not in ("sgl-kernel", "sglang-kernel"):
                bad(prefix + ".kernel.package", raw_kernel.get("package"), "'sgl-kernel' or 'sglang-kernel'")
            if raw_kernel.get("source", "prebuilt") not in ("prebuilt", "build"):
                bad(prefix + ".kernel.source", raw_kernel.get("source"), "'prebuilt' or 'build'")
            kernel = KernelPackage(
                package=str(raw_kernel.get("package")),
                version=version(prefix + ".kernel.version", raw_kernel.get("version")),
                source=raw_kernel.get("source", "prebuilt"),
            )
        flash_attn = pins.get("flash_attn") if engine == "sglang" else None
        if flash_attn is not None:
            version(prefix + ".flash_attn", flash_attn)
        # vLLM's wheel carries its own flash-attention build (vllm/vllm_flash_attn).
        default_source = "build" if engine == "sglang" else "none"
        flash_attn_source = pins.get("flash_attn_source", default_source)
        if flash_attn_source not in ("build", "prebuilt", "none"):
            bad(prefix + ".flash_attn_source", flash_attn_source, "'build', 'prebuilt' or 'none'")
        elif engine == "vllm" and flash_attn_source != "none":
            bad(prefix + ".flash_attn_source", flash_attn_source, "'none' in a vllm stack")
        overrides = _overrides(pins.get("overrides", {}), prefix + ".overrides", bad)
        stacks[stack_id] = EngineStack(
            id=stack_id,
            overrides=overrides,
            engine=engine,
            cuda=version(prefix + ".cuda", pins.get("cuda"), re.compile(r"^\d+\.\d+$"),
                         "a CUDA major.minor like 12.8"),
            python=version(prefix + ".python", pins.get("python"), re.compile(r"^3\.\d+$"),
                           "a Python minor version like 3.12"),
            torch=version(prefix + ".torch", pins.get("torch")),
            sglang=version(prefix + ".sglang", pins.get("sglang")) if engine == "sglang" else None,
            vllm=version(prefix + ".vllm", pins.get("vllm"), valid="a vllm release like 0.16.0")
            if engine == "vllm" else None,
            kernel=kernel,
            flashinfer=version(prefix + ".flashinfer", pins.get("flashinfer")),
            flash_attn=flash_attn,
            flash_attn_source=flash_attn_source,
        )
    monitoring = _monitoring_pins(raw.get("monitoring"), where, problems, bad) if "monitoring" in raw else None
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
        path=str(path.resolve()),
        monitoring=monitoring,
    )


def _monitoring_pins(raw: Any, where: str, problems: list[str], bad) -> MonitoringPins | None:
    valid = ("a mapping of " + ", ".join(MONITORING_DISTROS) + " (each: "
             + ", ".join(MONITORING_PACKAGES) + " -> exact apt version) and dcgm_exporter")
    if not isinstance(raw, dict):
        bad("monitoring", raw, valid)
        return None
    unknown_keys(raw, set(MONITORING_DISTROS) | {"dcgm_exporter"}, "monitoring.", where, problems)
    distros: dict[str, dict[str, str]] = {}
    for distro in MONITORING_DISTROS:
        pins = raw.get(distro)
        if not isinstance(pins, dict):
            bad(f"monitoring.{distro}", pins, "a mapping of " + ", ".join(MONITORING_PACKAGES) + " -> version")
            continue
        unknown_keys(pins, set(MONITORING_PACKAGES), f"monitoring.{distro}.", where, problems)
        for package in MONITORING_PACKAGES:
            value = pins.get(package)
            if not isinstance(value, str) or not APT_VERSION_RE.match(value):
                bad(f"monitoring.{distro}.{package}", value, "an exact apt version like 2.42.0+ds-5+deb12u1"
                    " (quoted string; `apt-cache policy " + package + "` shows it)")
        distros[distro] = {package: str(pins.get(package)) for package in MONITORING_PACKAGES}
    dcgm = raw.get("dcgm_exporter")
    if not isinstance(dcgm, str) or not APT_VERSION_RE.match(dcgm):
        bad("monitoring.dcgm_exporter", dcgm, "the exact apt version of NVIDIA's datacenter-gpu-manager-exporter"
            " like 4.8.2-1 (quoted string)")
    return MonitoringPins(distro_packages=distros, dcgm_exporter=str(dcgm))


def _overrides(raw: Any, where: str, bad) -> tuple[tuple[str, str], ...]:
    """`overrides:` maps an exact requirement (name==version) to why it replaces the pin the
    resolved packages carry; the reason is required, and travels into the lock's header."""
    if not isinstance(raw, dict):
        bad(where, raw, "a mapping of 'package==version' to the reason for the override")
        return ()
    found = []
    for requirement, why in raw.items():
        if not isinstance(requirement, str) or not OVERRIDE_RE.match(requirement):
            bad(f"{where}.{requirement}", requirement, "an exact requirement like nvidia-cudnn-cu12==9.16.0.29")
        elif not isinstance(why, str) or not why.strip():
            bad(f"{where}.{requirement}", why, "the reason for the override (a non-empty string)")
        else:
            found.append((requirement, " ".join(why.split())))
    return tuple(sorted(found))
