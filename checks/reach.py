"""Whether a host can be reached at all, asked once before anything is run on it.

A host that does not answer is one line (its address and port, the cause in OpenSSH's own words,
the next step) and exit status 3, the same for every command (docs/operations.md): its checks
are not run, so a host that is down is not reported as a hundred failed checks, each blaming an
overloaded host.

The question is one `ssh ... true` with the settings the checks use (checks/connection.py's
config: the inventory's key, port, user, known hosts and jump host), bounded by OpenSSH's
ConnectTimeout, which covers the TCP connection and the protocol's banner and key exchange
(ssh_config(5)): a port that refuses, a name that does not resolve and a listener that never
speaks all end within it. Its connection stays open as the control master the checks' own
commands then ride on (connection.py's ControlPersist), so a reachable host costs no second
handshake. Hosts reached another way (local://, docker://) are not asked: the command itself
says when one is gone.
"""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import threading
from urllib.parse import parse_qs, urlsplit

# pyinfra's own connect timeout (its config's CONNECT_TIMEOUT default, pyinfra/api/config.py,
# 3.10): a host the deploy would give up on is given up on here too.
CONNECT_TIMEOUT_S = 10


def _ssh_words(url: str) -> tuple[list[str], str, str] | None:
    """ssh's options and target for an ssh:// URL as testinfra's ssh backend reads it, and the
    address and port said before asking (None: not an ssh URL)."""
    parts = urlsplit(url)
    if parts.scheme != "ssh" or not parts.hostname:
        return None
    options = []
    config = parse_qs(parts.query).get("ssh_config")
    if config:
        options += ["-F", config[0]]
    if parts.port:
        options += ["-p", str(parts.port)]
    target = f"{parts.username}@{parts.hostname}" if parts.username else parts.hostname
    return options, target, str(parts.port or "")


