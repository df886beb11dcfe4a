"""Dispatch: which role runs on which host, by inventory group. No operations of its own.

    uv run pyinfra -y inventory/lab.py deploy.py      # the embedded lab
    uv run pyinfra inventory/prod.py deploy.py        # the real machine
"""

from roles.base import base
from roles.health import health
from roles.serving import serving
from roles.sglang import sglang
from roles.site import current_host

settings = current_host()

if settings.in_group("gpu_nodes") or settings.in_group("builders"):
    base()

if settings.in_group("gpu_nodes"):
    sglang()
    serving()

# Last on every gpu node: the health checks judge what the roles above left (roles/health).
if settings.in_group("gpu_nodes"):
    health()
