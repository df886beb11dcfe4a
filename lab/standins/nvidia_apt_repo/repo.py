"""STAND-IN for NVIDIA's package servers: a local, signed apt repository for the lab.

NVIDIA's servers (developer.download.nvidia.com, nvidia.github.io) cannot be reached from
these machines. This module builds, with Debian's own tools (dpkg-deb, apt-ftparchive, gpg
with a throwaway key), a repository with the same layout, package names, versions and
dependency names as the real ones, holding EMPTY packages (plus tiny stand-in programs where
the deploy calls one: nvidia-ctk, nvidia-smi, nvcc, nvidia-persistenced), and serves it over
http to the lab containers. Keyring, sources entry, pinning, holding, install and the
update-alternatives registration of /usr/local/cuda thus all run through real apt and dpkg.

Layout mirrored (public URLs, see the CUDA installation guide and the NVIDIA container
toolkit install guide):
    compute/cuda/repos/debian12/x86_64/            flat repo ("deb URL /"), cuda-keyring_1.1-1_all.deb,
                                                   the signing key as <key id>.pub
    libnvidia-container/gpgkey                     armored signing key
    libnvidia-container/stable/deb/amd64/          flat repo ("deb URL/$(ARCH) /")

It never ships in a production path: only inventory/lab.py and tests use it.

    uv run python -m lab.standins.nvidia_apt_repo.repo build    # prints the folder
"""

from __future__ import annotations

import atexit
import fcntl
import hashlib
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from lab.standins.nvidia_apt_repo import nvidia_smi
from lab.standins.nvidia_apt_repo.dcgm import dcgm_packages
from lab.standins.nvidia_apt_repo.dcgm_exporter import dcgm_exporter_packages
from lab.standins.nvidia_apt_repo.signing import SIGNING_KEY_FILE, SIGNING_KEY_FINGERPRINT, cuda_key_file_name, keyring

HERE = Path(__file__).resolve().parent
PROJECT_ROOT = HERE.parents[2]
STATE_DIR = PROJECT_ROOT / ".lab" / "nvidia_apt_repo"  # git-ignored
PUBLIC_CUDA_REPOS = "https://developer.download.nvidia.com/compute/cuda/repos"
DISTRO_PATH = "debian12"  # the lab's distro; production's ubuntu2404 is covered by plan tests

# Driver versions in the stand-in: the pinned one, a newer one on the same branch and one of
# the next branch, so that the lab proves the pin (not "newest wins") picks the version.
DRIVER_VERSIONS = ["580.95.05", "580.105.08", "590.48.01"]
KEYRING_VERSION = "1.1-1"


@dataclass
class Package:
    name: str
    version: str
    arch: str = "amd64"
    depends: list[str] = field(default_factory=list)
    recommends: list[str] = field(default_factory=list)
    files: dict[str, tuple[str | bytes, int]] = field(default_factory=dict)  # path -> (content, mode)
    conffiles: list[str] = field(default_factory=list)
    postinst: str | None = None
    prerm: str | None = None
    description: str = ""


STANDIN_NOTE = "STAND-IN package of the inference-host lab (empty; real name and version)."

# Where the lab's stand-in kernel (lab/standins/proxmox/pve-standin-kernel) lists a loaded
# module, since /proc cannot be written in a container; /run is emptied at every boot like /proc.
STANDIN_PROC = "/run/pve-standin/proc-driver-nvidia"

PERSISTENCED = f"""#!/bin/sh
# STAND-IN nvidia-persistenced (inference-host lab): the real daemon needs a loaded module.
if [ ! -r /proc/driver/nvidia/version ] && [ ! -r {STANDIN_PROC}/version ]; then
    echo "nvidia-persistenced failed to initialize: no NVIDIA kernel module is loaded" >&2
    exit 1
fi
exec sleep infinity
"""

