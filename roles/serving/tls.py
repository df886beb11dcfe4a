"""roles/serving's TLS (serving_tls_*, docs/security.md#tls): the certificate, its key and the CA on
the host, how the unit's readiness probe reaches an engine that serves HTTPS, and, on a replica
behind gateways that serve TLS, the gateways' CA its rolling drain and the benchmark verify them with."""

from __future__ import annotations

from pyinfra.operations import files

from roles.shared import layout
from roles.shared.replicas import gateway_ca_file, gateways, gateways_ca_on_replicas, replicas
from roles.shared.tls import curl_tls_options, https_url, local_address
from roles.shared.tls_files import ca_file_operation, tls_file_operations
from roles.site import HostSettings, address_of


def probe_address(settings: HostSettings) -> str:
    """Where the engine answers on its own host: loopback of the same family for a wildcard bind."""
    return local_address(settings.serving.host)


def tls_probe_url(settings: HostSettings, path: str) -> str:
    """https://NAME:PORT/PATH, NAME the node's address_of (ssh_hostname, else its inventory name):
    the name the certificate covers; probe_tls_options connects to probe_address."""
    return https_url(address_of(settings), settings.serving.port, path)


def engine_ca(settings: HostSettings) -> str:
    """The CA file on the node its engine's certificate is verified with: serving_tls_ca_file's
    copy, else the host's bundle."""
    return (
        layout.tls_files(settings.serving.unit_name)["ca"] if settings.serving.tls_ca_file else layout.SYSTEM_CA_BUNDLE
    )


def probe_tls_options(settings: HostSettings) -> list[str]:
    """curl's options for the readiness probe of an engine serving TLS (as checks/server_checks.py's
    tls_options): the certificate verified with serving_tls_ca_file's CA (else the host's bundle),
    for the name the probe's URL asks, connecting to the engine's own address."""
    if not settings.serving.tls_enabled:
        return []
    return curl_tls_options(engine_ca(settings), probe_address(settings))


def rolling_tls_options(settings: HostSettings, hosts: dict[str, HostSettings]) -> list[str]:
    """inference-engine-rolling's CA options: the replica's own CA for its https:// worker URL, the
    gateways' for their https:// control plane; none where neither serves TLS."""
    options = ["--worker-ca", engine_ca(settings)] if settings.serving.tls_enabled else []
    if any(g.gateway.tls_enabled for g in gateways(hosts)):
        options += ["--gateway-ca", gateways_ca_on_replicas(hosts)]
    return options


def tls_operations(settings: HostSettings, hosts: dict[str, HostSettings]) -> list:
    """serving_tls_*: the certificate and its key as 0600 files of the service user and the CA the
    checks verify with (0644), all removed without TLS (roles/shared/tls_files.py); a change
    restarts the engine through the switch (uvicorn reads them once, at start). Also the gateways'
    CA on a replica behind gateways that serve TLS, which restarts nothing (only clients read it)."""
    files.directory(
        name=f"Create {layout.STABLE_DIR} (TLS files)", path=layout.STABLE_DIR, user="root", group="root", mode="0755"
    )
    serving, path, source = settings.serving, layout.REPLICA_GATEWAY_CA_FILE, gateway_ca_file(hosts)
    behind_gateways = settings.name in [node.name for node in replicas(hosts)]
    ca_file_operation(
        path,
        source if behind_gateways else None,
        "the CA the gateways' certificates are verified with, gateway_tls_ca_file",
        "behind no gateway with gateway_tls_ca_file",
    )
    return tls_file_operations(
        layout.tls_files(serving.unit_name),
        (serving.tls_cert_secret, serving.tls_key_secret),
        serving.tls_ca_file,
        (settings.base.service_user, settings.base.service_group),
        "the engine",
        "serving",
    )
