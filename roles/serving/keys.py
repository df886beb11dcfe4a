"""The engine's API keys as 0600 files of its service user (docs/security.md#keys-and-their-roles):
the client and admin keys in its --config file, and each tenant's client key: vLLM takes them as
more --api-key values in the same file, SGLang reads them from a file of their own through the
release's *-tenant-api-keys.patch (roles/engine_envs/patches/sglang/<version>/), whose path the
unit's environment file names. Never a command line, never a log."""

from __future__ import annotations

import json
from collections.abc import Callable

from roles.site import HostSettings

# The variable SGLang's tenant-keys patch reads the file's path from (srt/utils/auth.py as patched).
TENANT_KEYS_ENV = "INFERENCE_HOST_TENANT_API_KEYS_FILE"


def secret_args_content(value: str | None, admin: str | None = None, tenants: tuple[str, ...] = ()) -> str:
    # JSON is YAML: SGLang's --config parser reads {"api-key": ...} like `api-key: ...`, and so
    # does vLLM's (FlexibleArgumentParser.load_config_file: yaml.safe_load, `--api-key VALUE`).
    # The file keeps its .yaml name: vLLM refuses a --config file named otherwise. SGLang's
    # --admin-api-key (server_args.py, 0.5.9 and 0.5.10; srt/arg_groups/fields/serving.py, 0.5.23)
    # keeps the admin routes from the client key (docs/security.md#keys-and-their-roles).
    # vLLM 0.16.0's `api_key: list[str] | None` ("the server will require one of these keys",
    # vllm/entrypoints/openai/cli_args.py) takes a list, which load_config_file turns into
    # `--api-key CLIENT TENANT...`: the client key first, which every reader of this file takes.
    client = [value, *tenants] if tenants and value is not None else value
    keys = {"api-key": client, "admin-api-key": admin}
    return json.dumps({flag: key for flag, key in keys.items() if key is not None}) + "\n"


def tenant_keys_content(tenants: dict[str, str]) -> str:
    """The tenants' file SGLang's patch reads: {tenant: key}, JSON."""
    return json.dumps(dict(sorted(tenants.items()))) + "\n"


def key_files(
    settings: HostSettings, engine: str, paths: dict[str, str], value_of: Callable[[str], str]
) -> list[tuple[str, str, str | None]]:
    """(path, what it holds, content; None: the file is removed) of the engine's key files;
    value_of reads a vault key (the deploy) or masks it (the preview)."""
    serving = settings.serving
    secret, admin, tenants = serving.api_key_secret, serving.admin_api_key_secret, serving.tenant_api_key_secrets
    listed = engine == "vllm" and bool(secret)
    names = " and ".join(name for name in (secret, admin) if name)
    if listed and tenants:
        names += " and the tenants' " + ", ".join(tenants[t] for t in sorted(tenants))
    found: list[tuple[str, str, str | None]] = [
        (
            paths["secret_args"],
            f"the API keys (secrets {names}) as the engine's --config file" if names else "no API key set",
            secret_args_content(
                secret and value_of(secret),
                admin and value_of(admin),
                tuple(value_of(tenants[t]) for t in sorted(tenants)) if listed else (),
            )
            if secret or admin
            else None,
        )
    ]
    if engine == "sglang" and tenants and secret:
        refs = ", ".join(f"{t}: {tenants[t]}" for t in sorted(tenants))
        content = tenant_keys_content({t: value_of(ref) for t, ref in tenants.items()})
        found.append((paths["tenant_keys"], f"the tenants' client keys (secrets {refs})", content))
    else:
        found.append((paths["tenant_keys"], "no tenant key set", None))
    return found


def tenant_keys_env(settings: HostSettings, engine: str, paths: dict[str, str]) -> dict[str, str]:
    """The environment file's line naming the tenants' file, for SGLang's patch."""
    serving = settings.serving
    if engine == "sglang" and serving.tenant_api_key_secrets and serving.api_key_secret:
        return {TENANT_KEYS_ENV: paths["tenant_keys"]}
    return {}
