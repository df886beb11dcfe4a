"""The command lines the roles build, read back by a real `sh` (issue 44): a value arrives as the
words the role meant, unchanged, or is refused before any host is contacted.

The oracle needs no hand-written expectation. Each command is built twice by the same code:
once with plain placeholder words (`zq3qz`), once with seeded hostile values (spaces, `$(...)`,
backquotes, `;`, `|`, `&`, newlines, quotes, globs, `~`, `#`, a leading `-`, unicode). Both run
under `/bin/sh -c` (dash on Debian, the shell pyinfra's connectors start) in an empty folder,
with PATH holding only recorders: every program the shell starts writes its argument vector
(`printf '%s\\0' "$0" "$@"`) and exits 0. The role meant what the placeholder run did, so the
hostile run must record the same calls, print the same output and create the same files, with
each placeholder replaced by its hostile value. A split word, an expanded `$(...)` (an extra
`touch` call), a glob or a comment shows as a difference.

Two kinds of code are driven:

- every `sh(...)` call site in roles/ (found with ast, as test_shell_builder.py does), its own
  literal template rendered with hostile values in each field (as a word, and as a list of
  words where the field is whole words);
- the roles' real command-building functions: every fact's `command()`, the locked
  environment's build, the apt pin resolution, the secret file's install, the guest key push,
  the account migration's steps, and the fact batch that wraps them all.
"""

from __future__ import annotations

import ast
import inspect
import itertools
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from pyinfra.api import FactBase

from roles.shared.shell import sh
from tests.unit.conftest import PROJECT_ROOT
from tests.unit.test_shell_builder import role_sources

SEED = 44
SHELL = "/bin/sh"
# Pieces of hostile values: what a careless operator or an attacker could type into a setting.
PIECES = [
    " ",
    "  ",
    "\t",
    "\n",
    "$(touch pwned)",
    "`touch pwned`",
    "; touch pwned",
    "| touch pwned",
    "&& touch pwned",
    "& touch pwned &",
    "'",
    '"',
    "\\",
    "\\'",
    "*",
    "?",
    "[a-z]",
    "~",
    "~root",
    "#",
    "{a,b}",
    "$HOME",
    "${IFS}",
    "$1",
    "$$",
    "!",
    "<",
    ">x",
    "(",
    ")",
    "=",
    ",",
    "%",
    "é",
    "☃",
    "\u200b",
    "ѕ",  # Cyrillic dze, a look-alike of s
    "-",
    "--",
    "/",
    "..",
    ".",
]
PROGRAMS_FALLBACK = ["touch", "rm", "sh", "bash", "echo", "printf", "reboot"]


def hostile(rng: random.Random, serial: int) -> str:
    """A value of 1-5 hostile pieces around a unique token (so it never names an existing file)."""
    parts = rng.choices(PIECES, k=rng.randint(1, 5))
    parts.insert(rng.randint(0, len(parts)), f"v{serial}")
    value = "".join(parts)
    if rng.random() < 0.15:
        value = "-" + value  # an option in disguise
    return value


# --- the recorders and the batch runner ------------------------------------------------------------


def _programs() -> list[str]:
    """Every word that could be a program in the roles' templates, plus the injected ones."""
    names = set(PROGRAMS_FALLBACK)
    for path in role_sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                names.update(w for w in node.value.replace("(", " ").replace(";", " ").split() if _program_like(w))
    return sorted(names)


def _program_like(word: str) -> bool:
    return word[:1].isalpha() and all(c.isalnum() or c in "-_." for c in word) and len(word) < 40


# One file a process (named by its pid, appended to): processes of a pipeline run at once.
RECORDER = """#!/bin/sh
printf '%s\\0' "${0##*/}" "$@" >> "$REC/$$"
printf '\\036\\0' >> "$REC/$$"
exit 0
"""


@dataclass
class Outcome:
    calls: list[tuple[bytes, ...]]
    stdout: bytes
    files: list[str]