def _resolved(options: list[str], target: str, port: str) -> tuple[str, str]:
    """The address and port OpenSSH will use (`ssh -G`: the config read, nothing contacted)."""
    try:
        shown = subprocess.run(
            ["ssh", "-G", *options, "--", target], capture_output=True, text=True, timeout=5, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        shown = ""
    values = dict(line.split(" ", 1) for line in shown.splitlines() if " " in line)
    return values.get("hostname", target.rsplit("@", 1)[-1]), values.get("port", port or "22")


# paramiko 4.0's SSHClient.connect (client.py) waits for the key exchange with
# Transport.start_client(timeout=CONNECT_TIMEOUT), which returns, not raises, when the time is up;
# connect then asks get_remote_server_key(), which raises "No existing session" (transport.py).
# So from pyinfra (which connects with paramiko) these words mean: no SSH banner or key exchange
# came within the connect timeout, over a connection that was accepted.
PARAMIKO_NO_KEX = "No existing session"
NO_BANNER = (
    f"no SSH banner or key exchange within {CONNECT_TIMEOUT_S} s over an accepted connection"
    f" (paramiko's words for it: {PARAMIKO_NO_KEX})"
)


def plain_cause(cause: str) -> str:
    """The connector's cause, with what it means where its words do not say it."""
    return NO_BANNER if PARAMIKO_NO_KEX in cause else cause


# OpenSSH (9.x) says "connect to host A port P: Connection timed out" when the TCP connection
# itself got no answer (sshconnect.c, ssh_connect_direct: strerror(ETIMEDOUT)), and "Connection to
# A port P timed out" when it was accepted and the banner or key exchange then never came
# (packet.c, sshpkt_fatal: SSH_ERR_CONN_TIMEOUT).
_ACCEPTED_THEN_SILENT = re.compile(r"^connection to \S+ port \d+ timed out")


def next_step(cause: str, address: str, port: str) -> str:
    """What to do, by the cause ssh gave."""
    lowered = cause.lower()
    if "banner" in lowered or PARAMIKO_NO_KEX.lower() in lowered or _ACCEPTED_THEN_SILENT.match(lowered):
        return (
            f"something accepts connections on {address} port {port} but does not speak SSH: a hung or"
            " overloaded sshd (its MaxStartups, a full disk), or another program on that port; look from"
            " the host's console"
        )
    if "resolve" in lowered:
        return f"check the host's name or ssh_hostname in the inventory ({address}) and this machine's DNS"
    if "refused" in lowered or "unable to connect to port" in lowered:  # paramiko's words for it
        return f"sshd is not listening on {address} port {port}: check ssh_port in the inventory, or start sshd"
    if "permission denied" in lowered or "host key" in lowered:
        return "the host answered but refused this key: check ssh_user, ssh_key and ssh_known_hosts_file"
    return f"nothing answered on {address} port {port}: is the host up (its console), a firewall in between?"


def _sigint_as_at_exec() -> None:
    """In the child, after Python's at-fork hooks ran with SIGINT blocked: the default action
    (a Ctrl-C now ends the child silently; exec would reset a handler anyway), then unblocked."""
    with contextlib.suppress(ValueError):  # not the main thread of a non-gevent program: leave it
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def start_quietly(command: list[str], **options) -> subprocess.Popen:
    """subprocess.Popen, with SIGINT blocked while it forks. Under pyinfra's gevent (every command
    that loads an inventory) the child runs Python's at-fork hooks (threading's, gevent's) between
    fork and exec; a Ctrl-C there raised KeyboardInterrupt inside them, and the child printed
    "Exception ignored in ... _after_fork" and a traceback beside the command's one line. The
    blocked signal waits in the child until _sigint_as_at_exec, and in this process until the
    fork is done (then it interrupts as usual)."""
    _forking(+1)
    try:
        return subprocess.Popen(command, text=True, preexec_fn=_sigint_as_at_exec, **options)
    finally:
        _forking(-1)


# How many start_quietly calls are inside Popen now, per OS thread (a signal mask is a thread's;
# get_native_id is the OS thread's id under gevent too, get_ident a greenlet's). Under gevent,
# Popen yields while it waits for the child's exec and another host's greenlet forks meanwhile:
# the mask is set by the first in and cleared by the last out (each restoring "its" old mask
# would leave SIGINT blocked for good).
_FORKS: dict[int, list] = {}
_FORKS_LOCK = threading.Lock()


def _forking(step: int) -> None:
    with _FORKS_LOCK:
        thread = threading.get_native_id()
        count, was_blocked = _FORKS.get(thread, [0, False])
        if step > 0 and count == 0:
            was_blocked = signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        count += step
        _FORKS[thread] = [count, was_blocked]
        if count == 0:
            del _FORKS[thread]
            if not was_blocked:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _ask(command: list[str], seconds: int, started) -> str | None:
    """ssh's cause for not reaching the host, or None when `true` ran there."""
    try:
        process = start_quietly(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except OSError as error:
        return f"ssh could not be started: {error.strerror}"
    if started:
        started(process)
    try:
        _, stderr = process.communicate(timeout=seconds + 5)
    except subprocess.TimeoutExpired:  # past ssh's own timeout: a wedged lookup or proxy command
        process.kill()
        process.communicate()
        return f"no answer within {seconds + 5} s"
    if process.returncode < 0:  # killed by the caller that stopped waiting, or by a signal
        return f"ssh was stopped (signal {-process.returncode}) before it connected"
    if process.returncode != 255:  # `true` ran (or the remote shell said why not): reached
        return None
    said = [line.strip() for line in stderr.splitlines() if line.strip()]
    return said[-1] if said else "ssh exited 255 and said nothing"


def reason(url: str, timeout_s: float = CONNECT_TIMEOUT_S, started=None) -> str | None:
    """None when the host answers (or is not reached over ssh); else why not, in one line:
    "unreachable at ADDRESS port PORT: CAUSE; what to do: ...". started(process) is called with
    the ssh as it starts, so that a caller that stops waiting can kill it."""
    words = _ssh_words(url)
    if words is None:
        return None
    options, target, port = words
    seconds = max(1, int(timeout_s))
    command = ["ssh", *options, "-o", f"ConnectTimeout={seconds}", "-o", "BatchMode=yes", "--", target, "true"]
    cause = _ask(command, seconds, started)
    if cause is None:
        return None
    if cause.startswith("ssh was stopped"):  # the caller gave up waiting: no second ssh (-G)
        address, port = target.rsplit("@", 1)[-1], port or "22"
    else:
        address, port = _resolved(options, target, port)
    return f"unreachable at {address} port {port}: {cause[:200]}; what to do: {next_step(cause, address, port)}"


def unreachable(url: str, name: str | None = None, timeout_s: float = CONNECT_TIMEOUT_S) -> str | None:
    """reason(), the host's name first: the one line a command prints for it."""
    why = reason(url, timeout_s)
    return f"{name or urlsplit(url).hostname or url}: {why}" if why else None
