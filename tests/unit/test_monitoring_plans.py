"""Plan tests of roles/monitoring (the real pyinfra CLI on @fake hosts, tests/unit/plans/record.py):
the pinned packages per distribution, the files, the checks' timer, and no secret on any
command line."""

from __future__ import annotations

import json
from functools import cache

from roles.shared.apt_resolve import install_command
from roles.site import load_stack
from roles.site.stack import DCGM_FOR_EXPORTER
from tests.unit.test_gpu_stack_plans import APT_INSTALL, PROJECT_ROOT, plan

STACK = load_stack(PROJECT_ROOT / "inventory" / "stack.yml")
INVENTORY = "inventory_monitoring.py"


@cache
def gpu():
    return plan(INVENTORY, "@fake/gpu-watched")


@cache
def monitor():
    return plan(INVENTORY, "@fake/mon-debian12")


def test_gpu_node_installs_its_exporters_pinned_for_ubuntu():
    p = gpu()
    pins = STACK.monitoring.for_distro("ubuntu2404")
    assert any(
        c.startswith(APT_INSTALL) and f"prometheus-node-exporter={pins['prometheus-node-exporter']}" in c
        for c in p.commands
    ), "\n".join(p.commands)
    # the exporter at its upstream version and DCGM's core at the one it is built against (left to
    # apt, the dependency would be the index's newest), epoch and revision read from the host's
    # index when it runs
    resolve = install_command(
        {
            "datacenter-gpu-manager-exporter": STACK.monitoring.dcgm_exporter,
            "datacenter-gpu-manager-4-core": DCGM_FOR_EXPORTER[STACK.monitoring.dcgm_exporter],
            # the profiling module the counters file's DCGM_FI_PROF_* rows need, pinned like the core
            "datacenter-gpu-manager-4-proprietary": DCGM_FOR_EXPORTER[STACK.monitoring.dcgm_exporter],
        }
    )
    assert any(resolve in c for c in p.commands), "\n".join(p.commands)
    assert not [c for c in p.commands if "datacenter-gpu-manager-exporter=" in c and resolve not in c]
    # it reads the index when it runs, refreshed by the step itself, not from a fact at planning
    step = next(i for i, c in enumerate(p.commands) if resolve in c)
    assert p.commands[step].index("apt-get update") < p.commands[step].index("apt-cache madison")
    assert p.uploads["/etc/default/prometheus-node-exporter"].endswith(
        'ARGS="--web.listen-address=0.0.0.0:9100 --collector.textfile.directory=/var/lib/prometheus/node-exporter"\n'
    )
    dropin = p.uploads["/etc/systemd/system/nvidia-dcgm-exporter.service.d/90-inference-host.conf"]
    assert "-f /etc/dcgm-exporter/inference-host-counters.csv -a 0.0.0.0:9400 -x 300000\n" in dropin
    # GpuXidError reads the windowed count: the file the exporter reads must enable it
    counters = p.uploads["/etc/dcgm-exporter/inference-host-counters.csv"].splitlines()
    assert "DCGM_EXP_XID_ERRORS_COUNT, counter, reported XIDs during last window" in counters


def test_gpu_node_gets_the_checks_timer_with_its_budget():
    p = gpu()
    service = p.uploads["/etc/systemd/system/inference-host-checks.service"]
    assert "CPUQuota=25%" in service and "TimeoutStartSec=90" in service
    assert "OnUnitActiveSec=120s" in p.uploads["/etc/systemd/system/inference-host-checks.timer"]
    assert '"serving_host": "10.0.0.5"' in p.uploads["/etc/inference-host/checks/expect.json"]
    assert any(
        "uv pip sync --quiet --require-hashes" in c and "/opt/inference-host/checks/env-" in c for c in p.commands
    )
    assert "checks/textfile.py" in p.uploads["/opt/inference-host/checks/bundle.tar"]  # one archive, unpacked
    assert any(
        c.startswith("rm -rf -- /opt/inference-host/checks/bundle-")
        and " tar -xf /opt/inference-host/checks/bundle.tar" in c
        for c in p.commands
    ), "\n".join(p.commands)
    assert not any("prometheus=" in c for c in p.commands)  # no Prometheus on a gpu node


def test_the_checks_run_as_their_own_user_with_only_what_they_read():
    """Issue 53: the checks' account first (roles/base), then the engine's environment file 0640
    with its group (never others'), its own copy of the client key, the textfile folder its own,
    and the unit as it."""
    p, user = gpu(), "inference-host-checks"
    (env_file,) = [path for path in p.uploads if path.endswith("/serving/inference-engine.env")]
    release = env_file.rsplit("/", 1)[0]
    account = p.index(f"useradd -d /nonexistent -s /usr/sbin/nologin -g {user} -r -M {user}")
    assert (
        p.index("groupadd -r inference-host-checks")
        < account
        < p.index(f"chown root:{user} {release}/inference-engine.env")
    )
    assert f"chmod 640 {release}/inference-engine.env" in p.commands
    # the client key alone, the checks' own 0600 file; the engine's (with the admin key) stays its own
    (own,) = [c for c in p.commands if "/etc/inference-host/checks/api-key.json.inference-host-new" in c]
    assert f"install -m 0600 --owner={user} --group={user} -T -- " in own
    (engine,) = [c for c in p.commands if f"{release}/inference-engine-secret-args.yaml.inference-host-new" in c]
    assert "install -m 0600 --owner=inference --group=inference -T -- " in engine
    assert (
        '"api_key_file": "/etc/inference-host/checks/api-key.json"'
        in p.uploads["/etc/inference-host/checks/expect.json"]
    )
    assert f"chown {user}:prometheus /var/lib/prometheus/node-exporter" in p.commands
    service = p.uploads["/etc/systemd/system/inference-host-checks.service"]
    assert [line for line in service.splitlines() if line.startswith(("User=", "Group="))] == [
        f"User={user}",
        f"Group={user}",
    ]
    for line in ("SupplementaryGroups=systemd-journal", "ReadWritePaths=/var/lib/prometheus/node-exporter"):
        assert line in service.splitlines()
    assert "\nCapabilityBoundingSet=\nAmbientCapabilities=\n" in service  # no capability at all


