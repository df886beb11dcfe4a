"""The package mirrors' credentials (cuda_repo_credentials_secret, base_pypi_index_credentials_secret):
from the vault into 0600 root files that each consumer reads by itself. Never into a URL, a command
line, an environment variable's value, a build argument or a 0644 file: the URLs stay as the
inventory has them, without a user part.

- apt reads /etc/apt/auth.conf.d/*.conf (apt_auth.conf(5); Debian/apt methods/aptmethod.h opens
  them as root before it drops privileges, so 0600 root is enough). Its parser
  (apt-pkg/contrib/netrc.cc, MaybeAddAuth, apt 2.x) splits tokens on spaces and tabs, knows no
  quoting, and uses an entry whose machine has no protocol for https only: ours names the
  protocol and the repository's path, `machine https://host[:port]/path`, so the credential goes
  to that repository and nowhere else. The keyring package is downloaded by apt's own helper
  (/usr/lib/apt/apt-helper download-file), which reads the same file: one copy of the secret.
- uv and pip read the netrc file named by NETRC (uv's documentation, "Authentication: netrc files";
  pip through its vendored requests, utils.get_netrc_auth), matched by the index's host name. Only
  the file's path is in their environment.
- the kernel-wheel builds (roles/wheels) get that netrc as a BuildKit secret (docker build
  --secret id=pypi-netrc,src=...; the Dockerfiles mount it with RUN --mount=type=secret), which
  lands in no layer and no image history, unlike a --build-arg.

The vault value is login:password, as a URL's user part would hold it but not percent-encoded.
netrc has no quoting its readers share (Python's netrc module reads '"' and '\\' as quoting, apt
and curl do not): a login or password is printable ASCII without spaces, double quotes or backslashes
(a keyword as a value is read as a value: each reader takes the token after `login` or `password`
as it is). A value outside that is refused in one line that names the setting and
the position of the character, never the value.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from pyinfra import host
from pyinfra.operations import files

from roles.shared.layout import ETC_DIR
from roles.shared.once import first_time
from roles.shared.refusal import Refused
from roles.shared.secret_files import secret_file
from roles.site import HostSettings, secret_value

CUDA_AUTH_FILE = "/etc/apt/auth.conf.d/inference-host-cuda.conf"
PYPI_NETRC = f"{ETC_DIR}/pypi.netrc"
BUILD_SECRET_ID = "pypi-netrc"
NOT_IN_TOKENS = {'"': "a double quote", "\\": "a backslash"}


class CredentialError(ValueError):
    """A credential (or a URL's part) that no netrc reader reads back unchanged; the message holds
    no character of the value."""


def token_problem(value: str) -> str | None:
    """Why value cannot be one netrc token, or None; never showing the value."""
    if not value:
        return "is empty"
    for index, char in enumerate(value, 1):
        if char in NOT_IN_TOKENS:
            return f"holds {NOT_IN_TOKENS[char]} at character {index}"
        if not "!" <= char <= "~":
            kind = "a space" if char == " " else "a control character" if char.isascii() else "a non-ASCII character"
            return f"holds {kind} at character {index}"
    return None


def token(value: str, what: str) -> str:
    problem = token_problem(value)
    if problem:
        raise CredentialError(f"{what} {problem}")
    return value


def parse_credentials(value: str, setting: str) -> tuple[str, str]:
    """(login, password) of a vault value login:password (one trailing newline allowed)."""
    text = value[:-1] if value.endswith("\n") else value
    login, colon, password = text.partition(":")
    if not colon:
        raise CredentialError(f"the vault value of {setting} has no ':'; expected login:password")
    return (
        token(login, f"the login in {setting}'s vault value"),
        token(password, f"the password in {setting}'s vault value"),
    )


def apt_auth_text(repo_url: str, login: str, password: str) -> str:
    """An apt_auth.conf(5) entry for everything under repo_url (its protocol named: apt uses an entry
    without one for https only)."""
    parts = urlsplit(repo_url)
    machine = token(f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}/", "the repository URL")
    return _entry(machine, login, password)


def netrc_text(index_url: str, login: str, password: str) -> str:
    """A netrc entry for the index's host (uv and requests look entries up by host name)."""
    return _entry(token(urlsplit(index_url).hostname or "", "the index's host name"), login, password)


def _entry(machine: str, login: str, password: str) -> str:
    """One line: netrc's tokens are separated by blanks, and each value was checked to be one token."""
    words = ("machine", machine, "login", token(login, "the login"), "password", token(password, "the password"))
    return " ".join(words) + "\n"


def _credentials(setting: str, ref: str) -> tuple[str, str]:
    try:
        return parse_credentials(secret_value(ref), setting)
    except CredentialError as error:
        raise Refused(
            f"{host.name}: {setting} = {ref!r}: {error}; expected login:password of printable ASCII without"
            " spaces, double quotes or backslashes (inference-host vault set FILE NAME, value on stdin)"
        ) from None


def cuda_auth(settings: HostSettings) -> bool:
    """apt's credential for the CUDA mirror, written once per host; False when the mirror needs none."""
    ref = settings.cuda.repo_credentials_secret
    if not ref:
        return False
    if first_time("the CUDA mirror's credential"):
        login, password = _credentials("cuda_repo_credentials_secret", ref)
        files.directory(name="Create /etc/apt/auth.conf.d", path="/etc/apt/auth.conf.d", mode="0755")
        secret_file(
            label="the CUDA mirror's login (cuda_repo_credentials_secret)",
            value=apt_auth_text(settings.cuda.repo_url, login, password),
            dest=CUDA_AUTH_FILE,
            user="root",
            group="root",
        )
    return True


def pypi_netrc(settings: HostSettings) -> str | None:
    """The netrc file uv, pip and the wheel builds read for the PyPI mirror, written once per host;
    None when the mirror needs no credential."""
    ref = settings.base.pypi_index_credentials_secret
    if not ref or not settings.base.pypi_index_url:
        return None
    if first_time("the PyPI mirror's credential"):
        login, password = _credentials("base_pypi_index_credentials_secret", ref)
        files.directory(name=f"Create {ETC_DIR}", path=ETC_DIR, mode="0755")
        secret_file(
            label="the PyPI mirror's login (base_pypi_index_credentials_secret)",
            value=netrc_text(settings.base.pypi_index_url, login, password),
            dest=PYPI_NETRC,
            user="root",
            group="root",
        )
    return PYPI_NETRC
