"""roles/gateway: SGLang's model gateway (smg, a Rust binary on PyPI; `sglang-router` is its
older name) as a systemd service in front of the gpu nodes' replicas.

On a host of the gateways group it lays down:

    <gateway_install_dir>/locks/smg-<version>-<stamp>.txt  the committed lock it installs
    <gateway_install_dir>/envs/smg-<version>-<stamp>/      smg's uv environment, exactly that lock
    <gateway_install_dir>/current -> envs/smg-<version>-<stamp>
    /etc/smg/api-key                                 the API key (0600, the gateway's user smg)
    /etc/smg/control-plane-api-key                   the control-plane key (0600, smg)
    /etc/smg/tls.crt, tls.key, tls-ca.crt            with gateway_tls_*: its certificate, key (0600,
                                                     smg) and the CA its clients verify it with (0644)
    /etc/smg/workers-ca.crt                          with TLS replicas: the CA smg verifies them with
    /etc/smg/tenant-api-keys                         the tenants' keys, TENANT:KEY a line (0600, smg)
    /usr/local/libexec/inference-host/smg-launch     starts smg with the key read from that file
    /etc/systemd/system/<unit>.service               --worker-urls from the inventory

The environment is made as the engines' are (roles/shared/locked_env.py): the lock
(inventory/locks/smg-<version>.txt, made by `uv run python -m roles.gateway.lock
inventory/stack.yml <version>` and checked for staleness when the inventory loads) is installed
with `uv pip sync --require-hashes` into a new `.building` folder, renamed into place when
complete; the stamp in its name covers the lock, so a changed lock is a new folder and the live
one is never replaced in place.

The gateway checks the API key (401 without it: smg 1.13.0 answers
{"error": {"code": "invalid_api_key", ...}}) and passes it on to the workers, which bind a
private address. Its control plane (/workers, /flush_cache and the other admin routes) takes the
control-plane key only (smg's --control-plane-api-keys, role admin).
smg probes each worker's /health itself (--health-check-interval-secs) and
routes around one that fails (is_healthy false in GET /workers), which is what the health
checks read to report a replica down as DEGRADED. A rolling upgrade drains a replica through
DELETE /workers/{id} before restarting it and adds it back with POST /workers (roles/serving).
"""

from __future__ import annotations

import io

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import apt, files, server, systemd

from roles.gateway.command import api_key_secret, gateway_arguments
from roles.gateway.tenants import TENANT_KEYS_ENV, TENANT_KEYS_FILE, tenant_api_key_secrets, tenant_keys
from roles.shared import locked_env
from roles.shared import systemd_syntax as sd
from roles.shared import templates as shared_templates
from roles.shared.host_facts import UnitActiveState
from roles.shared.layout import (
    GATEWAY_API_KEY_FILE,
    GATEWAY_CONTROL_PLANE_KEY_FILE,
    GATEWAY_TLS_FILES,
    GATEWAY_WORKERS_CA_FILE,
    LIBEXEC,
    current_link,
    unit_file,
)
from roles.shared.locked_env import EnvironmentStamp, build_command
from roles.shared.replicas import gateway_on_its_host, replicas, workers_ca_file
from roles.shared.secret_files import secret_file
from roles.shared.shell import argv, sh
from roles.shared.system_account import system_account
from roles.shared.tls_files import ca_file_operation, tls_file_operations
from roles.shared.unit_owner import refuse_foreign_units
from roles.shared.uv import uv_environment
from roles.site import HostSettings, Site, current_host, current_site, secret_value
from roles.site import lock as site_lock

LAUNCHER = f"{LIBEXEC}/smg-launch"
API_KEY_FILE = GATEWAY_API_KEY_FILE
SERVICE_USER = "smg"
CONTROL_KEY_ENV = "INFERENCE_HOST_GATEWAY_CONTROL_PLANE_KEY_FILE"


# Bump when the install commands change what an environment holds: every gateway rebuilds.
RECIPE = "lock-sync-1"


def lock_text(site: Site, settings: HostSettings) -> str:
    """The committed lock of this gateway's smg release (beside the stack file)."""
    return site.stack.lock_text(site_lock.gateway_lock_name(settings.gateway.version))


def env_path(site: Site, settings: HostSettings) -> str:
    """<install_dir>/envs/smg-<version>-<stamp>: a changed lock or interpreter is a new folder."""
    stamp = locked_env.stamp((RECIPE, settings.gateway.python, lock_text(site, settings)))
    return f"{settings.gateway.install_dir}/envs/smg-{settings.gateway.version}-{stamp}"


