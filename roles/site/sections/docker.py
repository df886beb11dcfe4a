"""roles/docker_engine on builders (docker_*)."""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar

from pydantic import Field

from roles.site.fields import (
    UNIX_NAME_RE,
    HostFolder,
    KeyFingerprint,
    Section,
    Url,
    check,
    one_of,
    positive,
)

DOCKER_OWNED_KEYS = {"data-root", "log-driver", "log-opts", "default-shm-size", "runtimes"}
# daemon.json keys that hand the engine (root) to someone else (dockerd's flags of the same name,
# docs.docker.com/reference/cli/dockerd/#daemon-configuration-file): `hosts` opens the API on a
# TCP address (root for whoever reaches it; the packaged unit's `-H fd://` also makes dockerd
# refuse to start: "directives are specified both as a flag and in the configuration file"),
# `group` gives the API socket to a group (docker_users is the one way in, listed), and
# `userland-proxy-path` names a program dockerd runs as root.
DOCKER_ROOT_KEYS = {"hosts", "group", "userland-proxy-path"}
DOCKER_EXTRA_TEXT = (
    "daemon.json keys other than "
    + ", ".join(sorted(DOCKER_OWNED_KEYS | DOCKER_ROOT_KEYS))
    + " (the role's own, or keys that give root to whoever reaches the API: docker_users names them)"
)


DockerSize = Annotated[
    str,
    check(
        lambda v: re.match(r"^\d+[bkmg]?$", v, re.IGNORECASE) is not None,
        "a size like 64m, 1g (a number with an optional b/k/m/g unit)",
    ),
]


class DockerSettings(Section):
    """roles/docker_engine on builders: the engine, its daemon.json and the NVIDIA container toolkit."""

    PREFIX: ClassVar[str] = "docker_"

    source: Annotated[str, one_of("docker", "distro")] = Field(
        "docker",
        description=(
            "'docker': Docker's repository (docker-ce, docker-buildx-plugin); 'distro': the distribution's docker.io."
        ),
    )
    repo_url: Url = Field(
        "https://download.docker.com/linux",
        description=("Base of Docker's repositories: <url>/<ubuntu|debian>, key at <url>/<ubuntu|debian>/gpg."),
    )
    repo_key_fingerprint: KeyFingerprint = Field(
        "9DC858229FC7DD38854AE2D88D81803C0EBFCD88",
        description=(
            "Fingerprint of Docker's repository key (<url>/<ubuntu|debian>/gpg), installed only when it is this"
            " key: Docker's release key, as its install guide for Ubuntu and Debian names it."
        ),
    )
    nvidia_toolkit_repo_url: Url = Field(
        "https://nvidia.github.io/libnvidia-container/stable/deb",
        description=("NVIDIA container toolkit apt repository (apt appends /$(ARCH))."),
    )
    nvidia_toolkit_key_url: Url = Field(
        "https://nvidia.github.io/libnvidia-container/gpgkey",
        description=("The toolkit repository's armored signing key."),
    )
    nvidia_toolkit_key_fingerprint: KeyFingerprint = Field(
        "C95B321B61E88C1809C4F759DDCAE044F796ECB0",
        description=(
            "Fingerprint of the toolkit repository's key, installed only when it is this key: NVIDIA's key for"
            " libnvidia-container (key id DDCAE044F796ECB0)."
        ),
    )
    data_root: HostFolder = Field("/var/lib/docker", description="daemon.json data-root.")
    log_max_size: DockerSize = Field("100m", description=("daemon.json log-opts max-size (json-file driver)."))
    log_max_file: Annotated[int, positive] = Field(3, description="daemon.json log-opts max-file.")
    default_shm_size: DockerSize = Field("1g", description="daemon.json default-shm-size.")
    daemon_extra: Annotated[
        dict[str, Any],
        check(
            lambda v: not set(v) & (DOCKER_OWNED_KEYS | DOCKER_ROOT_KEYS),
            DOCKER_EXTRA_TEXT,
        ),
    ] = Field(
        {},
        description=(
            "More daemon.json keys (registry mirrors, iptables: false in a container); the keys above "
            "and 'runtimes' belong to the role."
        ),
    )
    manage_engine: bool = Field(
        True,
        description=("False: the builder's Docker engine is managed outside this project (roles/wheels only uses it)."),
    )
    users: Annotated[
        list[str], check(lambda v: all(UNIX_NAME_RE.match(u) for u in v), "lower-case Unix user names")
    ] = Field(
        [], description=("Users created if missing and added to group docker (root-equivalent, so empty by default).")
    )
