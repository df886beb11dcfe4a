"""roles/serving's TLS (serving_tls_*, docs/security.md#tls): the certificate, its key and the CA on
the host, and how the unit's readiness probe reaches an engine that serves HTTPS."""

from __future__ import annotations

import ipaddress

from pyinfra.operations import files

from roles.shared import layout
from roles.shared.secret_files import secret_file
from roles.site import HostSettings, address_of, secret_value


def probe_address(settings: HostSettings) -> str:
    """Where the engine answers on its own host: loopback of the same family for a wildcard bind."""
    address = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(settings.serving.host, settings.serving.host)
    return f"[{address}]" if ipaddress.ip_address(address).version == 6 else address


def tls_probe_url(settings: HostSettings, path: str) -> str:
    """https://NAME:PORT/PATH, NAME the node's address_of (ssh_hostname, else its inventory name):
    the name the certificate covers; probe_tls_options connects to probe_address."""
    name = address_of(settings)
    return f"https://{f'[{name}]' if ':' in name else name}:{settings.serving.port}{path}"


def probe_tls_options(settings: HostSettings) -> list[str]:
    """curl's options for the readiness probe of an engine serving TLS (as checks/server_checks.py's
    tls_options): the certificate verified with serving_tls_ca_file's CA (else the host's bundle),
    for the name the probe's URL asks, connecting to the engine's own address."""
    if not settings.serving.tls_enabled:
        return []
    ca = layout.tls_files(settings.serving.unit_name)["ca"] if settings.serving.tls_ca_file else layout.SYSTEM_CA_BUNDLE
    return ["--cacert", ca, "--connect-to", f"::{probe_address(settings)}:"]


def tls_operations(settings: HostSettings) -> list:
    """serving_tls_*: the certificate and its key as 0600 files of the service user (the secret
    installer, roles/shared/secret_files.py: staged in its root-only folder, never on a command
    line or in a log) and the CA the checks verify with (0644); all removed without TLS. A change
    restarts the engine through the switch (uvicorn reads them once, at start)."""
    paths, serving = layout.tls_files(settings.serving.unit_name), settings.serving
    files.directory(
        name=f"Create {layout.STABLE_DIR} (TLS files)", path=layout.STABLE_DIR, user="root", group="root", mode="0755"
    )
    if not serving.tls_enabled:
        for path in paths.values():
            files.file(name=f"Remove {path} (no serving_tls_cert_secret)", path=path, present=False)
        return []
    assert serving.tls_cert_secret and serving.tls_key_secret  # tls_enabled
    written = [
        secret_file(
            label=f"the engine's TLS {what} (secret {name})",
            value=secret_value(name).rstrip("\n") + "\n",
            dest=paths[kind],
            user=settings.base.service_user,
            group=settings.base.service_group,
        )
        for kind, what, name in (
            ("cert", "certificate", serving.tls_cert_secret),
            ("key", "private key", serving.tls_key_secret),
        )
    ]
    if serving.tls_ca_file:
        written.append(
            files.put(
                name=f"Install {paths['ca']} (the CA the checks verify the engine with, serving_tls_ca_file)",
                src=serving.tls_ca_file,
                dest=paths["ca"],
                user="root",
                group="root",
                mode="0644",
            )
        )
    else:
        files.file(name=f"Remove {paths['ca']} (no serving_tls_ca_file)", path=paths["ca"], present=False)
    return [op for op in written if op is not None]
