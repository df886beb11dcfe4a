"""How the project's clients reach a listener that serves TLS (the engine's serving_tls_*, the
gateway's gateway_tls_*; docs/security.md#tls): at https://NAME:PORT, NAME the name the certificate
covers (the host's address_of: ssh_hostname, else its inventory name), verified with a CA file
(curl --cacert; verification is never skipped), connecting to the listener's own address on its host (--connect-to: no
DNS lookup of NAME there). Pure: the roles, the checks and `inference-host` share it."""

from __future__ import annotations

import ipaddress


def url_host(address: str) -> str:
    """An address as a URL's host: an IPv6 address in brackets (RFC 3986), a DNS name as it is."""
    try:
        return f"[{address}]" if ipaddress.ip_address(address).version == 6 else address
    except ValueError:
        return address


def local_address(bound: str) -> str:
    """Where a listener bound to `bound` answers on its own host: loopback of the same family
    for a wildcard bind, as a URL's host."""
    return url_host({"0.0.0.0": "127.0.0.1", "::": "::1"}.get(bound, bound))


def https_url(name: str, port: int, path: str = "") -> str:
    """https://NAME:PORT/PATH, NAME the name the listener's certificate covers."""
    return f"https://{url_host(name)}:{port}{path}"


def curl_tls_options(ca_file: str, connect_address: str) -> list[str]:
    """curl's options for https_url on the listener's own host: the certificate verified with
    ca_file for the name the URL asks, the connection made to connect_address (local_address)."""
    return ["--cacert", ca_file, "--connect-to", f"::{connect_address}:"]
