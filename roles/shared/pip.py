"""pip on a host: which CA bundle it trusts and which index it uses (uv: roles/shared/uv.py)."""

from __future__ import annotations

from roles.shared.layout import SYSTEM_CA_BUNDLE
from roles.shared.mirror_auth import pypi_netrc
from roles.site import HostSettings


def pip_environment(settings: HostSettings) -> dict[str, str]:
    """pip on the host: trust the system bundle (with the extra CAs) and use the site's mirror."""
    env = {"PIP_CERT": SYSTEM_CA_BUNDLE, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    if settings.base.pypi_index_url:
        env["PIP_INDEX_URL"] = settings.base.pypi_index_url
    netrc = pypi_netrc(settings)  # the mirror's login: only the 0600 file's path is in the environment
    if netrc:
        env["NETRC"] = netrc
    return env