def unit_kwargs(settings: HostSettings, hosts: dict[str, HostSettings]) -> dict:
    """Encoded for systemd (roles/shared/systemd_syntax.py): the template takes nothing else."""
    version = settings.gateway.version
    key_file = API_KEY_FILE if api_key_secret(hosts) else None
    gateway = settings.gateway
    command = [
        f"{current_link(settings.gateway.install_dir)}/bin/python",
        LAUNCHER,
        *gateway_arguments(settings, hosts),
    ]
    return dict(
        version=sd.comment(version),
        worker_count=sd.comment(len(replicas(hosts))),
        description=sd.text(f"SGLang model gateway (smg {version})", "Description= (gateway_version)"),
        service_user=sd.text(SERVICE_USER, "User="),
        api_key_env=sd.environment("INFERENCE_HOST_GATEWAY_KEY_FILE", key_file) if key_file else None,
        control_key_env=sd.environment(CONTROL_KEY_ENV, GATEWAY_CONTROL_PLANE_KEY_FILE)
        if gateway.control_plane_api_key_secret
        else None,
        tenant_keys_env=sd.environment(TENANT_KEYS_ENV, TENANT_KEYS_FILE) if tenant_api_key_secrets(hosts) else None,
        exec_start=sd.argv(command, "ExecStart= (the gateway's arguments)"),
    )


def drain_settle_secs(hosts: dict[str, HostSettings]) -> int:
    """How long smg keeps a worker it was asked to remove in Draining (routed nothing) before it
    drops it: the replicas' serving_drain_timeout_s, the longest the rolling switch waits on the
    replica's own running requests (smg does not wait for them: drain_workers.rs)."""
    return max((node.serving.drain_timeout_s for node in replicas(hosts)), default=5)


def templates(settings: HostSettings, hosts: dict[str, HostSettings]) -> list[tuple[str, str, str, dict]]:
    """(path, template, mode, keyword arguments): the deploy writes them (the preview records that)."""
    return [
        (
            LAUNCHER,
            "roles/gateway/templates/smg-launch.j2",
            "0755",
            dict(
                version=settings.gateway.version,
                key_required=bool(api_key_secret(hosts)),
                control_plane_key=bool(settings.gateway.control_plane_api_key_secret),
                tenant_keys=bool(tenant_api_key_secrets(hosts)),
                drain_settle_secs=drain_settle_secs(hosts),
            ),
        ),
        (
            unit_file(settings.gateway.unit_name),
            "roles/gateway/templates/smg.service.j2",
            "0644",
            unit_kwargs(settings, hosts),
        ),
    ]


@deploy("Replicas serving")
def replicas_serving() -> None:
    """An ordering barrier, called by every host at one place in deploy.py, after the gpu nodes'
    roles and before the gateway's.

    pyinfra 3 orders operations as a graph of each host's own sequence (State.get_op_order: a
    topological sort), not by the lines of deploy.py: without a shared operation the gateway
    host's operations ran first and smg started before any replica served. An operation called
    from the same line on every host is one node of that graph; it never runs anything itself.
    """
    server.shell(
        name="Start the gateways once the replicas have switched and serve", commands=["true"], _if=lambda: False
    )


@deploy("Gateway")
def gateway() -> None:
    settings, site = current_host(), current_site()
    # Before any operation of any host: a name the host has as someone else's unit is refused.
    refuse_foreign_units({"gateway_unit_name": settings.gateway.unit_name}, settings.base.install_root)
    changed = [_environment(site, settings)]
    files.directory(name=f"Create {LIBEXEC}", path=LIBEXEC, user="root", group="root", mode="0755")
    changed += [
        files.template(
            name=f"Write {path}",
            src=template,
            dest=path,
            user="root",
            group="root",
            mode=mode,
            jinja_env_kwargs=shared_templates.jinja_env_kwargs(template),
            **kwargs,
        )
        for path, template, mode, kwargs in templates(settings, site.hosts)
    ]
    changed += _api_key(site.hosts)
    changed += _role_keys(settings)
    changed += _tls(settings, site.hosts)
    changed += tenant_keys(site.hosts, SERVICE_USER)
    _start(settings, changed)


def _environment(site: Site, settings: HostSettings):
    """smg's environment, installed exactly from its committed lock (roles/gateway/lock.py)
    into a new stamped folder, as the engine environments are; `current` follows it."""
    gateway, target = settings.gateway, env_path(site, settings)
    name = target.rsplit("/", 1)[1]
    # curl: the restart below waits on the gateway's /health with it, as do the health checks.
    apt.packages(name="Install curl (the gateway's checks)", packages=["curl"], update=True, cache_time=24 * 3600)
    for folder in (f"{gateway.install_dir}/envs", f"{gateway.install_dir}/locks"):
        files.directory(name=f"Create {folder}", path=folder, user="root", group="root", mode="0755")
    requirements = f"{gateway.install_dir}/locks/{name}.txt"
    uploaded = files.put(
        name=f"Upload the lock of smg {gateway.version} to {requirements}",
        src=io.BytesIO(lock_text(site, settings).encode()),
        dest=requirements,
        user="root",
        group="root",
        mode="0644",
    )
    built = host.get_fact(EnvironmentStamp, env_dir=target)
    current = current_link(gateway.install_dir)
    installed = server.shell(
        name=f"Build the uv environment of smg {gateway.version} (exactly from its lock) at {target}",
        commands=[build_command(target, gateway.python, requirements, current, pip_check=True)],
        _env=uv_environment(settings),
        _if=lambda: built != name or uploaded.did_change(),
    )
    linked = files.link(name=f"Link {current} to {target}", path=current, target=target, user="root", group="root")
    return [installed, linked]


