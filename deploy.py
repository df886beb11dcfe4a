"""Dispatch: which role runs on which host, by inventory group. No operations of its own.

    uv run pyinfra -y inventory/lab.py deploy.py      # the embedded lab
    uv run pyinfra inventory/prod.py deploy.py        # the real machine
"""

from roles.base import base
from roles.site import current_host
from roles.wheels import wheels

settings = current_host()

if settings.in_group("gpu_nodes"):
    base()

if settings.in_group("builders"):
    wheels()
