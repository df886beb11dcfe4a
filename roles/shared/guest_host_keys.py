"""A guest's SSH host key, read through its node and pinned in the inventory's known_hosts file
before anything connects to the guest (docs/security.md#host-keys).

The node is reached over a pinned key itself, so what it reads from inside the guest is the
guest's key, whoever answers at the guest's address: an LXC guest's key file through `pct exec`
(lxc-attach on the node), a KVM guest's key as cloud-init prints it on the VM's serial console at
its first boot, read from the console's socket on the node; no network between.
The deploy reaches a guest it has created in its next pass (roles/proxmox_host
continue_in_guests): the pin is written in this pass, on the control machine, so that pass
connects strictly.
"""

from __future__ import annotations

from pathlib import Path

from pyinfra.operations import python

from roles.shared.refusal import failed
from roles.shared.shell import Shell, argv
from roles.site import HostSettings
from roles.site.host_keys import (
    HostKeyError,
    host_pattern,
    parse_public_key,
    reached_over_ssh,
    record_key,
    recorded_keys,
)
from roles.site.schema import address_of

HOST_KEY_FILE = "/etc/ssh/ssh_host_ed25519_key.pub"
# A container just started may still be running its first boot: the key is waited for, bounded.
KEY_WAIT_S = 30
# Looped in the container's own shell (POSIX sh, no seq): the key file, once it is not empty.
_WAIT_FOR_KEY = 'i=0; while [ "$i" -lt "$1" ]; do [ -s "$2" ] && exec cat "$2"; i=$((i + 1)); sleep 1; done; exit 1'


def read_lxc_key_command(vmid: int) -> Shell:
    return argv("pct", "exec", vmid, "--", "sh", "-c", _WAIT_FOR_KEY, "sh", KEY_WAIT_S, HOST_KEY_FILE)


# cloud-init prints the VM's host public keys between these lines on the console at the end of
# the first boot of an instance (cc_keys_to_console, a per-instance module, runs its
# write-ssh-key-fingerprints tool), on the console its kernel writes to (console=ttyS0).
CONSOLE_BEGIN = "-----BEGIN SSH HOST KEY KEYS-----"
CONSOLE_END = "-----END SSH HOST KEY KEYS-----"
# A first boot may upgrade the image's packages (Proxmox's ciupgrade) before it prints the keys,
# and a VM with many GPUs passed through boots slowly. The console is read for at most this long.
KVM_KEY_WAIT_S = 1200
# On the node (Perl is Proxmox's own language, always there): connect to the VM's serial console
# socket, where QEMU writes what the VM prints on ttyS0 to whoever is connected (nothing is kept
# for a later reader), and print the keys' block once it is complete; a bounded wait.
_READ_CONSOLE_KEYS = (
    "use IO::Socket::UNIX; my ($path, $wait, $begin, $end) = @ARGV;"
    ' $SIG{ALRM} = sub { die "no SSH host keys on $path within $wait s\\n" }; alarm $wait;'
    ' my $console = IO::Socket::UNIX->new(Peer => $path) or die "cannot connect to $path: $!\\n";'
    " my $in = 0; while (my $line = <$console>) { $line =~ s/[\\r\\n]+\\z//;"
    ' $in ||= index($line, $begin) >= 0; next unless $in; print "$line\\n"; exit 0 if index($line, $end) >= 0 }'
    ' die "$path closed before the SSH host keys were printed\\n";'
)


def kvm_console_socket(vmid: int) -> str:
    """serial0's socket (qemu-server src/PVE/CLI/qm.pm `terminal`: /var/run/qemu-server/VMID.serial0)."""
    return f"/var/run/qemu-server/{vmid}.serial0"


def read_console_keys_command(socket: str, wait_s: int) -> Shell:
    return argv("perl", "-e", _READ_CONSOLE_KEYS, socket, wait_s, CONSOLE_BEGIN, CONSOLE_END)


def read_kvm_console_key_command(vmid: int) -> Shell:
    return read_console_keys_command(kvm_console_socket(vmid), KVM_KEY_WAIT_S)


def console_key(text: str, source: str) -> str:
    """The ed25519 line of the keys' block cloud-init printed (between CONSOLE_BEGIN and
    CONSOLE_END; the console's carriage returns and other lines around it ignored)."""
    lines = [line.strip() for line in text.replace("\r", "\n").splitlines()]
    found: list[str] = []
    if CONSOLE_BEGIN in lines and CONSOLE_END in lines:
        block = lines[lines.index(CONSOLE_BEGIN) + 1 : lines.index(CONSOLE_END)]
        found = [line for line in block if line.startswith("ssh-ed25519 ")]
    if len(found) != 1:
        raise HostKeyError(
            f"{source}: expected one ssh-ed25519 key between {CONSOLE_BEGIN} and {CONSOLE_END}, found"
            f" {len(found)}; its key is not pinned: check its fingerprint on the VM's console"
            " (ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub), then: inference-host trust INVENTORY HOST"
        )
    return found[0]


