"""A repository's signing key, installed only when it is the key the settings pin.

apt trusts a repository through the key its sources entry names (`signed-by=`): whoever serves
that key file decides what root installs from then on. So a key is never trusted because of where
it came from. It is downloaded to a temporary folder, its primary keys' fingerprints are read
with gpg's own parser (`gpg --show-keys --with-colons`, the `fpr` record after each `pub`; gpg(1),
doc/DETAILS in GnuPG 2.2), and only a file whose primary keys are exactly the pinned one is
moved into place. Anything else stops the deploy in one line naming both fingerprints, and the
key file in place (if any) is left as it was.

The download goes through apt's own helper (/usr/lib/apt/apt-helper download-file), which reads
the mirror's login from /etc/apt/auth.conf.d as apt does (roles/shared/mirror_auth.py) and
honours apt's proxy settings. A plain-http mirror is safe to name here: what is fetched over it
is checked against the pin, and apt checks every index it reads against the pinned key.
"""

from __future__ import annotations

from pyinfra.api import FactBase
from pyinfra.operations import apt, server

from roles.shared.once import first_time
from roles.shared.shell import Shell, sh

APT_HELPER = "/usr/lib/apt/apt-helper"
KEY_DOWNLOAD_TIMEOUT_S = 600
# gpg's --with-colons output: each primary key's fingerprint is the 10th field of the first `fpr`
# record after its `pub` record (subkeys follow as `sub` records with `fpr` of their own).
PRIMARY_FINGERPRINTS = sh(
    'awk -F: \'$1 == "pub" {{ want = 1; next }} $1 == "sub" {{ want = 0 }}'
    ' want && $1 == "fpr" {{ print $10; want = 0 }}\''
)
# The package that brings /usr/bin/gpg on Debian and Ubuntu (gnupg depends on it).
GPG_PACKAGE = "gpg"


class KeyFingerprints(FactBase):
    """The primary keys' fingerprints in an OpenPGP key file (armored or binary), sorted; [] when
    the file is missing, None when gpg is missing (not installed yet: the key is checked again)."""

    def command(self, path: str) -> Shell:
        return sh(
            "[ -e {path} ] || exit 0; command -v gpg >/dev/null || {{ echo no-gpg; exit 0; }};"
            ' home=$(mktemp -d) && GNUPGHOME="$home" gpg --batch --with-colons --show-keys -- {path} 2>/dev/null'
            ' | {fingerprints}; rm -rf -- "$home"',
            path=path,
            fingerprints=PRIMARY_FINGERPRINTS,
        )

    def process(self, output: list[str]) -> list[str] | None:
        lines = [line.strip() for line in output if line.strip()]
        if lines == ["no-gpg"]:
            return None
        return sorted(lines)


def install_gpg(host) -> None:
    """gpg on the host, once per host and deploy (a host may take two or three keys)."""
    if not first_time("gpg"):
        return
    apt.packages(
        name=f"Install {GPG_PACKAGE} (reads the fingerprints of the repositories' signing keys)",
        packages=[GPG_PACKAGE],
        no_recommends=True,
        update=True,
        cache_time=24 * 3600,
    )


def install_command(url: str, dest: str, fingerprint: str, setting: str) -> Shell:
    """Download url, compare its primary keys with the pinned fingerprint, install it as dest
    (0644) only when they are exactly that one key; otherwise one line on stderr and exit 1."""
    return sh(
        "work=$(mktemp -d) || exit 1; trap 'rm -rf -- \"$work\"' EXIT;"
        ' timeout {limit} {helper} download-file {url} "$work/key" >/dev/null 2>"$work/err"'
        ' || {{ rc=$?; reason=$(grep -m 1 "^E: " "$work/err"); [ "$rc" = 124 ] && reason="timed out";'
        ' echo {download_failed}"${{reason:-apt-helper exit $rc}}" >&2; exit 1; }};'
        ' got=$(GNUPGHOME="$work" gpg --batch --with-colons --show-keys -- "$work/key" 2>/dev/null'
        " | {fingerprints} | sort | tr '\\n' ' '); got=${{got% }};"
        ' if [ "$got" != {expected} ]; then echo {served}"${{got:-no OpenPGP key}}"{pinned} >&2; exit 1; fi;'
        ' install -D -m 0644 -- "$work/key" {dest}',
        limit=KEY_DOWNLOAD_TIMEOUT_S,
        helper=APT_HELPER,
        url=url,
        download_failed=f"could not download {url} within {KEY_DOWNLOAD_TIMEOUT_S} s: ",
        fingerprints=PRIMARY_FINGERPRINTS,
        expected=fingerprint,
        served=f"{url}: the key served there is ",
        pinned=f", not the one {setting} pins ({fingerprint}); nothing was installed",
        dest=dest,
    )


def pinned_key(host, name: str, url: str, dest: str, fingerprint: str, setting: str):
    """The operation that leaves dest holding the key `fingerprint` pins (its did_change tells
    whether apt's lists need reading again). No change when dest already is that key."""
    install_gpg(host)
    present = host.get_fact(KeyFingerprints, path=dest)
    return server.shell(
        name=f"{name}: {url}, pinned to {fingerprint} ({setting})",
        commands=[install_command(url, dest, fingerprint, setting)],
        _if=lambda: present != [fingerprint],
    )
