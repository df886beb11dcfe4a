"""Every command README.md and docs/*.md tell a user to type exists: each `python -m <module>` of
ours and each `uv run <tool>` answers `--help` with its usage (a documented subcommand,
`python -m lab down`, answers its own `--help`), or is listed below as one that runs elsewhere,
with why. A renamed module, a dropped subcommand or a console script that is not installed fails
here, not in a newcomer's terminal. The commands are read from the documents, so a document that
names a new one is held to it without an edit here."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path

import pytest

from tests.unit.conftest import PROJECT_ROOT

OURS = ("roles", "checks", "lab", "tests")
# `python -m <module> [subcommand]`: a subcommand is a bare word (not a path: inventory/x.py).
MODULE = re.compile(r"(?<![\w/.-])python -m ([A-Za-z_][\w.]*)((?: +[a-z][a-z-]*(?![\w/.]))?)")
# `uv run [uv's options] <tool>`: uv's options that take a value, so that the value is not the tool.
UV_VALUE_OPTIONS = {"--extra", "--with", "--group", "--python", "--directory", "--index-url", "--project", "-p"}
UV_RUN = re.compile(r"(?<![\w-])uv run ([^\n`|;]*)")
# What the documents name that does not run here, each with why.
ELSEWHERE = {
    "sglang.launch_server": "the engine's own server, in the engine's environment on a gpu node",
    "sglang.bench_serving": "the engine's own benchmark, in the engine's environment on a gpu node",
    "vllm.entrypoints.openai.api_server": "the engine's own server, in the engine's environment on a gpu node",
    "tests.infra": "the checks' old module, named where the upgrade notes say what moved",
    "roles.sglang.lock": "the old lock command, named where the upgrade notes say what moved",
}
HELP_TIMEOUT_S = 60


def documents() -> list[Path]:
    return [PROJECT_ROOT / "README.md", *sorted((PROJECT_ROOT / "docs").glob("*.md"))]


def _tool_of(words: str) -> str | None:
    """The tool `uv run <words>` runs: the first word that is neither one of uv's options nor an
    option's value; None for python (python -m is read by MODULE; python <file> is a script)."""
    given = iter(words.split())
    for word in given:
        if word.startswith("-"):
            if word in UV_VALUE_OPTIONS:
                next(given, None)
            continue
        return word if re.fullmatch(r"[a-z][\w-]*", word) and word != "python" else None
    return None


def documented(texts: dict[str, str]) -> dict[tuple[str, ...], str]:
    """{(kind, name[, subcommand]): 'document:line'} for every command the texts name: kind is
    'module' (python -m) or 'tool' (uv run <tool>)."""
    found: dict[tuple[str, ...], str] = {}
    for name, text in texts.items():
        for match in MODULE.finditer(text):
            where = f"{name}:{text.count(chr(10), 0, match.start()) + 1}"
            module, word = match.group(1).rstrip("."), match.group(2).strip()
            found.setdefault(("module", module), where)
            if word:
                found.setdefault(("module", module, word), where)
        for match in UV_RUN.finditer(text):
            tool = _tool_of(match.group(1))
            if tool:
                found.setdefault(("tool", tool), f"{name}:{text.count(chr(10), 0, match.start()) + 1}")
    return found


# A command that took --help for an argument must not reach the network (nor PyPI's wheels).
OFFLINE = {"http_proxy": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9", "no_proxy": "", "UV_OFFLINE": "1"}


@cache
def _help(argv: tuple[str, ...]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k.lower() not in ("http_proxy", "https_proxy", "no_proxy")}
    try:
        return subprocess.run(
            [*argv, "--help"],
            cwd=PROJECT_ROOT,
            env=env | OFFLINE,
            capture_output=True,
            text=True,
            timeout=HELP_TIMEOUT_S,
        )
    except FileNotFoundError as error:
        return subprocess.CompletedProcess(argv, 127, "", str(error))
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, 124, "", f"no answer to --help within {HELP_TIMEOUT_S} s")


