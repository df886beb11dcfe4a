"""Install an apt package by its upstream version, resolved on the host when the operation runs.

NVIDIA's DCGM packages carry an epoch (`1:4.5.3-1`) that their file names leave out (NVIDIA/DCGM
v4.5.3 CMakeLists.txt, CPACK_DEBIAN_PACKAGE_EPOCH 1), and whether the exporter's package has one
could not be read from NVIDIA's index: a literal `pkg=4.5.3-1` is "not found" by apt. The full
version is therefore read from the host's own index (`apt-cache madison`) at execution time, after
the repository is configured and the step's own `apt-get update` ran: a fact would be read while
planning, before the CUDA repository exists on a fresh host (docs/upstream.md).
"""

from __future__ import annotations

import re

from pyinfra import host
from pyinfra.facts.deb import DebPackages
from pyinfra.operations import server

from roles.shared.shell import Shell, sh

# Debian policy 5.6.1: package names; 5.6.12: [epoch:]upstream_version[-debian_revision]
_PACKAGE = re.compile(r"[a-z0-9][a-z0-9+.-]+")
_UPSTREAM = re.compile(r"[0-9][A-Za-z0-9.+~-]*")
_EPOCH = re.compile(r"^[0-9]+:")
_REVISION = re.compile(r"-[^-]*$")


def upstream_version(version: str) -> str:
    """`1:4.5.3-1` -> `4.5.3`: the version without epoch and Debian revision."""
    return _REVISION.sub("", _EPOCH.sub("", version))


def installed_at(installed: dict, packages: list[str], upstream: str) -> bool:
    """True when every package is installed (DebPackages fact: name -> versions) at `upstream`."""
    return all(any(upstream_version(v) == upstream for v in installed.get(p) or ()) for p in packages)


def install_command(pins: dict[str, str]) -> Shell:
    """One shell step: the index refreshed, then each package at the candidate of the host's index
    whose upstream version is its pin, epoch and revision included as the index writes them; a
    pin the index lacks -> one line naming the package, the pin and the versions the index has,
    exit 1, nothing installed.

    The refresh is part of the step (which runs only when something must be installed): an index
    read hours ago may lack the pinned release, or name files the repository no longer serves."""
    for package, upstream in pins.items():
        # apt-get reads any word starting with '-' as an option, and `pkg=version` splits at the
        # first '=': only names and versions of Debian's grammar reach it.
        if not (_PACKAGE.fullmatch(package) and _UPSTREAM.fullmatch(upstream)):
            raise ValueError(
                f"refused: {package!r}={upstream!r} is not a Debian package name and upstream version"
                " (Debian policy 5.6.1 and 5.6.12)"
            )
    # The pins travel as words (package, version, package, version, ...) in "$@"; each pair is
    # taken from the front and its resolved `package=version` put at the end.
    return sh(
        "DEBIAN_FRONTEND=noninteractive apt-get update -qq || exit 1; set -- {pairs}; n=$(($# / 2)); "
        'while [ "$n" -gt 0 ]; do pkg=$1; pin=$2; shift 2; n=$((n - 1)); '
        "have=$(apt-cache madison \"$pkg\" | awk -F'|' '{{gsub(/ /, \"\", $2); if (!seen[$2]++) print $2}}'); "
        'full=$(printf \'%s\\n\' "$have" | PIN="$pin" awk '
        '\'{{v = $0; sub(/^[0-9]+:/, "", v); sub(/-[^-]*$/, "", v);'
        ' if (v == ENVIRON["PIN"]) {{ print $0; exit }} }}\'); '
        'if [ -z "$full" ]; then [ -n "$have" ] || have=none; '
        "echo \"$pkg: version $pin (any epoch, any revision) is not in this host's apt index, which has:"
        " $(printf '%s' \"$have\" | tr '\\n' ' ')\" >&2; exit 1; fi; "
        'set -- "$@" "$pkg=$full"; done; '
        'DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends --allow-downgrades "$@"',
        pairs=[word for package, upstream in pins.items() for word in (package, upstream)],
    )


def install_resolved(label: str, pins: dict[str, str]) -> None:
    """Each package at its upstream version (`pins`: package -> version), the epoch and revision
    read from the host's freshly updated index when the step runs (roles/shared/apt_resolve.py);
    skipped when every one is installed at its version."""
    installed = host.get_fact(DebPackages)
    versions = ", ".join(f"{package} {upstream}" for package, upstream in pins.items())
    server.shell(
        name=f"Install {label}: {versions} (the versions the host's apt index has, epoch included)",
        commands=[install_command(pins)],
        _if=lambda: not all(installed_at(installed, [package], upstream) for package, upstream in pins.items()),
    )
