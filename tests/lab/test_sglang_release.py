"""The pinned SGLang releases themselves, downloaded from PyPI (cached under
$XDG_CACHE_HOME/inference-host/wheels): the committed CLI captures match the real wheels, and
every patch of the queue applies to the real wheel. Network: the lab tier (no Docker needed)."""

from __future__ import annotations

import subprocess
import zipfile

import pytest

from roles.engine_envs import patches_for
from roles.serving import cli_capture
from roles.serving import command as cmd
from roles.shared import pypi_wheels
from roles.site import PROJECT_ROOT, load_stack

pytestmark = pytest.mark.lab

STACK = load_stack(PROJECT_ROOT / "inventory" / "stack.yml")
PATCHED_VERSIONS = sorted(p.name for p in (PROJECT_ROOT / "roles/engine_envs/patches/sglang").iterdir() if p.is_dir())


@pytest.mark.parametrize("version", sorted({s.sglang for s in STACK.stacks.values() if s.engine == "sglang"}))
def test_committed_cli_matches_the_real_wheel(version):
    committed = cmd.cli_options(version)
    assert cli_capture.capture(pypi_wheels.pypi_wheel(version)) == committed
    assert len(committed["options"]) > 300


@pytest.mark.parametrize("version", PATCHED_VERSIONS)
def test_every_patch_applies_to_the_real_wheel(version, tmp_path):
    with zipfile.ZipFile(pypi_wheels.pypi_wheel(version)) as archive:
        archive.extractall(tmp_path)
    for patch in patches_for(version):
        header = patch.read_text().split("\n--- ", 1)[0]
        for word in ("What:", "Why:", "Upstream:"):
            assert word in header, f"{patch.name} lacks a {word} line in its header"
        for args in (["--dry-run"], [], ["-R", "--dry-run"]):  # applies, and is then detectable
            result = subprocess.run(
                ["patch", "-p1", "-s", "-f", *args, "-d", str(tmp_path)],
                stdin=patch.open(),
                capture_output=True,
                text=True,
            )
            assert result.returncode == 0, f"{patch.name} {args}: {result.stdout}{result.stderr}"


# Where each release builds its /server_info answer from the server arguments: the function
# runs here, from the real wheel, with the state it reads replaced by plain objects.
SERVER_INFO = {
    "0.5.9": ("sglang/srt/entrypoints/http_server.py", "server_info"),
    "0.5.10": ("sglang/srt/entrypoints/http_server.py", "server_info"),
    "0.5.23": ("sglang/srt/utils/common.py", "build_server_info"),
}
SECRETS = {"api_key": "c" * 32, "admin_api_key": "a" * 32, "ssl_keyfile_password": "p" * 12}


def _server_info_answer(source: str, function: str) -> dict:
    """Runs `function` as the release defines it, compiled alone from its module's source."""
    import ast
    import asyncio
    import dataclasses
    from types import SimpleNamespace
    from typing import Any

    node = next(n for n in ast.parse(source).body if getattr(n, "name", None) == function)
    node.decorator_list = []
    Args = dataclasses.make_dataclass("Args", [*SECRETS, "model_path"])
    args = Args(**SECRETS, model_path="/models/kimi")
    args.resolved_dict = lambda: dataclasses.asdict(args)
    args.launch_command = "python -m sglang.launch_server --config /etc/x.yaml"

    async def no_states():
        return []

    namespace: dict = {
        "dataclasses": dataclasses,
        "List": list,  # the release's annotations, evaluated as it runs
        "Dict": dict,
        "Any": Any,
        "__version__": "x",
        "describe_kv_events_publisher": lambda _: None,
        "_global_state": SimpleNamespace(
            tokenizer_manager=SimpleNamespace(server_args=args, get_internal_state=no_states), scheduler_info={}
        ),
    }
    exec(compile(ast.Module(body=[node], type_ignores=[]), function, "exec"), namespace)
    if function == "build_server_info":
        return namespace[function](args, {})
    return asyncio.run(namespace[function]())


@pytest.mark.parametrize("version", sorted(SERVER_INFO))
def test_server_info_answers_without_the_keys(version, tmp_path):
    """/server_info takes no admin key: with the keys in it, the client key reads the admin key.
    The release's own function answers with every key; patched, with none of them."""
    path, function = SERVER_INFO[version]
    with zipfile.ZipFile(pypi_wheels.pypi_wheel(version)) as archive:
        archive.extract(path, tmp_path)
    unpatched = _server_info_answer((tmp_path / path).read_text(), function)
    assert {k: unpatched[k] for k in SECRETS} == SECRETS  # the leak the patch closes
    patch = next(p for p in patches_for(version) if p.name.endswith("keep-keys-out-of-server-info.patch"))
    subprocess.run(["patch", "-p1", "-s", "-f", "-d", str(tmp_path)], stdin=patch.open(), check=True)
    patched = _server_info_answer((tmp_path / path).read_text(), function)
    assert not set(SECRETS) & set(patched) and patched["model_path"] == "/models/kimi", patched