def _argv(kind: str, name: str) -> tuple[str, ...]:
    if kind == "module":
        return (sys.executable, "-m", name)
    return (str(Path(sys.executable).parent / name),)


def _subcommands(usage: str) -> set[str] | None:
    """argparse's subcommand choices ({set,check,rename}), None when the command has none."""
    match = re.search(r"\{([a-z][\w,-]*)\}", usage)
    return set(match.group(1).split(",")) if match else None


def problems(commands: dict[tuple[str, ...], str], run=_help) -> list[str]:
    """'document:line: command: what is wrong' for each documented command that does not answer."""
    checked = {
        key: where
        for key, where in commands.items()
        if key[1] not in ELSEWHERE and (key[0] == "tool" or key[1].split(".")[0] in OURS)
    }
    tops = sorted({key[:2] for key in checked})
    with ThreadPoolExecutor(max_workers=2) as pool:  # 2 cores; each answer is an interpreter start
        answers = dict(zip(tops, pool.map(lambda key: run(_argv(*key)), tops), strict=True))
    found = []
    for key, where in sorted(checked.items(), key=lambda item: item[1]):
        shown = ("python -m " if key[0] == "module" else "uv run ") + " ".join(key[1:])
        answer = answers[key[:2]]
        if answer.returncode != 0 or "usage" not in answer.stdout.lower():
            if len(key) == 2:
                last = (answer.stderr.strip() or answer.stdout.strip() or "no output").splitlines()[-1]
                found.append(f"{where}: {shown} --help: exit {answer.returncode}: {last}")
            continue
        if len(key) == 3:
            choices = _subcommands(answer.stdout)
            if choices is not None and key[2] not in choices:
                found.append(f"{where}: {shown}: no such subcommand (it has {', '.join(sorted(choices))})")
            elif choices is not None and run((*_argv(*key[:2]), key[2])).returncode != 0:
                found.append(f"{where}: {shown} --help fails")
    return found


def test_every_documented_command_answers_help():
    texts = {str(path.relative_to(PROJECT_ROOT)): path.read_text() for path in documents()}
    commands = documented(texts)
    # The documents' main commands are found (the parser reads what a user reads).
    assert {("tool", "pyinfra"), ("tool", "pytest"), ("module", "checks"), ("module", "roles.render")} <= set(commands)
    found = problems(commands)
    assert found == [], "documented commands that do not answer --help:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "text, problem",
    [
        ("    uv run python -m roles." + "gone x\n", "python -m roles." + "gone --help: exit 1"),
        ("`uv run --extra bench gone-tool`", "uv run gone-tool --help: exit 127"),
        ("`python -m roles.site.vault sett`", "python -m roles.site.vault sett: no such subcommand"),
    ],
)
def test_a_command_that_does_not_answer_is_caught(text, problem):
    answers = {
        ("roles." + "gone",): subprocess.CompletedProcess((), 1, "", "No module named it"),
        ("gone-tool",): subprocess.CompletedProcess((), 127, "", "not installed"),
        ("roles.site.vault",): subprocess.CompletedProcess((), 0, "usage: vault {set,check,rename}", ""),
    }

    def run(argv):
        return answers[(Path(argv[-1]).name,)]

    commands = documented({"README.md": text + "\n`uv run python -m sglang.launch_server`\n"})
    assert ("module", "sglang.launch_server") in commands
    found = problems(commands, run)
    assert len(found) == 1 and problem in found[0], found
    assert found[0].startswith("README.md:1: ")


def test_uv_runs_options_are_not_taken_for_the_tool():
    commands = documented({"README.md": "uv run --extra bench pytest; uv run --frozen ruff check; uv run pyinfra -y"})
    assert {key[1] for key in commands} == {"pytest", "ruff", "pyinfra"}
