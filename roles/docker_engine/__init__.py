"""roles/docker_engine: Docker engine with buildx, and NVIDIA's container toolkit, on builders.

The engine comes from Docker's repository (docker_source = "docker": docker-ce with the
buildx plugin) or from the distro (docker_source = "distro": docker.io). daemon.json carries
the site's data-root, log limits and default shm size; its other keys are kept, because
`nvidia-ctk runtime configure` writes the nvidia runtime into the same file. That command runs
only when the runtime is missing, so a second deploy changes nothing.
"""

from __future__ import annotations

import json
from io import StringIO

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import apt, files, server, systemd

from roles.docker_engine.facts import DAEMON_JSON, DockerDaemonConfig
from roles.shared.apt_keys import pinned_key
from roles.shared.nvidia_repo import Distro, current_distro
from roles.site import DockerSettings, current_host

DOCKER_KEYRING = "/etc/apt/keyrings/docker.asc"
DOCKER_SOURCES = "/etc/apt/sources.list.d/docker.list"
TOOLKIT_KEYRING = "/usr/share/keyrings/nvidia-container-toolkit-keyring.asc"
TOOLKIT_SOURCES = "/etc/apt/sources.list.d/nvidia-container-toolkit.list"

DOCKER_PACKAGES = ["docker-ce", "docker-ce-cli", "containerd.io", "docker-buildx-plugin"]
# Ubuntu packages buildx as docker-buildx; Debian 12 has none (its docker.io 20.10 has the
# built-in BuildKit builder: DOCKER_BUILDKIT=1).
DISTRO_PACKAGES = {"ubuntu": ["docker.io", "docker-buildx"], "debian": ["docker.io"]}
TOOLKIT_PACKAGES = ["nvidia-container-toolkit"]


@deploy("Docker engine")
def docker_engine() -> None:
    settings = current_host().docker
    distro = current_distro("roles/docker_engine")
    sources_changed = []
    if settings.source == "docker":
        sources_changed += _docker_repository(settings, distro)
    sources_changed += _toolkit_repository(settings)
    apt.update(
        name="Update apt lists for Docker's and NVIDIA's container repositories",
        _if=lambda: any(op.did_change() for op in sources_changed),
    )
    packages = DOCKER_PACKAGES if settings.source == "docker" else DISTRO_PACKAGES[distro.id]
    _engine_users(settings)
    # daemon.json goes first, so that the engine's first start (by its package) already uses
    # the site's data-root and options.
    restart = _daemon_json(settings)
    apt.packages(
        name=f"Install Docker engine from {settings.source} ({', '.join(packages)})",
        packages=packages,
        no_recommends=True,
    )
    apt.packages(
        name="Install NVIDIA container toolkit",
        packages=TOOLKIT_PACKAGES,
        no_recommends=True,
    )
    restart = _nvidia_runtime() or restart
    systemd.service(
        name="Run the Docker engine",
        service="docker.service",
        enabled=True,
        running=True,
        restarted=restart,
    )


def _docker_repository(settings: DockerSettings, distro: Distro) -> list:
    base = f"{settings.repo_url.rstrip('/')}/{distro.id}"
    key = pinned_key(
        host,
        name="Install Docker's repository key",
        url=f"{base}/gpg",
        dest=DOCKER_KEYRING,
        fingerprint=settings.repo_key_fingerprint,
        setting="docker_repo_key_fingerprint",
    )
    sources = files.put(
        name=f"Point apt at Docker's repository {base} {distro.codename} stable",
        src=StringIO(f"deb [arch=amd64 signed-by={DOCKER_KEYRING}] {base} {distro.codename} stable\n"),
        dest=DOCKER_SOURCES,
        mode="0644",
    )
    return [key, sources]


def _toolkit_repository(settings: DockerSettings) -> list:
    key = pinned_key(
        host,
        name="Install NVIDIA's container toolkit key",
        url=settings.nvidia_toolkit_key_url,
        dest=TOOLKIT_KEYRING,
        fingerprint=settings.nvidia_toolkit_key_fingerprint,
        setting="docker_nvidia_toolkit_key_fingerprint",
    )
    # $(ARCH) is expanded by apt itself, as in NVIDIA's own list file.
    url = settings.nvidia_toolkit_repo_url.rstrip("/")
    sources = files.put(
        name=f"Point apt at NVIDIA's container toolkit repository {url}",
        src=StringIO(f"deb [signed-by={TOOLKIT_KEYRING}] {url}/$(ARCH) /\n"),
        dest=TOOLKIT_SOURCES,
        mode="0644",
    )
    return [key, sources]


def _engine_users(settings: DockerSettings) -> None:
    server.group(name="Create group docker", group="docker", system=True)
    for user in settings.users:
        server.user(
            name=f"Let {user} use the Docker engine (group docker)",
            user=user,
            groups=["docker"],
            append=True,
        )


def daemon_settings(settings: DockerSettings) -> dict:
    """The daemon.json keys this role owns (dockerd(8) daemon configuration file)."""
    return {
        "data-root": settings.data_root,
        "log-driver": "json-file",
        "log-opts": {"max-size": settings.log_max_size, "max-file": str(settings.log_max_file)},
        "default-shm-size": settings.default_shm_size,
    }


def merged_daemon_json(current: dict | None, settings: DockerSettings) -> dict:
    """The site's keys over whatever else is there (the nvidia runtime, hand-made additions)."""
    return {**(current or {}), **settings.daemon_extra, **daemon_settings(settings)}


def _daemon_json(settings: DockerSettings) -> bool:
    """Bring daemon.json to the settings; True if it changes (the engine must restart)."""
    current = host.get_fact(DockerDaemonConfig)
    wanted = merged_daemon_json(current, settings)
    files.directory(name="Create /etc/docker", path="/etc/docker", mode="0755")
    # Compared as data, not text: nvidia-ctk rewrites the file in its own layout.
    if wanted == current:
        return False
    files.put(
        name=f"Write {DAEMON_JSON} (data-root {settings.data_root}, logs"
        f" {settings.log_max_size} x {settings.log_max_file}, shm {settings.default_shm_size})",
        src=StringIO(json.dumps(wanted, indent=4, sort_keys=True) + "\n"),
        dest=DAEMON_JSON,
        mode="0644",
    )
    return True


def _nvidia_runtime() -> bool:
    """`nvidia-ctk runtime configure` when daemon.json lacks the runtime; True if it runs."""
    current = host.get_fact(DockerDaemonConfig) or {}
    lacks_runtime = "nvidia" not in current.get("runtimes", {})
    server.shell(
        name="Add the nvidia runtime to daemon.json (nvidia-ctk runtime configure)",
        commands=["nvidia-ctk runtime configure --runtime=docker"],
        _if=lambda: lacks_runtime,
    )
    return lacks_runtime
