"""The embedded lab for replicas behind SGLang's model gateway:

    uv run pyinfra -y inventory/lab_replicas.py deploy.py

Two gpu nodes (systemd containers, the stand-in SGLang server as in inventory/lab.py) serve a
whole copy each, bound to their address on Docker's bridge; a third container is the gateways
host and runs the REAL gateway (smg from PyPI). The containers reach each other by address
(Docker's default bridge has no names): each host's ssh_hostname is its container's address,
as the lab last recorded it (loading this file asks Docker nothing); the lab connector, which
brings each `@lab/<role>` up as pyinfra connects to it, puts the running container's in.

The gateway's host is the monitors group too (roles/monitoring): the distribution's Prometheus
and Alertmanager there scrape both replicas' node_exporter, DCGM exporter (the stand-in package
of the lab's NVIDIA repository) and stand-in server's /metrics, smg's /metrics and its own
node_exporter; alerts go to a webhook receiver on that host (tests/lab/test_monitoring.py starts
it). The replicas run the checks' timer. Intervals are short so that a lab test sees an alert fire
and clear within minutes.
"""

import os

import lab
from lab.standins.nvidia_apt_repo import repo as nvidia_apt_standin
from validation import require_valid_inventory

_PLACEHOLDER = {"rep-a": "172.17.0.101", "rep-b": "172.17.0.102", "gw": "172.17.0.100"}


def _address(role: str) -> str:
    """The container's address as the lab recorded it when it brought it up, else (no lab yet:
    `inference-host validate inventory/lab_replicas.py` validates anyway) a placeholder. The checks
    (`python -m checks.gateway`) load this file outside pyinfra: they read the recorded ones,
    which name the replicas at the gateway."""
    return lab.recorded_address(role, _PLACEHOLDER[role])


_vault, _password_file = lab.throwaway_vault()  # with the monitor's basic-auth password
os.environ.setdefault("INFERENCE_HOST_VAULT_PASSWORD_FILE", _password_file)
_ca_bundle = os.environ.get("SSL_CERT_FILE", "/etc/ssl/certs/ca-certificates.crt")
_nvidia = nvidia_apt_standin.url_for(lab.PREFIX)  # served by the lab connector while pyinfra runs

# The firewall (roles/firewall) on every host: this machine, the control machine, is the only
# source of SSH and of the endpoint (its address on Docker's bridge), and reaches the replicas
# straight as a benchmark machine would (the rolling tests send to them); the gateway and the
# monitor are let in from the inventory's groups, and a replica never reaches the other's engine
# (tests/lab/test_replicas.py, test_the_firewall_lets_in_only_the_gateway).
_control = [nvidia_apt_standin.bridge_gateway() + "/32"]
_common = {
    "stack_file": "stack.yml",
    "secrets_file": os.path.relpath(_vault, os.path.dirname(os.path.abspath(__file__))),
    "base_extra_ca_certificates": [_ca_bundle] if os.path.exists(_ca_bundle) else [],
    "firewall_enabled": True,
    "firewall_ssh_allowed_sources": _control,
    "firewall_serving_allowed_sources": _control,
    "firewall_worker_allowed_sources": _control,
}

# Streams through the gateway across the rolling upgrade (tests/lab/test_replicas.py): seconds
# of each (the stand-in decodes 100 tokens/s; INFERENCE_HOST_LAB_STREAM_SECONDS=30 on demand,
# shorter in CI), and a drain timeout that outlasts what a drained replica may still hold: two
# running (one with a long prompt in prefill, 3 s), two queued behind them (at most 2 run at
# once: serving_max_running_requests), and 10 s to spare. Not SGLang's 30 s idle refresh of its
# gauges: the drain reads the live load (/v1/loads, published at idle at once), not the gauges.
# It is also smg's drain settle time, which every re-add waits out (undrain, each rolling step):
# 64 s while it covered the gauges, 34 s now. Same value in every deploy of a run: a change
# would restart the gateway.
_stream_seconds = int(os.environ.get("INFERENCE_HOST_LAB_STREAM_SECONDS", "8"))

# Tests set this to a CA file (tests/lab/test_replicas.py, the TLS test): the gateway and both
# replicas then serve TLS with the certificates and keys that test put into the throwaway vault,
# and the gateway reaches the replicas at https:// verified with that CA.
_tls_ca_file = os.environ.get("INFERENCE_HOST_LAB_TLS_CA_FILE")
_replica_tls = (
    {
        "serving_tls_cert_secret": "engine_tls_cert",
        "serving_tls_key_secret": "engine_tls_key",
        "serving_tls_ca_file": _tls_ca_file,
    }
    if _tls_ca_file
    else {"serving_plaintext_acknowledged": "the lab's Docker bridge, reachable from this machine only"}
)
_gateway_tls = (
    {
        "gateway_tls_cert_secret": "gateway_tls_cert",
        "gateway_tls_key_secret": "gateway_tls_key",
        "gateway_tls_ca_file": _tls_ca_file,
    }
    if _tls_ca_file
    else {"gateway_plaintext_acknowledged": "the lab's Docker bridge, reachable from this machine only"}
)

