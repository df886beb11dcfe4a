"""Secrets: a YAML file whose values are ansible-vault encrypted, one value per key.

    hf_token: !vault |
      $ANSIBLE_VAULT;1.1;AES256
      6231...

Key names stay readable, so the site model can check every secret reference without the
password; values are decrypted only at deploy time, with ansible-core's own vault library,
from the password in the file named by INFERENCE_HOST_VAULT_PASSWORD_FILE (default
~/.config/inference-host/vault-password). A value is never printed, never put on a command
line, and reaches a host only as a file of mode 0600 (see the roles that use them).

    uv run inference-host vault set inventory/secrets.vault.yml hf_token   # typed unseen, or stdin
    uv run inference-host vault list inventory/secrets.vault.yml
    uv run inference-host vault check inventory/secrets.vault.yml          # decrypts all
    uv run inference-host vault rename inventory/secrets.vault.yml OLD NEW # no password needed
    uv run inference-host vault rekey inventory/secrets.vault.yml NEW_PASSWORD_FILE

(`python -m roles.site.vault` is the same command.) The file is written whole or not at all: a
temporary file in the same folder, mode 0600, renamed over it.

A renamed key (RENAMED_SECRETS) is read under its new name for one release, with a one-line
notice; a vault holding both names is refused.

An API key (an entry whose name ends in `api_key`: every setting that gives a key a role names
one, docs/security.md#keys-and-their-roles) is held to API_KEY_RULE by `set`, `check`, the
validation and the deploy: not empty or blank, at least MIN_API_KEY_CHARACTERS characters, no
white space at either end, not beginning with '-' (argparse would read it as an option), and no
two API keys of one vault alike (one key, one role).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import yaml

from roles.site import yamlfile
from roles.site.command_line import OneLineParser, run_command
from roles.site.pem import ONE_LINE, control_character, read_value

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
                f" release only; the next release refuses it: uv run inference-host vault rename {path}"
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
        raise SecretsError("file not found; create it with `uv run inference-host vault set FILE NAME`") from None
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
            f"{yamlfile.one_line(error)}; expected the secrets file as `inference-host vault set` writes it"
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
            " set it with `inference-host vault set FILE NAME`"
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
        return f"set it again: inference-host vault set {path} {name}"

    template = _template_values()

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
    unset = [name for name in failed if wanted[name] in template]
    if unset:  # step 2 of the README half done: not damage, not a wrong password
        raise SecretsError(
            f"{path}: secret {unset[0]!r} is still the template's value (encrypted with a password no one"
            f" has){f', as are {len(unset) - 1} more' if len(unset) > 1 else ''}; set it:"
            f" inference-host vault set {path} {unset[0]}"
        )
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


# The committed template (README step 2): its values are encrypted with a discarded password.
TEMPLATE = Path(__file__).resolve().parents[2] / "inventory" / "secrets.vault.yml"


def _template_values() -> set[str]:
    try:
        return {str(value) for value in stored(TEMPLATE).values()}
    except (OSError, SecretsError):
        return set()


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
    """Whole or not at all: a temporary file in the same folder (mkstemp makes it 0600), flushed
    to disk, then renamed over the vault (a rename within one file system is atomic), so an
    interrupted write leaves the old file, never half of one."""
    import tempfile

    path = Path(path)
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            yaml.dump(dict(entries), handle, Dumper=_VaultDumper, default_flow_style=False)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, 0o600)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def rekey(path: Path, new_password: bytes, password: bytes | None = None) -> int:
    """Every value decrypted with the current password and encrypted with the new one, written
    at once (_write); returns how many. Nothing is written when one value does not decrypt."""
    path = Path(path)
    values = decrypt_all(path, password=password)
    if not new_password:
        raise SecretsError("the new password file is empty; expected the new password in it")
    vault = _vault(new_password)
    _write(path, {name: _Encrypted(vault.encrypt(value.encode()).decode()) for name, value in values.items()})
    return len(values)


def _parser(prog: str) -> OneLineParser:
    parser = OneLineParser(prog=prog, description="Secrets in an ansible-vault encrypted YAML file.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="{set,list,check,rename,rekey}")
    for name, help_text, extra in (
        ("set", "set NAME: typed without echo at a terminal, else the first line of stdin", ("name",)),
        ("list", "list the secret names (no password needed)", ()),
        ("check", "decrypt every value (needs the vault password)", ()),
        ("rename", "rename a key OLD to NEW (no password needed)", ("old", "new")),
        ("rekey", "a new password: every value re-encrypted with the one in NEW_PASSWORD_FILE", ("new_password_file",)),
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
            values = decrypt_all(path)
            problems = api_key_problems(path, values)
            for problem in problems:
                print(problem, file=sys.stderr)
            if problems:
                return 2
            print(f"{path}: {len(values)} secrets decrypt")
        elif args.command == "rekey":
            return _rekey(path, Path(args.new_password_file))
        else:
            return _set(path, args.name)
    except SecretsError as error:
        said = str(error)  # the path once: most messages begin with it already
        print(said if said.startswith(f"{path}:") else f"{path}: {said}", file=sys.stderr)
        return 2
    return 0


def _rekey(path: Path, new_file: Path) -> int:
    try:
        new_password = new_file.expanduser().read_bytes().strip()
    except OSError as error:
        raise SecretsError(f"cannot read the new password from {new_file} ({error.strerror})") from None
    count = rekey(path, new_password)
    print(
        f"{path}: {count} secrets encrypted with the password in {new_file}; now point"
        f" {PASSWORD_FILE_ENV} at it (or move it to {password_file()})"
    )
    return 0


# A secret is a token, a key, a password or a URL: a few KiB at most. A control character in it
# (a '\r' pasted from Windows, a NUL, a tab) is never part of one, and is a line break or an end
# of string in the 0600 files a secret is written to (EnvironmentFile=, the engine's YAML config).
MAX_SECRET_CHARACTERS = 65536


def _value_problem(value: str) -> str | None:
    if len(value) > MAX_SECRET_CHARACTERS:
        return f"is longer than {MAX_SECRET_CHARACTERS} characters; expected a token, key, password or URL"
    bad = control_character(value)
    if bad is not None:
        return f"has the control character {ascii(value[bad])} at position {bad}; expected {ONE_LINE}"
    return None


# SGLang 0.5.9 checks its keys with `if api_key:` (srt/utils/auth.py): an empty key serves
# everyone. A key shorter than this is guessable or a placeholder left in by mistake; 32 is what
# `python3 -c 'import secrets; print(secrets.token_urlsafe(24))'` gives.
MIN_API_KEY_CHARACTERS = 32
API_KEY_RULE = (
    f"at least {MIN_API_KEY_CHARACTERS} characters, no white space at either end, not beginning with '-'"
    " (e.g. python3 -c 'import secrets; print(secrets.token_urlsafe(32))')"
)


def is_api_key(name: str) -> bool:
    """Whether a vault entry is an API key (its name ends in api_key), held to API_KEY_RULE."""
    return name.endswith("api_key")


def api_key_problem(value: str) -> str | None:
    """Why a value cannot be an API key, without the value; None when it can."""
    if not value.strip():
        return "is empty or only white space (SGLang's `if api_key:` would serve everyone)"
    if value != value.strip():
        return "has white space at one end (a key pasted with a space or a line break)"
    if len(value) < MIN_API_KEY_CHARACTERS:
        return f"is {len(value)} characters long, under {MIN_API_KEY_CHARACTERS}"
    if value.startswith("-"):
        return "begins with '-' (the engine's and the gateway's argparse would read it as an option)"
    return None


def api_key_problems(path: Path, values: dict[str, str]) -> list[str]:
    """One line per API key of `values` (name -> plaintext) that breaks API_KEY_RULE, and per
    two API keys sharing a value; never a value."""
    problems = []
    seen: dict[str, str] = {}
    for name in sorted(n for n in values if is_api_key(n)):
        problem = api_key_problem(values[name])
        if problem:
            problems.append(f"{path}: secret {name!r} {problem}; expected {API_KEY_RULE}: {_fix(path, name)}")
        elif values[name] in seen:
            problems.append(
                f"{path}: secrets {seen[values[name]]!r} and {name!r} hold the same key; expected each API key"
                f" distinct (one key, one role): {_fix(path, name)}"
            )
        else:
            seen[values[name]] = name
    return problems


def new_value_problem(path: Path, name: str, value: str) -> str | None:
    """Why `value` cannot be stored as `name` in the vault at path (`vault set`, `rotate`), without
    the value; None when it can. An API key is also compared with the vault's other API keys."""
    problem = _value_problem(value)
    if problem or not is_api_key(name):
        return problem
    problem = api_key_problem(value)
    if problem:
        return f"{problem}; expected {API_KEY_RULE}"
    others = decrypt_all(path, [n for n in load(path) if is_api_key(n) and n != name]) if Path(path).exists() else {}
    same = next((n for n, v in sorted(others.items()) if v == value), None)
    if same:
        return f"is the key {same} holds; expected each API key distinct (one key, one role)"
    return None


def _fix(path: Path, name: str) -> str:
    return f"set a new one: inference-host vault set {path} {name} (value on stdin)"


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
    if sys.stdin.isatty():  # typed: never echoed, never in the shell's history
        import getpass

        value = getpass.getpass(f"value of {name} (not echoed): ")
    else:
        value = read_value(sys.stdin, MAX_SECRET_CHARACTERS + 2)
    if not value:
        print(f"{path}: no value on stdin; nothing written", file=sys.stderr)
        return 2
    problem = new_value_problem(path, name, value)
    if problem:  # the value itself is never echoed
        print(f"{path}: the value for {name} {problem}; nothing written", file=sys.stderr)
        return 2
    replaced = [old for old, new in RENAMED_SECRETS.items() if new == name and old in existing]
    set_secret(path, name, value)
    print(f"{path}: {name} set" + "".join(f" (replaces {old}, its old name)" for old in replaced))
    return 0


if __name__ == "__main__":
    run_command(lambda: _main(sys.argv[1:]), "python -m roles.site.vault")