class Runner:
    """Runs many commands in one `sh` per batch: each in its own subshell, folder and output."""

    def __init__(self, root: Path):
        self.root = root
        self.bin = root / "bin"
        self.bin.mkdir()
        recorder = self.bin / ".recorder"
        recorder.write_text(RECORDER)
        recorder.chmod(0o755)
        for name in _programs():
            (self.bin / name).symlink_to(recorder)
        self.count = 0

    def run(self, commands: list[str]) -> list[Outcome]:
        batch = self.root / f"batch{self.count}"
        self.count += 1
        batch.mkdir()
        script = []
        for index, command in enumerate(commands):
            for folder in (batch / str(index), batch / f"{index}.rec"):
                folder.mkdir()
            # Each command from its own file (`.` in a subshell): a quote it leaves open ends
            # there, and the cases after it still run.
            (batch / f"{index}.sh").write_text(command + "\n")
            script.append(
                f'REC="$ROOT/{index}.rec"; cd "$ROOT/{index}" && ( . "$ROOT/{index}.sh" )'
                f' </dev/null >"$ROOT/{index}.out" 2>/dev/null'
            )
        env = {"PATH": str(self.bin), "ROOT": str(batch), "HOME": "/nonexistent-home"}
        subprocess.run([SHELL, "-c", "export REC\n" + "\n".join(script)], env=env, timeout=120, check=False)
        outcomes = []
        for index in range(len(commands)):
            out = batch / f"{index}.out"
            folder = batch / str(index)
            calls = [call for record in (batch / f"{index}.rec").iterdir() for call in _calls(record.read_bytes())]
            files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))
            outcomes.append(Outcome(sorted(calls), out.read_bytes() if out.exists() else b"", files))
        shutil.rmtree(batch)
        return outcomes


def _calls(data: bytes) -> list[tuple[bytes, ...]]:
    calls = []
    for chunk in data.split(b"\x1e\x00"):
        if chunk:
            calls.append(_as_systemd_reads(tuple(chunk.rstrip(b"\x00").split(b"\x00"))))
    return calls


def _as_systemd_reads(call: tuple[bytes, ...]) -> tuple[bytes, ...]:
    """systemd-run's command words, as the manager reads them: expanded like ExecStart=, so the
    role doubles each `$` (roles/shared/systemd_syntax.py transient_argv) and `$$` is one `$`.
    Its options (`-p KEY=VALUE`) are not expanded."""
    if call[0] != b"systemd-run":
        return call
    index = 1
    while index < len(call) and call[index].startswith(b"-"):
        index += 2 if call[index] == b"-p" else 1
    return call[:index] + tuple(word.replace(b"$$", b"$") for word in call[index:])


def _substitute(outcome: Outcome, values: dict[str, str]) -> Outcome:
    def sub(data: bytes) -> bytes:
        for placeholder, value in values.items():
            data = data.replace(placeholder.encode(), value.encode())
        return data

    return Outcome(
        sorted(tuple(sub(word) for word in call) for call in outcome.calls),
        sub(outcome.stdout),
        sorted(sub(f.encode()).decode() for f in outcome.files),
    )


def _scratch_parent() -> str:
    """Where the path settings' recorders live: not under /tmp or /var/tmp, which the site model
    refuses for a folder the service account owns (another user could make it first), nor under
    /root or /home. The first of these this user may write."""
    for parent in ("/var/cache", "/srv", "/opt"):
        if os.access(parent, os.W_OK):
            return parent
    pytest.fail("the shell read-back needs a folder outside /tmp it may write: /var/cache, /srv or /opt")


@pytest.fixture(scope="module")
def runner():
    with tempfile.TemporaryDirectory(prefix="ih-shell-", dir=_scratch_parent()) as root:
        yield Runner(Path(root))


# --- the cases ----------------------------------------------------------------------------------


@dataclass
class Case:
    where: str
    meant: str  # built with placeholders
    built: str | None  # built with hostile values; None: refused before contact
    values: dict[str, str]  # placeholder -> hostile value


class Values:
    """Hands out placeholders and their hostile values, one pair per word."""

    serials = itertools.count()  # unique across cases: the fact batch runs several together

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.pairs: dict[str, str] = {}

    def word(self) -> tuple[str, str]:
        serial = next(self.serials)
        value = hostile(self.rng, serial)
        # The placeholder keeps the value's folders ('/', '.', '..'), so a path means the same.
        placeholder = "/".join(
            part if part in ("", ".", "..") else f"zq{serial}s{index}qz" for index, part in enumerate(value.split("/"))
        )
        self.pairs[placeholder] = value
        # Each folder's name too, after the whole value: a builder may name a path's folders
        # (roles/shared/secret_files.py checks every folder above its destination).
        for index, part in enumerate(value.split("/")):
            if "/" in value and part not in ("", ".", ".."):
                self.pairs[f"zq{serial}s{index}qz"] = part
        return placeholder, value


