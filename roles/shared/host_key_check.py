"""A host whose SSH key differs from the pinned one: one line naming both fingerprints, and the
deploy stops before any command runs on any host.

pyinfra 3.10 turns paramiko's BadHostKeyException into four warning lines and "SSH host key
error: Host key for X does not match." (pyinfra/connectors/ssh.py `_connect`), without either
key, and then goes on with the hosts it could reach. Installed by config.py, `install` wraps the
connect of pyinfra's SSH client (pyinfra/connectors/sshuserclient/client.py `SSHClient.connect`,
which raises paramiko's exception with both keys) so the host's error line says what is pinned,
what answered and what to do; `refuse_changed` (deploy.py's first step) then stops the whole
deploy while it plans: a changed key is a reason to stop, not a host to skip.
"""

from __future__ import annotations

import base64

from roles.shared.refusal import Refused
from roles.site.host_keys import HostKey

# inventory host (as pyinfra names it) -> its one-line report; filled while pyinfra connects.
CHANGED: dict[str, str] = {}


def changed_key_line(address: str, known_hosts: str | None, expected, presented) -> str:
    """The report for paramiko's keys (PKey: get_name(), asbytes())."""
    pinned = HostKey(expected.get_name(), base64.b64encode(expected.asbytes()).decode())
    answered = HostKey(presented.get_name(), base64.b64encode(presented.asbytes()).decode())
    return (
        f"SSH host key of {address} changed: {known_hosts or 'known_hosts'} pins {pinned.type}"
        f" {pinned.fingerprint}, the host presented {answered.type} {answered.fingerprint}; nothing was"
        " run. If the host was rebuilt, compare the new key on its console (ssh-keygen -lf"
        " /etc/ssh/ssh_host_ed25519_key.pub) and pin it: inference-host trust INVENTORY HOST --replace"
    )


def unpinned_line(address: str, known_hosts: str | None) -> str:
    return (
        f"no SSH host key of {address} is pinned in {known_hosts or 'known_hosts'}, and only a pinned key"
        " is accepted: the deploy pins the guests it creates; pin another host after checking its"
        " fingerprint: inference-host trust INVENTORY HOST"
    )


def install() -> None:
    from paramiko import BadHostKeyException, SSHException
    from pyinfra.api.exceptions import ConnectError
    from pyinfra.connectors.sshuserclient import client

    connect = client.SSHClient.connect
    if getattr(connect, "one_line_host_key", False):
        return

    # pyinfra passes everything but the host name by keyword (pyinfra/connectors/ssh.py _connect).
    def connect_or_one_line(self, hostname, **kwargs):
        known_hosts = kwargs.get("_pyinfra_ssh_known_hosts_file")
        try:
            return connect(self, hostname, **kwargs)
        except BadHostKeyException as error:
            line = changed_key_line(hostname, known_hosts, error.expected_key, error.key)
            CHANGED[hostname] = line
            # A ConnectError is the host's own error line (pyinfra/api/host.py `connect`); raised
            # here, past pyinfra's handler of the paramiko exception and its retries.
            raise ConnectError(line) from None
        except SSHException as error:
            if not str(error).startswith("StrictPolicy:"):  # pyinfra's own policy: no key pinned
                raise
            # Not a reason to stop the others: a guest the node has not made yet is such a host.
            raise ConnectError(unpinned_line(hostname, known_hosts)) from None

    connect_or_one_line.one_line_host_key = True  # type: ignore[attr-defined]  # a mark on the function
    connect_or_one_line.__wrapped__ = connect  # type: ignore[attr-defined]  # the contract test reads pyinfra's signature
    client.SSHClient.connect = connect_or_one_line  # type: ignore[method-assign, assignment]


def refuse_changed() -> None:
    """Stops the deploy while it plans when any host answered with another key than pinned."""
    if CHANGED:
        raise Refused("; ".join(CHANGED[address] for address in sorted(CHANGED)))