# nvidia-modprobe's -u (load nvidia-uvm) with -c N (then make its device files), as documented
# in NVIDIA's nvidia-modprobe.1 (github.com/NVIDIA/nvidia-modprobe, nvidia-modprobe.1.m4); the
# real tool exits 1 when the module cannot be loaded. nvidia-uvm's major is dynamic (511 here).
NVIDIA_MODPROBE = f"""#!/bin/sh
# STAND-IN nvidia-modprobe (inference-host lab): no kernel module can be loaded in a container.
# With the (stand-in) nvidia module loaded, -u -c N makes /dev/nvidia-uvm and /dev/nvidia-uvm-tools.
uvm=0; create=""
for arg in "$@"; do
    case "$arg" in
        -u|--unified-memory) uvm=1 ;;
        -c*|--create-nvidia-device-file=*) create=1 ;;
    esac
done
if [ ! -r /proc/driver/nvidia/version ] && [ ! -r {STANDIN_PROC}/version ]; then
    exit 1
fi
if [ "$uvm" = 1 ] && [ -n "$create" ]; then
    [ -c /dev/nvidia-uvm ] || mknod -m 0666 /dev/nvidia-uvm c 511 0
    [ -c /dev/nvidia-uvm-tools ] || mknod -m 0666 /dev/nvidia-uvm-tools c 511 1
fi
exit 0
"""

# dkms 3.0.10 (Debian 12), what `dkms status` prints ("<module>/<version>, <kernel>, <arch>:
# installed", or "<module>/<version>: added" when built for no kernel), read from its tree
# /var/lib/dkms/<module>/<version>/<kernel>/<arch>/module/.
DKMS = """#!/bin/sh
# STAND-IN dkms (inference-host lab): only `dkms status [-m M] [-v V]`, read from /var/lib/dkms.
[ "$1" = status ] || { echo "dkms (stand-in): only 'status' is available in the lab" >&2; exit 1; }
shift; mod='*'; ver='*'
while [ $# -gt 0 ]; do
    case "$1" in -m) mod="$2"; shift ;; -v) ver="$2"; shift ;; esac; shift
done
for dir in /var/lib/dkms/$mod/$ver; do
    [ -d "$dir/source" ] || continue
    m=$(basename "$(dirname "$dir")"); v=$(basename "$dir"); built=
    for k in "$dir"/*/x86_64/module; do
        [ -d "$k" ] || continue
        kernel=$(basename "$(dirname "$(dirname "$k")")")
        echo "$m/$v, $kernel, x86_64: installed"; built=1
    done
    [ -n "$built" ] || echo "$m/$v: added"
done
"""


def _dkms_postinst(version: str) -> str:
    """What the real package's postinst does through dkms: add the source, build and install
    for every kernel whose headers are there (/lib/modules/<kernel>/build), and skip the
    others with dkms's own notice. The lab's kernel is the running one."""
    tree = f"/var/lib/dkms/nvidia/{version}"
    skipped = (  # dkms's notice; the script expands $kernel
        "Module build for kernel $kernel was skipped since the kernel headers for this kernel"
        " do not seem to be installed."
    )
    return f"""#!/bin/sh
set -e
mkdir -p {tree}
ln -sfn /usr/src/nvidia-{version} {tree}/source
kernel=$(uname -r)
if [ -e /lib/modules/$kernel/build ]; then
    echo "Building module(s)... done. (stand-in)"
    mkdir -p {tree}/$kernel/x86_64/module
    for ko in nvidia nvidia-uvm nvidia-modeset nvidia-drm nvidia-peermem; do
        echo "stand-in $ko.ko {version}" > {tree}/$kernel/x86_64/module/$ko.ko
    done
else
    echo "{skipped}"
fi
"""


# The unit the real package installs (ExecStart as in NVIDIA's nvidia-persistenced sources,
# init/systemd/nvidia-persistenced.service.template).
PERSISTENCED_UNIT = """[Unit]
Description=NVIDIA Persistence Daemon
Wants=syslog.target

[Service]
Type=simple
ExecStart=/usr/bin/nvidia-persistenced --verbose
ExecStopPost=/bin/rm -rf /var/run/nvidia-persistenced

[Install]
WantedBy=multi-user.target
"""


