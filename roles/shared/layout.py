"""Where things live on an engine host, for the roles that make them and those that use them."""

from __future__ import annotations

from roles.shared.engine_env import stamp
from roles.site import EngineStack, HostSettings, Site, current_site


def env_dir(settings: HostSettings, stack: EngineStack, site: Site | None = None) -> str:
    """The uv environment of one engine stack as this deploy builds it (roles/engine_envs builds it,
    roles/serving runs it): <base_install_root>/envs/<stack id>-<stamp>."""
    return f"{settings.base.install_root}/envs/{stamp(site or current_site(), settings, stack)}"
