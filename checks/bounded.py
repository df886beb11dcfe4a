"""Every command the checks run on a host ends within a bound; an overrun is a named failure.

A GPU that fell off the bus (Xid 79) or a driver stuck in the kernel makes `nvidia-smi`, every
NVML call and any CUDA program block for minutes or for ever; a stuck `nv-hostengine` blocks
`dcgmi`; an engine that accepts a connection and never answers blocks an HTTP client without a
time limit. The checks must still print a verdict, so each command is bounded twice:

- on the host: `timeout -k 5 <bound> sh -c <command>` started by a small shell (GROUP_WATCH) that
  outlives it. GNU `timeout` (coreutils 9.x, timeout.c) makes itself a process group leader and
  at the bound sends TERM to the whole group, but it waits only for its own child: once that
  child (the `sh`) dies of the TERM, `timeout` exits 124 at once and its KILL never comes, so a
  program that ignores TERM (a driver call stuck in the kernel often does), or any child of the
  command, was left running. The shell around it therefore gives the group the same 5 s, then
  KILL, and reads /proc until no process of the group is left (a zombie counts as gone); its last
  line on stderr says which. The overrun's line says "killed" only once the group is gone, and
  names what is left otherwise (a process in D state ignores even KILL);
- here: the local process (the command itself with the local backend, `ssh` or `docker exec`
  otherwise) is killed <bound> + 5 s + LOCAL_GRACE_S after it started, because a process in
  uninterruptible sleep (D state) can hold the host's shell and `timeout` with it.

An interrupted run (Ctrl-C, or SIGTERM which `python -m checks` turns into the same) kills the
command running now: the local process group, and on the host the command's group (TERM, 5 s,
KILL), through the same connection kind, before the interruption goes on.

An overrun raises CommandOverrun, whose text is one line: the command, its bound, the likely
cause and the next step (a check shows it as its FAIL line). A program that overran once is not
run again on that host in this run (and neither is one that hangs for the same reason: a CUDA
program or `dcgmi` once `nvidia-smi` did not answer): the next checks fail at once, naming the
first overrun, so one wedge costs one bound, not one bound per check. A run can also carry a
total deadline (`python -m checks --deadline-s`): each command's bound is cut to what is left of
it, and once it is spent nothing more is run. That makes the verdict's time bounded: the
deadline plus one kill grace (host_grace_s(): 2 × 5 s + 3 s, then LOCAL_GRACE_S: 23 s).

testinfra runs every command, its modules' included, through `backend.run`, which ends in
`backend.run_local` (the local, ssh, docker and other process backends, testinfra 10.x
testinfra/backend/base.py); both are wrapped on the one backend instance given to bound().
"""

from __future__ import annotations

import contextlib
import os
import re
import resource
import shlex
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from roles.shared.shell import Shell, sh

KILL_AFTER_S = 5  # `timeout -k`: TERM first, KILL this much later
LOCAL_GRACE_S = 10  # on top of the remote bound and KILL_AFTER_S: transport (ssh, docker exec)
DEFAULT_DEADLINE_S = 900  # one host's whole `python -m checks` run
# The most one command may print (each of stdout and stderr): the checks read tables and logs of
# kilobytes; a tool looping on an error prints gigabytes within its bound (`yes` fills 1.8 GB in
# 3 s here), which would be held in memory until the bound.
OUTPUT_CAP_BYTES = 64 * 1024 * 1024
# `dcgmi diag -r N`: NVIDIA documents level 1 as seconds, 2 as about 2 minutes, 3 as about 15
# (DCGM user guide, "Run Levels"); the bounds leave room for 8 GPUs.
DCGM_DIAG_BOUND_S = {1: 180, 2: 1200, 3: 3600}
# How long the shell around `timeout` waits, after KILL, for the group's processes to leave
# /proc before it names what is left (a process in D state stays until its kernel call ends).
GONE_WAIT_S = 3
# The marks the shell around each command writes on stderr (taken out of the result): the
# command's process group on the host, and after an overrun whether it is gone.
GROUP_MARK = "IH-GROUP "
LEFT_MARK = "IH-LEFT "
# POSIX sh (dash, bash): the command's group ($p, `timeout`'s own: it calls setpgid(0, 0)) and,
# when `timeout` reports the bound (124, or 137 when it had to KILL its child), TERM's grace for
# the rest of the group, KILL, then up to GONE_WAIT_S for it to leave. `members` lists the
# group's processes that are not zombies from /proc (the state field follows the last ") " of
# /proc/PID/stat, then ppid, then the group): a zombie is dead, and `kill -0` would count it for
# as long as a slow init leaves it unreaped.
GROUP_WATCH = (
    ' & p=$!; echo "IH-GROUP $p" >&2; '
    "members() {{ left=''; for f in /proc/[0-9]*/stat; do read -r l 2>/dev/null < $f || continue; "
    'set -- ${{l##*) }}; if [ "$3" = "$p" ] && [ "$1" != Z ]; then d=${{f%/stat}}; '
    'left="$left ${{d#/proc/}}:$1"; fi; done; }}; '
    "wait $p; rc=$?; if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then "
    "t=$(($(date +%s) + {grace})); "
    'while members; [ -n "$left" ] && [ "$(date +%s)" -lt $t ]; do sleep 0.1; done; '
    "kill -KILL -$p 2>/dev/null; t=$(($(date +%s) + {gone})); "
    'while members; [ -n "$left" ] && [ "$(date +%s)" -lt $t ]; do sleep 0.1; done; '
    'echo "IH-LEFT $p${{left:- none}}" >&2; fi; exit $rc'
)

