"""Dispatch: which role runs on which host, by inventory group. No operations of its own.

    uv run pyinfra -y inventory/lab.py deploy.py      # the embedded lab
    uv run pyinfra inventory/prod.py deploy.py        # the real machine

The rebuild is an ordered walk, done by ONE run of the command:

1. the Proxmox node is prepared (IOMMU, vfio, nouveau blacklist, kernel headers, the NVIDIA
   driver built by DKMS, nvidia-uvm at boot, the kernel settings its LXC guests share);
2. it reboots when anything asked for that (proxmox_allow_reboot; otherwise the node stops
   with one message saying what to do, and the same command is run again after the reboot);
3. its guests are created once its driver lists the GPUs (after that reboot), with SSH keys
   for the deploy;
4. the deploy continues inside each guest its node has made and started.

pyinfra plans every host before it runs anything, so what a step finds only after an earlier
step ran (a loaded module, a new guest) cannot be in the same plan: the node's last operation
(continue_in_guests, roles/proxmox_host says why it is built so) runs this command again as a
second and, from a bare node, third pass, which plans with what the first made. A converged
site needs one pass. A guest that is not ready is reported, never an error.

Composition happens here and only here: roles never import each other. The node's operations
come first, then a barrier every host passes (guests_ready), so pyinfra runs all of the nodes'
operations before any of the guests' own.
"""

from pyinfra import logger

from roles.base import base
from roles.cuda import cuda
from roles.docker_engine import docker_engine
from roles.eagle3_training import eagle3_training
from roles.engine_envs import engine_envs
from roles.gateway import gateway, replicas_serving
from roles.health import health
from roles.kvm_guest import kvm_guest
from roles.lxc_guest import lxc_guest
from roles.monitoring import monitoring, watched
from roles.nvidia_driver import nvidia_driver
from roles.proxmox_host import (
    continue_in_guests,
    guest_wait_reason,
    guests_of,
    guests_ready,
    needs_host_driver,
    proxmox_host,
    proxmox_reboot,
)
from roles.serving import serving
from roles.site import current_host
from roles.weights import weights
from roles.wheels import wheels

settings = current_host()
waiting = guest_wait_reason(settings)  # a guest its node has not made (or started) yet
if waiting:
    logger.warning(f"{waiting} (nothing is deployed inside it in this pass)")
engine_host = settings.in_group("gpu_nodes") and not waiting
builder = settings.in_group("builders") and not waiting

if settings.in_group("proxmox_hosts"):
    proxmox_host()
    if needs_host_driver(settings):  # the node's kernel driver serves its LXC guests' GPUs
        nvidia_driver()  # full mode; persistenced and nvidia-uvm start once the module loads
    proxmox_reboot()
    for guest in guests_of(settings.name):
        if guest.in_group("lxc_guests"):
            lxc_guest(guest)
        else:
            kvm_guest(guest)
    weights()  # weights the node keeps for its guests (read-only mount points), before they start

guests_ready()  # every host: guests wait here until their node has made them

if engine_host:
    base()
    nvidia_driver()
    cuda()

if builder:
    if settings.docker.manage_engine:
        docker_engine()
    if settings.build.kernel_wheels:
        wheels()

if engine_host:
    weights()  # on its own disk when no node keeps them; the service waits for a verified copy
    # Installs the kernel wheels the builders made (roles/wheels) from their wheelhouse.
    engine_envs()
    serving()
    if settings.eagle3_training.enabled:
        eagle3_training()  # laid down only: the user starts its steps (systemctl)

if settings.in_group("gateways") and not engine_host:
    base()  # packages, the site's CAs (uv reaches PyPI through them), limits; beside the replicas' roles

replicas_serving()  # every host: the gateways' operations wait for the replicas' (a barrier)

if settings.in_group("gateways"):
    gateway()  # its workers already serve: smg registers them as it starts

if watched(settings) and not waiting:
    # Exporters and the checks' timer on gpu nodes; Prometheus and Alertmanager on monitors.
    monitoring()

if engine_host:
    # Last, after the barrier too: the health checks judge what every role above left
    # (roles/health), and a failed check is the deploy's last word.
    health()

if settings.in_group("proxmox_hosts"):
    # The very last step: a guest this pass created (or that waited for the node's reboot) is
    # deployed by the next pass of the same command, which this starts (roles/proxmox_host).
    continue_in_guests()
