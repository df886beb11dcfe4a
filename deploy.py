"""Dispatch: which role runs on which host, by inventory group. No operations of its own.

    uv run pyinfra -y inventory/lab.py deploy.py      # the embedded lab
    uv run pyinfra inventory/prod.py deploy.py        # the real machine
"""

from roles.base import base
from roles.cuda import cuda
from roles.docker_engine import docker_engine
from roles.health import health
from roles.nvidia_driver import nvidia_driver
from roles.serving import serving
from roles.sglang import sglang
from roles.site import current_host

settings = current_host()
engine_host = settings.in_group("gpu_nodes")
builder = settings.in_group("builders")

if engine_host or builder:
    base()

if engine_host:
    nvidia_driver()

if engine_host or builder:
    cuda()

if builder:
    docker_engine()

if engine_host:
    sglang()
    serving()
    # Last: the health checks judge what the roles above left (roles/health).
    health()