_replica = {
    **_common,
    "serving_drain_timeout_s": 2 * (_stream_seconds + 4) + 10,
    "serving_max_running_requests": 2,
    "gpu_count": 8,
    "serving_served_model_name": "kimi-k2.5",
    "serving_api_key_secret": "engine_api_key",
    "serving_admin_api_key_secret": "engine_admin_api_key",
    # Bound to the bridge: the gateway reaches it there (and checks the key in front of it).
    "serving_host": "0.0.0.0",
    **_replica_tls,
    # The lock's GPU-free subset in Debian 12's Python 3.11, as in inventory/lab.py.
    "sglang_install_mode": "no-gpu-deps",
    "engine_python": "/usr/bin/python3",
    "sglang_install_leave_out": lab.PYTHON311_LEAVE_OUT,
    "serving_launch_command": ["{env}/bin/python", lab.STANDIN_DEST + "/server.py"],
    # The stand-in reads config.json at start, as SGLang does (no weights role here: the weights
    # lab is inventory/lab.py's).
    "serving_model_path": lab.STANDIN_DEST + "/tiny-model",
    "serving_ready_timeout": int(os.environ.get("INFERENCE_HOST_LAB_READY_TIMEOUT", "20")),
    "serving_extra_env": {"INFERENCE_HOST_STANDIN_LOAD_SECONDS": "1"},
    "health_after_deploy": ["service", "server"],
    "cuda_repo_url": f"{_nvidia}/compute/cuda/repos",
    "cuda_repo_key_fingerprint": nvidia_apt_standin.SIGNING_KEY_FINGERPRINT,  # the stand-in's signing key
    # The checks' timer (roles/monitoring): often enough for an alert test to see a restart loop
    # within a minute or two; the budget is a whole CPU and 40 s, as the lab's two cores are
    # shared with the test and other labs (a run took 10-16 s at a load of 15-20; 25 s was too
    # little while the deploy of the other hosts still ran).
    "monitoring_check_interval": "45s",
    "monitoring_check_cpu_quota_percent": 100,
    "monitoring_check_timeout_s": 40,
    # DCGM's Xid window (dcgm-exporter -x): GpuXidError clears this long after a planted Xid.
    "monitoring_xid_window_s": 30,
}

gpu_nodes = [
    ("@lab/rep-a", {**_replica, "ssh_hostname": _address("rep-a")}),
    ("@lab/rep-b", {**_replica, "ssh_hostname": _address("rep-b")}),
]

gateways = [
    (
        "@lab/gw",
        {
            **_common,
            "ssh_hostname": _address("gw"),
            "gateway_health_check_interval": 1,
            # /workers and smg's admin routes take this key only.
            "gateway_control_plane_api_key_secret": "gateway_control_plane_api_key",
            **_gateway_tls,
            # The container's own Python (Debian 12: 3.11): uv's managed CPython builds come from
            # GitHub, which the lab cannot reach. The lock (made for 3.12) names the same packages
            # here and carries their 3.11 wheels' hashes too: the install is still hash-checked.
            "gateway_python": "/usr/bin/python3",
        },
    ),
]

# The same host (pyinfra merges a host's data across its groups: one dict, given in both).
_monitor = {
    "monitoring_web_password_secret": "monitoring_web_password",
    "monitoring_webhook_url": "http://127.0.0.1:9099/alerts",
    # Short enough for a lab test to see each alert fire and clear: scrape and evaluate every 5 s,
    # a failing check and a silent /metrics alert after 20 s, restarts counted over a minute, alerts
    # sent 5 s after they fire, and 10 s after they join a group that already fired (the replicas'
    # 'cuda works' fails all along: no torch in the lab).
    "monitoring_scrape_interval": "5s",
    "monitoring_check_failing_for": "20s",
    "monitoring_alert_group_wait": "5s",
    "monitoring_alert_group_interval": "10s",
    "monitoring_down_for": "20s",
    "monitoring_restart_window": "1m",
}
gateways[0][1].update(_monitor)
monitors = [gateways[0]]

require_valid_inventory(__file__, globals())