def _nvcc(cuda: str, build: str) -> str:
    return f"""#!/bin/sh
# STAND-IN nvcc (inference-host lab): reports its version; it compiles nothing.
if [ "$1" = "--version" ] || [ "$1" = "-V" ]; then
    echo "nvcc: NVIDIA (R) Cuda compiler driver"
    echo "Cuda compilation tools, release {cuda}, V{build}"
    exit 0
fi
echo "nvcc (stand-in): compiling is not possible in the lab" >&2
exit 1
"""


def driver_packages(version: str) -> list[Package]:
    """Debian's names in NVIDIA's CUDA repository (compute-only set and its dependencies)."""
    v = f"{version}-1"
    same = f"(= {v})"
    return [
        Package(
            "nvidia-driver-cuda",
            v,
            depends=[
                f"nvidia-smi {same}",
                f"libcuda1 {same}",
                f"libnvidia-ml1 {same}",
                f"nvidia-persistenced (>= {version})",
            ],
            recommends=["nvidia-kernel-open-dkms | nvidia-kernel-dkms"],
        ),
        # Without a driver as the real one; with the lab's planted GPUs, from real captures.
        Package(
            "nvidia-smi",
            v,
            depends=[f"libnvidia-ml1 {same}"],
            files={
                "/usr/bin/nvidia-smi": (nvidia_smi.WRAPPER, 0o755),
                nvidia_smi.PROGRAM_PATH: (nvidia_smi.program(version), 0o755),
            },
        ),
        Package("libcuda1", v, depends=[f"nvidia-kernel-support {same}"]),
        Package("libnvidia-ml1", v),
        Package("nvidia-kernel-support", v),
        Package(
            "nvidia-persistenced",
            v,
            files={
                "/usr/bin/nvidia-persistenced": (PERSISTENCED, 0o755),
                "/lib/systemd/system/nvidia-persistenced.service": (PERSISTENCED_UNIT, 0o644),
            },
        ),
        # The real package depends on dkms and builds the open modules through it; the stand-in
        # records a build in dkms's tree, only where headers exist (see _dkms_postinst).
        Package(
            "nvidia-kernel-open-dkms",
            v,
            depends=[f"nvidia-kernel-support {same}", "dkms"],
            files={
                f"/usr/src/nvidia-{version}/dkms.conf": (f'PACKAGE_NAME="nvidia"\nPACKAGE_VERSION="{version}"\n', 0o644)
            },
            postinst=_dkms_postinst(version),
            prerm=f"#!/bin/sh\nrm -rf /var/lib/dkms/nvidia/{version}\n",
        ),
        Package("nvidia-modprobe", v, files={"/usr/bin/nvidia-modprobe": (NVIDIA_MODPROBE, 0o755)}),
        Package("nvidia-kernel-dkms", v, depends=[f"nvidia-kernel-support {same}"]),
        # The meta-package the issue warns about: it pulls the proprietary flavor.
        Package("cuda-drivers", v, depends=[f"nvidia-driver-cuda {same}", f"nvidia-kernel-dkms {same}"]),
    ]


