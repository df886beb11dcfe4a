"""What an engine environment is made of, for the role that builds it (roles/sglang) and the
one that runs it (roles/serving): its lock, its kernel wheels and its stamp; and how any locked
environment is built (the engine's and the EAGLE-3 training job's): exactly from its lock, into
a new folder renamed into place when complete, byte-compiled, never replacing the live one.

    <base_install_root>/envs/<stack id>-<stamp>/

The stamp hashes everything that shapes an environment: the stack's lock (every package,
version and sha256; roles/site/lock.py), the keys of the kernel wheels built from source
(roles/shared/wheel_plan.py, keyed by the builder's own settings), the sglang patch queue, the
interpreter and the install mode. Any change of these is a new folder, built beside the live
one; nothing else is (a changed index mirror is not: the lock's hashes pin the same files).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from roles.shared.patches import patch_queue
from roles.shared.pip import SYSTEM_CA_BUNDLE
from roles.shared.wheel_plan import planned_builds
from roles.site import PROJECT_ROOT, EngineStack, HostSettings, Site
from roles.site import lock as stack_lock

# roles/sglang applies them; the stamp reads them (a changed patch is a new environment).
SGLANG_PATCHES = PROJECT_ROOT / "roles" / "sglang" / "patches"
# Bump when the install commands change what an environment holds: every host rebuilds.
RECIPE = "lock-sync-1"
STAMP_CHARS = 12
# Written into an environment once its install completed: its folder name (the stamp).
MARKER = ".inference-host-stack"
# The lock an environment was installed from, copied into it.
LOCK_COPY_NAME = "inference-host-lock.txt"


def sglang_patches(version: str):
    return patch_queue(SGLANG_PATCHES, "sglang", version)


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
    if not built or (builder is None and settings.sglang.install_mode != "full"):
        return []
    source = builder or settings
    plans = {w.package: w for w in planned_builds(stack, source.build)}
    return [
        KernelWheel(package, plans[package].version, plans[package].key,
                    builder.name if builder else None,
                    f"{source.build.wheelhouse_dir}/{package}/{plans[package].key}",
                    f"{settings.build.wheelhouse_dir}/{package}/{plans[package].key}")
        for package in built
    ]


# What the no-gpu-deps mode byte-compiles (build_command's compile_only).
NO_GPU_COMPILED = ("sglang",)


def no_gpu_subset(text: str, settings: HostSettings) -> str:
    """The no-gpu-deps mode's part of a lock (roles/site/lock.py says which packages and why),
    entries and hashes unchanged."""
    return stack_lock.select(text, stack_lock.no_gpu_packages(text, settings.sglang.install_leave_out))


def requirements_text(site: Site, settings: HostSettings, stack: EngineStack) -> str:
    """What `uv pip sync` installs: the stack's lock (the lab's mode: its part without a GPU)."""
    text = site.stack.lock_text(stack.id)
    if settings.sglang.install_mode == "no-gpu-deps":
        return no_gpu_subset(text, settings)
    return text


def stamp(site: Site, settings: HostSettings, stack: EngineStack) -> str:
    """The environment's folder name: changes when anything that shapes the env changes."""
    digest = hashlib.sha256()
    for part in (RECIPE, settings.sglang.install_mode, settings.sglang.python or stack.python,
                 requirements_text(site, settings, stack),
                 *(f"{w.package}={w.key}" for w in kernel_wheels(site, settings, stack)),
                 *(p.read_text() for p in sglang_patches(stack.sglang))):
        digest.update(part.encode() + b"\0")
    return f"{stack.id}-{digest.hexdigest()[:STAMP_CHARS]}"


def uv_environment(settings: HostSettings) -> dict[str, str]:
    """uv on the host: the system CA bundle, the site's index mirror for packages and its mirror
    for uv's managed CPython builds (uv's documented UV_* variables)."""
    root = settings.base.install_root
    env = {"SSL_CERT_FILE": SYSTEM_CA_BUNDLE, "UV_NO_PROGRESS": "1",
           "UV_CACHE_DIR": f"{root}/uv-cache", "UV_PYTHON_INSTALL_DIR": f"{root}/python"}
    if settings.base.pypi_index_url:
        env["UV_INDEX_URL"] = settings.base.pypi_index_url
    if settings.sglang.python_install_mirror:
        env["UV_PYTHON_INSTALL_MIRROR"] = settings.sglang.python_install_mirror
    return env


def build_command(target: str, python: str, requirements: str, current: str, *,
                  before: list[str] = (), after_sync: list[str] = (), check: bool = False,
                  compile_only: tuple[str, ...] | None = None) -> str:
    """One guarded shell command that builds <target> exactly from the lock at <requirements>:
    into <target>.building, `uv pip sync --require-hashes` (these packages, nothing else, every
    file checked against the lock's sha256; uv 0.13's sync also removes what the lock lacks),
    byte-compiled at install (`--compile-bytecode`) as root with umask 022 so other users read
    the .pyc and a start compiles nothing, the lock copied in and the marker written last, then
    renamed into place. <current> is the live link: a target it points at is never removed.
    Any failure removes only the .building folder and says the live environment still serves.

    compile_only (the lab's no-gpu-deps mode): byte-compile only these packages' folders, not
    everything installed. The lab runs nothing of its environments but sglang's metadata and
    patched source; compiling the other ~16,000 modules of the subset costs about 20 s of a
    2-core machine per environment, and a CI run builds about eight."""
    name = target.rsplit("/", 1)[1]
    building = f"{target}.building"
    venv_python = f"{building}/bin/python"
    steps = [
        *before,
        f"if [ -e {target} ]; then [ \"$(readlink -f {current})\" != \"$(readlink -f {target})\" ]"
        f" || {{ echo '{target} is live but incomplete; not replaced' >&2; exit 1; }}; rm -rf {target}; fi",
        f"rm -rf {building}",
        f"uv venv --quiet --python {python} {building}",
        f"uv pip sync --quiet --require-hashes{'' if compile_only else ' --compile-bytecode'}"
        f" --python {venv_python} {requirements}",
        *(step.format(python=venv_python) for step in after_sync),
    ]
    if compile_only:
        site = f"$(echo {building}/lib/python3*/site-packages)"
        steps.append(f"{venv_python} -m compileall -q {' '.join(f'{site}/{p}' for p in compile_only)} >/dev/null")
    if check:
        steps.append(f"uv pip check --quiet --python {venv_python}")
    steps += [f"cp {requirements} {building}/{LOCK_COPY_NAME}",
              f"echo '{name}' > {building}/{MARKER}",
              f"mv -T {building} {target}"]
    failed = (f"rm -rf {building}; echo \"FAILED to build {target}; the live environment"
              f" ($(readlink {current} || echo none)) was not touched and still serves\" >&2; exit 1")
    return f"umask 022; ( {' && '.join(steps)} ) || {{ {failed}; }}"
