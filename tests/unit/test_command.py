"""The `inference-host` command: every subcommand (found by walking the parser, so a new one is
walked too) answers -h/--help with exit 0 and bad arguments with exit 2 and one line on stderr;
the console script is installed; a closed pipe ends quietly; the old `python -m` paths answer
--help; `deploy --check` is pyinfra's own dry run with diffs, read back with pyinfra's parser."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from inference_host import cli
from tests.unit.conftest import PROJECT_ROOT


def _subcommands(parser, prefix=()) -> list[tuple[str, ...]]:
    found = []
    for action in parser._actions:
        if action.__class__.__name__ == "_SubParsersAction":
            for name, sub in action.choices.items():
                found.append((*prefix, name))
                found += _subcommands(sub, (*prefix, name))
    return found


SUBCOMMANDS = _subcommands(cli.build_parser())


def _run(argv, capsys) -> tuple[int, str, str]:
    try:
        code = cli.main(list(argv))
    except SystemExit as done:
        code = done.code
    out, err = capsys.readouterr()
    return code, out, err


def test_the_walk_finds_every_subcommand():
    names = {path[0] for path in SUBCOMMANDS}
    assert {"validate", "preview", "deploy", "check", "accept", "bench", "vault", "lock", "lab"} <= names
    assert {"status", "drain", "undrain"} <= names
    assert {("lock", "engines"), ("lock", "gateway"), ("lock", "eagle3")} <= set(SUBCOMMANDS)


@pytest.mark.parametrize("path", SUBCOMMANDS, ids=" ".join)
@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_help_exits_0(path, flag, capsys):
    code, out, err = _run([*path, flag], capsys)
    assert code == 0, err
    assert out.startswith("usage: ") and err == ""


@pytest.mark.parametrize("path", SUBCOMMANDS, ids=" ".join)
def test_a_bad_argument_exits_2_with_one_line(path, capsys):
    code, out, err = _run([*path, "--no-such-option"], capsys)
    assert code == 2
    assert len(err.splitlines()) == 1 and "error:" in err and "Traceback" not in err, err


@pytest.mark.parametrize(
    "argv",
    [
        ["no-such-command"],
        [],
        ["validate", "inventory/lab.py", "--no-such-option"],
        ["validate", "inventory/lab.py", "--inventory", "inventory/prod.py"],
        ["check", "inventory/lab.py", "--inventory", "inventory/prod.py"],
        ["check", "inventory/lab.py", "--suites", "gpu", "--no-such-option"],
        ["status", "inventory/lab.py", "--timeout", "soon"],
        ["status", "inventory/lab.py", "--timeout", "0"],
        ["deploy", "inventory/lab.py", "--no-such-option"],
        ["vault", "frob", "inventory/secrets.vault.yml"],
        ["lab", "sideways"],
    ],
)
def test_more_bad_arguments_exit_2_with_one_line(argv, capsys):
    code, out, err = _run(argv, capsys)
    assert code == 2, (code, err)
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err


def test_an_invalid_inventory_is_exit_2_and_json_says_why(tmp_path, capsys):
    bad = tmp_path / "bad.py"
    bad.write_text("gpu_nodes = {'gpu1': {'gpu_count': 'many'}}\n")
    code, out, err = _run(["validate", str(bad), "--json"], capsys)
    assert code == 2
    answer = json.loads(out)
    assert answer["valid"] is False and any("gpu_count" in p for p in answer["problems"])


def test_validate_json_is_one_object(capsys):
    code, out, _ = _run(["validate", "inventory/lab.py", "--json"], capsys)
    assert code == 0
    answer = json.loads(out)
    assert answer["valid"] is True and answer["stack"]["id"] and answer["hosts"]
    assert "secret_names" in answer and all(isinstance(n, str) for n in answer["secret_names"])


def test_validate_settings_needs_no_inventory(capsys):
    code, out, _ = _run(["validate", "--settings"], capsys)
    assert code == 0 and out == (PROJECT_ROOT / "docs" / "settings.md").read_text()


def test_deploy_check_is_pyinfras_dry_run_with_diffs():
    from pyinfra_cli.cli import cli as pyinfra_cli

    argv = cli.pyinfra_argv("inventory/lab.py", check=True, yes=False, limit=["gpu1"], extra=[])
    context = pyinfra_cli.make_context("pyinfra", argv[1:])  # pyinfra's own parser (click)
    # no -y: pyinfra prints its table of detected changes, then --dry exits before any prompt
    assert context.params["dry"] and context.params["diff"] and not context.params["yes"]
    assert context.params["inventory"] == "inventory/lab.py" and context.params["operations"] == ("deploy.py",)
    assert context.params["limit"] == ("gpu1",)
    plain = pyinfra_cli.make_context("pyinfra", cli.pyinfra_argv("inventory/lab.py", False, False, [], [])[1:])
    assert not plain.params["dry"] and not plain.params["yes"]


def test_the_console_script_is_installed_and_runs_from_any_folder(tmp_path):
    script = Path(sys.executable).with_name("inference-host")
    assert script.is_file(), "uv sync installs it (inference_host/console-script)"
    answer = subprocess.run(
        [str(script), "validate", str(PROJECT_ROOT / "inventory" / "lab.py")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert answer.returncode == 0 and "valid" in answer.stdout, answer.stderr


@pytest.mark.parametrize(
    "argv",
    [
        [str(Path(sys.executable).with_name("inference-host")), "validate", "inventory/lab.py"],
        [sys.executable, "-m", "validation", "inventory/lab.py"],
        [sys.executable, "-m", "roles.site", "--settings"],
    ],
    ids=["inference-host", "python -m validation", "python -m roles.site --settings"],
)
def test_a_closed_pipe_ends_quietly(argv):
    # The reader goes away before the first line is written (like `| head -0`).
    process = subprocess.Popen(argv, cwd=PROJECT_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.close()
    err = process.stderr.read().decode()
    process.wait(timeout=120)
    assert "Traceback" not in err and "BrokenPipe" not in err, err


@pytest.mark.parametrize(
    "module",
    ["roles.site", "roles.site.vault", "roles.serving.cli_capture", "roles.gateway.cli_capture", "lab", "checks"],
)
def test_the_old_module_paths_answer_help(module):
    answer = subprocess.run(
        [sys.executable, "-W", "ignore", "-m", module, "--help"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert answer.returncode == 0 and answer.stdout.startswith("usage:"), answer.stderr
    assert "Traceback" not in answer.stderr
