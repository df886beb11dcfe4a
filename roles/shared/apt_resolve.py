"""Install an apt package by its upstream version, resolved on the host when the operation runs.

NVIDIA's DCGM packages carry an epoch (`1:4.5.3-1`) that their file names leave out (NVIDIA/DCGM
v4.5.3 CMakeLists.txt, CPACK_DEBIAN_PACKAGE_EPOCH 1), and whether the exporter's package has one
could not be read from NVIDIA's index: a literal `pkg=4.5.3-1` is "not found" by apt. The full
version is therefore read from the host's own index (`apt-cache madison`) at execution time, after
the repository is configured and `apt-get update` ran: a fact would be read while planning, before
the CUDA repository exists on a fresh host (docs/upstream.md).
"""

from __future__ import annotations

import re
import shlex

from pyinfra import host
from pyinfra.facts.deb import DebPackages
from pyinfra.operations import apt, server

# Debian policy 5.6.12: [epoch:]upstream_version[-debian_revision]
_EPOCH = re.compile(r"^[0-9]+:")
_REVISION = re.compile(r"-[^-]*$")


def upstream_version(version: str) -> str:
    """`1:4.5.3-1` -> `4.5.3`: the version without epoch and Debian revision."""
    return _REVISION.sub("", _EPOCH.sub("", version))


def installed_at(installed: dict, packages: list[str], upstream: str) -> bool:
    """True when every package is installed (DebPackages fact: name -> versions) at `upstream`."""
    return all(any(upstream_version(v) == upstream for v in installed.get(p) or ()) for p in packages)


def install_command(packages: list[str], upstream: str) -> str:
    """One shell step: each package at the candidate of the host's index whose upstream version is
    `upstream`, epoch and revision included as the index writes them; none -> one line naming the
    package, the pin and the versions the index has, exit 1, nothing installed."""
    names = " ".join(shlex.quote(p) for p in packages)
    return (
        f"pin={shlex.quote(upstream)}; args=''; "
        f"for pkg in {names}; do "
        "have=$(apt-cache madison \"$pkg\" | awk -F'|' '{gsub(/ /, \"\", $2); if (!seen[$2]++) print $2}'); "
        'full=$(printf \'%s\\n\' "$have" | awk -v pin="$pin" '
        '\'{v = $0; sub(/^[0-9]+:/, "", v); sub(/-[^-]*$/, "", v); if (v == pin) { print $0; exit } }\'); '
        'if [ -z "$full" ]; then [ -n "$have" ] || have=none; '
        "echo \"$pkg: version $pin (any epoch, any revision) is not in this host's apt index, which has:"
        " $(printf '%s' \"$have\" | tr '\\n' ' ')\" >&2; exit 1; fi; "
        'args="$args $pkg=$full"; done; '
        "DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends --allow-downgrades $args"
    )


def install_resolved(label: str, packages: list[str], upstream: str) -> None:
    """`packages` at upstream version `upstream`, the epoch and revision read from the host's index
    when the step runs (roles/shared/apt_resolve.py); skipped when they are installed at it."""
    installed = host.get_fact(DebPackages)
    apt.update(name=f"Update the apt index for {label} {upstream}", cache_time=24 * 3600)
    server.shell(
        name=f"Install {label} {upstream} (the version the host's apt index has, epoch included)",
        commands=[install_command(packages, upstream)],
        _if=lambda: not installed_at(installed, packages, upstream),
    )
