"""`inference-host trust INVENTORY HOST`: pin the SSH host key of a host the deploy did not create
(the node itself, a guest made before keys were pinned, a KVM guest) in the inventory's
known_hosts file, after showing its fingerprint (docs/operations.md, "trust").

Where the key comes from, best first:
- `--key-file FILE`: the host's public key, copied from its console (out of band);
- an LXC guest whose node is in the inventory: read on the node (`pct exec`), over the node's
  pinned key, as the deploy reads the guests it creates (roles/shared/guest_host_keys.py);
- otherwise what answers at the host's address (`ssh-keyscan`): shown as `ssh-keygen -l` prints
  it, to be compared with `ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub` on the host's
  console before it is confirmed.

A key already pinned is left alone (said so, exit 0); a different pinned key is refused unless
--replace. At a terminal the command asks; elsewhere it needs --yes.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from roles.site.command_line import FAILED, OK, UNREACHABLE, USAGE
from roles.site.host_keys import HostKey, HostKeyError, host_pattern, parse_public_key, record_key, recorded_key

SCAN_BOUND_S = 10  # ssh-keyscan's own -T is per connection step; the process is bounded too
KEY_TYPE = "ssh-ed25519"


class KeyUnavailable(Exception):
    """The key could not be read: the message says from where and why."""


def _connect_problem(address: str, port: int) -> str | None:
    """The exit-code contract's one line for an address that takes no TCP connection (ssh-keyscan
    itself says nothing about a refused port), or None when something accepts it."""
    from checks.reach import next_step

    try:
        with socket.create_connection((address, port), timeout=SCAN_BOUND_S / 2):
            return None
    except OSError as error:
        cause = error.strerror or str(error) or type(error).__name__
        step = next_step(cause, address, str(port))
        return f"{address}: unreachable at {address} port {port}: {cause}; what to do: {step}"


def _silent(address: str, port: int, cause: str) -> str:
    """The contract's one line for an address that takes the connection and gives no key."""
    from checks.reach import next_step

    step = next_step("banner", address, str(port))
    return f"{address}: unreachable at {address} port {port}: {cause}; what to do: {step}"


def scan_key(address: str, port: int | None) -> HostKey:
    """The ed25519 key that answers at address:port (ssh-keyscan, bounded)."""
    refused = _connect_problem(address, port or 22)
    if refused:
        raise KeyUnavailable(refused)
    command = ["ssh-keyscan", "-t", "ed25519", "-T", "5", "-p", str(port or 22), "--", address]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=SCAN_BOUND_S, check=False)
    except FileNotFoundError:
        raise KeyUnavailable("ssh-keyscan is not installed here (OpenSSH's client); pass --key-file") from None
    except subprocess.TimeoutExpired:
        raise KeyUnavailable(
            _silent(address, port or 22, f"ssh-keyscan gave no answer within {SCAN_BOUND_S} s")
        ) from None
    lines = [line for line in done.stdout.splitlines() if line.strip() and not line.startswith("#")]
    if not lines:
        # ssh-keyscan prints nothing for a port that accepts and never speaks (its -T is the wait)
        why = (done.stderr.strip().splitlines() or ["it printed nothing"])[-1][:160]
        raise KeyUnavailable(_silent(address, port or 22, f"no SSH banner or {KEY_TYPE} key within 5 s ({why})"))
    return parse_public_key(lines[0], f"ssh-keyscan {address}")


def node_key(inventory: str, guest) -> HostKey:
    """An LXC guest's key read on its node (pct exec), as the deploy reads it."""
    from inference_host.teardown import READ_BOUND_S, Unreachable, _on_node
    from roles.shared.guest_host_keys import read_lxc_key_command

    try:
        result = _on_node(inventory, guest.guest.node, read_lxc_key_command(guest.guest.vmid), READ_BOUND_S)
    except Unreachable as error:
        raise KeyUnavailable(str(error)) from None
    if result.rc != 0:
        raise KeyUnavailable(
            f"{guest.guest.node}: pct exec {guest.guest.vmid} could not read the key (exit {result.rc})"
        )
    return parse_public_key(result.stdout, f"{guest.guest.node}: LXC guest {guest.guest.vmid}")


