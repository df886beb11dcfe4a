"""Cross-host rules about the vault: a *_secret setting names a key the vault has."""

from __future__ import annotations

from roles.site.vault import RENAMED_SECRETS


def _reference_problem(setting: str, ref: str | None, secret_names, secrets_file: str | None) -> str | None:
    """Why a *_secret setting's vault key cannot be read, or None. An old name of a renamed key
    (vault.RENAMED_SECRETS) is refused in the inventory, which is plain text; the vault's own entry
    under the old name is still read for one release (vault.load)."""
    if ref in RENAMED_SECRETS:
        new = RENAMED_SECRETS[ref]
        return (
            f"{setting} = {ref!r} names the vault key by its old name; write {setting} = {new!r}"
            f" (docs/upgrades.md#engine-neutral-setting-names)"
        )
    if ref and secret_names is not None and ref not in secret_names:
        return f"{setting} = {ref!r} names no secret in {_vault_state(secrets_file, secret_names)}"
    return None


def _vault_state(secrets_file: str | None, secret_names) -> str:
    """The vault as it is, for a reference to a key it lacks (an unreadable vault is named by its
    own line, and its references are not judged: secret_names None)."""
    if not secrets_file:
        return (
            "the vault (no secrets_file set); expected secrets_file = '<file>.vault.yml' beside the inventory"
            " (inference-host vault set FILE NAME makes it)"
        )
    if not secret_names:
        return (
            f"{secrets_file}, which has no keys; expected a key set with inference-host vault set {secrets_file} NAME"
        )
    return f"{secrets_file}; expected one of: {', '.join(sorted(secret_names))}"


def mirror_credential_problems(host, secret_names, secrets_file: str | None) -> list[str]:
    """Why a mirror's credential setting cannot be used, without the "file: host" prefix: its vault key
    is missing, it has no mirror to log in to, or the mirror is plain http (apt sends auth.conf's
    credentials only over https unless told otherwise, apt_auth.conf(5); uv and pip would send them
    in clear)."""
    problems = []
    for setting, ref, url_setting, url in (
        ("cuda_repo_credentials_secret", host.cuda.repo_credentials_secret, "cuda_repo_url", host.cuda.repo_url),
        (
            "base_pypi_index_credentials_secret",
            host.base.pypi_index_credentials_secret,
            "base_pypi_index_url",
            host.base.pypi_index_url,
        ),
    ):
        if not ref:
            continue
        problem = _reference_problem(setting, ref, secret_names, secrets_file)
        if problem:
            problems.append(problem)
        elif url is None:
            problems.append(
                f"{setting} = {ref!r} without {url_setting}; expected {url_setting}, the mirror it logs in to"
            )
        elif not url.startswith("https://"):
            problems.append(
                f"{setting} = {ref!r} with {url_setting} = {url!r}, plain http, which would send the credential"
                f" in clear; expected an https:// {url_setting}"
            )
    return problems


def key_roles(site_hosts) -> list[tuple[str, str, str]]:
    """(host, setting, vault key) of every API key the site gives a role: the engines' client and
    admin keys, each tenant's client key, the gateways' control-plane key
    (docs/security.md#keys-and-their-roles)."""
    found = []
    for host in site_hosts.values():
        if host.in_group("gpu_nodes"):
            for key in ("api_key_secret", "admin_api_key_secret"):
                if getattr(host.serving, key):
                    found.append((host.name, f"serving_{key}", getattr(host.serving, key)))
            for tenant, ref in sorted(host.serving.tenant_api_key_secrets.items()):
                found.append((host.name, f"serving_tenant_api_key_secrets[{tenant!r}]", ref))
        if host.in_group("gateways"):
            control = host.gateway.control_plane_api_key_secret
            if control:
                found.append((host.name, "gateway_control_plane_api_key_secret", control))
    return found