NEXT_STEP_DRIVER = (
    "look for Xid lines in the node's kernel log (`dmesg | grep -i xid`, `journalctl -k`; Xid 79: "
    "the GPU fell off the bus), run `nvidia-smi -q` on the node itself, and reboot the node "
    "(or the guest, then the node) if it hangs there too"
)


@dataclass(frozen=True)
class Kind:
    """A kind of command: its bound, and what an overrun of it most likely means."""

    name: str
    bound_s: float
    cause: str
    next_step: str
    family: str | None = None  # overrun once: the family is not run again on that host
    blocked_by: tuple[str, ...] = ()  # families whose overrun stops this kind too


KINDS = {
    kind.name: kind
    for kind in (
        Kind(
            "nvidia-smi",
            30,
            "the NVIDIA driver does not answer (a GPU off the bus, a driver stuck in the kernel)",
            NEXT_STEP_DRIVER,
            family="driver",
        ),
        Kind(
            "gpu program",
            300,
            "a CUDA program did not end: the GPU or the driver does not answer, or a collective "
            "waits for a peer that never comes",
            NEXT_STEP_DRIVER,
            family="driver",
        ),
        Kind(
            "dcgmi",
            60,
            "DCGM's host engine (nv-hostengine) or the driver under it does not answer",
            "`systemctl status nvidia-dcgm` and restart it; if nvidia-smi hangs too, the driver: " + NEXT_STEP_DRIVER,
            family="dcgm",
            blocked_by=("driver",),
        ),
        Kind(
            "systemctl",
            60,
            "systemd does not answer, or a unit's start/stop job waits (its TimeoutStartSec/TimeoutStopSec)",
            "`systemctl list-jobs` and `journalctl -u <unit>` on the host; `systemctl status` of the unit",
            family="systemd",
        ),
        Kind(
            "journalctl",
            60,
            "the journal is very large or journald does not answer",
            "`journalctl --disk-usage` and `systemctl status systemd-journald` on the host",
            family="journal",
        ),
        Kind(
            "engine HTTP",
            60,
            "the engine accepted the connection and never answered (a stuck scheduler, a GPU hang)",
            "`journalctl -u <unit>` for the engine's last lines; py-spy dump of the engine's "
            "processes; restart the unit; if nvidia-smi hangs too, the driver: " + NEXT_STEP_DRIVER,
            family="http",
        ),
        Kind(
            "benchmark",
            1800,
            "the engine stopped answering during the benchmark (a GPU hang, a stuck scheduler)",
            "`journalctl -u <unit>` for the engine's last lines; `python -m checks --suites gpu,server`",
        ),
        Kind(
            "python probe",
            120,
            "a Python probe on the host did not end (a hung filesystem under the weights, an import that blocks)",
            "run the probe by hand on the host; `mount` and `dmesg` for a stuck filesystem",
        ),
        Kind(
            "connection",
            30,
            "the host cannot be reached or does not open a session: down, an address that drops "
            "packets, a DNS that does not answer, sshd (or the container) stuck, a refused key",
            "`ssh -v <host> true` (or `docker ps -a` for a container) from this machine; the host's "
            "console if ssh hangs after authentication (a hung home or PAM module)",
            family="connection",
        ),
        Kind(
            "kernel log",
            60,
            "`dmesg` did not end; it only copies the kernel's own log buffer, so a hang points at the "
            "kernel itself (a driver stuck in a kernel call, often the GPU's after an Xid), not at load",
            "read the log another way: `journalctl -k -b` on the host, or the node's console (IPMI/BMC "
            "serial over LAN); if nvidia-smi hangs too, the driver: " + NEXT_STEP_DRIVER,
            family="kernel log",
        ),
        Kind(
            "command",
            60,
            "the host did not finish a plain command (an overloaded host, a hung filesystem)",
            "run the command by hand on the host; `uptime`, `dmesg` for hung tasks",
        ),
    )
}