def test_monitor_installs_prometheus_pinned_for_debian_and_writes_its_files():
    p = monitor()
    pins = STACK.monitoring.for_distro("debian12")
    for package in ("prometheus", "prometheus-alertmanager", "prometheus-node-exporter"):
        assert any(c.startswith(APT_INSTALL) and f"{package}={pins[package]}" in c for c in p.commands), package
    config = p.uploads["/etc/prometheus/prometheus.yml"]
    assert "10.0.0.5:9100" in config and "10.0.0.5:9400" in config and "10.0.0.5:30000" in config
    assert "10.0.0.9:9093" in config  # Alertmanager where Prometheus listens
    assert "--web.listen-address=10.0.0.9:9090" in p.uploads["/etc/default/prometheus"]
    assert (
        "--storage.tsdb.retention.time=30d --storage.tsdb.retention.size=50GB" in p.uploads["/etc/default/prometheus"]
    )
    assert "GpuXidError" in p.uploads["/etc/prometheus/inference-host.rules.yml"]
    # No secret in alertmanager.yml: the heartbeat URL is the relay's on the loopback. It still goes
    # through the 0600 upload (it held the URL inline before the relay; a diff would show that).
    assert "/etc/prometheus/alertmanager.yml" not in p.uploads
    (alertmanager,) = [text for path, text in p.uploads.items() if "receiver: heartbeat" in str(text)]
    assert "http://10.0.0.9:9099/alerts" in alertmanager and "url: http://127.0.0.1:9097/heartbeat" in alertmanager
    assert "https://hc-ping.com/plan-heartbeat-0000" not in alertmanager
    assert "api_url_file: /etc/prometheus/inference-host-slack.url" in alertmanager
    assert "routing_key_file: /etc/prometheus/inference-host-pagerduty.key" in alertmanager
    assert any(
        "install -m 0600 " in c and " /etc/prometheus/alertmanager.yml.inference-host-new && mv -f -T" in c
        for c in p.commands
    )
    # The relay: its script, its hardened unit, its own user, and its URLs through the 0600 upload.
    assert "def forward(" in p.uploads["/opt/inference-host/alert-relay/alert_relay.py"]
    unit = p.uploads["/etc/systemd/system/inference-host-alert-relay.service"]
    assert "User=inference-host-alert-relay" in unit and "--port 9097" in unit
    assert any(
        "install -m 0600 --owner=inference-host-alert-relay --group=inference-host-alert-relay" in c
        and " /etc/inference-host/alert-relay.json.inference-host-new && mv -f -T" in c
        for c in p.commands
    )
    (relay,) = [
        t
        for path, t in p.uploads.items()
        if path.startswith("/var/lib/inference-host/upload") and '"receivers"' in str(t)
    ]
    relay_config = json.loads(relay)
    assert relay_config.pop("receivers") == {"heartbeat": "https://hc-ping.com/plan-heartbeat-0000"}
    token = relay_config.pop("token")
    assert relay_config == {} and len(token) == 64
    # ...and the same token for Alertmanager, in its own 0600 file, named in each relayed webhook.
    assert any(
        "install -m 0600 " in c
        and " /etc/prometheus/inference-host-alert-relay.token.inference-host-new && mv -f -T" in c
        for c in p.commands
    )
    assert any(
        str(t).strip() == token for path, t in p.uploads.items() if path.startswith("/var/lib/inference-host/upload")
    )
    assert "credentials_file: /etc/prometheus/inference-host-alert-relay.token" in alertmanager


SECRETS = (
    "plan-web-password",
    "https://hc-ping.com/plan-heartbeat-0000",
    "plan-slack-token",
    "plan-pagerduty-key",
)


def test_the_secrets_are_on_no_command_line_and_in_no_plain_upload():
    for p in (gpu(), monitor()):
        plain = {
            path: text for path, text in p.uploads.items() if not path.startswith("/var/lib/inference-host/upload")
        }
        for secret in SECRETS:
            assert not any(secret in c for c in p.commands), secret
            assert not any(secret in str(text) for text in plain.values()), [
                path for path, text in plain.items() if secret in str(text)
            ]
    # each receiver secret reaches the monitor, through the 0600 upload
    staged = [str(t) for path, t in monitor().uploads.items() if path.startswith("/var/lib/inference-host/upload")]
    assert any(t.strip() == "https://hooks.slack.com/services/PLAN/SLACK/plan-slack-token" for t in staged)
    assert any(t.strip() == "plan-pagerduty-key" for t in staged)


def test_an_exporter_installed_at_the_pin_is_not_installed_again():
    """Idempotence: dpkg reports the exporter at 1:4.8.2-1 (the stand-in's epoch): no install step."""
    p = plan("inventory_monitoring_installed.py", "@fake/gpu-watched")
    assert not [c for c in p.commands if "datacenter-gpu-manager-exporter" in c], "\n".join(p.commands)
