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

import os
import subprocess
import threading
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
    value, `processes` how many distinct processes were seen, `passes` how many samples ran."""

    secrets: dict[str, str]
    container_prefix: str
    interval_s: float = 0.1
    proc: Path = Path("/proc")
    found: list[str] = field(default_factory=list)
    processes: int = 0
    passes: int = 0
    _seen: set[tuple[int, int, bytes]] = field(default_factory=set)
    _containers: set[str] = field(default_factory=set)
    _containers_at: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __post_init__(self) -> None:
        short = sorted(name for name, value in self.secrets.items() if len(value) < MIN_LENGTH)
        assert not short, f"values too short to sample for reliably: {short}"

    def watch(self, name: str, value: str) -> None:
        """One more value from now on (a key a test is about to rotate in)."""
        assert len(value) >= MIN_LENGTH, f"{name}: too short to sample for reliably"
        self.secrets = {**self.secrets, name: value}

    def start(self) -> CmdlineSampler:
        self._thread = threading.Thread(target=self._run, name="cmdline-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> CmdlineSampler:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=30)
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample_once()
            self._stop.wait(self.interval_s)

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
        me, hops = os.getpid(), 0
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
