"""Dispatch: which role runs on which host, by inventory group. No operations of its own.

    uv run pyinfra -y inventory/lab.py deploy.py      # the embedded lab
    uv run pyinfra inventory/prod.py deploy.py        # the real machine

Composition happens here and only here: roles never import each other. The Proxmox nodes'
operations come first (with roles/nvidia_driver on a node whose LXC guests have GPUs), then a
barrier every host passes (guests_ready), so pyinfra runs all of the nodes' operations before any of the guests' own: the guests exist and
have their GPUs before the rest of the deploy continues inside them.
"""

from roles.base import base
from roles.cuda import cuda
from roles.docker_engine import docker_engine
from roles.gateway import gateway
from roles.health import health
from roles.kvm_guest import kvm_guest
from roles.lxc_guest import lxc_guest
from roles.nvidia_driver import nvidia_driver
from roles.proxmox_host import (
    guests_of,
    guests_ready,
    host_driver_services,
    needs_host_driver,
    proxmox_host,
)
from roles.serving import serving
from roles.sglang import sglang
from roles.site import current_host
from roles.wheels import wheels

settings = current_host()
engine_host = settings.in_group("gpu_nodes")
builder = settings.in_group("builders")

if settings.in_group("proxmox_hosts"):
    proxmox_host()
    if needs_host_driver(settings):  # the node's kernel driver serves its LXC guests' GPUs
        nvidia_driver()
        host_driver_services()
    for guest in guests_of(settings.name):
        if guest.in_group("lxc_guests"):
            lxc_guest(guest)
        else:
            kvm_guest(guest)

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
    # Installs the kernel wheels the builders made (roles/wheels) from their wheelhouse.
    sglang()
    serving()
    # Last: the health checks judge what the roles above left (roles/health).
    health()

if settings.in_group("gateways"):
    # After the replicas' operations: the gateway starts with its workers already serving.
    if not engine_host:
        base()  # packages, the site's CAs (pip reaches PyPI through them), limits
    gateway()