def plan(path: Path, pattern: str, key: HostKey, replace: bool) -> tuple[str, str]:
    """('same' | 'new' | 'replace' | 'refused', what to say)."""
    found = recorded_key(path, pattern, key.type)
    if found == key:
        return "same", f"{pattern}: {key.type} {key.fingerprint} is already pinned in {path}; nothing changed"
    if found is None:
        return "new", f"{pattern} presents {key.type} {key.fingerprint}"
    if not replace:
        return "refused", (
            f"{pattern}: {path} pins {found.type} {found.fingerprint}, the host presents {key.fingerprint};"
            " nothing changed (pass --replace once you know why its key changed)"
        )
    return "replace", f"{pattern} presents {key.type} {key.fingerprint}, replacing the pinned {found.fingerprint}"


def _confirmed(args, question: str) -> str | None:
    """None when confirmed (--yes, or y at a terminal), else why not."""
    if args.yes:
        return None
    if not sys.stdin.isatty():
        return "not at a terminal: confirm with --yes once the fingerprint is checked; nothing changed"
    try:
        answer = input(f"{question} [y/N] ")
    except EOFError:
        answer = ""
    return None if answer.strip().lower() in ("y", "yes") else "not confirmed; nothing changed"


def trust(args, parser) -> int:
    from inference_host.site_load import load as _load
    from roles.site.host_keys import reached_over_ssh
    from roles.site.schema import address_of

    site = _load(parser, args.inventory)
    target = site.hosts.get(args.host)
    if target is None:
        parser.error(f"{args.host!r} is not a host of {args.inventory}; hosts: {', '.join(site.hosts) or 'none'}")
    if not reached_over_ssh(target.name) or not target.ssh.known_hosts_file:
        parser.error(f"{target.name} is reached by a pyinfra connector, not SSH: it has no host key to pin")
    path = Path(target.ssh.known_hosts_file).expanduser()
    address = address_of(target)
    pattern = host_pattern(address, target.ssh.port)
    node = site.hosts.get(target.guest.node or "")
    try:
        if args.key_file:
            source = str(args.key_file)
            key = parse_public_key(Path(args.key_file).read_text(), source)
        elif target.in_group("lxc_guests") and node is not None and target.guest.vmid is not None:
            source = f"read on {node.name} (pct exec {target.guest.vmid})"
            key = node_key(args.inventory, target)
        else:
            source = f"what answers at {pattern} (ssh-keyscan)"
            key = scan_key(address, target.ssh.port)
    except OSError as error:
        parser.error(f"--key-file {args.key_file}: {error.strerror}")
    except HostKeyError as error:
        print(f"inference-host trust: {error}", file=sys.stderr)
        return FAILED
    except KeyUnavailable as error:
        print(f"inference-host trust: {error}", file=sys.stderr)
        return UNREACHABLE
    verdict, line = plan(path, pattern, key, args.replace)
    if verdict == "same":
        print(line)
        return OK
    if verdict == "refused":
        print(f"inference-host trust: {line}", file=sys.stderr)
        return FAILED
    print(f"{target.name}: {line} ({source})")
    if "ssh-keyscan" in source:
        print("compare it with `ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub` on the host's own console")
    refusal = _confirmed(args, f"pin this key for {target.name} in {path}?")
    if refusal:
        print(f"inference-host trust: {refusal}", file=sys.stderr)
        return USAGE
    record_key(path, pattern, key, replace=args.replace)
    print(f"pinned {pattern} {key.type} {key.fingerprint} in {path}")
    return OK


def add_trust_parser(commands) -> None:
    sub = commands.add_parser(
        "trust",
        help="pin a host's SSH key in the inventory's known_hosts, after showing its fingerprint",
        description="Pin HOST's ed25519 host key in the inventory's known_hosts file (ssh_known_hosts_file,"
        " default <inventory>.known_hosts), for hosts the deploy did not create: the node, a guest made"
        " before keys were pinned, a KVM guest. An LXC guest's key is read on its node; another host's"
        " key is what answers at its address, shown as `ssh-keygen -l` prints it, to be compared on the"
        " host's console. A different pinned key is refused unless --replace.",
    )
    sub.add_argument("inventory", help="inventory file, e.g. inventory/prod.py")
    sub.add_argument("host", help="the host's inventory name")
    sub.add_argument("--yes", action="store_true", help="pin without asking (for scripts; check the fingerprint first)")
    sub.add_argument("--replace", action="store_true", help="replace a different key already pinned for the host")
    sub.add_argument("--key-file", metavar="FILE", help="the host's public key file, copied from its console")
    sub.set_defaults(run=trust)
