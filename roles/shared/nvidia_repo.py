"""NVIDIA's CUDA apt repository, shared by roles/nvidia_driver and roles/cuda.

NVIDIA signs the repository with one key and publishes it beside the packages as
<repository>/<key id>.pub (3bf863cc.pub since the key rotation of April 2022; NVIDIA's forum
answers name that file as the manual alternative to the cuda-keyring package, which NVIDIA
prefers: docs/security.md says why the deploy does not use it). The deploy installs that key
file, only when its fingerprint is the pinned cuda_repo_key_fingerprint (roles/shared/apt_keys.py),
and writes the sources entry itself with the configured URL (`cuda_repo_url`), so that an
air-gapped site's mirror is the only source apt reads. The path under the URL derives from the
distro: ubuntu2404, debian12.

The cuda-keyring package is not installed: it is a .deb fetched from the same server and
installed by root with dpkg, so its maintainer scripts would run whatever that server sends, and
its key could not be checked before dpkg trusts it. A host that has it from an earlier deploy
keeps it (its keyring file is no longer named by any sources entry).

A mirror that asks for a login (cuda_repo_credentials_secret) gets it from a 0600 file of apt's
own (roles/shared/mirror_auth.py); apt's helper, which downloads the key, reads that file too: the
URL in the sources entry, the operation's name and the command line carry no credential.
"""

from __future__ import annotations

from dataclasses import dataclass
from io import StringIO

from pyinfra import host
from pyinfra.facts.server import LinuxDistribution
from pyinfra.operations import apt, files

from roles.shared import mirror_auth
from roles.shared.apt_keys import pinned_key
from roles.shared.once import first_time
from roles.shared.refusal import Refused
from roles.site import HostSettings

# Not /usr/share/keyrings/cuda-archive-keyring.gpg: that file belongs to the cuda-keyring package
# on hosts of earlier deploys. /etc/apt/keyrings is the folder for keys an administrator adds
# (apt's sources.list(5), signed-by); .asc: the armored file as NVIDIA serves it.
CUDA_KEYRING = "/etc/apt/keyrings/nvidia-cuda.asc"
ARCH = "x86_64"
# DCGM 4's core package in the CUDA repository (dcgmi, nv-hostengine, nvidia-dcgm.service): the
# driver role installs it, and the monitoring role pins it beside the exporter built against it.
DCGM_CORE_PACKAGE = "datacenter-gpu-manager-4-core"


@dataclass(frozen=True)
class Distro:
    """The two systems these roles support, with the names NVIDIA's and Docker's repos use."""

    id: str  # "ubuntu" / "debian": Docker's repository path
    codename: str  # "noble" / "bookworm": Docker's suite
    nvidia_path: str  # "ubuntu2404" / "debian12": NVIDIA's repository path


SUPPORTED: dict[tuple[str | None, int | None, int | None], Distro] = {
    ("Ubuntu", 24, 4): Distro("ubuntu", "noble", "ubuntu2404"),
    ("Debian", 12, None): Distro("debian", "bookworm", "debian12"),
}


def current_distro(role: str) -> Distro:
    """The host's distro, or a clear error naming what the role supports."""
    facts = host.get_fact(LinuxDistribution)
    name, major, minor = facts.get("name"), facts.get("major"), facts.get("minor")
    distro = SUPPORTED.get((name, major, minor)) or SUPPORTED.get((name, major, None))
    if distro is None:
        raise Refused(
            f"{host.name}: {name} {major}.{minor} is not supported by {role};"
            " supported: Ubuntu 24.04 (production) and Debian 12 (lab)"
        )
    return distro


def cuda_repo_url(settings: HostSettings, distro: Distro) -> str:
    return f"{settings.cuda.repo_url.rstrip('/')}/{distro.nvidia_path}/{ARCH}/"


def cuda_sources_file(distro: Distro) -> str:
    # The very file cuda-keyring installs, so that exactly one entry for the repo exists.
    return f"/etc/apt/sources.list.d/cuda-{distro.nvidia_path}-{ARCH}.list"


def cuda_sources_line(settings: HostSettings, distro: Distro) -> str:
    return f"deb [signed-by={CUDA_KEYRING}] {cuda_repo_url(settings, distro)} /"


def ensure_cuda_repository(settings: HostSettings, distro: Distro) -> None:
    """Signing key, sources entry, and an apt update when either changed (once per host)."""
    if not first_time("the CUDA repository"):
        return
    url = cuda_repo_url(settings, distro)
    fingerprint = settings.cuda.repo_key_fingerprint
    mirror_auth.cuda_auth(settings)  # apt's login for the mirror, before the key's download reads it
    key = pinned_key(
        host,
        name="Install the CUDA repository's signing key",
        url=f"{url}{cuda_key_file_name(fingerprint)}",
        dest=CUDA_KEYRING,
        fingerprint=fingerprint,
        setting="cuda_repo_key_fingerprint",
    )
    sources = files.put(
        name=f"Point apt at NVIDIA's CUDA repository {url}",
        src=StringIO(cuda_sources_line(settings, distro) + "\n"),
        dest=cuda_sources_file(distro),
        mode="0644",
    )
    apt.update(
        name="Update apt lists for NVIDIA's CUDA repository",
        _if=lambda: key.did_change() or sources.did_change(),
    )


def cuda_key_file_name(fingerprint: str) -> str:
    """NVIDIA's name for the key's file: its key id (the fingerprint's last 8 hex digits) in lower
    case, 3bf863cc.pub for EB693B3035CD5710E231E123A4B469963BF863CC."""
    return f"{fingerprint[-8:].lower()}.pub"