# Which kind a command is, from the program it starts with (for commands not labelled by their
# caller, e.g. testinfra's own modules).
PROGRAMS = {
    "nvidia-smi": "nvidia-smi",
    "dcgmi": "dcgmi",
    "systemctl": "systemctl",
    "journalctl": "journalctl",
    "dmesg": "kernel log",
}
WRAPPERS = {"env", "exec", "nice", "ionice", "sudo"}
# testinfra's backends that start a local process per command (backend.run_local: bounded there);
# the others (paramiko, winrm, salt, ansible) talk from a library in this process, and are waited
# for in a thread that is given up at the same local bound.
RUN_LOCAL_BACKENDS = {"local", "ssh", "safe-ssh", "docker", "podman", "kubectl", "openshift", "lxc", "chroot"}


class CommandOverrun(Exception):
    """A bounded command did not finish (or was not run because its kind already overran)."""


class _LocalOverrun(Exception):
    pass


class _LocalFlood(Exception):
    pass


def program_of(command: str) -> str:
    """The program a shell command starts with ("command" when unknown): assignments and
    wrappers skipped, `sh -c`/`bash -c` looked into."""
    try:
        words = shlex.split(command)
    except ValueError:
        return "command"
    index = 0
    while index < len(words):
        word = words[index]
        if re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", word) or word in WRAPPERS:
            index += 1
            continue
        if word in ("sh", "bash") and words[index + 1 : index + 2] == ["-c"]:
            return program_of(words[index + 2]) if index + 2 < len(words) else "command"
        return PROGRAMS.get(word.rsplit("/", 1)[-1], "command")
    return "command"


def _seconds(value: float) -> str:
    return f"{value:g} s" if float(value).is_integer() else f"{value:.1f} s"


def _shown(command: str) -> str:
    text = " ".join(command.split())
    return text if len(text) <= 120 else text[:119] + "…"


