"""The site's extra CA certificates (base_extra_ca_certificates) in a host's system bundle."""

from __future__ import annotations

from pyinfra.operations import files, server
from pyinfra.operations.util import any_changed

from roles.shared.layout import extra_ca_file
from roles.site import HostSettings


def trust_extra_cas(settings: HostSettings) -> None:
    """base_extra_ca_certificates in the system bundle (pip, uv, git and curl read it): roles/base
    on gpu nodes, roles/weights on the hosts it alone runs on."""
    uploads = [
        files.put(name=f"Trust extra CA certificate {pem}", src=pem, dest=extra_ca_file(index), mode="0644")
        for index, pem in enumerate(settings.base.extra_ca_certificates)
    ]
    if uploads:
        server.shell(
            name="Rebuild the system CA bundle", commands=["update-ca-certificates"], _if=any_changed(*uploads)
        )