def _build(where: str, build: Callable[[Callable[[], tuple[str, str]]], tuple[object, object]], rng) -> Case:
    values = Values(rng)
    plain, bad = build(values.word)
    try:
        built = str(bad())
    except ValueError as error:
        assert "option" in str(error) or str(error).startswith("refused"), (where, error)
        built = None
    return Case(where, str(plain()), built, values.pairs)


def sh_call_sites() -> list[tuple[str, str]]:
    """(file:line, template) of every sh() call in roles/."""
    sites = []
    for path in role_sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "sh" and node.args:
                template = node.args[0]
                literals = [template.body, template.orelse] if isinstance(template, ast.IfExp) else [template]
                for literal in literals:
                    sites.append((f"{path.name}:{node.lineno}", literal.value))
    return sites


def _template_case(where: str, template: str, rng: random.Random) -> Case:
    fields = sorted({f for _, f, _, _ in __import__("string").Formatter().parse(template) if f})

    def build(word):
        plain, bad = {}, {}
        for field in fields:
            as_list = rng.random() < 0.3 and _takes_list(template, field)
            pairs = [word() for _ in range(2 if as_list else 1)]
            plain[field] = [p for p, _ in pairs] if as_list else pairs[0][0]
            bad[field] = [v for _, v in pairs] if as_list else pairs[0][1]
        return (lambda: sh(template, **plain)), (lambda: sh(template, **bad))

    return _build(where, build, rng)


def _takes_list(template: str, field: str) -> bool:
    try:
        sh(template, **{f: (["a", "b"] if f == field else "a") for f in _fields(template)})
    except ValueError:
        return False
    return True


def _fields(template: str) -> set[str]:
    from string import Formatter

    return {f for _, f, _, _ in Formatter().parse(template) if f}


def fact_classes() -> list[type]:
    """Every fact the roles define (a FactBase subclass with its own command())."""
    import importlib

    classes = {}
    for path in role_sources():
        module = ".".join(path.relative_to(Path(__file__).resolve().parents[2]).with_suffix("").parts)
        module = module.removesuffix(".__init__")
        if module in ("deploy", "config"):
            continue
        for _, cls in inspect.getmembers(importlib.import_module(module), inspect.isclass):
            if issubclass(cls, FactBase) and "command" in vars(cls) and cls.__module__.startswith("roles."):
                if cls.__name__.startswith("_"):  # a base class (no tool of its own): its subclasses run
                    continue
                classes[f"{cls.__module__}.{cls.__name__}"] = cls
    for cls in list(classes.values()):
        for sub in cls.__subclasses__():
            classes[f"{sub.__module__}.{sub.__name__}"] = sub
    return [classes[k] for k in sorted(classes)]


def _fact_case(cls: type, rng: random.Random) -> Case:
    parameters = list(inspect.signature(cls.command).parameters.values())[1:]

    def build(word):
        plain, bad = {}, {}
        for p in parameters:
            if p.annotation in (int, "int"):
                plain[p.name] = bad[p.name] = rng.randint(100, 999999)
            else:
                plain[p.name], bad[p.name] = word()
        return (lambda: cls().command(**plain)), (lambda: cls().command(**bad))

    return _build(f"{cls.__module__}.{cls.__name__}.command", build, rng)


