"""One `docker exec -i <container> sh` per lab host, kept open, that runs each command pyinfra
sends instead of a `docker exec` per command.

Why: pyinfra's docker connector (pyinfra/connectors/docker.py, 3.10) starts the docker CLI once
per command (`sh -c "docker exec -i <id> sh -c '<command>'"`): about 65 ms each on a 2-core
machine, measured through pyinfra (20 file uploads: 119 commands, 7.8 s), where the command
itself takes a few. A bare lab walk runs hundreds. Over SSH, what the target uses, a command is a
new channel on one open connection; this is the lab's equivalent.

What stays as docker exec made it: each command runs in a process started by `docker exec`
(the container's cgroup, capabilities, seccomp and AppArmor profile, its environment and `/` as
working directory), as `sh -c '<command>'` with pyinfra's own wrapping (env, sudo, su:
make_unix_command_for_host), stdin from /dev/null as pyinfra's closed pipe, exit status and the
stdout and stderr lines kept apart. What differs, on purpose: output arrives when the command
ends (pyinfra prints it only with -v); stdout lines come before stderr lines (pyinfra reads the
two pipes in two greenlets, so their order was arrival order, not a contract).

Each command writes its two outputs to files of its own (named by a random token) in a folder
private to the session; the session then prints a frame: a head line (the token, the status and
the two outputs' sizes in bytes), each output's first that-many bytes base64-encoded, the token
after each, and removes the two files (a child still writing between the size and the encoding
adds nothing to the frame). Nothing the command prints can end its own output early, and a background child
the command left (`(sleep 1; echo late) &`) writes into files already read and removed, never into
the next command's. A frame that is not exactly that (a stray write into the shell's own output,
an output whose size differs from its head's) or an output file that is gone (something removed
the session's folder under the command) ends the session: the command is answered failed (status
255, as docker exec does when its container goes away), never run again, and a new session takes
the next command. A folder found gone BEFORE a command starts means the command has not run: a
new session runs it, once. A session that ends mid-command (the container stopped: the node's
reboot) answers the same way; a timed-out command's session is killed and its folder removed
through a new `docker exec` (the argv with `-c`). A command that sends stdin (pyinfra's _stdin)
or asks for a terminal (_get_pty) goes through docker exec as before.
"""

from __future__ import annotations

import base64
import binascii
import secrets
import shlex
import subprocess

import gevent
import gevent.lock
from pyinfra.connectors.util import CommandOutput, OutputLine

# Status of a command whose session ended under it: what docker exec returns when the container
# it runs in stops (the CLI's "exit status 255" for a broken exec).
ENDED = 255


# How long removing a killed session's folder may take (a new `docker exec`).
CLEANUP_TIMEOUT = 10


class SessionEnded(Exception):
    """The session's shell exited (the container stopped or restarted), or its answer cannot be
    trusted (a broken frame, its output files removed): the session is ended either way."""


class FolderGone(Exception):
    """The session's folder was gone before the command started: the command did not run."""