def _api_key(hosts: dict[str, HostSettings]) -> list:
    system_account(SERVICE_USER, "the gateway")
    files.directory(name="Create /etc/smg", path="/etc/smg", user="root", group="root", mode="0755")
    return _key_file(API_KEY_FILE, api_key_secret(hosts), "API key", "no API key set")


def _role_keys(settings: HostSettings) -> list:
    """The control-plane key, a 0600 file of the gateway's user that smg-launch reads
    (docs/security.md#keys-and-their-roles); the setting removed, the file too."""
    control = settings.gateway.control_plane_api_key_secret
    return _key_file(GATEWAY_CONTROL_PLANE_KEY_FILE, control, "control-plane key", "not set")


def _key_file(path: str, secret: str | None, what: str, unset: str) -> list:
    """One key as a 0600 file of the gateway's user, or the file removed when no secret names it."""
    if not secret:
        return [files.file(name=f"Remove {path} ({unset})", path=path, present=False)]
    deployed = secret_file(
        label=f"the gateway's {what} (secret {secret})",
        value=secret_value(secret) + "\n",
        dest=path,
        user=SERVICE_USER,
        group=SERVICE_USER,
    )
    return [deployed] if deployed is not None else []


def _tls(settings: HostSettings, hosts: dict[str, HostSettings]) -> list:
    """gateway_tls_*: smg's certificate and key, 0600 files of its user, and the CA its clients on
    this host verify it with (roles/shared/tls_files.py, as the engine's); with replicas that serve
    TLS, their CA (serving_tls_ca_file, 0644) for --ca-cert-paths. A change restarts smg (_start)."""
    gateway = settings.gateway
    written = tls_file_operations(
        GATEWAY_TLS_FILES,
        (gateway.tls_cert_secret, gateway.tls_key_secret),
        gateway.tls_ca_file,
        (SERVICE_USER, SERVICE_USER),
        "the gateway",
        "gateway",
    )
    put = ca_file_operation(
        GATEWAY_WORKERS_CA_FILE,
        workers_ca_file(hosts),
        "the CA smg verifies its TLS workers with, serving_tls_ca_file",
        "no replica serves TLS",
    )
    return [*written, put] if put is not None else written


# How long a (re)started gateway may take to route to a replica: smg registers its
# --worker-urls in the background after it starts listening (smg 1.13.0 server.rs: "Worker
# initialization job submitted (will complete in background)"), checking a worker that does not
# answer yet every --worker-startup-check-interval seconds.
READY_TIMEOUT_S = 120


def _start(settings: HostSettings, changed: list) -> None:
    unit = f"{settings.gateway.unit_name}.service"
    operations = [op for op in changed if op is not None for op in (op if isinstance(op, list) else [op])]
    state = host.get_fact(UnitActiveState, unit=unit)
    server.shell(
        name=f"Reload systemd for the changed {unit}",
        commands=["systemctl daemon-reload"],
        _if=lambda: any(op.did_change() for op in operations),
    )
    started = systemd.service(name=f"Enable and start {unit}", service=unit, running=True, enabled=True)
    restarted = server.shell(
        name=f"Restart {unit} for changed settings",
        commands=[sh("systemctl restart -- {unit}", unit=unit)],
        _if=lambda: state == "active" and any(op.did_change() for op in operations),
    )
    # smg answers /health as soon as it listens, with no worker yet: the endpoint serves once
    # GET /readiness answers 200 {"status":"ready","healthy_workers":N,...} (503 {"status":"not
    # ready","reason":"insufficient healthy workers"} before; smg 1.13.0, seen from the binary).
    base, tls = gateway_on_its_host(settings)
    readiness = f"{base}/readiness"
    server.shell(
        name=f"Wait until {unit} routes to a healthy replica ({readiness} answers 200, at most {READY_TIMEOUT_S} s)",
        commands=[
            sh(
                "for i in $(seq {seconds}); do {curl} && exit 0; sleep 1; done; echo {failed} >&2; exit 1",
                seconds=READY_TIMEOUT_S,
                curl=argv("curl", "-fsS", *tls, "--", readiness),
                failed=f"{unit} never reported a healthy replica at {readiness}; read journalctl -u {unit}"
                " here and the verdict of python -m checks.gateway INVENTORY",
            )
        ],
        _if=lambda: started.did_change() or restarted.did_change(),
    )
