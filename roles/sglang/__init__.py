"""roles/sglang: one uv environment per engine stack, patched, beside the previous ones.

    <base_install_root>/envs/<stack id>/        the environment of one stack (kept on upgrade)
    <base_install_root>/current -> envs/<id>    switched by roles/serving after the new
                                                environment is built and patched

Kernel wheels come from the local wheelhouse (<build_wheelhouse_dir>/<package>/<key>/) when the
builders made them, else from PyPI. With sglang_install_mode = "no-gpu-deps" (lab only) the
real sglang wheel of the pinned version is installed with --no-deps: nothing else.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import files, server

from roles.sglang.facts import SglangEnvironmentStamp, UnappliedPatches
from roles.shared.layout import env_dir
from roles.shared.patches import patch_queue
from roles.shared.pip import SYSTEM_CA_BUNDLE
from roles.site import EngineStack, HostSettings, current_host, current_site

PATCH_ROOT = Path(__file__).resolve().parent / "patches"
PATCH_DIR_NAME = "inference-host-patches"


def patches_for(version: str) -> list[Path]:
    return patch_queue(PATCH_ROOT, "sglang", version)


def install_requirements(settings: HostSettings, stack: EngineStack) -> list[str]:
    if settings.sglang.install_mode == "no-gpu-deps":
        return [f"sglang=={stack.sglang}"]
    pins = [
        f"sglang=={stack.sglang}",
        f"torch=={stack.torch}",
        f"{stack.kernel.package}=={stack.kernel.version}",
        f"flashinfer-python=={stack.flashinfer}",
    ]
    if stack.flash_attn and stack.flash_attn_source != "none":
        pins.append(f"flash-attn=={stack.flash_attn}")
    return pins


def stamp(settings: HostSettings, stack: EngineStack) -> str:
    """What a finished install records: changes when anything that shapes the env changes."""
    key = "\n".join([settings.sglang.install_mode, settings.sglang.python or stack.python,
                     *install_requirements(settings, stack)])
    return f"{stack.id} {hashlib.sha256(key.encode()).hexdigest()[:16]}"


@deploy("SGLang")
def sglang(wheelhouses: list[str] | tuple[str, ...] = ()) -> None:
    """wheelhouses: the wheelhouse folders of this stack's source-built kernel wheels (from
    roles/wheels, handed over by deploy.py); used when present on the host, else PyPI's."""
    settings = current_host()
    stack = current_site().stack.active
    target = env_dir(settings, stack)
    files.directory(name=f"Create {settings.base.install_root}/envs",
                    path=f"{settings.base.install_root}/envs", user="root", group="root", mode="0755")
    built = _environment(settings, stack, target, wheelhouses)
    _patches(stack, target, built)


def _environment(settings: HostSettings, stack: EngineStack, target: str, wheelhouses):
    expected = stamp(settings, stack)
    built = host.get_fact(SglangEnvironmentStamp, env_dir=target)
    python = settings.sglang.python or stack.python
    env = {"SSL_CERT_FILE": SYSTEM_CA_BUNDLE, "UV_NO_PROGRESS": "1",
           "UV_CACHE_DIR": f"{settings.base.install_root}/uv-cache",
           "UV_PYTHON_INSTALL_DIR": f"{settings.base.install_root}/python"}
    if settings.base.pypi_index_url:
        env["UV_INDEX_URL"] = settings.base.pypi_index_url
    requirements = " ".join(f"'{r}'" for r in install_requirements(settings, stack))
    no_deps = " --no-deps" if settings.sglang.install_mode == "no-gpu-deps" else ""
    # Wheelhouse folders that exist are searched before PyPI (locally built SM120 kernels).
    find_links = "".join(
        f' $([ -d {path} ] && echo "--find-links {path}")' for path in wheelhouses
    )
    # Built in a temporary folder and moved into place: a failed install never leaves a
    # half environment behind under the stack's name.
    building = f"{target}.building"
    return server.shell(
        name=f"Build the uv environment of stack {stack.id} (sglang {stack.sglang},"
             f" {settings.sglang.install_mode}) at {target}",
        commands=[
            f"rm -rf {building} {target}"
            f" && uv venv --quiet --python {python} {building}"
            f" && uv pip install --quiet --python {building}/bin/python{no_deps}{find_links} {requirements}"
            f" && echo '{expected}' > {building}/.inference-host-stack"
            f" && mv -T {building} {target}"
            f" || {{ rm -rf {building}; exit 1; }}"
        ],
        _env=env,
        _if=lambda: built != expected,
    )


def _patches(stack: EngineStack, target: str, built) -> None:
    patch_dir = f"{target}/{PATCH_DIR_NAME}"
    files.directory(name=f"Create {patch_dir}", path=patch_dir, user="root", group="root", mode="0755")
    patches = patches_for(stack.sglang)
    uploads = []
    for patch in patches:
        uploads.append(files.put(name=f"Upload patch {stack.sglang}/{patch.name}", src=str(patch),
                  dest=f"{patch_dir}/{patch.name}", mode="0644"))
    unapplied = host.get_fact(UnappliedPatches, env_dir=target)
    # Idempotent: a patch whose reverse applies cleanly is in place. A patch that applies
    # neither way stops the deploy here, before roles/serving touches the running service.
    server.shell(
        name=f"Apply {len(patches)} patch(es) of sglang {stack.sglang} to {target}",
        commands=[
            f"site=$(echo {target}/lib/python3*/site-packages); cd {patch_dir} && for p in *.patch; do"
            " [ -e \"$p\" ] || continue;"
            " if patch -p1 -R -s -f --dry-run -d \"$site\" < \"$p\" >/dev/null 2>&1; then continue; fi;"
            " if ! patch -p1 -s -f --dry-run -d \"$site\" < \"$p\"; then"
            f"   echo \"patch $p does not apply to sglang {stack.sglang} in {target};"
            " the running service was not touched\" >&2; exit 1; fi;"
            " patch -p1 -s -f -d \"$site\" < \"$p\" || exit 1; done"
        ],
        # The fact saw the environment as it was before this run: a fresh build or a new
        # patch file needs the step too.
        _if=lambda: bool(unapplied) or built.did_change() or any(u.did_change() for u in uploads),
    )
