"""pip and uv on a host: which CA bundle they trust and which index they use."""

from __future__ import annotations

from roles.site import HostSettings

# Debian/Ubuntu's bundle, with the site's extra CAs once roles/base ran update-ca-certificates.
SYSTEM_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


def pip_environment(settings: HostSettings) -> dict[str, str]:
    """pip on the host: trust the system bundle (with the extra CAs) and use the site's mirror."""
    env = {"PIP_CERT": SYSTEM_CA_BUNDLE, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    if settings.base.pypi_index_url:
        env["PIP_INDEX_URL"] = settings.base.pypi_index_url
    return env
