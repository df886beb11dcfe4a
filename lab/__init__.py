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

The package's face: every name below is importable from `lab`; each concern lives in its own
module (docker_engine, images, containers, addresses, contents, pve_node, vault), and what brings
a host up (up, bring_up, the connector's names) stays here, where tests replace its parts.
"""

from __future__ import annotations

import os
from pathlib import Path

# Re-exported: `lab.<name>` is how the inventories, the connector, lab/cuda_image.py and the
# tests reach these.
from lab.addresses import (  # noqa: F401
    addresses_file,
    enable_ssh,
    known_hosts_file,
    record_address,
    recorded_address,
    recorded_addresses,
    ssh_connection_data,
)
from lab.containers import (  # noqa: F401
    GUEST_VMID,
    HOSTS,
    LAB_DOCKER_SOCKET,
    LAB_UV_CACHE,
    LAB_UV_CACHE_DEST,
    MAIN_LAB,
    MODELS_GUEST_PATH,
    MODELS_HOST_PATH,
    SYSTEMD_RUN_FLAGS,
    UV_CACHE_ROLES,
    _wait_for_systemd,
    container_address,
    container_name,
    container_state,
    ensure_container,
    models_volume,
)
from lab.contents import (  # noqa: F401
    PYTHON311_LEAVE_OUT,
    STANDIN_DEST,
    STANDIN_ROLES,
    STANDIN_SOURCE,
    TINY_MODEL_DEST,
    TINY_MODEL_ROLES,
    install_standins,
    install_tiny_model,
)
from lab.docker_engine import (  # noqa: F401
    PREFIX,
    PROJECT_ROOT,
    STATE_DIR,
    LabError,
    _docker,
    _log,
    engine_available,
    state_lock,
)
from lab.images import (  # noqa: F401
    BASE_SOURCE,
    DEBIAN_MIRROR,
    DEBOOTSTRAP_IMAGE,
    DEBOOTSTRAP_PACKAGES,
    REGISTRY_IMAGE,
    SYSTEMD_DOCKERFILE,
    _debootstrap_base,
    _image_exists,
    base_image,
    systemd_image,
)
from lab.pve_node import (  # noqa: F401
    DCGM_STANDIN_GPUS,
    GPU_ANSWER_ROLES,
    GPU_INFORMATION_SAMPLE,
    PVE_GPUS,
    PVE_IOMMU_GROUPS,
    PVE_PROC_DIR,
    PVE_STANDIN_DIR,
    PVE_STANDIN_LOG,
    PVE_STANDINS,
    PVE_TEMPLATE,
    REPLICA_ROLES,
    plant_replica_gpus,
    prepare_pve_node,
    replica_gpu_information,
)
from lab.vault import guest_ssh_public_keys, throwaway_ssh_public_key, throwaway_vault, vault_secret  # noqa: F401

# How pyinfra reaches the lab's hosts: Docker's exec (the default), or real OpenSSH inside the
# containers (INFERENCE_HOST_LAB_CONNECT=ssh; enable_ssh), as a real site's hosts are reached.
CONNECT = os.environ.get("INFERENCE_HOST_LAB_CONNECT", "docker")


def pyinfra_name(role: str) -> str:
    """The name pyinfra gives the host `@lab/<role>` expands to (the connector's make_names_data):
    the one pyinfra's own connector would give it, so --limit, messages and the checks keep it."""
    return container_name(role) if CONNECT == "ssh" else f"@docker/{container_name(role)}"


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


_local_base_image = ""  # the lab's CUDA devel image as pushed by this process, pinned by digest


def _bring_up_local_builder() -> None:
    """`@lab/local`: this machine's Docker engine as the kernel wheel builder; its base image is
    the lab's CUDA devel image (lab/cuda_image.py), built and pushed to the lab's registry here,
    not while the inventory loads."""
    global _local_base_image
    if "local" in _brought_up:
        return
    from lab.cuda_image import cuda_devel_image

    _local_base_image = cuda_devel_image(build=True)
    _brought_up.add("local")


def pinned_base_image(named: object) -> object:
    """What `@lab/local`'s build_base_image becomes once it is brought up: the inventory's
    placeholder (lab.cuda_image.PENDING) becomes the digest of this process's push; any other
    value (a test's planted digest) stays as the inventory named it."""
    from lab.cuda_image import PENDING

    return _local_base_image if named == PENDING and _local_base_image else named


def fresh(role: str) -> str:
    """The role's container made again from the lab image, as bare as a newly created guest
    (its volumes stay: the node's models, the shared uv cache); what lab.up puts in, put in."""
    _docker("rm", "-f", container_name(role), check=False)
    return up((role,))[0]


def down(roles=MAIN_LAB) -> None:
    for role in roles:
        _docker("rm", "-f", container_name(role), check=False)
    _docker("volume", "rm", "-f", models_volume(), check=False)
