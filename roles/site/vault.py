"""Secrets: a YAML file whose values are ansible-vault encrypted, one value per key.

    hf_token: !vault |
      $ANSIBLE_VAULT;1.1;AES256
      6231...

Key names stay readable, so the site model can check every secret reference without the
password; values are decrypted only at deploy time, with ansible-core's own vault library,
from the password in the file named by INFERENCE_HOST_VAULT_PASSWORD_FILE (default
~/.config/inference-host/vault-password). A value is never printed, never put on a command
line, and reaches a host only as a file of mode 0600 (see the roles that use them).

    uv run python -m roles.site.vault set inventory/secrets.vault.yml hf_token   # value on stdin
    uv run python -m roles.site.vault list inventory/secrets.vault.yml
    uv run python -m roles.site.vault check inventory/secrets.vault.yml          # decrypts all
    uv run python -m roles.site.vault rename inventory/secrets.vault.yml OLD NEW # no password needed

A renamed key (RENAMED_SECRETS) is read under its new name for one release, with a one-line
notice; a vault holding both names is refused.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import yaml

from roles.site import yamlfile
from roles.site.command_line import OneLineParser, quiet_on_closed_pipe

PASSWORD_FILE_ENV = "INFERENCE_HOST_VAULT_PASSWORD_FILE"
DEFAULT_PASSWORD_FILE = Path("~/.config/inference-host/vault-password")


class SecretsError(Exception):
    pass


class _Encrypted(str):
    """Ciphertext of one value, as read from the file (never the plaintext)."""


class _VaultLoader(yamlfile.UniqueKeyLoader):
    """A secret written twice is refused (the last would silently win)."""


class _VaultDumper(yaml.SafeDumper):
    pass


# A !vault value is a scalar: construct_scalar raises yaml's own error for another node.
_VaultLoader.add_constructor("!vault", lambda loader, node: _Encrypted(loader.construct_scalar(node)))  # type: ignore[arg-type]
_VaultDumper.add_representer(_Encrypted, lambda dumper, data: dumper.represent_scalar("!vault", str(data), style="|"))


# Vault keys that were renamed: old key -> new key (docs/upgrades.md#engine-neutral-setting-names).
# The vault is encrypted and edited with a tool, not a text editor, so for one release an old key
# is still read, under its new name, with a notice saying so; the release after refuses it. A
# vault holding both names is refused now: which value is meant cannot be told.
RENAMED_SECRETS = {"sglang_api_key": "engine_api_key"}

_NOTICED: set[tuple[str, str]] = set()


def load(path: Path) -> dict[str, _Encrypted]:
    """The encrypted entries of a secrets file, by the names the deploy reads them with (a key
    of RENAMED_SECRETS under its new name, with a notice); no password needed."""
    entries = stored(path)
    for old, new in RENAMED_SECRETS.items():
        if old not in entries:
            continue
        if new in entries:
            raise SecretsError(
                f"holds both {old} and {new}, the new name of {old}; expected {new} only: remove {old}"
                f" (its line and its !vault block) once {new} holds the key"
            )
        if (str(path), old) not in _NOTICED:
            _NOTICED.add((str(path), old))
            print(
                f"inference-host: notice: {path}: the vault key {old} is read as {new}, its new name, in this"
                f" release only; the next release refuses it: uv run python -m roles.site.vault rename {path}"
                f" {old} {new}",
                file=sys.stderr,
            )
        entries = {new if key == old else key: value for key, value in entries.items()}
    return entries


def stored(path: Path) -> dict[str, _Encrypted]:
    """The encrypted entries of a secrets file, by the names written in it; no password needed."""
    try:
        text = yamlfile.read_text(Path(path))
        raw = yamlfile.load(text, _VaultLoader)
    except FileNotFoundError:
        raise SecretsError("file not found; create it with `uv run python -m roles.site.vault set FILE NAME`") from None
    except IsADirectoryError:
        raise SecretsError("is a folder; expected the secrets file (YAML)") from None
    except PermissionError:
        raise SecretsError("cannot be read by this user; expected a readable secrets file") from None
    except OSError as error:
        raise SecretsError(f"cannot be read ({error.strerror}); expected the secrets file (YAML)") from None
    except UnicodeDecodeError:
        raise SecretsError("is not a text file; expected the secrets file (YAML)") from None
    except yamlfile.DuplicateKeyError as error:
        raise SecretsError(str(error)) from None
    except yaml.YAMLError as error:
        # One line (PyYAML's own text is up to 9 lines); the vault's keys are then unknown, and
        # the validation says so instead of calling it empty.
        raise SecretsError(
            f"{yamlfile.one_line(error)}; expected the secrets file as `python -m roles.site.vault set` writes it"
        ) from None
    raw = raw or {}
    if not isinstance(raw, dict):
        raise SecretsError("expected a mapping of secret name -> !vault value")
    # Plain names are shown (the "not encrypted" line below names them), values never.
    foreign = yamlfile.foreign_keys_problem(text, list(raw), lambda _: True, "a secrets file", _VaultLoader)
    if foreign:
        raise SecretsError(foreign)
    plain = [key for key, value in raw.items() if not isinstance(value, _Encrypted)]
    lines = yamlfile.top_level_lines(text, _VaultLoader) if plain else {}
    if plain:
        # The value itself is never printed: it may be the plaintext secret.
        raise SecretsError(
            f"{'keys' if len(plain) > 1 else 'key'} {', '.join(f'{k!r} (line {lines.get(k)})' for k in plain)}"
            " not encrypted (plaintext in the"
            " file: treat it as leaked); expected every value to be a !vault value: remove the line and"
            " set it with `python -m roles.site.vault set FILE NAME` (value on stdin)"
        )
    return raw


def password_file() -> Path:
    return Path(os.environ.get(PASSWORD_FILE_ENV) or DEFAULT_PASSWORD_FILE).expanduser()


_WARNED: set[str] = set()


def _warn_if_open(source: Path) -> None:
    """One line on stderr when the password file is open to other users (any of mode 077, the
    rule OpenSSH applies to a private key: authfile.c sshkey_perm_ok). A warning, not a refusal:
    the file stays on the machine that runs the deploy and never reaches a host, and a deploy
    must not stop over a file the user may share on purpose; the line says how to close it."""
    try:
        mode = source.stat().st_mode & 0o777
    except OSError:
        return  # missing: reading it names that
    if mode & 0o077 and str(source) not in _WARNED:
        _WARNED.add(str(source))
        print(
            f"inference-host: warning: the vault password file {source} is open to other users (mode"
            f" {mode:04o}): it unlocks every secret; expected mode 0600 (chmod 600 {source})",
            file=sys.stderr,
        )


def _vault(password: bytes | None = None):
    from ansible.constants import DEFAULT_VAULT_ID_MATCH
    from ansible.parsing.vault import VaultLib, VaultSecret

    if password is None:
        source = password_file()
        _warn_if_open(source)
        try:
            password = source.read_bytes().strip()
        except OSError as error:
            raise SecretsError(
                f"cannot read the vault password from {source} ({error.strerror}); set"
                f" {PASSWORD_FILE_ENV} to a file holding it"
            ) from None
    return VaultLib([(DEFAULT_VAULT_ID_MATCH, VaultSecret(password))])


def damage(ciphertext: str) -> str | None:
    """Why one !vault value is not a whole ansible-vault value, or None (no password needed).
    ansible-core 2.18 ansible/parsing/vault/__init__.py: parse_vaulttext_envelope (a
    `$ANSIBLE_VAULT;1.1;AES256` header, then hex lines), parse_vaulttext (hex of salt, HMAC and
    ciphertext, one per line); VaultAES256 writes a 32-byte salt, a SHA-256 HMAC (64 hex
    digits) and the PKCS#7-padded plaintext, a whole number of 16-byte blocks. A value cut
    mid-way fails one of these: it is named as damaged, not blamed on the password."""
    from ansible.errors import AnsibleError
    from ansible.parsing.vault import parse_vaulttext, parse_vaulttext_envelope

    try:
        body, version, cipher, _ = parse_vaulttext_envelope(ciphertext.encode())
        if not ciphertext.startswith("$ANSIBLE_VAULT;") or cipher != "AES256":
            return "its header is not $ANSIBLE_VAULT;1.1;AES256"
        data, salt, hmac = parse_vaulttext(body)
    except (AnsibleError, ValueError) as error:
        return f"its text is not whole ({str(error).splitlines()[0][:80]})"
    if len(salt) != 32 or len(hmac) != 64 or not data or len(data) % 16:
        return "it is shorter than the value ansible-vault wrote (a salt, an HMAC and whole 16-byte blocks)"
    return None


def decrypt_all(path: Path, names=None, password: bytes | None = None) -> dict[str, str]:
    """Plaintext of the named secrets (all when names is None). Raises SecretsError. A value that
    is damaged (cut mid-way, edited) is named as such: the password is blamed only when no value
    of the file decrypts with it."""
    from ansible.errors import AnsibleError

    entries = load(path)
    vault = _vault(password)
    wanted = entries if names is None else {n: entries[n] for n in names}

    def fix(name: str) -> str:
        return f"set it again: python -m roles.site.vault set {path} {name} (value on stdin)"

    for name, ciphertext in wanted.items():
        problem = damage(ciphertext)
        if problem:
            raise SecretsError(
                f"{path}: secret {name!r} is damaged in the file: {problem}; expected it whole: {fix(name)}"
            )
    values, failed = {}, []
    for name, ciphertext in wanted.items():
        try:
            values[name] = vault.decrypt(ciphertext.encode()).decode()
        except AnsibleError:
            failed.append(name)
    if failed and (values or _another_decrypts(vault, entries, failed)):
        raise SecretsError(
            f"{path}: secret {failed[0]!r} does not decrypt, while the file's other values do with the same"
            f" password: the value is damaged (cut or edited); expected it whole: {fix(failed[0])}"
        )
    if failed:
        raise SecretsError(
            f"{path}: secret {failed[0]!r} cannot be decrypted with the password from"
            f" {password_file()}; expected the password the file was encrypted with"
        )
    return values


def _another_decrypts(vault, entries: dict, failed: list[str]) -> bool:
    from ansible.errors import AnsibleError

    for name, ciphertext in entries.items():
        if name in failed or damage(ciphertext):
            continue
        try:
            vault.decrypt(ciphertext.encode())
            return True
        except AnsibleError:
            continue
    return False


def set_secret(path: Path, name: str, value: str, password: bytes | None = None) -> None:
    """Add or replace one secret (and drop the entry of its old name, RENAMED_SECRETS); the file
    is written with mode 0600."""
    path = Path(path)
    entries = stored(path) if path.exists() else {}
    ciphertext = _vault(password).encrypt(value.encode()).decode()
    entries = {key: item for key, item in entries.items() if RENAMED_SECRETS.get(key) != name}
    entries[name] = _Encrypted(ciphertext)
    _write(path, entries)


def rename_secret(path: Path, old: str, new: str) -> None:
    """Store the value of `old` under `new`, unchanged: an ansible-vault value is not bound to its
    key, so neither the password nor the plaintext is needed."""
    path = Path(path)
    entries = stored(path)
    if old not in entries:
        raise SecretsError(f"has no key {old}; expected one of: {', '.join(sorted(entries)) or 'none'}")
    if new in entries:
        raise SecretsError(f"already holds {new}; expected a new name (remove {new} first to replace it)")
    _write(path, {new if key == old else key: item for key, item in entries.items()})


def _write(path: Path, entries: dict[str, _Encrypted]) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        yaml.dump(dict(entries), handle, Dumper=_VaultDumper, default_flow_style=False)
    os.chmod(path, 0o600)


def _parser(prog: str) -> OneLineParser:
    parser = OneLineParser(prog=prog, description="Secrets in an ansible-vault encrypted YAML file.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="{set,list,check,rename}")
    for name, help_text, extra in (
        ("set", "set NAME from the first line of stdin (needs the vault password)", ("name",)),
        ("list", "list the secret names (no password needed)", ()),
        ("check", "decrypt every value (needs the vault password)", ()),
        ("rename", "rename a key OLD to NEW (no password needed)", ("old", "new")),
    ):
        command = commands.add_parser(name, help=help_text, description=help_text)
        command.add_argument("file", type=Path, help="the secrets file, e.g. inventory/secrets.vault.yml")
        for argument in extra:
            command.add_argument(argument, help="letters, digits and _")
    return parser


def _main(argv: list[str], prog: str = "python -m roles.site.vault") -> int:
    parser = _parser(prog)
    args = parser.parse_args(argv)
    path = args.file
    try:
        if args.command == "list":
            print("\n".join(sorted(stored(path))))
        elif args.command == "rename":
            if not all(re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name) for name in (args.old, args.new)):
                print(f"{parser.prog} rename: error: OLD and NEW take letters, digits and _", file=sys.stderr)
                return 2
            rename_secret(path, args.old, args.new)
            print(f"{path}: {args.old} renamed {args.new}")
        elif args.command == "check":
            print(f"{path}: {len(decrypt_all(path))} secrets decrypt")
        else:
            return _set(path, args.name)
    except SecretsError as error:
        print(f"{path}: {error}", file=sys.stderr)
        return 2
    return 0


# A secret is a token, a key, a password or a URL: a few KiB at most. A control character in it
# (a '\r' pasted from Windows, a NUL, a tab) is never part of one, and is a line break or an end
# of string in the 0600 files a secret is written to (EnvironmentFile=, the engine's YAML config).
MAX_SECRET_CHARACTERS = 65536


def _value_problem(value: str) -> str | None:
    if len(value) > MAX_SECRET_CHARACTERS:
        return f"is longer than {MAX_SECRET_CHARACTERS} characters; expected a token, key, password or URL"
    bad = next((i for i, c in enumerate(value) if ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F), None)
    if bad is not None:
        return (
            f"has the control character {ascii(value[bad])} at position {bad}; expected the secret on one line"
            " without control characters (a Windows line end \\r, a tab, a NUL)"
        )
    return None


def _set(path: Path, name: str) -> int:
    if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name):
        raise SecretsError(
            f"secret name {name[:80]!r} is invalid; expected letters, digits and _"
            " (the name an inventory's *_secret setting refers to)"
        )
    if name in RENAMED_SECRETS:
        raise SecretsError(f"the key {name} was renamed {RENAMED_SECRETS[name]}; expected the new name")
    if not path.parent.is_dir() or path.is_dir():
        raise SecretsError("expected a file path in an existing folder")
    existing = stored(path) if path.exists() else {}
    value = sys.stdin.readline(MAX_SECRET_CHARACTERS + 2).rstrip("\n")
    if not value:
        print(f"{path}: no value on stdin; nothing written", file=sys.stderr)
        return 2
    problem = _value_problem(value)
    if problem:  # the value itself is never echoed
        print(f"{path}: the value for {name} {problem}; nothing written", file=sys.stderr)
        return 2
    replaced = [old for old, new in RENAMED_SECRETS.items() if new == name and old in existing]
    set_secret(path, name, value)
    print(f"{path}: {name} set" + "".join(f" (replaces {old}, its old name)" for old in replaced))
    return 0


if __name__ == "__main__":
    quiet_on_closed_pipe()
    raise SystemExit(_main(sys.argv[1:]))
