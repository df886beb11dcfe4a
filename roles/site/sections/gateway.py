"""roles/gateway: the smg model gateway (gateway_*)."""

from __future__ import annotations

import re
from typing import Annotated, ClassVar

from pydantic import Field

from roles.site.fields import (
    HostFolder,
    IpAddress,
    PlaintextReason,
    SecretName,
    Section,
    ServiceUnitName,
    check,
    one_of,
    positive,
    tcp_port,
)
from roles.site.grammars import host_path_problem, world_writable_problem
from roles.site.sections.base import CaFile


class GatewaySettings(Section):
    """roles/gateway on the gateways group: SGLang's model gateway (the smg package, a Rust
    binary; sglang-router is its older name) in front of the gpu nodes' replicas. It checks
    the gpu nodes' serving_api_key_secret and passes it on to them; its control plane takes
    gateway_control_plane_api_key_secret only (docs/security.md#keys-and-their-roles)."""

    PREFIX: ClassVar[str] = "gateway_"

    @property
    def tls_enabled(self) -> bool:
        """Whether the gateway serves TLS: gateway_tls_cert_secret and gateway_tls_key_secret both set."""
        return bool(self.tls_cert_secret and self.tls_key_secret)

    @property
    def plaintext_reason(self) -> str | None:
        """gateway_plaintext_acknowledged where the gateway serves plain HTTP (no TLS), else None."""
        return None if self.tls_enabled else self.plaintext_acknowledged

    version: Annotated[str, check(re.compile(r"^\d+\.\d+\.\d+$").match, "a release like 1.13.0")] = Field(
        "1.13.0",
        description=(
            "The smg release, installed exactly from its committed lock (locks/smg-<version>.txt "
            "beside the stack file)."
        ),
    )
    install_dir: HostFolder = Field(
        "/opt/smg",
        description=("Root of the gateway's environments (envs/smg-<version>-<stamp>) and its `current` link."),
    )
    python: Annotated[
        str,
        check(
            lambda v: (
                re.fullmatch(r"3\.\d+", v)
                or (v.startswith("/") and not host_path_problem(v) and not world_writable_problem(v))
            ),
            "a Python version like 3.12 or an absolute path without shell syntax, outside /tmp",
        ),
    ] = Field(
        "3.12",
        description=("Interpreter uv builds the gateway environment with: '3.12' (the lock's target) or a path."),
    )
    unit_name: ServiceUnitName = Field("smg", description=("Name of the gateway's systemd unit."))
    host: IpAddress = Field("0.0.0.0", description="Address the gateway binds.")
    plaintext_acknowledged: PlaintextReason | None = Field(
        None,
        description=(
            "Why the gateway may serve plain HTTP beyond loopback here (the bearer key and the prompts"
            " cross the network in clear): required when gateway_host is not a loopback address;"
            " docs/security.md#tls. None: gateway_host must be loopback."
        ),
    )
    tls_cert_secret: SecretName | None = Field(
        None,
        description=(
            "Vault key of the gateway's TLS certificate (PEM, the chain from the server's own): with"
            " gateway_tls_key_secret smg serves HTTPS (--tls-cert-path), and gateway_host may leave"
            " loopback without gateway_plaintext_acknowledged (docs/security.md#tls)."
        ),
    )
    tls_key_secret: SecretName | None = Field(
        None,
        description=(
            "Vault key of the private key of gateway_tls_cert_secret (PEM, unencrypted), --tls-key-path: a"
            " 0600 file of the gateway's user, never on a command line."
        ),
    )
    tls_ca_file: CaFile | None = Field(
        None,
        description=(
            "Local PEM file of the CA that signed gateway_tls_cert_secret, uploaded 0644 to the gateway and"
            " the replicas behind it: the checks, `inference-host status`, the rolling drain and the"
            " benchmark verify the gateway with it. None: the hosts' CA bundle."
        ),
    )
    port: Annotated[int, tcp_port] = Field(8000, description=("The gateway's HTTP port (the endpoint clients use)."))
    policy: Annotated[str, one_of("cache_aware", "round_robin", "random", "power_of_two")] = Field(
        "cache_aware",
        description=(
            "smg's --policy: cache_aware keeps requests sharing a prefix on the replica whose radix cache holds it."
        ),
    )
    prometheus_host: IpAddress = Field(
        "127.0.0.1", description=("Where the gateway's /metrics listens (--prometheus-host).")
    )
    prometheus_port: Annotated[int, tcp_port] = Field(
        29000, description=("Port of the gateway's /metrics (--prometheus-port).")
    )
    control_plane_api_key_secret: SecretName | None = Field(
        None,
        description=(
            "Vault key (named *api_key) of smg's control-plane key (--control-plane-api-keys, role admin):"
            " the only key its /workers and admin routes take; the rolling upgrade drains with it. Required"
            " when the replicas have serving_api_key_secret."
        ),
    )
    health_check_interval: Annotated[int, positive] = Field(
        5, description=("Seconds between smg's probes of each worker's /health (--health-check-interval-secs).")
    )
    health_failure_threshold: Annotated[int, positive] = Field(
        2, description=("Failed probes before smg routes around a worker (--health-failure-threshold).")
    )