class ShellSession:
    """A long-lived shell, `argv` (e.g. ["docker", "exec", "-i", container, "sh"]), that runs one
    command at a time. run() -> (exit status, stdout lines, stderr lines)."""

    def __init__(self, argv: list[str]):
        self.argv = argv
        self.process: subprocess.Popen | None = None
        self.folder = ""
        self._lock = gevent.lock.Semaphore()

    def _start(self) -> None:
        # gevent's subprocess when pyinfra's CLI has monkey-patched it: a read yields to the
        # other hosts' greenlets.
        self.process = subprocess.Popen(
            self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
        )
        token = secrets.token_hex(8)
        # Private to this session (mktemp -d: mode 0700, root's): the outputs may hold what a fact
        # read. The shell's umask stays docker exec's (022): the commands inherit it.
        self._send(f"d=$(mktemp -d /tmp/.lab-shell.XXXXXX) && printf '%s %s\\n' {token} \"$d\" || exit 1\n")
        line = self._read_line()
        marker, _, folder = line.partition(" ")
        if marker != token or not folder.startswith("/tmp/.lab-shell."):
            self.close()
            raise SessionEnded(f"the shell did not start: {line!r}")
        self.folder = folder

    def _send(self, text: str) -> None:
        assert self.process is not None and self.process.stdin is not None
        try:
            self.process.stdin.write(text.encode())
            self.process.stdin.flush()
        except (BrokenPipeError, OSError) as error:
            raise SessionEnded(str(error)) from None

    def _read_line(self) -> str:
        assert self.process is not None and self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise SessionEnded("the shell's output ended")
        return line.decode("utf-8", "replace").rstrip("\n")

    def close(self, graceful: bool = True) -> None:
        """Its folder removed and its shell ended (killed if it does not end within 5 s; at once
        when not graceful: a command still runs in it). The shell removes the folder itself only
        when it was asked to and then exited 0; otherwise (killed, dead, or dying as it was asked)
        a shell of its own does."""
        if self.process is not None:
            asked = False
            if graceful and self.folder and self.process.poll() is None:
                try:
                    self._send(f"rm -rf {self.folder}; exit 0\n")
                    asked = True
                except SessionEnded:
                    pass
            elif self.process.poll() is None:
                self.process.kill()
            try:
                if self.process.stdin:
                    self.process.stdin.close()
            except OSError:
                pass
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            if asked and self.process.returncode == 0:
                self.folder = ""
        if self.folder:
            self._remove_folder()
        self.process = None

    def _remove_folder(self) -> None:
        """The folder of a session that was killed or ended, removed by a shell of its own (`argv`
        ends with the shell: `sh -c 'rm -rf ...'`); bounded, and a container that is gone has
        nothing left to remove."""
        folder, self.folder = self.folder, ""
        try:
            subprocess.run(
                [*self.argv, "-c", f"rm -rf {shlex.quote(folder)}"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=CLEANUP_TIMEOUT,
                check=False,
            )
        except (subprocess.TimeoutExpired, OSError):
            pass

    def run(self, command: str, timeout: float | None = None) -> tuple[int, list[str], list[str]]:
        """Run `command` with `sh -c`; TimeoutError after timeout seconds (the session is closed, as
        pyinfra gives up on a timed-out docker exec without waiting for it)."""
        return self._execute(f"sh -c {shlex.quote(command)}", timeout)

    def put(self, data: bytes, remote: str) -> tuple[int, list[str], list[str]]:
        """Write `data` to the file `remote` as `docker cp` of pyinfra's temporary file leaves it:
        replaced whole (a new file moved over the old), root's, mode 0600 (mkstemp's) until the
        operation sets its own. The bytes travel base64-encoded in a here-document of the session
        (not an argument: one argument holds at most 128 KiB, MAX_ARG_STRLEN)."""
        end = f"END_{secrets.token_hex(8)}"  # '_' is not base64's: no line of the data can end it
        encoded = base64.encodebytes(data).decode()
        target = shlex.quote(remote)
        script = (
            f"t={target}.lab-put.$$\n"
            f'(umask 077 && base64 -d >"$t") <<\'{end}\' || {{ rm -f "$t"; exit 1; }}\n{encoded}{end}\n'
            f'mv -f "$t" {target}'
        )
        return self._execute(f"(\n{script}\n)", None)

    def _execute(self, shell_text: str, timeout: float | None) -> tuple[int, list[str], list[str]]:
        with self._lock:
            for _ in range(2):  # a second time only when the first session's folder was gone before it ran
                if self.process is None or self.process.poll() is not None:
                    self.close()
                    try:
                        self._start()
                    except SessionEnded as error:  # what `docker exec` says of a stopped container, in effect
                        return 1, [], [f"the lab's shell session could not start: {error}"]
                try:
                    with gevent.Timeout(timeout, TimeoutError):
                        return self._frame(shell_text)
                except FolderGone:
                    self.close(graceful=False)  # the command did not run: a new session runs it
                except SessionEnded as error:
                    self.close(graceful=False)
                    return ENDED, [], [f"the lab's shell session ended under this command: {error}"]
                except TimeoutError:
                    self.close(graceful=False)
                    raise
            return ENDED, [], ["the lab's shell session lost its folder twice before this command ran"]

    def _frame(self, shell_text: str) -> tuple[int, list[str], list[str]]:
        """Send one command in its frame (the module's docstring) and read its answer."""
        token = secrets.token_hex(8)
        out, err = f"{self.folder}/{token}.out", f"{self.folder}/{token}.err"
        self._send(
            f"[ -d {self.folder} ] || {{ printf '%s gone\\n' {token}; exit 0; }}; "
            f"{shell_text} </dev/null >{out} 2>{err}; rc=$?; "
            f"if [ -f {out} ] && [ -f {err} ]; then "
            # The sizes are taken once and exactly that many bytes are sent: a background child of
            # the command may still write into its files between `wc` and `base64`.
            f"so=$(wc -c <{out}); se=$(wc -c <{err}); printf '%s %s %s %s\\n' {token} $rc $so $se; "
            f"head -c $so {out} | base64; printf '%s\\n' {token}; head -c $se {err} | base64; "
            f"rm -f {out} {err}; printf '%s\\n' {token}; "
            f"else rm -f {out} {err}; printf '%s lost\\n' {token}; fi\n"
        )
        head = self._read_line().split(" ")
        if head == [token, "gone"]:
            raise FolderGone
        if head == [token, "lost"]:
            raise SessionEnded(f"its output files in {self.folder} were removed while it ran")
        if len(head) != 4 or head[0] != token or not all(field.isdigit() for field in head[1:]):
            raise SessionEnded(f"a broken frame: {' '.join(head)[:80]!r} where its head was due")
        parts = [self._part(token, int(size)) for size in head[2:]]
        return int(head[1]), _lines(parts[0]), _lines(parts[1])

    def _part(self, token: str, size: int) -> str:
        """One output of the frame, checked against its size: a stray write into the shell's
        output cannot pass as the command's."""
        encoded = []
        line = self._read_line()
        while line != token:
            encoded.append(line)
            line = self._read_line()
        try:
            data = base64.b64decode("".join(encoded), validate=True)
        except binascii.Error as error:
            raise SessionEnded(f"a broken frame: {error}") from None
        if len(data) != size:
            raise SessionEnded(f"a broken frame: {len(data)} bytes where {size} were written")
        return data.decode("utf-8", "replace")


def _lines(text: str) -> list[str]:
    """Lines as pyinfra's read_buffer makes them: split at newlines only, each without its "\n"."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return lines


def command_output(stdout: list[str], stderr: list[str]) -> CommandOutput:
    """pyinfra's CommandOutput of the two outputs (stdout's lines first)."""
    return CommandOutput(
        [OutputLine("stdout", line) for line in stdout] + [OutputLine("stderr", line) for line in stderr]
    )