def _function_cases(rng: random.Random) -> list[Case]:
    from roles.shared import guest_keys, legacy_account, locked_env, secret_files

    def locked(word):
        def args(pick):
            names = [pick() for _ in range(6)]
            return dict(
                target=f"/{names[0]}/envs/{names[1]}",
                python=names[2],
                requirements=names[3],
                current=names[4],
                checks=[sh("test -e {x}", x=names[5])],
                installs=lambda python: [sh("{python} -c pass", python=python)],
                pip_check=True,
                compile_only=(names[5], names[0]),
            )

        plain, bad = _paired(word)
        return (lambda: locked_env.build_command(**args(plain))), (lambda: locked_env.build_command(**args(bad)))

    def secret(word):
        plain, bad = _paired(word)
        return (
            lambda: "\n".join(secret_files.install_steps(plain(), plain(), plain(), plain())),
            lambda: "\n".join(secret_files.install_steps(bad(), bad(), bad(), bad())),
        )

    def keys(word):
        plain, bad = _paired(word)
        vmid = rng.randint(100, 999)
        return (
            lambda: "\n".join(guest_keys.push_keys_commands(vmid, plain(), True)),
            lambda: "\n".join(guest_keys.push_keys_commands(vmid, bad(), True)),
        )

    def account(word):
        plain, bad = _paired(word)
        ids = (rng.randint(100, 999), rng.randint(100, 999))

        def steps(pick):
            user, group, data, new_data, new_log = pick(), pick(), pick(), pick(), pick()
            migration = legacy_account.AccountMigration(
                user=user,
                group=group,
                ids=ids,
                add_group=True,
                add_user=True,
                moves=((legacy_account.FORMER_DATA_DIR, new_data), (legacy_account.FORMER_LOG_DIR, new_log)),
            )
            commands = [c for _, cs in legacy_account.adoption_steps(migration, data) for c in cs]
            commands += [c for _, cs in legacy_account.drop_steps(migration, "why") for c in cs]
            return "\n".join(commands)

        return (lambda: steps(plain)), (lambda: steps(bad))

    # install_command (apt pins) refuses any name outside Debian's grammar (test_apt_resolve.py);
    # its template is read back with hostile words among the sh() call sites.
    builders = {"build_command": locked, "install_steps": secret}
    builders |= {"push_keys_commands": keys, "adoption_and_drop_steps": account}
    return [_build(name, build, rng) for name, build in builders.items()]


def _paired(word):
    """Two pickers that hand out the same sequence of (placeholder, hostile) pairs."""
    pairs: list[tuple[str, str]] = []
    cursors = {"plain": 0, "bad": 0}

    def picker(kind: str, index: int):
        def pick() -> str:
            position = cursors[kind]
            cursors[kind] += 1
            while len(pairs) <= position:
                pairs.append(word())
            return pairs[position][index]

        return pick

    return picker("plain", 0), picker("bad", 1)


def _batched(cases: list[Case], rng: random.Random) -> Case:
    """The fact batch (roles/shared/fact_batch.py) around commands the cases built."""
    from roles.shared.fact_batch import batch_script

    # Not a case whose value holds a newline: the batch frames each line a command prints with
    # "|", and the model here substitutes a value into the plain run's framed output, where its
    # newline is no new frame; the real shell's output is framed per line. The two then differ in
    # the framing the model writes, which says nothing of how the shell read the value (seen once
    # a new template shifted the seeded values); the cases above run each such command unbatched.
    chosen = [c for c in cases if c.built is not None and not any("\n" in v for v in c.values.values())]
    chosen = rng.sample(chosen, min(5, len(chosen)))
    values = {k: v for c in chosen for k, v in c.values.items()}
    meant = batch_script([c.meant for c in chosen])
    built = batch_script([c.built for c in chosen])
    return Case("fact_batch.batch_script", meant, built, values)


# --- the test -----------------------------------------------------------------------------------

TRIALS_PER_SITE = 12
TRIALS_PER_FACT = 12
TRIALS_PER_FUNCTION = 20


def all_cases(seed: int = SEED) -> list[Case]:
    rng = random.Random(seed)
    Values.serials = itertools.count()  # the same values on every call
    cases = []
    for where, template in sh_call_sites():
        cases += [_template_case(where, template, rng) for _ in range(TRIALS_PER_SITE)]
    for cls in fact_classes():
        cases += [_fact_case(cls, rng) for _ in range(TRIALS_PER_FACT)]
    for _ in range(TRIALS_PER_FUNCTION):
        cases += _function_cases(rng)
    cases += [_batched(cases, rng) for _ in range(TRIALS_PER_FUNCTION)]
    return cases


def read_back(runner: Runner, cases: list[Case], batch: int = 200) -> tuple[list[str], dict[str, int]]:
    problems = []
    counts = {"cases": len(cases), "values": sum(len(c.values) for c in cases), "refused": 0}
    todo = [c for c in cases if c.built is not None]
    counts["refused"] = len(cases) - len(todo)
    for start in range(0, len(todo), batch):
        chunk = todo[start : start + batch]
        meant = runner.run([c.meant for c in chunk])
        got = runner.run([c.built for c in chunk])
        for case, plain, hostile_run in zip(chunk, meant, got, strict=True):
            expected = _substitute(plain, case.values)
            if hostile_run != expected:
                problems.append(_difference(case, expected, hostile_run))
    return problems, counts