def cuda_packages(cuda: str, toolkit: str, nvcc: str, runtime: str, priority: int) -> list[Package]:
    """cuda-toolkit-X-Y with its real dependency names; X.Y registers /usr/local/cuda."""
    dash = cuda.replace(".", "-")
    home = f"/usr/local/cuda-{cuda}"
    return [
        Package(
            f"cuda-toolkit-{dash}",
            f"{toolkit}-1",
            depends=[
                f"cuda-compiler-{dash} (>= {toolkit})",
                f"cuda-libraries-{dash} (>= {toolkit})",
                f"cuda-toolkit-{dash}-config-common",
            ],
        ),
        Package(f"cuda-compiler-{dash}", f"{toolkit}-1", depends=[f"cuda-nvcc-{dash} (>= {nvcc})"]),
        Package(
            f"cuda-nvcc-{dash}",
            f"{nvcc}-1",
            depends=[f"cuda-cudart-{dash}"],
            files={f"{home}/bin/nvcc": (_nvcc(cuda, nvcc), 0o755)},
        ),
        Package(f"cuda-libraries-{dash}", f"{toolkit}-1", depends=[f"cuda-cudart-{dash} (>= {runtime})"]),
        Package(
            f"cuda-cudart-{dash}",
            f"{runtime}-1",
            depends=["cuda-toolkit-config-common"],
            files={f"{home}/lib64/libcudart.so.{cuda.split('.')[0]}": (b"", 0o644)},
        ),
        Package(
            f"cuda-toolkit-{dash}-config-common",
            f"{runtime}-1",
            arch="all",
            postinst=f"#!/bin/sh\nset -e\nupdate-alternatives --install /usr/local/cuda cuda {home} {priority}\n",
            prerm=f'#!/bin/sh\nset -e\n[ "$1" = upgrade ] || update-alternatives --remove cuda {home}\n',
        ),
        # The meta-packages that must NOT be installed (they bring a driver along).
        Package(f"cuda-{dash}", f"{toolkit}-1", depends=[f"cuda-toolkit-{dash} (>= {toolkit})", "cuda-drivers"]),
    ]


def cuda_repo_packages() -> list[Package]:
    packages = [
        Package(
            "cuda-keyring",
            KEYRING_VERSION,
            arch="all",
            files={
                "/usr/share/keyrings/cuda-archive-keyring.gpg": (b"<key>", 0o644),
                f"/etc/apt/sources.list.d/cuda-{DISTRO_PATH}-x86_64.list": (
                    (
                        "deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg]"
                        f" {PUBLIC_CUDA_REPOS}/{DISTRO_PATH}/x86_64/ /\n"
                    ),
                    0o644,
                ),
            },
            conffiles=[f"/etc/apt/sources.list.d/cuda-{DISTRO_PATH}-x86_64.list"],
        ),
        Package("cuda-toolkit-config-common", "12.8.90-1", arch="all"),
        Package("cuda", "12.8.1-1", depends=["cuda-12-8 (>= 12.8.1)"]),
        # Debian 12's dkms is 3.0.10-8+deb12u1; this stand-in's version sorts above it, so that
        # apt takes it (the real one would pull a compiler to build a module nobody can load).
        Package("dkms", "3.0.10-8+deb12u1+standin1", arch="all", files={"/usr/sbin/dkms": (DKMS, 0o755)}),
    ]
    for version in DRIVER_VERSIONS:
        packages += driver_packages(version)
    packages += cuda_packages("12.8", "12.8.1", "12.8.93", "12.8.90", 128)
    packages += cuda_packages("13.0", "13.0.2", "13.0.88", "13.0.96", 130)
    packages += dcgm_packages(Package)  # DCGM 4 (lab/standins/nvidia_apt_repo/dcgm.py)
    packages += dcgm_exporter_packages(Package, DRIVER_VERSIONS[0])  # its Prometheus exporter
    return packages


# Proxmox VE 8's package server is unreachable too. A fresh Proxmox VE 8 node has its
# repository configured (pve-no-subscription or enterprise); the lab's node gets this one at
# bring-up (lab.prepare_pve_node), with the real layout (a "bookworm" suite, component
# pve-no-subscription) and the package chain the driver role installs for DKMS.
PVE_KERNEL = "6.8.12-9-pve"
PVE_HEADERS_SCRIPT = """#!/bin/sh
set -e
# STAND-IN: the real package ships /usr/src/linux-headers-{kernel} and the link
# /lib/modules/{kernel}/build. The lab's node boots the engine host's kernel, so the link is
# made for the running kernel: the kernel this node boots next, as after a real install.
mkdir -p /usr/src/linux-headers-{kernel}
mkdir -p /lib/modules/$(uname -r)
ln -sfn /usr/src/linux-headers-{kernel} /lib/modules/$(uname -r)/build
"""


