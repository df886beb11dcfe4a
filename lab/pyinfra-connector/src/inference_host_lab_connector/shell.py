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

Each command writes its two outputs to files under a directory private to the session, then the
session prints them base64-encoded between markers holding a random token: nothing the command
prints can end its own output early. A session that ends mid-command (the container stopped: the
node's reboot) answers that command as failed (status 255, as docker exec does when its container
goes away) and is replaced at the next command; the command is never run twice. A command that
sends stdin (pyinfra's _stdin) or asks for a terminal (_get_pty) goes through docker exec as before.
"""

from __future__ import annotations

import base64
import secrets
import shlex
import subprocess

import gevent
import gevent.lock
from pyinfra.connectors.util import CommandOutput, OutputLine

# Status of a command whose session ended under it: what docker exec returns when the container
# it runs in stops (the CLI's "exit status 255" for a broken exec).
ENDED = 255


class SessionEnded(Exception):
    """The session's shell exited (the container stopped or restarted)."""


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
        when not graceful: a command still runs in it)."""
        if self.process is not None:
            if not graceful and self.process.poll() is None:
                self.process.kill()
            try:
                if self.folder and self.process.poll() is None:
                    self._send(f"rm -rf {self.folder}; exit 0\n")
                if self.process.stdin:
                    self.process.stdin.close()
            except (SessionEnded, OSError):
                pass
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

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
            if self.process is None or self.process.poll() is not None:
                self.close()
                try:
                    self._start()
                except SessionEnded as error:  # what `docker exec` says of a stopped container, in effect
                    return 1, [], [f"the lab's shell session could not start: {error}"]
            token = secrets.token_hex(8)
            out, err = f"{self.folder}/out", f"{self.folder}/err"
            # The folder made again if something removed it (a deploy that empties /tmp).
            self._send(
                f"[ -d {self.folder} ] || mkdir -p -m 700 {self.folder}; "
                f"{shell_text} </dev/null >{out} 2>{err}; rc=$?; "
                f"printf '%s %s\\n' {token} $rc; base64 {out}; printf '%s\\n' {token}; base64 {err};"
                f" printf '%s\\n' {token}; : >{out}; : >{err}\n"
            )
            try:
                with gevent.Timeout(timeout, TimeoutError):
                    return self._answer(token)
            except SessionEnded:
                self.close(graceful=False)
                return ENDED, [], ["the lab's shell session ended under this command (the container stopped)"]
            except TimeoutError:
                self.close(graceful=False)
                raise

    def _answer(self, token: str) -> tuple[int, list[str], list[str]]:
        head = self._read_line()
        while not head.startswith(token + " "):  # nothing else is printed; a stray line is skipped
            head = self._read_line()
        status = int(head.split(" ", 1)[1])
        parts = []
        for _ in range(2):
            encoded = []
            line = self._read_line()
            while line != token:
                encoded.append(line)
                line = self._read_line()
            parts.append(base64.b64decode("".join(encoded)).decode("utf-8", "replace"))
        return status, _lines(parts[0]), _lines(parts[1])


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
