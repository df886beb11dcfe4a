"""The embedded lab: the same deploy, rehearsed on local systemd containers.

    uv run pyinfra -y inventory/lab.py deploy.py

Loading this file under pyinfra brings the lab up by itself (lab/__init__.py): a Debian 12
base image made with debootstrap when no registry answers, a systemd image on top, and one
container per rehearsal host, reached through pyinfra's @docker connector. No GPU exists
here: the gpu settings describe what the production guest has, and roles that need a GPU
are proven on real hardware (README: "What is verified where").
"""

import os

import pyinfra

import lab
from roles.site import require_valid_inventory

# A throwaway vault (random values, random password under .lab/), made on first use.
_vault, _password_file = lab.throwaway_vault()
os.environ.setdefault("INFERENCE_HOST_VAULT_PASSWORD_FILE", _password_file)

# This machine reaches PyPI only through a TLS-inspecting proxy: the container must trust
# the same CA bundle (the setting a site behind such a proxy uses too).
_ca_bundle = os.environ.get("SSL_CERT_FILE", "/etc/ssl/certs/ca-certificates.crt")

_site = {
    "stack_file": "stack.yml",
    "secrets_file": os.path.relpath(_vault, os.path.dirname(os.path.abspath(__file__))),
}

gpu_nodes = [
    (lab.pyinfra_name("gpu"), {
        **_site,
        "base_extra_ca_certificates": [_ca_bundle] if os.path.exists(_ca_bundle) else [],
        "gpu_count": 8,                          # what the production guest has
        "gpu_arch": "sm120",
        "serving_served_model_name": "kimi-k2.5",
        "serving_api_key_secret": "sglang_api_key",
        "serving_hf_token_secret": "hf_token",
    }),
]

# No builder here: Docker does not run inside these containers. The kernel wheel builder is
# rehearsed on this machine's own engine by inventory/lab_builder.py (roles/wheels/README.md).
builders = []

require_valid_inventory(__file__)

if pyinfra.is_cli:  # `python -m roles.site inventory/lab.py` validates without starting anything
    lab.up()
