"""One command per host for the file and package facts a deploy reads, instead of one each.

pyinfra 3 caches no fact: each `host.get_fact` runs its command on the host
(pyinfra/api/facts.py `_get_fact`, 3.10), and `will_change` runs an operation's generator a
second time, so a converged lab asked ~200 small questions (is this file there, what is its
sha1, which packages are installed), each one a `docker exec` or an SSH channel. Most of the
time of a no-change run was spent starting those commands, not answering them.

What this does, installed by config.py (so the CLI and its child passes get it):

- it remembers, per host, which of these facts the last run asked (fact, arguments and a
  digest of the connector arguments: paths and package names, never an answer or a password)
  under `$XDG_CACHE_HOME/inference-host/fact-batches/`;
- at the first such fact a host is asked in a run, it runs all the remembered ones in ONE shell
  command there (each in its own subshell, its exit status and output kept apart), and answers
  the same questions from that output for as long as nothing has changed anywhere;
- the moment any operation on any host is about to run a command (a shell command, an upload,
  a Python callback), every answer is dropped and every later fact runs its own command, as
  without this module: so an answer is never older than the last change the deploy made.

An answer is served only when its command exited 0 and pyinfra's own parser accepts it; a
failing one (and any fact not remembered, or not in FACTS) runs live, so errors read exactly as
pyinfra words them. Only facts that describe files and packages are batched: their answers change
only when something writes them, which the deploy itself does through operations. Facts about
running things (units, processes, devices) always run live.

`INFERENCE_HOST_FACT_BATCH=0` turns it off (compare, or rule it out).

Measured gain (the lab over real OpenSSH, `INFERENCE_HOST_LAB_CONNECT=ssh`, a no-change run of
190 operations, commit 25cd09d, 2026-12-07, `/usr/bin/time`, a 2-core machine at load 7-8):
with it wall 17.8 / 15.0 / 20.7 / 16.6 s (median 17.2), user + sys 6.6 s (median); without it
33.2 / 35.9 / 37.6 s (median 35.9), user + sys 7.7 s. The run's CPU drops by 14 % and its wall
time by half: well over the 10 % a patch of pyinfra must earn to stay (docs/profiles/).
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

from pyinfra import logger
from pyinfra.api import command as pyinfra_command
from pyinfra.api import facts as pyinfra_facts
from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS
from pyinfra.api.command import StringCommand
from pyinfra.facts import deb, files, server

from roles.shared.shell import Shell, chain, from_pyinfra, sh

# pyinfra's facts whose answer is a pure read of files, the package database or the system's
# name: each changes only when something writes it. The project's own such facts are marked
# with @batched where they are defined.
FACTS: set[type] = {
    files.File,
    files.Directory,
    files.Link,
    files.Sha1File,
    files.Sha256File,
    files.Md5File,
    files.FileContents,
    files.FindInFile,
    deb.DebPackages,
    deb.DebPackage,
    server.LinuxDistribution,
    server.Os,
    server.Users,
    server.Groups,
}
_BY_NAME = {f"{cls.__module__}.{cls.__name__}": cls for cls in FACTS}


def batched(cls: type) -> type:
    """Marks a fact whose answer is a pure read of files (no process, device or clock state)
    as one the batch may answer."""
    FACTS.add(cls)
    _BY_NAME[f"{cls.__module__}.{cls.__name__}"] = cls
    return cls


_MARK = "@@inference-host-fact"
_RESULT = re.compile(rf"^{_MARK} (\d+) (\d+)$")

_answers: dict[str, dict[str, list[str]]] = {}  # host name -> key -> stdout lines
_fetched: set[str] = set()  # hosts whose batch ran in this run (once, even when emptied)
_asked: dict[str, dict[str, dict]] = {}  # host name -> key -> the entry remembered for next run
stats = {"batches": 0, "served": 0, "dropped": 0}


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "inference-host" / "fact-batches"


def _plan_file(host_name: str) -> Path:
    return cache_dir() / (re.sub(r"[^A-Za-z0-9_.-]", "_", host_name) + ".json")


def _executor_digest(executor_kwargs: dict) -> str:
    # A digest, not the values: the connector arguments may hold a sudo password.
    text = repr(sorted((key, repr(value)) for key, value in executor_kwargs.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _key(name: str, fact_kwargs: dict, digest: str) -> str | None:
    try:
        return json.dumps([name, fact_kwargs, digest], sort_keys=True)
    except TypeError:
        return None  # arguments that are not plain data: asked live


def _shell(command: Any) -> str:
    return command.get_raw_value() if isinstance(command, StringCommand) else str(command)


def batch_script(commands: list[str]) -> Shell:
    """Returns one POSIX sh script that runs each command in its own subshell and prints, per
    command, its stdout lines each prefixed with '|' (a last line without a newline included),
    then `@@inference-host-fact INDEX STATUS`."""
    parts = [sh("exec 4>&1")]
    for index, command in enumerate(commands):
        # fd 3 carries the subshell's status past the pipe; the newlines keep a trailing
        # comment in a fact's command from swallowing the closing parenthesis.
        parts.append(
            sh(
                "r=$( {{ {{ (\n{command}\n) 2>/dev/null </dev/null; echo $? >&3; }}"
                ' | while IFS= read -r l || [ -n "$l" ]; do printf \'|%s\\n\' "$l"; done >&4; }} 3>&1 )'
                # printf, not echo: dash's echo reads backslashes in its words (\v, \c).
                "; printf '%s\\n' {mark}\" $r\"",
                command=from_pyinfra(command),
                mark=f"{_MARK} {index}",
            )
        )
    return chain(*parts, operator="\n")


def parse_batch(lines: list[str], count: int) -> dict[int, list[str]]:
    """Returns the stdout lines of each command of a batch_script output that exited 0."""
    answers: dict[int, list[str]] = {}
    current: list[str] = []
    for line in lines:
        if line.startswith("|"):
            current.append(line[1:])
            continue
        match = _RESULT.match(line)
        if match and int(match.group(1)) < count:
            if match.group(2) == "0":
                answers[int(match.group(1))] = current
            current = []
    return answers


def _remembered(host_name: str, digest: str) -> list[dict]:
    try:
        entries = json.loads(_plan_file(host_name).read_text())
    except (OSError, ValueError):
        return []
    return [
        entry
        for entry in entries
        if isinstance(entry, dict)
        and entry.get("executor") == digest
        and entry.get("fact") in _BY_NAME
        and isinstance(entry.get("kwargs"), dict)
    ]


def _run_batch(host, digest: str, executor_kwargs: dict) -> None:
    _fetched.add(host.name)
    entries = _remembered(host.name, digest)
    commands, keys = [], []
    for entry in entries:
        cls = _BY_NAME[entry["fact"]]
        fact = cls()
        key = _key(entry["fact"], entry["kwargs"], digest)
        if fact.shell_executable or key is None:
            continue
        command = _shell(pyinfra_facts._make_command(fact.command, dict(entry["kwargs"])))
        required = pyinfra_facts._make_command(fact.requires_command, dict(entry["kwargs"]))
        if required:  # as pyinfra guards it: a missing program prints the marker, asked live
            command = (
                f"if command -v {required} >/dev/null 2>&1; then ( {command}\n); "
                f"else echo '{pyinfra_facts._MISSING_COMMAND_MARKER}'; fi"
            )
        commands.append(command)
        keys.append(key)
    loaded = _answers.setdefault(host.name, {})
    start = 0
    for chunk in script_chunks(commands):
        answers = _run_script(host, chunk, executor_kwargs)
        loaded.update({keys[start + index]: lines for index, lines in answers.items()})
        start += len(chunk)
    logger.debug(f"{host.print_prefix}Loaded {len(loaded)} of {len(commands)} facts in batches")


# The @docker and @local connectors hand the script to `sh -c` as ONE argument, and Linux caps one
# argument of execve at MAX_ARG_STRLEN (32 pages: 128 KiB, include/uapi/linux/binfmts.h) or fails
# with E2BIG ("Argument list too long"): a host asked for a few hundred files (the checks' bundle)
# passes it. Batches are cut well below, leaving room for the connector's quoting.
MAX_SCRIPT_BYTES = 32 * 1024


def script_chunks(commands: list[str], limit: int = MAX_SCRIPT_BYTES) -> list[list[str]]:
    """The commands in order, cut into runs whose batch_script stays under limit bytes (a
    command longer than that alone goes alone)."""
    chunks: list[list[str]] = []
    size = limit
    for command in commands:
        cost = len(command.encode()) + 200  # batch_script's wrapper around each command
        if size + cost > limit:
            chunks.append([])
            size = 0
        chunks[-1].append(command)
        size += cost
    return chunks


def _run_script(host, commands: list[str], executor_kwargs: dict) -> dict[int, list[str]]:
    try:
        status, output = host.run_shell_command(StringCommand(batch_script(commands)), **executor_kwargs)
    except OSError:  # the command could not even start: these facts run live
        return {}
    stats["batches"] += 1
    if not status:
        return {}  # every fact of this batch runs live, with pyinfra's own errors
    return parse_batch(output.stdout_lines, len(commands))


def _get_fact(state, host, cls, args=None, kwargs=None, ensure_hosts=None, apply_failed_hosts=True):
    name = f"{cls.__module__}.{cls.__name__}"
    if cls not in FACTS or not host.connected:
        return _live_get_fact(state, host, cls, args, kwargs, ensure_hosts, apply_failed_hosts)
    fact_kwargs, global_kwargs = pyinfra_facts._handle_fact_kwargs(state, host, cls, args, kwargs)
    fact_kwargs = {k: v for k, v in fact_kwargs.items() if k != "self"}  # getcallargs adds it
    executor_kwargs = {k: v for k, v in global_kwargs.items() if k in CONNECTOR_ARGUMENT_KEYS}
    digest = _executor_digest(executor_kwargs)
    key = _key(name, fact_kwargs, digest)
    if key is None:
        return _live_get_fact(state, host, cls, args, kwargs, ensure_hosts, apply_failed_hosts)
    _asked.setdefault(host.name, {})[key] = {"fact": name, "kwargs": fact_kwargs, "executor": digest}
    if host.name not in _fetched:
        _run_batch(host, digest, executor_kwargs)
    lines = _answers.get(host.name, {}).get(key)
    if lines is not None and lines != [pyinfra_facts._MISSING_COMMAND_MARKER]:
        fact = cls()
        try:
            # As pyinfra does, the same instance builds the command first: some facts keep
            # their arguments for process() (HashFileFactBase keeps the path).
            pyinfra_facts._make_command(fact.command, dict(fact_kwargs))
            data = fact.process(lines) if lines else fact.default()
        except Exception:  # pyinfra's own run reports it the way it does
            data = None
        else:
            stats["served"] += 1
            return data
    return _live_get_fact(state, host, cls, args, kwargs, ensure_hosts, apply_failed_hosts)


def drop_answers() -> None:
    """Forgets every batched answer: something is about to change a host."""
    if any(_answers.values()):
        stats["dropped"] += 1
    _answers.clear()


def _dropping(execute):
    def execute_after_dropping(self, *args, **kwargs):
        drop_answers()
        return execute(self, *args, **kwargs)

    execute_after_dropping._drops_fact_batches = True  # type: ignore[attr-defined]  # a mark on the function
    execute_after_dropping.__wrapped__ = execute  # type: ignore[attr-defined]  # its signature stays pyinfra's (the contract test)
    return execute_after_dropping


def _command_classes():
    pending = [pyinfra_command.PyinfraCommand]
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        yield cls


def remember() -> None:
    """Writes, per host asked anything batchable in this run, what it was asked."""
    for host_name, asked in _asked.items():
        if not asked:
            continue
        path = _plan_file(host_name)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(list(asked.values()), sort_keys=True))
            tmp.replace(path)
        except OSError as error:
            logger.debug(f"Could not remember the facts asked of {host_name}: {error}")


_live_get_fact = pyinfra_facts._get_fact


def install() -> None:
    """Routes pyinfra's facts through the batch (idempotent; off with INFERENCE_HOST_FACT_BATCH=0)."""
    if os.environ.get("INFERENCE_HOST_FACT_BATCH", "1") == "0" or pyinfra_facts._get_fact is _get_fact:
        return
    pyinfra_facts._get_fact = _get_fact
    for cls in _command_classes():
        execute = cls.__dict__.get("execute")
        if execute is not None and not getattr(execute, "_drops_fact_batches", False):
            cls.execute = _dropping(execute)
    atexit.register(remember)
