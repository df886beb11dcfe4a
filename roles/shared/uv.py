"""uv on a host: which CA bundle it trusts, which index it uses and where its caches live
(pip: roles/shared/pip.py)."""

from __future__ import annotations

from roles.shared.layout import SYSTEM_CA_BUNDLE
from roles.shared.mirror_auth import pypi_netrc
from roles.site import HostSettings


def uv_environment(settings: HostSettings) -> dict[str, str]:
    """uv on a host: the system CA bundle, the site's index mirror for packages and its mirror
    for uv's managed CPython builds (uv's documented UV_* variables)."""
    root = settings.base.install_root
    env = {
        "SSL_CERT_FILE": SYSTEM_CA_BUNDLE,
        "UV_NO_PROGRESS": "1",
        "UV_CACHE_DIR": f"{root}/uv-cache",
        "UV_PYTHON_INSTALL_DIR": f"{root}/python",
    }
    if settings.base.pypi_index_url:
        env["UV_INDEX_URL"] = settings.base.pypi_index_url
    netrc = pypi_netrc(settings)  # the mirror's login: only the 0600 file's path is in the environment
    if netrc:
        env["NETRC"] = netrc
    if settings.base.python_install_mirror:
        env["UV_PYTHON_INSTALL_MIRROR"] = settings.base.python_install_mirror
    return env
