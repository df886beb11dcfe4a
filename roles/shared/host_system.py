"""What roles/base and roles/proxmox_host both do to the system they run on: refuse a distro
they do not support, and write kernel settings that apply at once (and at every boot)."""

from __future__ import annotations

from pyinfra import host
from pyinfra.facts.server import LinuxDistribution
from pyinfra.operations import files, server

from roles.shared.host_facts import ContainerVirtualization
from roles.shared.refusal import Refused
from roles.shared.shell import sh


def require_distro(supported: set[tuple[str, int]], role: str, what: str) -> None:
    """Stops the deploy of this host unless (distribution name, major version) is supported."""
    distro = host.get_fact(LinuxDistribution)
    if (distro.get("name"), distro.get("major")) not in supported:
        raise Refused(
            f"{host.name}: {distro.get('name')} {distro.get('major')} is not supported by {role}; expected {what}"
        )


def sysctl_file(path: str, template: str, sysctl: dict[str, str], name: str) -> None:
    """Writes the sysctl.d file (read at every boot) and applies it now when it changed. In a
    container /proc/sys is read-only but for its own namespaces' keys, and the lab's containers
    share the machine's kernel, which the deploy must not tune: there it is written only."""
    conf = files.template(name=name, src=template, dest=path, sysctl=sysctl, mode="0644")
    in_container = host.get_fact(ContainerVirtualization) is not None
    server.shell(
        name=f"Apply {path}",
        commands=[sh("sysctl -e -p {path}", path=path)],
        _if=lambda: conf.did_change() and not in_container,
    )
