"""Reboot a host when /run/reboot-required says so, and wait for it: a shared operation.

/run/reboot-required is the Debian convention for "a reboot is pending" (packages and the roles
touch it; /run is a tmpfs, so every boot starts without it). The check happens when the
operation runs, not while pyinfra plans, because the roles mark it in the same deploy.

pyinfra's own server.reboot confirms the reboot by a smaller /proc/uptime; this one confirms it
by /run being empty again (a token written just before is gone) and then waits for systemd to
finish booting (`systemctl is-system-running --wait`), so the next operation finds the services
a boot starts (modules loaded, device nodes made) already there. The same confirmation works on a
bare-metal node and on the lab's node container, which Docker restarts after `systemctl reboot`
ends its PID 1 (--restart=always); its /proc/uptime is the engine host's.
"""

from __future__ import annotations

from time import monotonic, sleep

from pyinfra.api import FunctionCommand, StringCommand, operation

from roles.shared.shell import Shell, sh

MARKER = "/run/reboot-required"
TOKEN = "/run/inference-host-reboot-token"


def required_now() -> bool:
    """True when the marker exists on the current host right now (an `_if=` condition)."""
    from pyinfra import host

    ok, _ = host.run_shell_command(StringCommand(f"test -f {MARKER}"))
    return ok


def why() -> Shell:
    """What asked for the reboot (/run/reboot-required.pkgs), for messages: a command
    substitution, to put between two quoted words."""
    return sh('"$(sort -u -- {pkgs} 2>/dev/null | paste -sd, -)"', pkgs=f"{MARKER}.pkgs")


@operation(is_idempotent=False)
def reboot_and_wait(reboot_timeout: int = 900, interval: int = 2):
    """Reboot the host (systemctl reboot) and return once it is back and done booting.

    + reboot_timeout: seconds to wait for the host to come back and finish booting
    + interval: seconds between reconnection attempts
    """
    yield StringCommand(f"echo $$ > {TOKEN}")
    yield StringCommand("( sleep 1 && systemctl reboot ) </dev/null >/dev/null 2>&1 &")

    def wait_until_booted(state, host):  # pragma: no cover (needs a host that reboots)
        deadline = monotonic() + reboot_timeout
        sleep(3)
        host.disconnect()
        while monotonic() < deadline:
            host.connect(show_errors=False)
            if host.connected:
                ok, _ = host.run_shell_command(StringCommand(f"test ! -e {TOKEN}"))
                if ok:
                    _, output = host.run_shell_command(StringCommand("systemctl is-system-running --wait || true"))
                    if output.stdout.strip() in ("running", "degraded"):
                        return True
            sleep(interval)
        raise Exception(f"{host.name} did not come back from its reboot within {reboot_timeout}s")

    yield FunctionCommand(wait_until_booted, (), {})
