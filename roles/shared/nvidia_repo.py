"""NVIDIA's CUDA apt repository, shared by roles/nvidia_driver and roles/cuda.

The repository is set up the way NVIDIA documents it (CUDA installation guide, "Network
Repo Installation"): install the cuda-keyring package, which brings the signing key
(/usr/share/keyrings/cuda-archive-keyring.gpg) and a sources entry for the public server.
The sources entry is then rewritten with the configured URL (`cuda_repo_url`), so that an
air-gapped site's mirror is the only source apt reads. The path under the URL derives from
the distro: ubuntu2404, debian12. A mirror that asks for a login (cuda_repo_credentials_secret)
gets it from a 0600 file of apt's own (roles/shared/mirror_auth.py), and the keyring package is
then downloaded by apt's helper, which reads that file: the URL in the sources entry, the
operation's name and the command line carry no credential.
"""

from __future__ import annotations

from dataclasses import dataclass
from io import StringIO

from pyinfra import host
from pyinfra.facts.files import File
from pyinfra.facts.server import LinuxDistribution
from pyinfra.operations import apt, files, server

from roles.shared import mirror_auth
from roles.shared.refusal import Refused
from roles.shared.shell import sh
from roles.site import HostSettings

CUDA_KEYRING = "/usr/share/keyrings/cuda-archive-keyring.gpg"
ARCH = "x86_64"
DOWNLOAD_DIR = "/var/cache/inference-host"
# DCGM 4's core package in the CUDA repository (dcgmi, nv-hostengine, nvidia-dcgm.service): the
# driver role installs it, and the monitoring role pins it beside the exporter built against it.
DCGM_CORE_PACKAGE = "datacenter-gpu-manager-4-core"
# apt's own downloader (package apt, /usr/lib/apt/apt-helper download-file URI FILE): it goes through
# apt's http(s) methods, which read /etc/apt/auth.conf.d, and its time limits (Acquire::*::Timeout,
# 30 s without progress); `timeout` bounds the whole download.
APT_HELPER = "/usr/lib/apt/apt-helper"
KEYRING_DOWNLOAD_TIMEOUT_S = 600


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


_done: set[str] = set()


def ensure_cuda_repository(settings: HostSettings, distro: Distro) -> None:
    """Keyring package, sources entry, and an apt update when either changed (once per host)."""
    if host.name in _done:
        return
    _done.add(host.name)
    url = cuda_repo_url(settings, distro)
    version = settings.cuda.keyring_version
    deb = f"cuda-keyring_{version}_all.deb"
    # Downloaded under its own name first: pyinfra's apt.deb inspects only files named *.deb,
    # and given a URL it keeps a temp file without that suffix (and reinstalls every time).
    files.directory(name=f"Create {DOWNLOAD_DIR}", path=DOWNLOAD_DIR, mode="0755")
    if mirror_auth.cuda_auth(settings):
        _download_with_apt(f"{url}{deb}", f"{DOWNLOAD_DIR}/{deb}")
    else:
        files.download(
            name=f"Download {url}{deb}",
            src=f"{url}{deb}",
            dest=f"{DOWNLOAD_DIR}/{deb}",
            mode="0644",
        )
    keyring = apt.deb(
        name=f"Install NVIDIA's repository keyring cuda-keyring {version}",
        src=f"{DOWNLOAD_DIR}/{deb}",
    )
    sources = files.put(
        name=f"Point apt at NVIDIA's CUDA repository {url}",
        src=StringIO(cuda_sources_line(settings, distro) + "\n"),
        dest=cuda_sources_file(distro),
        mode="0644",
    )
    apt.update(
        name="Update apt lists for NVIDIA's CUDA repository",
        _if=lambda: keyring.did_change() or sources.did_change(),
    )


def _download_with_apt(src: str, dest: str) -> None:
    """The keyring package from a mirror that asks for a login: apt's helper finds it in apt's
    auth.conf.d (curl or wget would want it on their command line or in a file of their own)."""
    if host.get_fact(File, path=dest):
        return
    partial = f"{dest}.partial"
    server.shell(
        name=f"Download {src} with apt's login for the mirror (cuda_repo_credentials_secret)",
        commands=[
            sh(
                "rm -f -- {partial} && timeout {limit} {helper} download-file {src} {partial}"
                " && chmod 0644 -- {partial} && mv -f -- {partial} {dest}"
                " || {{ rc=$?; rm -f -- {partial}; echo {failed} >&2; exit $rc; }}",
                partial=partial,
                limit=KEYRING_DOWNLOAD_TIMEOUT_S,
                helper=APT_HELPER,
                src=src,
                dest=dest,
                failed=f"could not download {src} within {KEYRING_DOWNLOAD_TIMEOUT_S}s with the login of"
                " cuda_repo_credentials_secret (exit 124: the time ran out); check the mirror and that login",
            )
        ],
    )
