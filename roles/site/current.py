"""Deploy-time access: the site and host a role is running for (the only reader of host.data)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from roles.site import vault
from roles.site.errors import SiteError
from roles.site.loading import _LOADED_INVENTORY, site_from_inventory
from roles.site.schema import HostSettings, Site


@cache
def _deploy_site(inventory_file: str) -> Site:
    from pyinfra import state

    return site_from_inventory(state.inventory, inventory_file)


def _inventory_file_of() -> str:
    """The inventory pyinfra loaded: recorded by require_valid_inventory as it ran."""
    if _LOADED_INVENTORY:
        return _LOADED_INVENTORY[-1]
    raise SiteError(
        [
            "the inventory file did not call validation.require_valid_inventory(__file__, globals());"
            " every inventory must end with it so that it is validated before connecting"
        ]
    )


def current_site() -> Site:
    return _deploy_site(_inventory_file_of())


def current_host() -> HostSettings:
    from pyinfra import host

    return current_site().hosts[host.name]


# Set by the preview (roles/render.py, the values roles/stated_state.py states): the deploy it
# records reads these and opens no vault, so no password is needed and no value can be written.
STATED_SECRETS: dict[str, str] = {}


def secret_value(name: str) -> str:
    """Plaintext of one secret, for a role that writes it into a 0600 file on the host."""
    if STATED_SECRETS:
        return STATED_SECRETS[name]
    site = current_site()
    assert site.secrets_file, "a secret is referenced only with a secrets_file (the site rules)"
    return vault.decrypt_all(Path(site.secrets_file), [name])[name]