def _difference(case: Case, expected: Outcome, got: Outcome) -> str:
    return (
        f"{case.where}: the shell did not read the values back\n  values: {case.values!r}\n"
        f"  command: {case.built!r}\n  meant calls: {expected.calls!r}\n  got calls:   {got.calls!r}\n"
        f"  meant output: {expected.stdout!r}\n  got output:   {got.stdout!r}\n"
        f"  meant files: {expected.files!r}\n  got files:   {got.files!r}"
    )


def test_the_shell_reads_every_hostile_value_back_as_the_role_meant(runner):
    cases = all_cases()
    assert len(sh_call_sites()) > 60 and len(fact_classes()) > 15  # the sites are found at all
    problems, counts = read_back(runner, cases)
    assert counts["values"] > 3000, counts
    assert not problems, f"{len(problems)} of {counts['cases']} commands misread:\n" + "\n".join(problems[:5])


def test_the_recorders_see_an_injection(runner):
    """The oracle itself: a value formatted into the command unquoted (the old f-string) is caught."""
    value = "/opt/ih$(touch pwned) x"
    meant = "rm -rf -- zq0qz"
    built = f"rm -rf -- {value}"
    problems, _ = read_back(runner, [Case("planted", meant, built, {"zq0qz": value})])
    assert len(problems) == 1 and "touch" in problems[0]


def test_a_value_starting_with_a_dash_is_refused_before_contact():
    with pytest.raises(ValueError, match="option"):
        sh("apt-get install -y {packages}", packages=["git", "-oDpkg::Pre-Invoke::=touch /tmp/x"])


def test_the_shell_is_posix_sh():
    assert os.path.exists(SHELL)


# --- the whole deploy: every command of a plan, the settings hostile -----------------------------

PLAN_INVENTORY = PROJECT_ROOT / "tests" / "unit" / "plans" / "inventory_shell_values.py"
PLAN_HOST = "@fake/gpu-shell"
# Per setting, candidates from the most hostile down: the first the site model takes is used (a
# setting whose every candidate is refused is refused before contact, which is the other outcome).
PATH_CANDIDATES = [
    "$(touch pwned)`touch pwned`; touch pwned|&#*?'\" x",
    "sp ace'q\"#~*?[a]☃é",
    "sp ace☃é",
]
# The path settings, each under a folder of the test's own (SANDBOX below): a program the roles run
# by a path built from a setting ({base_uv_dir}/<version>/bin/pip, an environment's bin/python) is
# then a recorder there too, so its arguments are read back like those of a program on PATH.
PATH_SETTINGS = {
    "base_install_root": "opt/ih",
    "base_uv_dir": "opt/uv",
    "base_data_dir": "var/lib/ie",
    "base_log_dir": "var/log/ie",
    "base_model_dir": "srv/models",
}
OTHER_SETTINGS = {"serving_served_model_name": ["kimi $(touch pwned)`id`;|&'\"*", "kimi k2's ☃ *"]}
# A program the shell runs by its path: a word in command position (after the start, an operator
# or a keyword) that ends in /bin/<name>, under a setting's placeholder folder.
PROGRAM_PATH = re.compile(
    r"(?:^|&&|\|\||[;|(]|\bthen|\bdo|\belse)\s*(/[^\s'\"]*zq\d+s\d+qz[^\s'\"]*/bin/[A-Za-z0-9_.+-]+)", re.M
)

# A folder such a command enters first (`cd -- {env}/inference-host-patches && ... && {env}/bin/python`).
ENTERED = re.compile(r"\bcd -- (/[^\s'\"]*zq\d+s\d+qz[^\s'\"]*)")


def plan_settings(sandbox: str) -> dict[str, list[str]]:
    paths = {s: [f"{sandbox}/{folder} {c}" for c in PATH_CANDIDATES] for s, folder in PATH_SETTINGS.items()}
    return {**paths, **OTHER_SETTINGS}


