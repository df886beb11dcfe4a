"""Secrets on the serving path, without a host: SGLang's start-up log of both pinned releases
(the real wheel, patched or not, through the stand-in's copy of its logging path), and the
order in which a secret file is created over SSH."""

from __future__ import annotations

import getpass
import grp
import os
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from roles.sglang import patches_for
from roles.shared import sglang_wheels as wheels
from roles.shared.secret_files import install_steps, staged_path
from roles.site import PROJECT_ROOT, load_stack

STACK = load_stack(PROJECT_ROOT / "inventory" / "stack.yml")
VERSIONS = sorted({stack.sglang for stack in STACK.stacks.values()})
KEY = "planted-api-key-0f9c2e"
STANDIN = PROJECT_ROOT / "tests" / "standins" / "sglang_server"


def _release(version: str, folder: Path, patched: bool) -> Path:
    with zipfile.ZipFile(wheels.sglang_wheel(version)) as archive:
        archive.extractall(folder, [n for n in archive.namelist() if n.startswith("sglang/")])
    if patched:
        for patch in patches_for(version):
            subprocess.run(["patch", "-p1", "-s", "-f", "-d", str(folder)], stdin=patch.open(), check=True)
    return folder


def _startup_log(release: Path) -> str:
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from startup_log import log_server_args;"
            f" log_server_args({{'api_key': {KEY!r}, 'admin_api_key': {KEY!r}, 'model_path': '/models/m',"
            " 'port': '30000', 'tp_size': '8'})")
    result = subprocess.run([sys.executable, "-c", code, str(STANDIN)], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(release)}, check=True)
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
    for folder, mode in ((root, 0o755), (root / "var", 0o755), (root / "var/lib", 0o755),
                         (root / "var/lib/inference-host", 0o755), (upload, 0o700), (root / "etc", 0o755),
                         (etc, 0o755)):
        folder.mkdir(exist_ok=True, parents=True)
        folder.chmod(mode)
    return root, upload, etc / "sglang-secret-args.yaml"


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
    assert _replay(root, plan) == [["etc/sglang/sglang-secret-args.yaml"], []]
