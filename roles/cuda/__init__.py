"""roles/cuda: CUDA toolkits from NVIDIA's repository, side by side, one of them selected.

Every engine stack in stack.yml names its CUDA version; each gets its own toolkit package
(cuda-toolkit-12-8, cuda-toolkit-13-0, ...) so that switching `active` never waits for a
download. Never the `cuda` / `cuda-12-8` meta-packages: they drag in a driver, and the driver
belongs to roles/nvidia_driver. The toolkit packages register /usr/local/cuda with
update-alternatives; the active stack's version is selected there and exported in
/etc/profile.d (CUDA_HOME, PATH, LD_LIBRARY_PATH) for shells and extension builds.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import apt, files, server

from roles.cuda.facts import SelectedCudaDirectory
from roles.shared import templates
from roles.shared.nvidia_repo import current_distro, ensure_cuda_repository
from roles.shared.shell import comment, sh, word
from roles.site import current_host, current_site

PROFILE_FILE = "/etc/profile.d/90-inference-host-cuda.sh"


def toolkit_package(cuda_version: str) -> str:
    """cuda-toolkit-<major>-<minor>: the toolkit alone, no driver."""
    return "cuda-toolkit-" + cuda_version.replace(".", "-")


def toolkit_dir(cuda_version: str) -> str:
    return f"/usr/local/cuda-{cuda_version}"


@deploy("CUDA")
def cuda() -> None:
    settings = current_host()
    stack = current_site().stack
    distro = current_distro("roles/cuda")
    ensure_cuda_repository(settings, distro)
    versions = sorted({engine.cuda for engine in stack.stacks.values()}, key=lambda v: tuple(map(int, v.split("."))))
    for version in versions:
        apt.packages(
            name=f"Install CUDA toolkit {version} ({toolkit_package(version)})",
            packages=[toolkit_package(version)],
            no_recommends=True,
        )
    _select(stack.active.cuda, stack.active.id)


def _select(version: str, stack_id: str) -> None:
    target = toolkit_dir(version)
    server.shell(
        name=f"Select CUDA {version} as /usr/local/cuda (stack {stack_id})",
        commands=[sh("update-alternatives --set cuda {target}", target=target)],
        _if=lambda: host.get_fact(SelectedCudaDirectory) != target,
    )
    files.template(
        name=f"Export CUDA_HOME={target} in {PROFILE_FILE}",
        src="roles/cuda/templates/90-inference-host-cuda.sh.j2",
        dest=PROFILE_FILE,
        cuda_home=word(target),  # one shell word: the file is sourced by login shells
        version=comment(version),
        mode="0644",
        jinja_env_kwargs=templates.jinja_env_kwargs("roles/cuda/templates/90-inference-host-cuda.sh.j2"),
    )