def _plan(values: dict[str, str]) -> list[str]:
    env = {**os.environ, "INFERENCE_HOST_SHELL_VALUES": json.dumps(values)}
    done = subprocess.run(
        [sys.executable, "tests/unit/plans/record.py", "--limit", PLAN_HOST, str(PLAN_INVENTORY), "deploy.py"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    return [r["command"] for r in records if "command" in r and r["host"] == PLAN_HOST]


def _accepted(setting: str, candidates: list[str]) -> str | None:
    from tests.unit.test_read_back import Inventory

    inventory = Inventory("plan", PLAN_INVENTORY)
    for value in candidates:
        _, problems = inventory.retyped(PLAN_HOST, setting, value)
        if not problems:
            return value
    return None


def _placeholder(value: str, serial: int, keep: str = "") -> str:
    """value's placeholder: its folders kept ('/', '.', '..', and the leading `keep`), each other
    part a unique word."""
    rest = value.removeprefix(keep)
    return keep + "/".join(
        part if part in ("", ".", "..") else f"zq{serial}s{index}qz" for index, part in enumerate(rest.split("/"))
    )


def programs_by_path(commands: list[str], pairs: dict[str, str], bin_dir: Path) -> list[str]:
    """Make each program the commands run by a path under a placeholder folder a recorder, at that
    path and at the path the hostile value gives (and the folders they enter first, folders);
    returns the placeholder paths of the programs."""
    found = sorted({m.group(1) for c in commands for m in PROGRAM_PATH.finditer(c)})
    for folder in {m.group(1) for c in commands for m in ENTERED.finditer(c)}:
        for target in {folder, _hostile(folder, pairs)}:
            Path(target).mkdir(parents=True, exist_ok=True)
    for path in found:
        for target in {path, _hostile(path, pairs)}:
            Path(target).parent.mkdir(parents=True, exist_ok=True)
            if not os.path.lexists(target):
                Path(target).symlink_to(bin_dir / ".recorder")
    return found


def _hostile(path: str, pairs: dict[str, str]) -> str:
    for placeholder, value in pairs.items():
        path = path.replace(placeholder, value)
    return path


def test_every_command_of_a_deploy_reads_its_settings_back(runner):
    """The real roles, run by pyinfra against a @fake host (tests/unit/plans/record.py), once with
    placeholders and once with hostile settings: the same commands, read the same by sh. Then
    the commands that run a program by a path built from a setting ({base_uv_dir}/<version>/bin/pip,
    an engine environment's bin/python) once more, with a recorder at that path: kept apart, as
    the folders the recorders need would change what the other commands find."""
    sandbox = runner.root / "prefix"
    chosen = {s: _accepted(s, c) for s, c in plan_settings(str(sandbox)).items()}
    hostile_values = {s: v for s, v in chosen.items() if v is not None}
    assert set(PATH_SETTINGS) <= set(hostile_values), chosen  # each folder setting takes one of them
    placeholders = {
        s: _placeholder(v, 9000 + i, f"{sandbox}/" if v.startswith(f"{sandbox}/") else "")
        for i, (s, v) in enumerate(hostile_values.items())
    }
    meant, built = _plan(placeholders), _plan(hostile_values)
    assert len(meant) == len(built) > 100, (len(meant), len(built))
    pairs = {placeholders[s]: v for s, v in hostile_values.items()}
    reached = [c for c in meant if any(p in c for p in pairs)]
    assert len(reached) > 10, "the settings reach no command line: the test would prove nothing"
    cases = [Case(f"plan command {i}", m, b, pairs) for i, (m, b) in enumerate(zip(meant, built, strict=True))]
    problems, _ = read_back(runner, cases)
    assert not problems, f"{len(problems)} of {len(cases)} plan commands misread:\n" + "\n".join(problems[:3])

    by_path = [c for c in cases if PROGRAM_PATH.search(c.meant)]
    try:
        programs = programs_by_path([c.meant for c in by_path], pairs, runner.bin)
        assert {Path(p).name for p in programs} >= {"pip", "python"}, programs
        recorded = {call[0] for outcome in runner.run([c.meant for c in by_path]) for call in outcome.calls}
        assert {b"pip", b"python"} <= recorded, "the programs run by a setting's path are not recorded"
        problems, _ = read_back(runner, by_path)
    finally:
        shutil.rmtree(sandbox, ignore_errors=True)
    assert not problems, f"{len(problems)} of {len(by_path)} commands misread:\n" + "\n".join(problems[:3])
