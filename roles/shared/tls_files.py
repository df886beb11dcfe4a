"""A listener's TLS files on its host (the engine's serving_tls_*, the gateway's gateway_tls_*;
docs/security.md#tls): the certificate and its key from the vault as 0600 files of the service's
user (the secret installer, roles/shared/secret_files.py: staged in its root-only folder, never
on a command line or in a log), the CA its clients verify it with uploaded 0644; all removed
when the listener serves no TLS. The operations that wrote something are returned: a change
restarts the listener (it reads the files once, at start)."""

from __future__ import annotations

from pyinfra.operations import files

from roles.shared.secret_files import secret_file
from roles.site import secret_value


def tls_file_operations(
    paths: dict[str, str],
    secrets: tuple[str | None, str | None],
    ca_file: str | None,
    owner: tuple[str, str],
    what: str,
    prefix: str,
) -> list:
    """paths: {"cert", "key", "ca"} on the host; secrets: the vault keys of the certificate and
    its key (both, or the listener serves no TLS); ca_file: the local CA file (None: the host's
    bundle); owner: (user, group) of the service; what: "the engine", "the gateway"; prefix: the
    settings' prefix ("serving", "gateway"), named in each operation."""
    cert_secret, key_secret = secrets
    if not (cert_secret and key_secret):
        for path in paths.values():
            files.file(name=f"Remove {path} (no {prefix}_tls_cert_secret)", path=path, present=False)
        return []
    written = [
        secret_file(
            label=f"{what}'s TLS {kind} (secret {name})",
            value=secret_value(name).rstrip("\n") + "\n",
            dest=paths[key],
            user=owner[0],
            group=owner[1],
        )
        for key, kind, name in (("cert", "certificate", cert_secret), ("key", "private key", key_secret))
    ]
    written.append(
        ca_file_operation(
            paths["ca"],
            ca_file,
            f"the CA the checks verify {what} with, {prefix}_tls_ca_file",
            f"no {prefix}_tls_ca_file",
        )
    )
    return [op for op in written if op is not None]


def ca_file_operation(path: str, source: str | None, what: str, why_absent: str):
    """A CA certificate (public: 0644, root's) uploaded from the local file `source`, or removed
    from the host when there is none; the upload's operation (None when removed)."""
    if not source:
        files.file(name=f"Remove {path} ({why_absent})", path=path, present=False)
        return None
    return files.put(name=f"Install {path} ({what})", src=source, dest=path, user="root", group="root", mode="0644")
