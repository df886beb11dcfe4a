"""Samples every process's command line (/proc/<pid>/cmdline) while the lab deploys, upgrades
and rotates, and names each process that held a vault value (issue 53: "no process's command
line in the lab holds a vault value"). Read from this machine's /proc: the lab's containers share
its process table (Docker runs no VM here), so one pass sees the containers' processes (their
cgroup names the container) and the control side's (the deploy, ssh, `inference-host rotate`:
descendants of the test process) at once, and other sessions' processes are left out.

A sampler, not a tracer: a process that lives shorter than one pass (0.1 s and the pass's own
time, 10-30 ms on this machine) can slip between two. What it reports never holds the value:
the secret's name and the process's argv with the value cut out."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

# Shorter values would match by chance (a port, a word); the lab's are 32 characters or more.
MIN_LENGTH = 8


def leaked(cmdline: bytes, secrets: dict[str, str]) -> list[str]:
    """Names of the secrets whose value is in one command line (its arguments NUL-separated, as
    /proc gives them): inside an argument, or across two (a value split at a space)."""
    text = cmdline.decode(errors="replace")
    joined = text.replace("\0", " ")
    return sorted(
        name for name, value in secrets.items() if len(value) >= MIN_LENGTH and (value in text or value in joined)
    )


def redacted(cmdline: bytes, secrets: dict[str, str], limit: int = 200) -> str:
    """The argv as a line, each secret's value replaced by <name>: safe to print."""
    text = cmdline.decode(errors="replace").replace("\0", " ").strip()
    for name, value in secrets.items():
        if len(value) >= MIN_LENGTH:
            text = text.replace(value, f"<{name}>")
    return text[:limit]


