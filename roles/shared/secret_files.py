"""Writing a secret onto a host: mode 0600, never in a command line, a log, a diff, or a file
another user can read at any moment.

Why not files.put (pyinfra 3.10, operations/files.py + connectors/ssh.py):
- with `--diff`, files.put prints the new content line by line, and pyinfra runs the
  operation's generator again when it executes (api/operation.py, command_generator), with
  state.config.DIFF as the command line set it: switching DIFF off around the call only
  covers the planning pass;
- over SSH without sudo, the SSH connector's put_file writes the destination itself through
  SFTP (sftp.putfo: created at the SFTP server's default mode, usually 0644), and files.put
  chmods it afterwards; `_temp_dir` is used only with sudo/su. The file is readable by others
  between the two steps, and forever if the chmod fails.

So the secret is uploaded into a root-only folder (0700: whatever mode SFTP gives the file,
nobody else can reach it) and put in place by one of two writers, chosen on the host from who
can change the destination's folder (`install_steps`):

- every folder from the destination's up to / belongs to root and nobody else may write in it:
  nobody but root can swap a name there, so root copies the upload beside the destination with
  `install -m 0600 -o user -g group` and renames it over the destination (atomic; a reader sees
  the old file or the new one, never a partial one);
- the folder belongs to the file's own user (the Hub token in the service account's home): the
  file is written and renamed by processes running as that user (setpriv, the upload handed
  over on standard input; `dd conv=excl` creates the new file with O_EXCL, which refuses a
  link in its place). Root writing there could be raced: a process of that account
  that swaps the new file's name for a symbolic link between root's steps turns root's chown or
  chmod onto a file of its choice (`rm -f new; cat > new; chown new` was won that way). Written
  as the account, a link leads only where the account could already write;
- any other folder is refused in one line (a folder another account may change).

Nothing is printed but the operation's name. Whether anything is to do is decided from a fact
that reports the destination's sha256, mode and owner (a symbolic link there counts as absent:
the rename replaces the link, not what it points to).
"""

from __future__ import annotations

import hashlib
from io import BytesIO
from pathlib import PurePosixPath

from pyinfra import host
from pyinfra.api import FactBase, FileUploadCommand, StringCommand, deploy, operation
from pyinfra.operations import files

from roles.shared.fact_batch import batched
from roles.shared.shell import Shell, chain, sh

# A root-only folder for the upload; the staged copy is removed once the file is in place.
UPLOAD_DIR = "/var/lib/inference-host/upload"


class Sealed:
    """A secret value that prints as *** wherever pyinfra or a traceback shows an argument."""

    def __init__(self, value: str):
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "***"

    __str__ = __repr__


@batched
class SecretFileState(FactBase):
    """Returns (sha256, mode, user, group) of a file, or None when it does not exist or is a link."""

    def command(self, path: str) -> Shell:
        return sh(
            "if [ -f {path} ] && [ ! -L {path} ]; then stat -c '%a %U %G' -- {path}"
            " && sha256sum -- {path} | cut -d' ' -f1; fi",
            path=path,
        )

    def process(self, output: list[str]) -> tuple[str, str, str, str] | None:
        lines = [line.strip() for line in output if line.strip()]
        if len(lines) < 2:
            return None
        mode, user, group = lines[0].split()
        return lines[1], mode, user, group


def _folders(dest: str) -> list[str]:
    """The destination's folder and every folder above it (relative paths stay relative, so
    no value can reach find(1) as an option)."""
    parents = [str(p) for p in PurePosixPath(dest).parents]
    return parents if dest.startswith("/") else [f"./{p}" for p in parents]


def install_steps(staged: str, dest: str, user: str, group: str) -> list[Shell]:
    """Shell steps that put the staged upload in place at dest (0600, user:group), following no
    link another account could plant (the module's docstring says how)."""
    new = f"{dest}.inference-host-new"
    folders = _folders(dest)
    refusal = (
        f"refusing to install {dest}: its folder {folders[0]} is neither root's alone (every folder"
        f" up to / owned by root, writable by no one else) nor owned by {user}, the file's owner"
    )
    # Run as the file's owner (its groups, no way back to more privilege), for a folder it owns.
    owner = sh("setpriv --reuid={user} --regid={group} --init-groups --no-new-privs --", user=user, group=group)
    return [
        sh(
            'if [ "$(find {folders} -maxdepth 0 -type d -user 0 ! -perm /022 -printf x)" = {count} ]; then'
            " install -m 0600 --owner={user} --group={group} -T -- {staged} {new} && mv -f -T -- {new} {dest};"
            ' elif [ -n "$(find {folder} -maxdepth 0 -type d -user {user} -printf x)" ]; then'
            " (umask 077 && {owner} rm -f -- {new} && {owner} dd of={new} conv=excl status=none < {staged}"
            " && {owner} mv -f -T -- {new} {dest});"
            " else echo {refusal} >&2; false; fi",
            folders=folders,
            count="x" * len(folders),
            folder=folders[0],
            user=user,
            group=group,
            staged=staged,
            new=new,
            dest=dest,
            owner=owner,
            refusal=refusal,
        ),
        sh("rm -f -- {staged}", staged=staged),
    ]


def staged_path(dest: str, upload_dir: str = UPLOAD_DIR) -> str:
    return f"{upload_dir}/{hashlib.sha1(dest.encode()).hexdigest()}"


@operation(is_idempotent=True)
def secret_put(sealed: Sealed, dest: str, user: str, group: str):
    """Install a secret at dest (0600, user:group); prints nothing of its content."""
    data = sealed.reveal().encode()
    wanted = (hashlib.sha256(data).hexdigest(), "600", user, group)
    if host.get_fact(SecretFileState, path=dest) == wanted:
        host.noop(f"{dest} is in place (mode 0600, {user}:{group})")
        return
    staged = staged_path(dest)
    # remote_temp_filename: were the connection to use sudo, the SSH user's upload would go
    # there (inside the 0700 folder, so it fails rather than lands in /tmp); the inventory
    # connects as root.
    yield FileUploadCommand(BytesIO(data), staged, remote_temp_filename=f"{staged}.upload")
    yield StringCommand(chain(*install_steps(staged, dest, user, group)))


@deploy("Secret file")
def secret_file(label: str, value: str, dest: str, user: str, group: str):
    """Returns the install operation (callers wire restarts to its did_change)."""
    files.directory(
        name="Create the root-only upload folder for secrets", path=UPLOAD_DIR, user="root", group="root", mode="0700"
    )
    return secret_put(
        name=f"Install {label} at {dest} (mode 0600)", sealed=Sealed(value), dest=dest, user=user, group=group
    )