class Runner:
    """The bounded `run` of one testinfra backend."""

    def __init__(self, backend):
        self.backend = backend
        self.plain_run = type(backend).run.__get__(backend)
        self.deadline: float | None = None
        self.deadline_s: float | None = None
        self.overran: dict[str, str] = {}  # family -> the first overrun's line
        self._local_limit: float | None = None
        self.process: subprocess.Popen | None = None  # the local process running now
        self.stopped = False  # stop(): nothing more is started
        # After a local overrun: what the host still runs of the command's group ("" none, None unknown).
        self.left_behind: str | None = None
        # A host reached through a transport (ssh, docker exec, ...) is reached once first.
        self.reached = getattr(backend, "NAME", "local") == "local"

    def _end_host_group(self, stderr) -> str | None:
        """Ends the host's process group of the command whose stderr file this is (its GROUP_MARK
        line): TERM, KILL_AFTER_S, KILL. Returns what is left of it ("" nothing, None unknown:
        no mark yet, or the host does not answer). On the local backend the group is this
        machine's; behind a transport a second, short bounded command does it there."""
        stderr.flush()
        stderr.seek(0)
        found = re.search(rb"^" + GROUP_MARK.encode() + rb"(\d+)$", stderr.read(65536), re.MULTILINE)
        if found is None:
            return None
        group = int(found.group(1))
        if getattr(self.backend, "NAME", "local") == "local":
            return end_group(group)
        # `kill -0` counts a zombie as there: "gone" is sure, anything else is not known.
        script = sh(
            "kill -TERM -{group} 2>/dev/null; sleep {grace}; kill -KILL -{group} 2>/dev/null; sleep 1; "
            "kill -0 -{group} 2>/dev/null || echo gone",
            group=group,
            grace=KILL_AFTER_S,
        )
        self._local_limit = KILL_AFTER_S + 1 + LOCAL_GRACE_S
        try:
            answer = self.plain_run(str(script))
        except BaseException:  # best effort: the host or the transport may be what hangs
            return None
        return "" if answer.stdout.strip() == "gone" else None

    def _call(self, command: str):
        """plain_run(command) within the local bound; a library backend's call is left to itself
        (a daemon thread) when it overruns, since a library call cannot be killed."""
        if getattr(self.backend, "NAME", "local") in RUN_LOCAL_BACKENDS:
            return self.plain_run(command)
        box: dict = {}

        def call():
            try:
                box["answer"] = self.plain_run(command)
            except BaseException as error:  # handed to the caller as it came
                box["error"] = error

        thread = threading.Thread(target=call, daemon=True)
        thread.start()
        thread.join(self._local_limit)
        if thread.is_alive():
            raise _LocalOverrun()
        if "error" in box:
            raise box["error"]
        return box["answer"]

    def _left(self, bound: float) -> float:
        """bound, cut to what is left of the run's total deadline (at least 1 s)."""
        if self.deadline is None:
            return bound
        return min(bound, max(round(self.deadline - time.monotonic(), 1), 1.0))

    def _reach(self, command: str) -> None:
        """Runs `true` before the first command on a host behind a transport. A host that cannot
        be reached is then one failure of its own kind ("connection"), and every later command
        is refused at once, instead of each one paying ssh's ConnectTimeout (testinfra's default
        10 s) or the whole bound of its kind (DNS and authentication have no ssh timeout), and
        instead of an unanswered connection being blamed on the command (the driver, for
        nvidia-smi)."""
        kind = KINDS["connection"]
        bound = self._left(kind.bound_s)
        self._local_limit = bound
        started = time.monotonic()
        try:
            answer = self._call("true")
            found = None if answer.rc == 0 else f"exit {answer.rc}: {_words(answer.stderr)}"
        except _LocalOverrun:
            found = f"no session after {time.monotonic() - started:.0f} s, killed"
        except _LocalFlood:
            found = "endless output from `true`"
        except Exception as error:  # ssh's own exit 255 (a RuntimeError), paramiko's SSHException, ...
            answer = error.args[0] if error.args else None
            words = getattr(answer, "stderr", None) or str(error) or type(error).__name__
            found = f"{type(error).__name__}: {_words(words)}"
        finally:
            self._local_limit = None
        if found is None:
            self.reached = True
            return
        target = f"{getattr(self.backend, 'NAME', '?')}://{getattr(self.backend, 'hostname', '?')}"
        self.overran["connection"] = f"the connection to {target} (bound {_seconds(bound)})"
        raise CommandOverrun(
            f"expected to reach {target} within {_seconds(bound)} (connection) to run `{_shown(command)}`; "
            f"found {found}; likely cause: {kind.cause}; what to do: {kind.next_step}"
        )

    def run(self, command: str, what: str | None = None, bound_s: float | None = None):
        kind = KINDS[what] if what else KINDS[program_of(command)]
        bound = float(bound_s or kind.bound_s)
        refused = self._refusal(command, kind)
        if refused:
            raise CommandOverrun(refused)
        if not self.reached:
            self._reach(command)
        bound = self._left(bound)
        self._local_limit = bound + host_grace_s() + LOCAL_GRACE_S
        self.left_behind = None
        started = time.monotonic()
        try:
            result = self._call(wrapped(command, bound))
        except _LocalOverrun:
            result = None
        except _LocalFlood:
            raise CommandOverrun(_flood_line(command, time.monotonic() - started)) from None
        except RuntimeError as error:  # testinfra's ssh backends: exit 255, ssh's or the command's
            lost = _ssh_lost(error)
            if lost is None:
                raise
            raise CommandOverrun(self._lost_line(command, lost)) from None
        finally:
            self._local_limit = None
        elapsed = time.monotonic() - started
        left = self.left_behind
        if result is not None:
            result, left = _take_marks(self.backend, result)
        if result is None or (result.rc in (124, 137) and elapsed >= bound - 0.5):
            cut = bound < float(bound_s or kind.bound_s)
            line = self._overrun_line(command, kind, bound, elapsed, cut=cut, left=left)
            if kind.family:
                self.overran.setdefault(kind.family, f"`{_shown(command)[:60]}` ({kind.name}, bound {_seconds(bound)})")
            raise CommandOverrun(line)
        return result

    def _lost_line(self, command: str, words: str) -> str:
        """The host was reached earlier and ssh lost it during this command: the connection's
        failure (every later command refused), not the command's."""
        kind = KINDS["connection"]
        target = f"{getattr(self.backend, 'NAME', '?')}://{getattr(self.backend, 'hostname', '?')}"
        self.overran["connection"] = f"the connection to {target} (lost)"
        return (
            f"expected `{_shown(command)}` to answer over the connection to {target}; found the "
            f"connection lost (ssh: {words}); likely cause: {kind.cause}; what to do: {kind.next_step}"
        )

    def _refusal(self, command: str, kind: Kind) -> str | None:
        for family in ("connection", kind.family, *kind.blocked_by):
            if family and family in self.overran:
                return (
                    f"expected `{_shown(command)}` to answer; found it not run: {self.overran[family]} "
                    f"did not answer earlier in this run (its FAIL line says more); likely cause: "
                    f"{kind.cause}; what to do: {kind.next_step}"
                )
        if self.deadline is not None and time.monotonic() >= self.deadline:
            return (
                f"expected `{_shown(command)}` to answer; found it not run: the run's total bound of "
                f"{_seconds(self.deadline_s or 0)} (--deadline-s) is spent; what to do: the FAIL lines "
                "that say 'no answer after' name the commands that took it"
            )
        return None

    def _overrun_line(self, command: str, kind: Kind, bound: float, elapsed: float, cut: bool, left: str | None) -> str:
        bound_text = _seconds(bound) + (" (what was left of the run's --deadline-s)" if cut else f" ({kind.name})")
        if left == "":
            ended = "killed (TERM, then KILL to its process group: none of it is left)"
        elif left:
            ended = (
                f"TERM and KILL sent to its process group, but {len(left.split())} of its processes are "
                f"still there (pid:state {left}; D: inside a kernel call, which not even KILL ends)"
            )
        else:  # the host's shell never said: the transport or the host's shell is stuck too
            ended = "no word from the host's bound either, so its processes may still run there"
        return (
            f"expected `{_shown(command)}` to finish within {bound_text}; found no answer after "
            f"{elapsed:.0f} s, {ended}; likely cause: {kind.cause}; what to do: {kind.next_step}"
        )

    def stop(self) -> None:
        """From another thread: kills the command running now (its process group) and starts no
        other, so a caller that gave up on this host leaves no ssh behind when it exits."""
        self.stopped = True
        process = self.process
        if process is not None:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def run_local(self, command: str, *args: str):
        """testinfra's BaseBackend.run_local with a time limit (the process group is killed)."""
        backend = self.backend
        encoded = backend.encode(backend.quote(command, *args))
        # The output goes to files, not pipes: a process that leaves the group holding them does
        # not keep the wait going, and a file has a size limit (RLIMIT_FSIZE: the writer gets
        # SIGXFSZ, or EFBIG if it ignores that) where a pipe read into memory has none.
        if self.stopped:
            raise _LocalOverrun()
        with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
            process = self.process = subprocess.Popen(
                encoded,
                shell=True,
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                start_new_session=True,
                preexec_fn=_cap_output,
            )
            if self.stopped:  # stop() came between the check above and the start
                os.killpg(process.pid, signal.SIGKILL)
            try:
                process.wait(timeout=self._local_limit)
            except subprocess.TimeoutExpired:
                _kill_group(process)
                self.left_behind = self._end_host_group(stderr)
                raise _LocalOverrun() from None
            except BaseException:  # Ctrl-C, or SIGTERM made KeyboardInterrupt: nothing started stays
                _kill_group(process)
                self._end_host_group(stderr)
                raise
            finally:
                self.process = None
            if max(os.fstat(f.fileno()).st_size for f in (stdout, stderr)) >= OUTPUT_CAP_BYTES:
                _kill_group(process)
                raise _LocalFlood()
            stdout.seek(0)
            stderr.seek(0)
            return backend.result(process.returncode, encoded, stdout.read(), stderr.read())


