"""Dispatch: which role runs on which host, by inventory group. No operations of its own.

    uv run pyinfra -y inventory/lab.py deploy.py      # the embedded lab
    uv run pyinfra inventory/prod.py deploy.py        # the real machine

The Proxmox node's operations come first in this file, so pyinfra runs them before the guests'
own: the guests exist and have their GPUs before the rest of the deploy continues inside them.
"""

from roles.base import base
from roles.kvm_guest import kvm_guest
from roles.lxc_guest import lxc_guest
from roles.proxmox_host import guests_of, proxmox_host
from roles.site import current_host

settings = current_host()

if settings.in_group("proxmox_hosts"):
    proxmox_host()
    for guest in guests_of(settings.name):
        if guest.in_group("lxc_guests"):
            lxc_guest(guest)
        else:
            kvm_guest(guest)

if settings.in_group("gpu_nodes") or settings.in_group("builders"):
    base()
