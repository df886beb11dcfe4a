"""The SSH public keys of a Proxmox guest (guest_ssh_public_keys): kept on its node, given to a
new guest at creation, and converged on an existing one from the node.

At creation both CLIs read a file on the node: `pct create --ssh-public-keys FILE` and
`qm create --sshkeys FILE` (pve-container 5.3.5 src/PVE/CLI/pct.pm and qemu-server 8.4.10
src/PVE/CLI/qm.pm, their parameter mappings; qm.pm URL-encodes the file's text into the config).

An existing container: pct writes the keys only in its post-create hook
(pve-container 5.3.5 src/PVE/LXC/Setup/Base.pm, set_user_authorized_ssh_keys and
ct_modify_file): root's ~/.ssh made 0700 when missing, and the keys placed between the lines
`# --- BEGIN PVE ---` and `# --- END PVE ---` of ~/.ssh/authorized_keys, appended to a file that
has no such block; lines outside the block are never touched. The deploy keeps exactly that
block equal to the setting (a key removed from the setting leaves the block, a key added inside
the guest outside the block stays) and writes the whole file back with `pct push ... --perms
0600` (src/PVE/CLI/pct.pm push: a running container only; the file is created or truncated in
the container's own namespaces, so it belongs to the container's root).
"""

from __future__ import annotations

import re
import urllib.parse
from io import StringIO

from pyinfra.operations import files

from roles.shared.layout import ETC_DIR
from roles.shared.shell import Shell, argv, sh
from roles.site import HostSettings

GUEST_KEYS_DIR = f"{ETC_DIR}/guest-keys"
AUTHORIZED_KEYS = "/root/.ssh/authorized_keys"
# pve-container Setup/Base.pm ct_modify_file: the marked block pct manages in a file.
PVE_BEGIN = "# --- BEGIN PVE ---"
PVE_END = "# --- END PVE ---"


def keys_file(guest: HostSettings) -> str:
    return f"{GUEST_KEYS_DIR}/{guest.guest.vmid}.pub"


def keys_text(guest: HostSettings) -> str:
    """The keys file's text: one key per line (what pct and qm read from it)."""
    return "".join(f"{key}\n" for key in guest.guest.ssh_public_keys)


def qm_sshkeys(guest: HostSettings) -> str:
    """The keys as a VM's config stores them: URI::Escape::uri_escape of the file's text
    (qemu-server 8.4.10 src/PVE/CLI/qm.pm param_mapping; unreserved characters kept)."""
    return urllib.parse.quote(keys_text(guest), safe="-_.~")


def put_guest_keys(guest: HostSettings) -> None:
    """Keep the guest's keys on the node (root-only): the file a create reads."""
    if not guest.guest.ssh_public_keys:
        return
    files.directory(name=f"Create {GUEST_KEYS_DIR}", path=GUEST_KEYS_DIR, mode="0700")
    files.put(
        name=f"Public keys for guest {guest.guest.vmid} ({len(guest.guest.ssh_public_keys)})",
        src=StringIO(keys_text(guest)),
        dest=keys_file(guest),
        mode="0600",
    )


def with_pve_block(current: str | None, keys: list[str]) -> str:
    """authorized_keys with its PVE block holding exactly `keys` (Setup/Base.pm ct_modify_file).

    No file: the block alone. A block: replaced in place. No block: appended after the file's
    lines. Everything outside the block is kept as it is.
    """
    block = [PVE_BEGIN, *keys, PVE_END]
    if current is None:
        return "\n".join(block) + "\n"
    lines = current.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    begin = next((i for i, line in enumerate(lines) if _is_marker(line, "BEGIN")), None)
    end = None if begin is None else next((i for i in range(begin, len(lines)) if _is_marker(lines[i], "END")), None)
    if begin is not None and end is not None:
        lines[begin : end + 1] = block
    else:
        lines += block
    return "\n".join(lines) + "\n"


# ct_modify_file's patterns, as written there (only the END one ignores case).
_MARKERS = {
    "BEGIN": re.compile(r"^#\s*---\s*BEGIN\s*PVE\s*"),
    "END": re.compile(r"^#\s*---\s*END\s*PVE\s*", re.IGNORECASE),
}


def _is_marker(line: str, word: str) -> bool:
    return bool(_MARKERS[word].match(line))


def same_keys_file(current: str | None, wanted: str) -> bool:
    """Equal as sshd reads them: trailing blanks and empty lines do not count."""
    if current is None:
        return False

    def lines(text: str) -> list[str]:
        return [line.rstrip() for line in text.splitlines() if line.strip()]

    return lines(current) == lines(wanted)


def push_keys_commands(vmid: int, content: str, make_ssh_dir: bool) -> list[Shell]:
    """Write `content` to root's authorized_keys in running container `vmid`, from the node.

    pct push reads a file on the node: a mktemp file (0600, removed after). Without ~/.ssh the
    push would fail (it creates no folder): pct exec makes it first, 0700 as pct's setup does.
    pct push runs as a task, and a CLI reports a failed task by printing its error while still
    exiting 0 (pve-common src/PVE/RESTEnvironment.pm fork_worker / tee_worker; CLIHandler.pm
    ignores the task's result): the file is read back and compared, so a failed push fails.
    """
    commands = []
    if make_ssh_dir:
        commands.append(argv("pct", "exec", vmid, "--", "mkdir", "-m", "0700", "/root/.ssh"))
    commands.append(
        sh(
            "keys=$(mktemp) && printf '%s' {content} > \"$keys\""
            ' && pct push {vmid} "$keys" {keys_path} --perms 0600'
            " && [ \"$(pct exec {vmid} -- sha256sum {keys_path} | cut -d' ' -f1)\""
            ' = "$(sha256sum < "$keys" | cut -d\' \' -f1)" ]; status=$?; rm -f "$keys"; exit $status',
            content=content,
            vmid=vmid,
            keys_path=AUTHORIZED_KEYS,
        )
    )
    return commands