def wrapped(command: str, bound: float) -> Shell:
    """The command as the host runs it: under `timeout`, in a group GROUP_WATCH ends whole."""
    start = sh("timeout -k {kill} {bound} sh -c {command}", kill=KILL_AFTER_S, bound=f"{bound:g}", command=str(command))
    return Shell(start + GROUP_WATCH.format(grace=KILL_AFTER_S, gone=GONE_WAIT_S))


def host_grace_s() -> float:
    """The most the host's side may add to a bound: TERM's grace in `timeout`, the same again in
    GROUP_WATCH, then its wait for the group to leave /proc."""
    return 2 * KILL_AFTER_S + GONE_WAIT_S


def _take_marks(backend, result):
    """(the result without GROUP_WATCH's lines, what was left of the group: "" nothing, None: no
    overrun reported)."""
    kept, left = [], None
    for line in result.stderr_bytes.splitlines(keepends=True):
        if line.startswith(GROUP_MARK.encode()):
            continue
        if line.startswith(LEFT_MARK.encode()):
            words = line.decode(errors="replace").split()[2:]
            left = "" if words == ["none"] else " ".join(words)
            continue
        kept.append(line)
    return backend.result(result.rc, result.command, result.stdout_bytes, b"".join(kept)), left


def group_left(group: int) -> str:
    """This machine's processes of process group `group` that are not zombies, as "pid:state ..."."""
    left = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(") ", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[2] == str(group) and fields[0] != "Z":
            left.append(f"{stat.parent.name}:{fields[0]}")
    return " ".join(left)


def end_group(group: int, grace_s: float | None = None) -> str:
    """TERM to this machine's process group, grace_s (KILL_AFTER_S) for it to go, KILL, then
    GONE_WAIT_S for it to leave /proc; returns what is left ("" nothing)."""
    grace = KILL_AFTER_S if grace_s is None else grace_s
    for signal_number, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, GONE_WAIT_S)):
        try:
            os.killpg(group, signal_number)
        except ProcessLookupError:
            return ""
        until = time.monotonic() + wait
        while group_left(group) and time.monotonic() < until:
            time.sleep(0.1)
    return group_left(group)


