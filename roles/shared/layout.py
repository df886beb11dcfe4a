"""Where things live on an engine host, for the roles that make them and those that use them."""

from __future__ import annotations

from roles.site import EngineStack, HostSettings


def env_dir(settings: HostSettings, stack: EngineStack) -> str:
    """The uv environment of one engine stack (roles/sglang builds it, roles/serving runs it)."""
    return f"{settings.base.install_root}/envs/{stack.id}"
