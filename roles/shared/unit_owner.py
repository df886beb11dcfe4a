"""A configured unit name against the units the host already has, before any change.

The site model refuses the names of the system's own units it knows (roles/site/grammars.py,
SYSTEM_UNITS), but only the host knows what else is installed there: a unit named like a
packaged service (`postgresql`, `nginx`, a vendor's agent) would be replaced by ours, since a
file in /etc/systemd/system overrides the package's in /usr/lib/systemd/system (systemd.unit(5),
"Unit File Load Path"). So the serving and gateway roles ask the host for its service unit files
(`systemctl list-unit-files`, aliases included) and refuse, while pyinfra is still planning (no
operation has run on any host), a configured name the host has as a unit this project did not
write.

Ours is recognised by what we install: /etc/systemd/system/<name>.service holds the line the
templates begin with, "written by inference-host (roles/...)" (roles/serving's unit is reached
through a link into the release, which grep follows; roles/gateway's is a file), or is a link
into <install_root>/current, where roles/serving keeps each release's unit.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyinfra import host
from pyinfra.api import FactBase

from roles.shared.layout import SYSTEMD_DIR
from roles.shared.refusal import Refused
from roles.shared.shell import Shell, chain, sh
from roles.site import current_site
from roles.site.errors import shown

# Both unit templates (roles/serving/templates/inference-engine.service.j2 and
# roles/gateway/templates/smg.service.j2) carry it, in either case, since their first versions.
MARKER = "written by inference-host (roles/"
LIST_TIMEOUT_S = 30


@dataclass(frozen=True)
class UnitFiles:
    """The host's service unit files (name -> systemctl's state: enabled, static, alias, ...),
    which of the asked names are ours, and where the asked names link to; `error` when the list
    could not be read."""

    states: dict[str, str]
    ours: frozenset[str]
    links: dict[str, str]
    error: str | None = None


class ServiceUnitFiles(FactBase):
    """Returns UnitFiles: `systemctl list-unit-files` of the service units (bounded), and for each
    of `units` whether its file in /etc/systemd/system is one this project wrote."""

    def command(self, units: list[str] | str) -> Shell:
        names = [units] if isinstance(units, str) else units  # one name, or a list of them
        listing = sh(
            'timeout {limit} systemctl list-unit-files --no-legend --no-pager --full --type=service; echo "list-rc $?"',
            limit=LIST_TIMEOUT_S,
        )
        # One test per asked unit (no `for` over quoted words): ours by its line, or where it links.
        owned = [
            sh(
                # printf, not echo: dash's echo reads a backslash in a name as an escape.
                "if grep -qsiF -e {marker} -- {path}; then printf '%s\\n' {ours}; fi;"
                " if [ -L {path} ]; then printf '%s %s\\n' {link} \"$(readlink -- {path})\"; fi",
                marker=MARKER,
                path=f"{SYSTEMD_DIR}/{unit}",
                ours=f"ours {unit}",
                link=f"link {unit}",
            )
            for unit in names
        ]
        return chain(listing, *owned, sh("true"), operator=";")

    def process(self, output: list[str]) -> UnitFiles:
        states: dict[str, str] = {}
        ours: set[str] = set()
        links: dict[str, str] = {}
        rc = None
        for line in output:
            words = line.split()
            if len(words) == 2 and words[0] == "list-rc":
                rc = int(words[1]) if words[1].isdigit() else -1
            elif len(words) == 2 and words[0] == "ours":
                ours.add(words[1])
            elif len(words) >= 3 and words[0] == "link":
                links[words[1]] = line.split(" ", 2)[2].strip()
            elif len(words) >= 2 and words[0].endswith(".service"):
                states[words[0]] = words[1]
        error = (
            None
            if rc == 0
            else "did not answer (no output)"
            if rc is None
            else f"ran past {LIST_TIMEOUT_S} s"
            if rc == 124
            else f"failed with exit {rc}"
        )
        return UnitFiles(states, frozenset(ours), links, error)


def foreign_unit_problem(setting: str, name: str, found: UnitFiles, install_root: str) -> str | None:
    """Why the configured unit name cannot be used on this host, or None (without "file: host")."""
    unit = f"{name.removesuffix('.service')}.service"
    if found.error:
        return (
            f"{setting} = {shown(name)} cannot be checked against the host's units: `systemctl list-unit-files`"
            f" {found.error}; expected systemd to answer there (systemctl status)"
        )
    state = found.states.get(unit)
    if state is None or unit in found.ours:
        return None
    if found.links.get(unit, "").startswith(f"{install_root.rstrip('/')}/current/"):
        return None
    return (
        f"{setting} = {shown(name)} is {unit}, a unit this host already has ({state}) that inference-host did not"
        f" write ({SYSTEMD_DIR}/{unit} has no '{MARKER}...' line); expected a unit name of its own"
    )


def refuse_foreign_units(units: dict[str, str], install_root: str) -> None:
    """Stop the deploy, before any operation runs anywhere, when a configured unit name (setting ->
    name) is a unit of this host's that the project did not write."""
    names = sorted({f"{name.removesuffix('.service')}.service" for name in units.values()})
    found = host.get_fact(ServiceUnitFiles, units=names)
    for setting, name in units.items():
        problem = foreign_unit_problem(setting, name, found, install_root)
        if problem:
            raise Refused(f"{current_site().inventory_file}: host {host.name}: {problem}")