def _cap_output() -> None:
    """In the child before exec: no file it (or anything it starts) writes, the output files
    included, grows past OUTPUT_CAP_BYTES."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (OUTPUT_CAP_BYTES, OUTPUT_CAP_BYTES))


# What OpenSSH's client itself prints when it, not the remote command, failed (ssh.c, sshconnect.c,
# clientloop.c, mux.c of OpenSSH 9.x): only then is an exit 255 the connection's; a remote command
# may exit 255 itself (nvidia-smi does on some errors).
SSH_OWN_ERROR = re.compile(
    r"^(ssh: |kex_exchange_identification|Connection (to \S+ )?(closed|timed out|reset)|client_loop: |"
    r"Timeout, server \S+ not responding|Permission denied \(|Host key verification failed|mux_client_|"
    r"Control socket connect)",
    re.MULTILINE,
)


def _ssh_lost(error: RuntimeError) -> str | None:
    """ssh's own words when a RuntimeError is testinfra's ssh exit 255 caused by ssh itself."""
    answer = error.args[0] if error.args else None
    if getattr(answer, "rc", None) != 255:
        return None
    stderr = str(getattr(answer, "stderr", "") or "").replace("\r", "")
    found = [line for line in stderr.splitlines() if SSH_OWN_ERROR.match(line)]
    return _words(" ".join(found)) if found else None


def _words(text: str) -> str:
    return " ".join(str(text).split())[:300] or "(nothing on stderr)"


def _flood_line(command: str, elapsed: float) -> str:
    return (
        f"expected `{_shown(command)}` to print at most {OUTPUT_CAP_BYTES // (1024 * 1024)} MiB; found "
        f"more after {elapsed:.0f} s, stopped; likely cause: the tool loops on an error or a log is far "
        "larger than expected; what to do: run it by hand on the host with `| head -50` and read "
        "what it repeats"
    )


def _kill_group(process: subprocess.Popen) -> None:
    """Kills the command's process group and stops waiting for it. A process in D state (or one
    that left the group) keeps the pipes open: the Popen is then abandoned, not read to the end
    (closing its pipes under gevent, which pyinfra's CLI patches in, raises while its reader
    greenlets still wait on them)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        process.communicate(timeout=2)
    except subprocess.TimeoutExpired:
        pass