def proxmox_repo_packages() -> list[Package]:
    series = PVE_KERNEL.rsplit(".", 1)[0]  # 6.8
    return [
        Package("proxmox-default-headers", "1.1.0", arch="all", depends=[f"proxmox-headers-{series}"]),
        Package(f"proxmox-headers-{series}", "6.8.12-9", arch="all", depends=[f"proxmox-headers-{PVE_KERNEL}"]),
        Package(
            f"proxmox-headers-{PVE_KERNEL}",
            "6.8.12-9",
            postinst=PVE_HEADERS_SCRIPT.format(kernel=PVE_KERNEL),
            prerm=f"#!/bin/sh\nrm -f /lib/modules/$(uname -r)/build\nrm -rf /usr/src/linux-headers-{PVE_KERNEL}\n",
        ),
    ]


def toolkit_repo_packages() -> list[Package]:
    v = "1.17.8-1"
    return [
        Package(
            "nvidia-container-toolkit",
            v,
            depends=[f"nvidia-container-toolkit-base (= {v})", f"libnvidia-container-tools (>= {v})"],
        ),
        Package(
            "nvidia-container-toolkit-base",
            v,
            depends=["python3"],
            files={
                "/usr/bin/nvidia-ctk": ((HERE / "nvidia-ctk").read_text(), 0o755),
                "/usr/bin/nvidia-container-runtime": (
                    "#!/bin/sh\necho 'nvidia-container-runtime (stand-in): no GPU here' >&2\nexit 1\n",
                    0o755,
                ),
            },
        ),
        Package("libnvidia-container-tools", v, depends=[f"libnvidia-container1 (>= {v})"]),
        Package("libnvidia-container1", v),
    ]


# ----------------------------------------------------------------------------------------------
# Building


def _run(*command: str, cwd: Path | None = None) -> str:
    tool = command[0]
    if not shutil.which(tool):
        raise RuntimeError(
            f"the NVIDIA apt repository stand-in needs {tool}"
            " (`apt-get install -y dpkg-dev apt-utils gnupg`; docs/lab.md: Prerequisites)"
        )
    result = subprocess.run(command, cwd=cwd, text=True, capture_output=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:3])} failed: {result.stderr}")
    return result.stdout