def pin_target(guest: HostSettings) -> tuple[Path, str] | None:
    """(known_hosts file, pattern) the guest's key is pinned under; None when the deploy does not
    reach the guest over SSH (a connector's host, like the lab's)."""
    known_hosts = guest.ssh.known_hosts_file
    if not reached_over_ssh(guest.name) or not known_hosts:
        return None
    return Path(known_hosts).expanduser(), host_pattern(address_of(guest), guest.ssh.port)


def pin_lxc_key(guest: HostSettings, created: bool) -> None:
    """An operation that reads the LXC guest's ed25519 host key on the node and pins it: replacing
    a pin when the deploy created the guest (an old pin is a destroyed guest's), else only where
    none is pinned yet (a different pin is the connection's business: it refuses)."""
    target = pin_target(guest)
    if target is None:
        return
    path, pattern = target
    vmid = guest.guest.vmid
    assert vmid is not None  # a guest has one (the site model requires guest_vmid)
    python.call(
        name=f"Pin the SSH host key of LXC guest {vmid} ({pattern}) in {path}, read on the node (pct exec)",
        function=_read_and_pin,
        command=read_lxc_key_command(vmid),
        source=f"LXC guest {vmid}'s {HOST_KEY_FILE}",
        path=str(path),
        pattern=pattern,
        replace=created,
    )


def pin_kvm_key_at_first_boot(guest: HostSettings, start: Shell) -> bool:
    """An operation that starts the KVM guest the deploy has just created (start: the role's
    `qm start`) and pins the ed25519 host key cloud-init prints on its serial console at that
    first boot, replacing any old pin (a destroyed guest's). The console is connected to at once
    after the start, in the same operation: what the VM prints while nobody reads is lost.
    False (nothing planned) when the deploy does not reach the guest over SSH."""
    target = pin_target(guest)
    if target is None:
        return False
    path, pattern = target
    vmid = guest.guest.vmid
    assert vmid is not None  # a guest has one (the site model requires guest_vmid)
    python.call(
        name=f"Start KVM guest {vmid} and pin its SSH host key ({pattern}) in {path},"
        " read from its serial console on the node",
        function=_start_and_pin,
        start=start,
        command=read_kvm_console_key_command(vmid),
        source=f"KVM guest {vmid}'s serial console ({kvm_console_socket(vmid)})",
        path=str(path),
        pattern=pattern,
    )
    return True


def _start_and_pin(state, host, start: Shell, command: Shell, source: str, path: str, pattern: str) -> bool:
    """python.call's callback: the start's own refusal (with the role's hint) fails the node."""
    ok, output = host.run_shell_command(start)
    if not ok:
        return failed(host, f"{host.name}: {output.stderr.strip()}")
    return _read_and_pin(state, host, command, source, path, pattern, replace=True, wait_s=KVM_KEY_WAIT_S, console=True)


def _read_and_pin(
    state,
    host,
    command: Shell,
    source: str,
    path: str,
    pattern: str,
    replace: bool,
    wait_s: int = KEY_WAIT_S,
    console: bool = False,
) -> bool:
    """python.call's callback (state and host first: its return value is the status). console:
    the output is the console's keys' block (console_key), else the key file."""
    ok, output = host.run_shell_command(command)
    if not ok:
        # A guest not ready is reported, not an error of its node (deploy.py): the node made it,
        # and nothing connects to the guest without a pin (strict checking), which this line says.
        host.log_styled(
            f"{host.name}: {source} could not be read within {wait_s} s ({output.stderr.strip()[:200]});"
            " its key is not pinned, and the deploy will not connect to the guest until it is"
            " (inference-host trust INVENTORY HOST, once you have checked its fingerprint)",
            fg="yellow",
        )
        return True
    try:
        text = console_key(output.stdout, f"{host.name}: {source}") if console else output.stdout
        key = parse_public_key(text, f"{host.name}: {source}")
        if record_key(Path(path), pattern, key, replace=replace):
            host.log_styled(f"Pinned {pattern} {key.type} {key.fingerprint} in {path}", fg="green")
    except HostKeyError as error:
        return failed(host, str(error))
    return True


def needs_pin(guest: HostSettings) -> bool:
    """No key of the guest pinned yet (read on the control machine while planning)."""
    target = pin_target(guest)
    return target is not None and not recorded_keys(target[0]).get(target[1])