def bound(host, deadline_s: float | None = None, started: float | None = None):
    """Makes every command run on this testinfra host bounded (idempotent); with deadline_s, a
    total deadline of that many seconds from `started` (time.monotonic(); default now)."""
    backend = host.backend
    runner = getattr(backend, "_ih_runner", None)
    if runner is None:
        runner = Runner(backend)
        backend._ih_runner = runner
        backend.run = lambda command, *args, **kwargs: runner.run(backend.quote(command, *args))
        backend.run_local = runner.run_local
    if deadline_s is not None:
        runner.deadline_s = deadline_s
        runner.deadline = (time.monotonic() if started is None else started) + deadline_s
    return host


def own_host(url: str, deadline_s: float | None = None, started: float | None = None, **kwargs):
    """A bounded testinfra host of the caller's own for url (kwargs as testinfra.get_host's).
    testinfra.get_host hands every caller in a process the same cached Host, and a bounded host
    keeps its deadline and the failures it saw (a connection that did not answer refuses every
    later command): bounding the cached one would refuse a later caller's commands for a run
    that has ended (a test after an in-process drain, a second check run)."""
    import testinfra.backend
    import testinfra.host

    backend = testinfra.backend.get_backend(url, **kwargs)
    host = testinfra.host.Host(backend)
    backend.set_host(host)
    return bound(host, deadline_s, started)


def release(host) -> None:
    """Undoes bound(): the host runs its commands as testinfra does, with no deadline and no
    memory of this run's failures. For a host the caller did not create (pytest-testinfra's
    cached one), at the end of the run that bounded it."""
    backend = getattr(host, "backend", None)
    if getattr(backend, "_ih_runner", None) is None:
        return
    for name in ("_ih_runner", "run", "run_local"):
        backend.__dict__.pop(name, None)


def unanswered(host, endpoint: str) -> str | None:
    """What an endpoint marked unanswered on this bounded host did (None: not marked)."""
    runner = getattr(getattr(host, "backend", None), "_ih_runner", None)
    return runner.overran.get(f"endpoint {endpoint}") if runner else None


def mark_unanswered(host, endpoint: str, text: str) -> None:
    """Marks an endpoint of this bounded host as one that did not answer (the first mark stays)."""
    runner = getattr(getattr(host, "backend", None), "_ih_runner", None)
    if runner is not None:
        runner.overran.setdefault(f"endpoint {endpoint}", text)


def run(host, command: str, what: str | None = None, bound_s: float | None = None):
    """host.run with the command's kind (KINDS) and bound named by the caller. A host that is not
    bounded (a unit test's recorded answers) runs it as given."""
    runner = getattr(getattr(host, "backend", None), "_ih_runner", None)
    if runner is None:
        return host.run(command)
    return runner.run(command, what=what, bound_s=bound_s)


# A step that can take longer than this says so at a terminal, every this many seconds: a silent
# `dcgmi diag -r 2` (minutes) reads as a hang.
PROGRESS_EVERY_S = 10


@contextlib.contextmanager
def progress(what: str, bound_s: float, enabled: bool = True, every_s: float | None = None):
    """While the block runs: a line on stdout every PROGRESS_EVERY_S (its time and bound)."""
    every = every_s or PROGRESS_EVERY_S
    done = threading.Event()
    started = time.monotonic()

    def tick():
        while not done.wait(every):
            print(
                f"{what}: still running after {time.monotonic() - started:.0f} s (bound {_seconds(bound_s)})",
                flush=True,
            )

    ticker = threading.Thread(target=tick, daemon=True)
    if enabled:
        ticker.start()
    try:
        yield
    finally:
        done.set()