def _build_deb(package: Package, out: Path, key: bytes) -> None:
    with tempfile.TemporaryDirectory(prefix="ih-standin-deb-") as tmp:
        root = Path(tmp)
        (root / "DEBIAN").mkdir()
        for path, (content, mode) in package.files.items():
            target = root / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            data = key if content == b"<key>" else content
            target.write_bytes(data if isinstance(data, bytes) else data.encode())
            target.chmod(mode)
        control = [
            f"Package: {package.name}",
            f"Version: {package.version}",
            f"Architecture: {package.arch}",
            "Maintainer: inference-host lab <standin@invalid>",
            "Section: stand-in",
            "Priority: optional",
        ]
        if package.depends:
            control.append("Depends: " + ", ".join(package.depends))
        if package.recommends:
            control.append("Recommends: " + ", ".join(package.recommends))
        control.append(f"Description: {package.name} {package.version}\n {STANDIN_NOTE}")
        (root / "DEBIAN" / "control").write_text("\n".join(control) + "\n")
        if package.conffiles:
            (root / "DEBIAN" / "conffiles").write_text("\n".join(package.conffiles) + "\n")
        for script in ("postinst", "prerm"):
            body = getattr(package, script)
            if body:
                (root / "DEBIAN" / script).write_text(body)
                (root / "DEBIAN" / script).chmod(0o755)
        name = f"{package.name}_{package.version}_{package.arch}.deb"
        _run("dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(out / name))


def _index_and_sign(repo: Path, gnupg: Path, label: str) -> None:
    packages = _run("apt-ftparchive", "packages", ".", cwd=repo)
    (repo / "Packages").write_text(packages)
    _run("gzip", "-kf9n", "Packages", cwd=repo)
    release = _run(
        "apt-ftparchive",
        "-o",
        f"APT::FTPArchive::Release::Origin={label}",
        "-o",
        f"APT::FTPArchive::Release::Label={label}",
        "release",
        ".",
        cwd=repo,
    )
    (repo / "Release").write_text(release)
    gpg = ["gpg", "--homedir", str(gnupg), "--batch", "--yes"]
    _run(*gpg, "--clearsign", "-o", "InRelease", "Release", cwd=repo)
    _run(*gpg, "-abs", "-o", "Release.gpg", "Release", cwd=repo)


def _proxmox_repo(root: Path, key: bytes, gnupg: Path) -> None:
    """download.proxmox.com/debian/pve: dists/bookworm/pve-no-subscription/binary-amd64, pool/."""
    pool = root / "pool"
    pool.mkdir(parents=True)
    for package in proxmox_repo_packages():
        _build_deb(package, pool, key)
    index = root / "dists" / "bookworm" / "pve-no-subscription" / "binary-amd64"
    index.mkdir(parents=True)
    (index / "Packages").write_text(_run("apt-ftparchive", "packages", "pool", cwd=root))
    _run("gzip", "-kf9n", "Packages", cwd=index)
    suite = root / "dists" / "bookworm"
    release = _run(
        "apt-ftparchive",
        "-o",
        "APT::FTPArchive::Release::Origin=Proxmox",
        "-o",
        "APT::FTPArchive::Release::Label=Proxmox Debian Repository (stand-in)",
        "-o",
        "APT::FTPArchive::Release::Suite=stable",
        "-o",
        "APT::FTPArchive::Release::Codename=bookworm",
        "-o",
        "APT::FTPArchive::Release::Architectures=amd64",
        "-o",
        "APT::FTPArchive::Release::Components=pve-no-subscription",
        "release",
        ".",
        cwd=suite,
    )
    (suite / "Release").write_text(release)
    gpg = ["gpg", "--homedir", str(gnupg), "--batch", "--yes"]
    _run(*gpg, "--clearsign", "-o", "InRelease", "Release", cwd=suite)
    _run(*gpg, "-abs", "-o", "Release.gpg", "Release", cwd=suite)


def signing_key() -> bytes:
    """The stand-in repositories' public key (binary), for a node's trusted.gpg.d."""
    return keyring(STATE_DIR)[1]


def _fingerprint() -> str:
    """Of everything the packages are built from: this folder's stand-ins and the captures
    nvidia-smi answers from."""
    captures = [*(nvidia_smi.CAPTURES / "h200-1gpu").glob("*"), *(nvidia_smi.CAPTURES / "h200-1gpu-health").glob("*")]
    sources = sorted([*HERE.glob("*.py"), HERE / "nvidia-ctk", SIGNING_KEY_FILE, *captures])
    return hashlib.sha256(b"".join(path.read_bytes() for path in sources if path.is_file())).hexdigest()[:16]


def build() -> Path:
    """Build the repository under .lab/ (once per version of this file); returns its web root.
    One process at a time: two labs brought up at once (pytest-xdist's workers) each removed the
    other's staging folder as an earlier build's."""
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    with open(STATE_DIR / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build()


def _build() -> Path:
    www = STATE_DIR / f"www-{_fingerprint()}"
    if (www / "ready").exists():
        return www
    gnupg, key, armored = keyring(STATE_DIR)
    staging = Path(tempfile.mkdtemp(prefix="www-", dir=STATE_DIR))
    cuda_repo = staging / "compute" / "cuda" / "repos" / DISTRO_PATH / "x86_64"
    toolkit_repo = staging / "libnvidia-container" / "stable" / "deb" / "amd64"
    for repo, packages in ((cuda_repo, cuda_repo_packages()), (toolkit_repo, toolkit_repo_packages())):
        repo.mkdir(parents=True)
        for package in packages:
            _build_deb(package, repo, key)
    _index_and_sign(cuda_repo, gnupg, "NVIDIA CUDA (inference-host stand-in)")
    _index_and_sign(toolkit_repo, gnupg, "libnvidia-container (inference-host stand-in)")
    _proxmox_repo(staging / "proxmox" / "debian" / "pve", key, gnupg)
    (staging / "libnvidia-container" / "gpgkey").write_text(armored)
    # Where NVIDIA publishes the CUDA repository's key: <repo>/<distro>/x86_64/<key id>.pub.
    (cuda_repo / cuda_key_file_name(SIGNING_KEY_FINGERPRINT)).write_text(armored)
    (staging / "ready").write_text(_fingerprint() + "\n")
    shutil.rmtree(www, ignore_errors=True)
    staging.rename(www)
    for old in STATE_DIR.glob("www-*"):  # builds of earlier versions of this file
        if old != www:
            shutil.rmtree(old, ignore_errors=True)
    return www


# ----------------------------------------------------------------------------------------------
# Serving to the lab containers


# Docker's default bridge interface; its address is the bridge network's gateway (dockerd gives
# the interface the gateway address it hands out: `docker network inspect bridge` names the
# same one, or none on older engines, as on these machines).
BRIDGE_INTERFACE = os.environ.get("INFERENCE_HOST_LAB_BRIDGE_INTERFACE", "docker0")
SIOCGIFADDR = 0x8915  # linux/sockios.h: get an interface's IPv4 address


def bridge_gateway() -> str:
    """The Docker bridge's gateway address: how the lab containers reach this machine. Read from
    the kernel (the interface's address), not asked of Docker: lab inventories call this while
    they load, and loading an inventory runs no program (tests/unit/test_lab_inventories.py)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            answer = fcntl.ioctl(probe.fileno(), SIOCGIFADDR, struct.pack("256s", BRIDGE_INTERFACE.encode()[:15]))
    except OSError as error:
        raise RuntimeError(
            f"cannot read the address of Docker's bridge interface {BRIDGE_INTERFACE}"
            f" ({error.strerror}); set INFERENCE_HOST_LAB_BRIDGE_INTERFACE to its name"
        ) from None
    return socket.inet_ntoa(answer[20:24])  # struct ifreq: the name (16 bytes), then a sockaddr_in


def port_for(prefix: str) -> int:
    """A port per lab prefix, stable between runs (the sources entry must not change)."""
    return 20000 + int(hashlib.sha256(prefix.encode()).hexdigest(), 16) % 20000


def url_for(prefix: str) -> str:
    """The URL serve() uses, without serving (inventory validation, tests)."""
    try:
        address = bridge_gateway()
    except (RuntimeError, OSError):
        address = "172.17.0.1"  # Docker's default; validation must work without an engine
    return f"http://{address}:{port_for(prefix)}"


def _answers(url: str, fingerprint: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/ready", timeout=2) as response:
            return response.read().decode().strip() == fingerprint
    except OSError:
        return False


def serve(prefix: str) -> str:
    """Serve the repository over http for as long as this process lives; returns its base URL."""
    www = build()
    address, port = bridge_gateway(), port_for(prefix)
    url = url_for(prefix)
    if _answers(url, _fingerprint()):
        return url  # already served (another deploy of the same lab is running)
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", "--bind", address, "--directory", str(www), str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    atexit.register(_stop, server)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if _answers(url, _fingerprint()):
            return url
        if server.poll() is not None:
            break
        time.sleep(0.1)
    _stop(server)
    raise RuntimeError(f"the NVIDIA apt repository stand-in could not be served on {url}")


def _stop(server: subprocess.Popen) -> None:
    if server.poll() is None:
        server.terminate()
        try:
            server.wait(timeout=5)
        except subprocess.TimeoutExpired:
            server.kill()


if __name__ == "__main__":
    if sys.argv[1:] == ["build"]:
        print(build())
    elif sys.argv[1:2] == ["serve"]:
        print(serve(sys.argv[2] if len(sys.argv) > 2 else os.environ.get("INFERENCE_HOST_LAB_PREFIX", "ih-lab")))
        input("serving; press Enter to stop\n")
    else:
        print("usage: python -m lab.standins.nvidia_apt_repo.repo build|serve [prefix]", file=sys.stderr)
        raise SystemExit(64)
