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
