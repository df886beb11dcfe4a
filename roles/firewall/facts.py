"""Facts of roles/firewall."""

from __future__ import annotations

from pyinfra.api import FactBase

from roles.shared.shell import Shell, sh


class SshConnection(FactBase):
    """Returns the deploy's own SSH connection as the host sees it, (client address, server
    port), from sshd's SSH_CONNECTION ("CLIENT_IP CLIENT_PORT SERVER_IP SERVER_PORT", sshd(8)
    ENVIRONMENT) in the environment of this command or of the first ancestor that has it (sudo
    resets the environment, its parent shell still holds it); None without one (docker exec,
    @local)."""

    def command(self) -> Shell:
        return sh(
            'pid=$$; while [ "$pid" -gt 1 ]; do'
            """ tr '\\000' '\\n' < "/proc/$pid/environ" 2>/dev/null | grep -m1 '^SSH_CONNECTION=' && exit 0;"""
            """ pid=$(sed -n 's/^PPid:[[:space:]]*//p' "/proc/$pid/status" 2>/dev/null);"""
            ' [ -n "$pid" ] || pid=0; done; true'
        )

    def process(self, output: list[str]) -> tuple[str, int] | None:
        return parse_ssh_connection(output)


def parse_ssh_connection(output: list[str]) -> tuple[str, int] | None:
    for line in output:
        parts = line.strip().removeprefix("SSH_CONNECTION=").split()
        if line.startswith("SSH_CONNECTION=") and len(parts) == 4 and parts[3].isdigit():
            return parts[0], int(parts[3])
    return None
