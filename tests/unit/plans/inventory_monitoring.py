"""Plan inventory: a gpu node on Ubuntu 24.04 watched by a monitors host on Debian 12."""

import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _fake import fake_host

from roles.site import vault
from validation import require_valid_inventory

_dir = Path(tempfile.mkdtemp(prefix="plan-monitoring-"))
(_dir / "password").write_text("plan-password")
_secrets = (
    ("engine_api_key", "plan-key-of-the-monitoring-plan-0123"),
    ("engine_admin_api_key", "plan-admin-key-of-the-monitoring-plan"),
    ("prometheus_web", "plan-web-password"),
    ("heartbeat_url", "https://hc-ping.com/plan-heartbeat-0000"),
    ("slack_url", "https://hooks.slack.com/services/PLAN/SLACK/plan-slack-token"),
    ("pagerduty_key", "plan-pagerduty-key"),
)
for name, value in _secrets:
    vault.set_secret(_dir / "secrets.vault.yml", name, value, b"plan-password")
os.environ["INFERENCE_HOST_VAULT_PASSWORD_FILE"] = str(_dir / "password")

_site = {
    "stack_file": "../../../inventory/stack.yml",
    "secrets_file": os.path.relpath(_dir / "secrets.vault.yml", Path(__file__).parent),
}
gpu_nodes = [
    (
        "@fake/gpu-watched",
        {
            **_site,
            **fake_host("ubuntu2404"),
            "gpu_count": 8,
            "serving_host": "10.0.0.5",
            "serving_plaintext_acknowledged": "unit test: a private network",
            "ssh_hostname": "10.0.0.5",
            "serving_api_key_secret": "engine_api_key",
            "serving_admin_api_key_secret": "engine_admin_api_key",
            "monitoring_check_interval": "2m",
            "monitoring_check_timeout_s": 90,
        },
    )
]
monitors = [
    (
        "@fake/mon-debian12",
        {
            **_site,
            **fake_host("debian12"),
            "ssh_hostname": "10.0.0.9",
            "monitoring_listen_address": "10.0.0.9",
            "monitoring_web_password_secret": "prometheus_web",
            "monitoring_webhook_url": "http://10.0.0.9:9099/alerts",
            "monitoring_heartbeat_url_secret": "heartbeat_url",
            "monitoring_slack_api_url_secret": "slack_url",
            "monitoring_pagerduty_routing_key_secret": "pagerduty_key",
        },
    )
]

require_valid_inventory(__file__, globals())
