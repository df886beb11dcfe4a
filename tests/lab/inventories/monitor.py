"""Lab inventory: one host of the monitors group (tests/lab/test_monitoring.py).

    INFERENCE_HOST_LAB_PREFIX=... uv run pyinfra -y tests/lab/inventories/monitor.py deploy.py

The real Prometheus, Alertmanager and node_exporter from Debian 12's archive under systemd, their
web endpoints behind basic auth (the lab vault's monitoring_web_password), alerts to a webhook
receiver inside the container (started by the test). No gpu node: the checks' metrics are
planted in node_exporter's textfile directory by the test.
"""

import os
from pathlib import Path

import pyinfra

import lab
from roles.site import vault as secrets
from validation import require_valid_inventory

if pyinfra.is_cli:
    lab.up(("mon",))

_vault, _password_file = lab.throwaway_vault()
os.environ.setdefault("INFERENCE_HOST_VAULT_PASSWORD_FILE", _password_file)
if "monitoring_web_password" not in secrets.load(Path(_vault)):
    import secrets as random

    secrets.set_secret(Path(_vault), "monitoring_web_password", random.token_urlsafe(18),
                       Path(_password_file).read_bytes().strip())

here = os.path.dirname(os.path.abspath(__file__))
monitors = [(lab.pyinfra_name("mon"), {
    "stack_file": os.path.relpath(os.path.join(lab.PROJECT_ROOT, "inventory", "stack.yml"), here),
    "secrets_file": os.path.relpath(_vault, here),
    "monitoring_web_password_secret": "monitoring_web_password",
    "monitoring_webhook_url": "http://127.0.0.1:9099/alerts",
    # Short enough for a lab test to see an alert fire: scrape and evaluate every 5 s, a failing
    # check alerts after 30 s.
    "monitoring_scrape_interval": "5s",
    "monitoring_check_failing_for": "30s",
})]

require_valid_inventory(__file__, globals())