@dataclass
class CmdlineSampler:
    """Start it, run the steps, stop it: `found` then holds one line per process that held a
    value, `processes` how many distinct command lines were seen, `passes` how many samples ran.

    start() samples in a child process (`python -m tests.lab.cmdline_sampler`), not a thread: the
    tests load inventories through pyinfra_cli, which patches the standard library with gevent,
    and a thread started before that broke its locks ("cannot release un-acquired lock", seen in
    the lab). The values reach the child on its stdin, never its argv; it watches the processes of
    the lab's containers and the descendants of this (the test) process."""

    secrets: dict[str, str]
    container_prefix: str
    interval_s: float = 0.1
    proc: Path = Path("/proc")
    control_pid: int = field(default_factory=os.getpid)
    found: list[str] = field(default_factory=list)
    processes: int = 0
    passes: int = 0
    _seen: set[tuple[int, int, bytes]] = field(default_factory=set)
    _containers: set[str] = field(default_factory=set)
    _containers_at: float = 0.0
    _child: subprocess.Popen | None = None
    _report: Path | None = None

    def __post_init__(self) -> None:
        short = sorted(name for name, value in self.secrets.items() if len(value) < MIN_LENGTH)
        assert not short, f"values too short to sample for reliably: {short}"

    def watch(self, name: str, value: str) -> None:
        """One more value from now on (a key a test is about to rotate in)."""
        assert len(value) >= MIN_LENGTH, f"{name}: too short to sample for reliably"
        self.secrets = {**self.secrets, name: value}
        if self._child and self._child.stdin:
            self._child.stdin.write(json.dumps({name: value}) + "\n")
            self._child.stdin.flush()

    def start(self) -> CmdlineSampler:
        folder = Path(tempfile.mkdtemp(prefix="ih-cmdline-"))
        self._report = folder / "report.json"
        self._child = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.lab.cmdline_sampler",
                "--prefix",
                self.container_prefix,
                "--control-pid",
                str(self.control_pid),
                "--interval",
                str(self.interval_s),
                "--report",
                str(self._report),
            ],
            stdin=subprocess.PIPE,
            cwd=Path(__file__).resolve().parents[2],
            text=True,
        )
        self.watch_all(self.secrets)
        return self

    def watch_all(self, values: dict[str, str]) -> None:
        for name, value in values.items():
            self.watch(name, value)

    def stop(self) -> CmdlineSampler:
        """Ends the child and reads what it saw (a sampler never started: what sample_once saw)."""
        if self._child is None:
            return self
        self._child.send_signal(signal.SIGTERM)
        self._child.wait(timeout=60)
        assert self._report, "started without a report file"
        report = json.loads(self._report.read_text())
        self.found.extend(report["found"])
        self.processes += report["processes"]
        self.passes += report["passes"]
        self._child = None
        return self

    def _container_ids(self) -> set[str]:
        # Refreshed every few seconds: the deploy's first containers appear after the sampler starts.
        if time.monotonic() - self._containers_at > 5:
            try:
                listed = subprocess.run(
                    ["docker", "ps", "-q", "--no-trunc", "--filter", f"name=^{self.container_prefix}-"],
                    capture_output=True,
                    text=True,
                    timeout=30,
                    check=False,
                ).stdout
            except (OSError, subprocess.TimeoutExpired):
                listed = ""  # no Docker (the unit tier's test of the sampler): the control side only
            self._containers = set(listed.split())
            self._containers_at = time.monotonic()
        return self._containers

    def _ours(self, pid: int, parents: dict[int, int], containers: set[str]) -> str | None:
        """Where a process belongs ('control' or a container's short id), None when not ours."""
        try:
            cgroups = (self.proc / str(pid) / "cgroup").read_text()
        except OSError:
            return None
        for container in containers:
            if container in cgroups:
                return container[:12]
        me, hops = self.control_pid, 0
        while pid > 1 and hops < 64:
            if pid == me:
                return "control"
            pid, hops = parents.get(pid, 0), hops + 1
        return None

    def sample_once(self) -> list[str]:
        """One pass over /proc; returns (and keeps) the lines of processes caught this pass."""
        containers = self._container_ids()
        lines: dict[int, bytes] = {}
        parents: dict[int, int] = {}
        starts: dict[int, int] = {}
        for entry in self.proc.iterdir():
            if not entry.name.isdigit():
                continue
            try:
                lines[int(entry.name)] = (entry / "cmdline").read_bytes()
                stat = (entry / "stat").read_text()
            except OSError:
                continue  # gone meanwhile
            fields = stat[stat.rfind(")") + 2 :].split()
            parents[int(entry.name)], starts[int(entry.name)] = int(fields[1]), int(fields[19])
        caught = []
        for pid, cmdline in lines.items():
            # By command line too: a process that execs keeps its pid and start time.
            key = (pid, starts.get(pid, 0), cmdline)
            if key in self._seen:
                continue
            where = self._ours(pid, parents, containers)
            if where is None:
                continue
            self._seen.add(key)
            self.processes += 1
            names = leaked(cmdline, self.secrets)
            if names:
                caught.append(
                    f"{', '.join(names)} on the command line of pid {pid} ({where}): {redacted(cmdline, self.secrets)}"
                )
        self.passes += 1
        self.found.extend(caught)
        return caught


def _main() -> int:
    """The child: values as JSON lines on stdin (more may follow), samples until SIGTERM, then
    writes {"found", "processes", "passes"} to --report."""
    parser = argparse.ArgumentParser(prog="python -m tests.lab.cmdline_sampler")
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--control-pid", type=int, required=True)
    parser.add_argument("--interval", type=float, default=0.1)
    parser.add_argument("--report", type=Path, required=True)
    args = parser.parse_args()
    sampler = CmdlineSampler({}, args.prefix, interval_s=args.interval, control_pid=args.control_pid)
    stopped = False

    def stop(*_) -> None:
        nonlocal stopped
        stopped = True

    signal.signal(signal.SIGTERM, stop)
    os.set_blocking(sys.stdin.fileno(), False)
    pending = ""
    while not stopped:
        try:
            read = os.read(sys.stdin.fileno(), 65536)
            if not read:
                break  # the test process is gone (its end of the pipe closed): so is the sampler
            pending += read.decode()
        except BlockingIOError:
            pass
        while "\n" in pending:
            line, pending = pending.split("\n", 1)
            sampler.secrets = {**sampler.secrets, **json.loads(line)}
        if sampler.secrets:
            sampler.sample_once()
        time.sleep(args.interval)
    args.report.write_text(
        json.dumps({"found": sampler.found, "processes": sampler.processes, "passes": sampler.passes})
    )
    return 0


if __name__ == "__main__":
    sys.exit(_main())