def key_role_problems(site_hosts, where: str, secret_names, secrets_file: str | None, engine: str | None) -> list[str]:
    """Why the site's API keys cannot each keep to one role: a missing or misnamed vault key, one
    key in two roles, an admin route or a control plane the client key would open."""
    from roles.site.vault import is_api_key

    problems = []
    roles_of: dict[str, set[str]] = {}
    for name, setting, ref in key_roles(site_hosts):
        here = f"{where}: host {name}"
        # (serving_api_key_secret is judged with serving_hf_token_secret, rules.py)
        problem = setting != "serving_api_key_secret" and _reference_problem(setting, ref, secret_names, secrets_file)
        if problem:
            problems.append(f"{here}: {problem}")
        if not is_api_key(ref):
            like = setting.removesuffix("_secret")
            if "[" in setting:  # serving_tenant_api_key_secrets['<tenant>']
                like = "tenant_" + setting.split("'")[1].replace("-", "_") + "_api_key"
            problems.append(
                f"{here}: {setting} = {ref!r} names a vault key that does not end in api_key; expected a name like"
                f" {like} (`inference-host vault set` and `vault check` hold"
                " keys named *api_key to the key rule: at least 32 characters, one role each)"
            )
        # One vault key may serve one role on many hosts (the replicas share their client key).
        roles_of.setdefault(ref, set()).add(setting)
    for ref, roles in sorted(roles_of.items()):
        if len(roles) > 1:
            problems.append(
                f"{where}: the vault key {ref!r} is given {len(roles)} roles ({', '.join(sorted(roles))}); expected"
                " one key per role: a client key that is also an admin or control-plane key opens what it guards"
            )
    problems.extend(_missing_roles(site_hosts, where, engine, secret_names))
    return problems


def _missing_roles(site_hosts, where: str, engine: str | None, secret_names) -> list[str]:
    """A client key without the key that would keep it off the admin routes or the control plane
    (a client key the vault lacks is named by its own line, not again here)."""
    problems = []
    nodes = [
        h
        for h in site_hosts.values()
        if h.in_group("gpu_nodes") and (secret_names is None or h.serving.api_key_secret in (None, *secret_names))
    ]
    for host in nodes:
        here = f"{where}: host {host.name}"
        client, admin = host.serving.api_key_secret, host.serving.admin_api_key_secret
        if engine == "sglang" and client and not admin:
            problems.append(
                f"{here}: serving_api_key_secret = {client!r} without serving_admin_api_key_secret:"
                " SGLang's admin routes (/flush_cache, /update_weights_from_disk, /pause_generation, ...)"
                " would take the client key (srt/utils/auth.py, ADMIN_OPTIONAL); expected"
                " serving_admin_api_key_secret = 'engine_admin_api_key', a key of its own"
                " (docs/upgrades.md#keys-with-roles)"
            )
        if host.serving.tenant_api_key_secrets and not client:
            problems.append(
                f"{here}: serving_tenant_api_key_secrets = {host.serving.tenant_api_key_secrets!r} without"
                " serving_api_key_secret: an engine without a client key serves everyone, so a tenant's key"
                " would guard nothing; expected serving_api_key_secret = 'engine_api_key' beside the tenants"
            )
        if engine == "vllm" and admin:
            problems.append(
                f"{here}: serving_admin_api_key_secret = {admin!r} with a vLLM stack; vLLM 0.16.0 has no"
                " admin key (only --api-key); expected no serving_admin_api_key_secret"
            )
    keyed = sorted({h.serving.api_key_secret for h in nodes if h.serving.api_key_secret})
    gateways = [h for h in site_hosts.values() if h.in_group("gateways")]
    for host in gateways:
        if keyed and not host.gateway.control_plane_api_key_secret:
            problems.append(
                f"{where}: host {host.name}: a gateway without gateway_control_plane_api_key_secret in front"
                f" of replicas with serving_api_key_secret = {keyed[0]!r}: smg 1.13.0 would take that client"
                " key on /workers and its admin routes; expected gateway_control_plane_api_key_secret ="
                " 'gateway_control_plane_api_key' (docs/upgrades.md#keys-with-roles)"
            )
    control = sorted({h.gateway.control_plane_api_key_secret or "" for h in gateways})
    if len(control) > 1:
        problems.append(
            f"{where}: the gateways name different gateway_control_plane_api_key_secret"
            f" ({', '.join(map(repr, control))}); expected one for every gateway: a replica's rolling"
            " upgrade drains it at each gateway with one key"
        )
    return problems
