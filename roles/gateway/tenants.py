"""The tenants' client keys at the gateway (docs/security.md#keys-and-their-roles): smg 1.13.0
takes each as `--tenant-api-key TENANT:KEY` (smg/router_args.py, _parse_tenant_api_keys: split at
the first ':', both parts trimmed; repeatable), beside --api-key on its data plane, and passes the
caller's own key on to the replica, whose patched engine takes it too (roles/serving/keys.py).
smg-launch adds them in-process from a 0600 file of the gateway's user, one TENANT:KEY a line."""

from __future__ import annotations

from pyinfra.operations import files

from roles.shared.replicas import replicas
from roles.shared.secret_files import secret_file
from roles.site import HostSettings, secret_value

TENANT_KEYS_FILE = "/etc/smg/tenant-api-keys"
TENANT_KEYS_ENV = "INFERENCE_HOST_GATEWAY_TENANT_KEYS_FILE"


def tenant_api_key_secrets(hosts: dict[str, HostSettings]) -> dict[str, str]:
    """{tenant: vault key}: the replicas' serving_tenant_api_key_secrets (one set for all, the site
    rules hold them to it), where they have a client key (without one there is nothing to add to)."""
    keyed = [n for n in replicas(hosts) if n.serving.api_key_secret]
    return dict(sorted(keyed[0].serving.tenant_api_key_secrets.items())) if keyed else {}


def tenant_keys_content(keys: dict[str, str]) -> str:
    """The file smg-launch reads: one TENANT:KEY a line, as --tenant-api-key takes it."""
    return "".join(f"{tenant}:{key}\n" for tenant, key in sorted(keys.items()))


def tenant_keys(hosts: dict[str, HostSettings], user: str) -> list:
    """The tenants' keys as a 0600 file of the gateway's user, or the file removed without tenants."""
    tenants = tenant_api_key_secrets(hosts)
    if not tenants:
        return [files.file(name=f"Remove {TENANT_KEYS_FILE} (no tenant key set)", path=TENANT_KEYS_FILE, present=False)]
    deployed = secret_file(
        label=f"the gateway's tenant keys (secrets {', '.join(f'{t}: {r}' for t, r in tenants.items())})",
        value=tenant_keys_content({tenant: secret_value(ref) for tenant, ref in tenants.items()}),
        dest=TENANT_KEYS_FILE,
        user=user,
        group=user,
    )
    return [deployed] if deployed is not None else []
