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


def _auth_module(path):
    """The release's srt/utils/auth.py, imported alone (it is "intentionally lightweight": no torch)."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(f"auth_{abs(hash(str(path)))}", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _decisions(auth, key: str) -> dict[str, bool]:
    """What the release's own decide_request_auth answers for one bearer key on a data-plane route
    (NORMAL) and an admin route (ADMIN_OPTIONAL), with a client and an admin key set."""
    return {
        level: auth.decide_request_auth(
            method="POST",
            path="/v1/chat/completions" if level == "NORMAL" else "/flush_cache",
            authorization_header=f"Bearer {key}",
            api_key=SECRETS["api_key"],
            admin_api_key=SECRETS["admin_api_key"],
            auth_level=getattr(auth.AuthLevel, level),
        ).allowed
        for level in ("NORMAL", "ADMIN_OPTIONAL")
    }


@pytest.mark.parametrize("version", sorted(SERVER_INFO))
def test_tenant_keys_open_the_data_plane_only_once_patched(version, tmp_path, monkeypatch):
    """Client keys per tenant: the release's own auth refuses a tenant's key (one --api-key); patched,
    it takes it on the NORMAL routes (the key file the unit's environment names) and still refuses
    it on the admin routes; an unknown key is refused; the client key is served as before."""
    import json

    path = "sglang/srt/utils/auth.py"
    with zipfile.ZipFile(pypi_wheels.pypi_wheel(version)) as archive:
        archive.extract(path, tmp_path)
    tenant, unknown = "t" * 32, "u" * 32
    keys = tmp_path / "tenant-api-keys.json"
    keys.write_text(json.dumps({"alpha": tenant, "beta": "b" * 32}))
    keys.chmod(0o600)
    monkeypatch.setenv("INFERENCE_HOST_TENANT_API_KEYS_FILE", str(keys))
    unpatched = _auth_module(tmp_path / path)
    assert _decisions(unpatched, tenant) == {"NORMAL": False, "ADMIN_OPTIONAL": False}  # what the patch adds
    patch = next(p for p in patches_for(version) if p.name.endswith("tenant-api-keys.patch"))
    subprocess.run(["patch", "-p1", "-s", "-f", "-d", str(tmp_path)], stdin=patch.open(), check=True)
    patched = _auth_module(tmp_path / path)
    assert _decisions(patched, tenant) == {"NORMAL": True, "ADMIN_OPTIONAL": False}
    assert _decisions(patched, "b" * 32) == {"NORMAL": True, "ADMIN_OPTIONAL": False}
    assert _decisions(patched, unknown) == {"NORMAL": False, "ADMIN_OPTIONAL": False}
    assert _decisions(patched, SECRETS["api_key"]) == {"NORMAL": True, "ADMIN_OPTIONAL": False}
    assert _decisions(patched, SECRETS["admin_api_key"]) == {"NORMAL": False, "ADMIN_OPTIONAL": True}
    # Without the variable: the release's behaviour, a tenant's key refused.
    monkeypatch.delenv("INFERENCE_HOST_TENANT_API_KEYS_FILE")
    assert _decisions(_auth_module(tmp_path / path), tenant)["NORMAL"] is False
    # An unreadable file stops the start (the middleware reads it when it is added), naming no key.
    monkeypatch.setenv("INFERENCE_HOST_TENANT_API_KEYS_FILE", str(tmp_path / "missing.json"))
    with pytest.raises(OSError):
        _auth_module(tmp_path / path).add_api_key_middleware(None, api_key="c" * 32, admin_api_key=None)
