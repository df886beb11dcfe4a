"""Dispatch: which role runs on which host, by inventory group. No operations of its own.

    uv run pyinfra -y inventory/lab.py deploy.py      # the embedded lab
    uv run pyinfra inventory/prod.py deploy.py        # the real machine
"""

from roles.base import base
from roles.cuda import cuda
from roles.docker_engine import docker_engine
from roles.nvidia_driver import nvidia_driver
from roles.site import current_host

settings = current_host()

if settings.in_group("gpu_nodes") or settings.in_group("builders"):
    base()

if settings.in_group("gpu_nodes"):
    nvidia_driver()

if settings.in_group("gpu_nodes") or settings.in_group("builders"):
    cuda()

if settings.in_group("builders"):
    docker_engine()
