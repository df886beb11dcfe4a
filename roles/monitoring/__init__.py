"""roles/monitoring: the machine watches itself between deploys.

On every gpu node (and every monitor, for its own disk): the distribution's
prometheus-node-exporter with its textfile collector. On every gpu node also: NVIDIA's DCGM
exporter (datacenter-gpu-manager-exporter, from NVIDIA's CUDA repository that roles/cuda
configures), and inference-host-checks.timer, which runs the fast health suites every
monitoring_check_interval and writes their verdicts and evidence for node_exporter
(checks/textfile.py), from a copy of the checks in an environment installed exactly from
the project's uv.lock (roles/monitoring/checks_env.py).

On the monitors group: the distribution's prometheus and prometheus-alertmanager, configured
from the site model (roles/monitoring/config.py: scrape jobs, alert rules with the health
settings' thresholds, the receiver; the alerts' texts in roles/monitoring/runbook.py), their web
endpoints on monitoring_listen_address behind basic auth (bcrypt hash of the vault's
monitoring_web_password_secret, in a 0600 file). Where a webhook or heartbeat URL comes from the
vault, also the alert relay (files/alert_relay.py, its own user and unit): Alertmanager posts to it
on the loopback, so no Alertmanager config or log line holds that URL.

Versions: inventory/stack.yml `monitoring:` (exact apt versions per distribution).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import io

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.facts.files import File
from pyinfra.operations import apt, files, server, systemd

from roles.monitoring import config, units
from roles.monitoring.checks_timer import install_checks_timer
from roles.monitoring.dashboard import DASHBOARD_FILE
from roles.shared import templates
from roles.shared.apt_resolve import install_resolved
from roles.shared.nvidia_repo import DCGM_CORE_PACKAGE, current_distro, ensure_cuda_repository
from roles.shared.secret_files import secret_file
from roles.shared.shell import sh
from roles.shared.system_account import system_account
from roles.site import PROJECT_ROOT, HostSettings, Site, current_host, current_site, secret_value
from roles.site.stack import DCGM_FOR_EXPORTER

NODE_EXPORTER = "prometheus-node-exporter"
PROMETHEUS_USER = "prometheus"  # the Debian/Ubuntu packages' service user
DCGM_EXPORTER_PACKAGE = "datacenter-gpu-manager-exporter"


# DCGM's profiling module (libdcgmmoduleprofiling.so.4), without which the exporter drops the
# counters file's DCGM_FI_PROF_* rows (NVIDIA/dcgm-exporter pkg/cmd/app.go queryDCPMetrics, tag
# 4.5.3-4.8.2; its own images install this package beside -core since PR #456).
DCGM_PROFILING_PACKAGE = "datacenter-gpu-manager-4-proprietary"


def exporter_pins(version: str) -> dict[str, str]:
    """The exporter at stack.yml's version, DCGM's core and its profiling module at the release it
    is built against."""
    dcgm = DCGM_FOR_EXPORTER[version]
    return {DCGM_EXPORTER_PACKAGE: version, DCGM_CORE_PACKAGE: dcgm, DCGM_PROFILING_PACKAGE: dcgm}


MONITOR_PACKAGES = ("prometheus", "prometheus-alertmanager")
# Files on the monitor that only operators read: the Grafana dashboard, amtool's configuration.
FOR_OPERATORS = (DASHBOARD_FILE, config.AMTOOL_CONFIG, config.AMTOOL_HTTP_CONFIG)


def watched(settings: HostSettings, site: Site | None = None) -> bool:
    """The role runs where a monitor watches: on the monitors themselves and, when the site has
    a monitors group, on every gpu node (exporters nobody scrapes are not installed)."""
    return settings.in_group("monitors") or (
        settings.in_group("gpu_nodes") and bool((site or current_site()).group("monitors"))
    )


@deploy("Monitoring")
def monitoring() -> None:
    settings, site = current_host(), current_site()
    distro = current_distro("roles/monitoring")
    assert site.stack.monitoring is not None, "the site rules require the pins with a monitors group"
    pins = site.stack.monitoring.for_distro(distro.nvidia_path)
    # The distribution's packages in one apt-get install: each install reads apt's lists anew
    # (about a second and a half each in the lab's bare-to-healthy run). The DCGM exporter is
    # apart: its version is resolved from NVIDIA's index on the host when the step runs.
    _apt(
        [
            (NODE_EXPORTER, pins[NODE_EXPORTER]),
            *([(p, pins[p]) for p in MONITOR_PACKAGES] if settings.in_group("monitors") else []),
        ]
    )
    _node_exporter(settings, site)
    if settings.in_group("gpu_nodes"):
        if settings.monitoring.dcgm_exporter:
            _dcgm_exporter(settings, site, distro)
        install_checks_timer(settings, site)
    if settings.in_group("monitors"):
        _monitor(settings, site)


def _apt(pinned: list[tuple[str, str]]) -> None:
    apt.packages(
        name="Install " + ", ".join(f"{p} {v}" for p, v in pinned),
        packages=[f"{p}={v}" for p, v in pinned],
        update=True,
        cache_time=24 * 3600,
        no_recommends=True,
    )


def _node_exporter(settings: HostSettings, site: Site) -> None:
    files.directory(
        name=f"Create the textfile collector's directory {config.TEXTFILE_DIR}",
        path=config.TEXTFILE_DIR,
        user=units.CHECKS_USER if settings.in_group("gpu_nodes") else PROMETHEUS_USER,  # the checks write there
        group=PROMETHEUS_USER,
        mode="0755",
    )
    path, template, kwargs = units.node_exporter_template(settings, site)
    written = files.template(
        name=f"Write {path} (listen {kwargs['listen']}, textfile {config.TEXTFILE_DIR})",
        src=template,
        dest=path,
        mode="0644",
        jinja_env_kwargs=templates.jinja_env_kwargs(template),
        **kwargs,
    )
    systemd.service(
        name=f"Enable and start {NODE_EXPORTER}",
        service=NODE_EXPORTER,
        running=True,
        enabled=True,
        restarted=written.will_change,
    )


def _dcgm_exporter(settings: HostSettings, site: Site, distro) -> None:
    ensure_cuda_repository(settings, distro)
    assert site.stack.monitoring is not None, "the site rules require the pins with a monitors group"
    version = site.stack.monitoring.dcgm_exporter
    # With the DCGM it is built against: left to apt, its dependency would be the index's newest.
    install_resolved("the DCGM exporter", exporter_pins(version))
    counters = files.put(
        name=f"Write {units.DCGM_COUNTERS} (upstream's counters plus the windowed Xid count)",
        src=str(PROJECT_ROOT / units.DCGM_COUNTERS_TEMPLATE),
        dest=units.DCGM_COUNTERS,
        mode="0644",
    )
    path, text = units.dcgm_dropin(settings, site)
    files.directory(name=f"Create {path.rsplit('/', 1)[0]}", path=path.rsplit("/", 1)[0], mode="0755")
    dropin = files.put(
        name=f"Write {path} (dcgm-exporter on port {settings.monitoring.dcgm_exporter_port})",
        src=io.StringIO(text),
        dest=path,
        mode="0644",
    )
    systemd.service(
        name=f"Enable and start {units.DCGM_EXPORTER_UNIT}",
        service=units.DCGM_EXPORTER_UNIT,
        running=True,
        enabled=True,
        daemon_reload=dropin.will_change,
        restarted=dropin.will_change or counters.will_change,
    )


def password_hash(password: str, host_name: str) -> str:
    """bcrypt (cost 12) of the password, with a salt derived from it and the host: the same
    input gives the same hash, so a deploy that changes nothing rewrites nothing."""
    import bcrypt

    raw = hmac.new(password.encode(), f"inference-host web.config {host_name}".encode(), hashlib.sha256).digest()[:16]
    # bcrypt's base64 alphabet (./A-Za-z0-9) in place of the standard one, 22 characters.
    salt = (
        base64.b64encode(raw)
        .decode()
        .translate(
            str.maketrans(
                "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/",
                "./ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789",
            )
        )[:22]
    )
    return bcrypt.hashpw(password.encode(), f"$2b$12${salt}".encode()).decode()


def _monitor(settings: HostSettings, site: Site) -> None:
    m = settings.monitoring
    for folder in (m.data_dir, config.ALERTMANAGER_DATA_DIR):
        files.directory(name=f"Create {folder}", path=folder, user=PROMETHEUS_USER, group=PROMETHEUS_USER, mode="0750")
    password = secret_value(m.web_password_secret) if m.web_password_secret else None
    hashed = password_hash(password, settings.name) if password else None
    changed = []
    for path, text in config.files(site, settings, hashed).items():
        if path in (config.WEB_CONFIG_FILE, config.ALERTMANAGER_FILE):
            continue
        written = files.put(name=f"Write {path}", src=io.StringIO(text), dest=path, mode="0644")
        if path not in FOR_OPERATORS:  # no service reads these: a new one restarts nothing
            changed.append(written)
    for path, template, kwargs in units.monitor_templates(settings):
        changed.append(
            files.template(
                name=f"Write {path} (listen {kwargs['listen']})",
                src=template,
                dest=path,
                mode="0644",
                jinja_env_kwargs=templates.jinja_env_kwargs(template),
                **kwargs,
            )
        )
    # The hash and the password Prometheus gives Alertmanager: 0600, the services' own user.
    changed.append(
        secret_file(
            label="the web endpoints' basic auth (bcrypt hash)",
            value=config.web_config(settings, hashed),
            dest=config.WEB_CONFIG_FILE,
            user=PROMETHEUS_USER,
            group=PROMETHEUS_USER,
        )
    )
    # No secret in it now, but written as one (0600, never in a diff): before the relay, Debian 12's
    # Alertmanager 0.25 had the vault's webhook URLs inline in it, and the diff of the first deploy
    # after an upgrade would print the old lines.
    changed.append(
        secret_file(
            label="Alertmanager's configuration",
            value=config.files(site, settings, hashed)[config.ALERTMANAGER_FILE],
            dest=config.ALERTMANAGER_FILE,
            user=PROMETHEUS_USER,
            group=PROMETHEUS_USER,
        )
    )
    secrets = [
        (config.PASSWORD_FILE, m.web_password_secret and password),
        (config.SMTP_PASSWORD_FILE, m.email_auth_password_secret and secret_value(m.email_auth_password_secret)),
        # (stripped: a value set from `echo URL |` ends in a line break; the site model checked each is one URL)
        *((path, key and secret_value(key).strip()) for path, key in config.secret_files(settings).items()),
        *((path, None) for path in config.RETIRED_FILES),
    ]
    for path, value in secrets:
        if value:
            changed.append(
                secret_file(
                    label=f"a secret for {path.rsplit('/', 1)[1]}",
                    value=value + "\n",
                    dest=path,
                    user=PROMETHEUS_USER,
                    group=PROMETHEUS_USER,
                )
            )
        else:
            changed.append(files.file(name=f"Remove {path} (not set)", path=path, present=False))
    _alert_relay(settings)
    restart = any(op is not None and op.will_change for op in changed)
    for unit in ("prometheus", "prometheus-alertmanager"):
        systemd.service(name=f"Enable and start {unit}", service=unit, running=True, enabled=True, restarted=restart)


def _alert_relay(settings: HostSettings) -> None:
    """The relay that holds the vault's webhook and heartbeat URLs (Alertmanager posts to it on
    the loopback): its own system user, the distribution's python3, a hardened unit. Without such
    a receiver it is stopped and its files removed."""
    receivers = config.relay_receivers(settings)
    unit_path, template, kwargs = units.relay_template(settings)
    if not receivers:
        installed = host.get_fact(File, path=unit_path)
        server.shell(
            name=f"Stop and disable {config.RELAY_UNIT} (no webhook URL in the vault)",
            commands=[sh("systemctl disable --now -- {unit}", unit=f"{config.RELAY_UNIT}.service")],
            _if=lambda: bool(installed),
        )
        for path in (unit_path, config.RELAY_CONFIG, config.RELAY_SCRIPT, config.RELAY_TOKEN_FILE):
            files.file(name=f"Remove {path} (no relay)", path=path, present=False)
        return
    apt.packages(name="Install python3 (the alert relay's interpreter)", packages=["python3"], no_recommends=True)
    system_account(config.RELAY_USER, "the alert relay")
    files.directory(name=f"Create {config.RELAY_DIR}", path=config.RELAY_DIR, user="root", group="root", mode="0755")
    script = files.put(
        name=f"Install the alert relay at {config.RELAY_SCRIPT}",
        src=str(PROJECT_ROOT / config.RELAY_SOURCE),
        dest=config.RELAY_SCRIPT,
        user="root",
        group="root",
        mode="0644",
    )
    values = {key: secret_value(key).strip() for key in receivers.values()}
    urls = secret_file(
        label=f"the alert relay's URLs ({', '.join(receivers)})",
        value=config.relay_config(settings, values),
        dest=config.RELAY_CONFIG,
        user=config.RELAY_USER,
        group=config.RELAY_USER,
    )
    # The same token for Alertmanager to send (0600, its own user): only it may post to the relay.
    secret_file(
        label="the alert relay's token, for Alertmanager",
        value=config.relay_token(settings, values) + "\n",
        dest=config.RELAY_TOKEN_FILE,
        user=PROMETHEUS_USER,
        group=PROMETHEUS_USER,
    )
    unit = files.template(
        name=f"Write {unit_path} (port {settings.monitoring.alert_relay_port} on {config.RELAY_HOST})",
        src=template,
        dest=unit_path,
        mode="0644",
        jinja_env_kwargs=templates.jinja_env_kwargs(template),
        **kwargs,
    )
    systemd.service(
        name=f"Enable and start {config.RELAY_UNIT}",
        service=f"{config.RELAY_UNIT}.service",
        running=True,
        enabled=True,
        daemon_reload=unit.will_change,
        restarted=unit.will_change or script.will_change or (urls is not None and urls.will_change),
    )
