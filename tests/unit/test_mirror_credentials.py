"""The package mirrors' logins (cuda_repo_credentials_secret, base_pypi_index_credentials_secret,
roles/shared/mirror_auth.py): each file read back by its consumer's own parser, hostile values
included (apt's, through apt's own downloader against a local server that records the
Authorization header it is sent; uv's, the same way; Python's netrc module, which pip's requests
uses); values no netrc reader shares refused in a line that shows none of them; and in the plan of
a deploy (the real pyinfra CLI on a @fake host), the logins reach the host only through the 0600
upload, never a command line, an exported environment variable or a plain file."""

from __future__ import annotations

import ast
import base64
import http.server
import importlib.util
import json
import netrc
import os
import random
import shutil
import subprocess
import sys
import threading
from functools import cache
from pathlib import Path
from types import SimpleNamespace

import pytest

from roles.shared import mirror_auth
from roles.shared.mirror_auth import CredentialError, apt_auth_text, netrc_text, parse_credentials, token_problem
from tests.unit.conftest import PROJECT_ROOT
from tests.unit.test_gpu_stack_plans import Plan, plan

APT_HELPER = "/usr/lib/apt/apt-helper"
TOKEN_CHARS = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) not in '"\\')

# Valid, and each misread by some other language the value passes near: a shell, a URL, a comment.
HOSTILE = [
    ("u", "#"),
    ("#user", "#pw"),
    ("user", "$(touch${IFS}/tmp/x)"),
    ("u'1", "p'w`id`;|&"),
    ("mirror-user", "p%40ss:with:colons"),
    ("machine1", "loginpassword"),
    ("user", "machine"),
    ("login", "password"),
    ("a", "x" * 300),
    ("__token__", "pypi-AgEIcHlwaS5vcmc"),
]


def _random_credentials(count: int, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    pairs = []
    while len(pairs) < count:
        login = "".join(rng.choice(TOKEN_CHARS.replace(":", "")) for _ in range(rng.randint(1, 24)))
        password = "".join(rng.choice(TOKEN_CHARS) for _ in range(rng.randint(1, 48)))
        if token_problem(login) is None and token_problem(password) is None:
            pairs.append((login, password))
    return pairs


# --- the grammar ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("login", "password"), HOSTILE + _random_credentials(200, seed=44))
def test_a_vault_value_is_split_into_login_and_password(login, password):
    assert parse_credentials(f"{login}:{password}", "s") == (login, password)
    assert parse_credentials(f"{login}:{password}\n", "s") == (login, password)  # as `vault set` may store it


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("no-colon-here", "the vault value of s has no ':'; expected login:password"),
        (":pw", "the login in s's vault value is empty"),
        ("user:", "the password in s's vault value is empty"),
        ("user:pass word", "the password in s's vault value holds a space at character 5"),
        ("user:pass\tword", "the password in s's vault value holds a control character at character 5"),
        ("user:pass\nword", "the password in s's vault value holds a control character at character 5"),
        ("user:pass\rword", "the password in s's vault value holds a control character at character 5"),
        ('user:pa"ss', "the password in s's vault value holds a double quote at character 3"),
        ("user:pa\\ss", "the password in s's vault value holds a backslash at character 3"),
        ("us\u0435r:pass", "the login in s's vault value holds a non-ASCII character at character 3"),
    ],
)
def test_a_value_no_netrc_reader_shares_is_refused_without_showing_it(value, message):
    with pytest.raises(CredentialError) as caught:
        parse_credentials(value, "s")
    assert str(caught.value) == message


# --- read back: Python's netrc (pip, through requests.utils.get_netrc_auth) ------------------------------


@pytest.mark.parametrize(("login", "password"), HOSTILE + _random_credentials(300, seed=4401))
def test_python_netrc_reads_the_pypi_netrc_back(tmp_path, login, password):
    path = tmp_path / "netrc"
    path.write_text(netrc_text("https://pypi.mirror.example:8443/simple", login, password))
    assert netrc.netrc(str(path)).authenticators("pypi.mirror.example") == (login, "", password)


# --- read back: apt and uv against a local server that records what they send --------------------------


class _Recorder(http.server.BaseHTTPRequestHandler):
    """Answers 401 to a request without credentials (uv sends its netrc's only then) and records
    the Basic credentials of every request, decoded."""

    seen: list[tuple[str, str | None]] = []

    def do_GET(self):
        header = self.headers.get("Authorization")
        sent = base64.b64decode(header.split(" ", 1)[1]).decode() if header else None
        _Recorder.seen.append((self.path, sent))
        if sent is None:
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="mirror"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = b"<html><body></body></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def _apt_sends(auth_conf: Path, url: str, tmp_path: Path) -> str | None:
    """What apt's own downloader sends for url with auth_conf as its only auth.conf (the real
    parser: apt-pkg/contrib/netrc.cc, MaybeAddAuth, in the apt this machine has)."""
    _Recorder.seen.clear()
    empty = tmp_path / "auth.conf.d"
    empty.mkdir(exist_ok=True)
    subprocess.run(
        [
            APT_HELPER,
            "-o",
            f"Dir::Etc::netrc={auth_conf}",
            "-o",
            f"Dir::Etc::netrcparts={empty}",
            "download-file",
            url,
            str(tmp_path / "download"),
        ],
        capture_output=True,
        timeout=30,
        check=False,
    )
    return _Recorder.seen[-1][1] if _Recorder.seen else None


needs_apt = pytest.mark.skipif(not os.access(APT_HELPER, os.X_OK), reason="apt's helper is Debian's and Ubuntu's")


@needs_apt
@pytest.mark.parametrize(("login", "password"), HOSTILE + _random_credentials(40, seed=4402))
def test_apt_reads_the_cuda_auth_file_back(server, tmp_path, login, password):
    auth_conf = tmp_path / "inference-host-cuda.conf"
    auth_conf.write_text(apt_auth_text(f"{server}/nvidia/cuda/repos", login, password))
    sent = _apt_sends(auth_conf, f"{server}/nvidia/cuda/repos/ubuntu2404/x86_64/cuda-keyring_1.1-1_all.deb", tmp_path)
    assert sent == f"{login}:{password}"


@needs_apt
def test_apt_sends_the_login_to_the_mirror_s_repositories_only(server, tmp_path):
    auth_conf = tmp_path / "inference-host-cuda.conf"
    auth_conf.write_text(apt_auth_text(f"{server}/nvidia/cuda/repos/", "user", "pw"))
    assert _apt_sends(auth_conf, f"{server}/nvidia/cuda/repos/debian12/x86_64/Release", tmp_path) == "user:pw"
    assert _apt_sends(auth_conf, f"{server}/nvidia/cuda/other/Release", tmp_path) is None
    assert _apt_sends(auth_conf, f"{server}/nvidia/cuda/repository/Release", tmp_path) is None


def test_the_cuda_entry_names_its_protocol_and_path():
    """Without a protocol apt uses an entry for https only, with one it uses it for that protocol
    only (apt_auth.conf(5)): the entry names both, and the repository's path."""
    assert apt_auth_text("https://mirror.example:8443/nvidia/cuda/repos", "u", "p") == (
        "machine https://mirror.example:8443/nvidia/cuda/repos/ login u password p\n"
    )


@pytest.mark.skipif(shutil.which("uv") is None, reason="uv runs these tests")
@pytest.mark.parametrize(("login", "password"), HOSTILE[:3] + HOSTILE[6:8])
def test_uv_reads_the_pypi_netrc_back(server, tmp_path, login, password):
    path = tmp_path / "netrc"
    path.write_text(netrc_text(f"{server}/simple", login, password))
    path.chmod(0o600)
    _Recorder.seen.clear()
    subprocess.run(
        [shutil.which("uv"), "pip", "compile", "--no-config", "--index-url", f"{server}/simple", "-"],
        input="inference-host-probe\n",
        env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), "NETRC": str(path), "UV_NO_CACHE": "1"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ("/simple/inference-host-probe/", f"{login}:{password}") in _Recorder.seen, _Recorder.seen


def test_the_wheel_build_s_fetch_reads_the_netrc_secret_back(tmp_path, monkeypatch):
    """fetch_source.py (run inside the build, where the BuildKit secret is mounted) sends the
    login to the index's host over https, and to nothing else."""
    spec = importlib.util.spec_from_file_location(
        "fetch_source", PROJECT_ROOT / "roles" / "wheels" / "docker" / "wheels" / "fetch_source.py"
    )
    fetch = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fetch)
    path = tmp_path / "pypi-netrc"
    path.write_text(netrc_text("https://pypi.mirror.example/simple", "u'1", "p'w`id`;|&"))
    monkeypatch.setenv("NETRC", str(path))
    header = fetch.authorization("https://pypi.mirror.example/pypi/flash-attn/2.8.3/json")["Authorization"]
    assert base64.b64decode(header.removeprefix("Basic ")).decode() == "u'1:p'w`id`;|&"
    assert fetch.authorization("http://pypi.mirror.example/pypi/x/1/json") == {}
    assert fetch.authorization("https://files.elsewhere.example/x.tar.gz") == {}
    monkeypatch.setenv("NETRC", str(tmp_path / "absent"))  # no secret mounted: no header
    assert fetch.authorization("https://pypi.mirror.example/pypi/x/1/json") == {}


@pytest.mark.parametrize("dockerfile", ["flash-attn.Dockerfile", "sgl-kernel.Dockerfile"])
def test_the_builds_take_the_login_as_a_secret_mount_never_a_build_argument(dockerfile):
    text = (PROJECT_ROOT / "roles" / "wheels" / "docker" / dockerfile).read_text()
    steps = [step for step in text.split("\nRUN ")[1:] if "pip install" in step or "fetch_source.py" in step]
    assert steps and all(f"--mount=type=secret,id={mirror_auth.BUILD_SECRET_ID}" in s for s in steps)
    assert f"NETRC=/run/secrets/{mirror_auth.BUILD_SECRET_ID}" in text
    assert "ARG PIP_INDEX_URL" in text and "NETRC" not in "".join(
        line for line in text.splitlines() if line.startswith("ARG ")
    )


# --- the plan: only the 0600 upload carries them ------------------------------------------------------------

HOST = "@fake/gpu-mirrors"
PLAN_INVENTORY = PROJECT_ROOT / "tests/unit/plans/inventory_mirror_credentials.py"


def _inventory_constant(name: str) -> str:
    """A constant of the plan inventory, read without running it (it sets up a vault and the
    vault password's variable for the pyinfra process it is written for)."""
    tree = ast.parse(PLAN_INVENTORY.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and [t.id for t in node.targets if isinstance(t, ast.Name)] == [name]:
            return ast.literal_eval(node.value)
    raise KeyError(name)


plan_inventory = SimpleNamespace(
    CUDA_LOGIN=_inventory_constant("CUDA_LOGIN"), PYPI_LOGIN=_inventory_constant("PYPI_LOGIN")
)
UPLOAD_DIR = "/var/lib/inference-host/upload"


@cache
def mirrors_plan() -> Plan:
    return plan("inventory_mirror_credentials.py", HOST)


def _passwords() -> list[str]:
    return [value.split(":", 1)[1] for value in (plan_inventory.CUDA_LOGIN, plan_inventory.PYPI_LOGIN)]


def leaks(p: Plan, secrets: list[str]) -> list[str]:
    """Where a secret is outside the 0600 upload: a command line, an exported variable, a plain file."""
    found = []
    for secret in secrets:
        found += [f"command: {c[:80]}" for c in p.commands if secret in c]
        found += [f"env of: {c[:80]}" for c, env in p.environments if secret in json.dumps(env)]
        found += [
            f"upload: {path}" for path, text in p.uploads.items() if secret in str(text) and UPLOAD_DIR not in path
        ]
    return found


def test_no_login_reaches_a_command_line_an_environment_or_a_plain_file():
    p = mirrors_plan()
    assert len(p.commands) > 50  # the whole gpu node was planned: base, driver, cuda, wheels, engines
    assert leaks(p, _passwords()) == []


@pytest.mark.parametrize("where", ["command", "env", "upload"])
def test_the_leak_check_finds_a_login_planted_anywhere(where):
    """The check above can fail: the old ways, the credential in the mirror's URL of a build
    argument, of an exported UV_INDEX_URL, of a 0644 pip.conf."""
    p = mirrors_plan()
    url = "https://pypi-user:" + _passwords()[1] + "@pypi.mirror.example/simple"
    planted = Plan([], "")
    planted.commands = [*p.commands, f"build_wheel.py --build-arg PIP_INDEX_URL={url}" if where == "command" else ""]
    planted.environments = [*p.environments, ("uv pip sync", {"UV_INDEX_URL": url} if where == "env" else {})]
    planted.uploads = {**p.uploads, "/etc/pip.conf": f"[global]\nindex-url = {url}\n" if where == "upload" else ""}
    (found,) = leaks(planted, _passwords())
    assert found.startswith(
        {"command": "command: build_wheel.py", "env": "env of: uv pip sync", "upload": "upload: /etc/pip.conf"}[where]
    )


def test_each_login_is_installed_0600_root_and_read_back():
    p = mirrors_plan()
    staged = {text for path, text in p.uploads.items() if path.startswith(UPLOAD_DIR)}
    cuda_login, cuda_password = plan_inventory.CUDA_LOGIN.split(":", 1)
    pypi_login, pypi_password = plan_inventory.PYPI_LOGIN.split(":", 1)
    assert (
        apt_auth_text("https://mirror.example:8443/nvidia/cuda/repos", cuda_login, cuda_password) in staged
        and netrc_text("https://pypi.mirror.example/simple", pypi_login, pypi_password) in staged
    )
    for dest in (mirror_auth.CUDA_AUTH_FILE, mirror_auth.PYPI_NETRC):
        new = f"{dest}.inference-host-new"
        # root's writer (the folders are root's alone): 0600 root:root beside dest, then renamed
        copy = f"install -m 0600 --owner=root --group=root -T -- {UPLOAD_DIR}/"
        assert any(copy in c and f"{new} && mv -f -T -- {new} {dest};" in c for c in p.commands), dest


def test_apt_source_and_key_download_carry_no_login():
    p = mirrors_plan()
    base = "https://mirror.example:8443/nvidia/cuda/repos/ubuntu2404/x86_64/"
    assert p.uploads["/etc/apt/sources.list.d/cuda-ubuntu2404-x86_64.list"] == (
        f"deb [signed-by=/etc/apt/keyrings/nvidia-cuda.asc] {base} /\n"
    )
    (download,) = [c for c in p.commands if "3bf863cc.pub" in c and "download-file" in c]
    assert f"timeout 600 /usr/lib/apt/apt-helper download-file {base}3bf863cc.pub " in download
    assert not any(c.startswith("curl") and "mirror.example" in c for c in p.commands)
    # apt's file is in place before the download that reads it
    auth = next(i for i, c in enumerate(p.commands) if f" {mirror_auth.CUDA_AUTH_FILE};" in c)
    assert auth < p.commands.index(download)


def test_uv_and_pip_find_the_login_through_netrc_written_first():
    p = mirrors_plan()
    installs = [
        (i, env) for i, (c, env) in enumerate(p.environments) if "UV_INDEX_URL" in env or "PIP_INDEX_URL" in env
    ]
    assert len(installs) >= 3  # uv through pip, cuobjdump through pip, the engines through uv
    assert all(env["NETRC"] == mirror_auth.PYPI_NETRC for _, env in installs)
    assert all(
        env.get("UV_INDEX_URL", env.get("PIP_INDEX_URL")) == "https://pypi.mirror.example/simple" for _, env in installs
    )
    written = next(
        i
        for i, c in enumerate(p.commands)
        if f"mv -f -T -- {mirror_auth.PYPI_NETRC}.inference-host-new {mirror_auth.PYPI_NETRC};" in c
    )
    first_use = p.commands.index(p.environments[installs[0][0]][0])
    assert written < first_use


def test_the_wheel_build_gets_the_netrc_as_a_buildkit_secret():
    p = mirrors_plan()
    (build,) = [c for c in p.commands if "/build_wheel.py --package flash-attn" in c]
    assert f"--secret id=pypi-netrc,src={mirror_auth.PYPI_NETRC}" in build
    assert "--build-arg PIP_INDEX_URL=https://pypi.mirror.example/simple " in build


def test_the_preview_shows_both_files_with_the_logins_masked(tmp_path):
    # In its own process: the inventory sets up a vault and its password's variable for the
    # process that loads it, and pyinfra's CLI patches the process with gevent.
    subprocess.run(
        [sys.executable, "-m", "roles.render", str(PLAN_INVENTORY), "--out", str(tmp_path)],
        cwd=PROJECT_ROOT,
        check=True,
        capture_output=True,
        timeout=120,
    )
    host = tmp_path / HOST
    assert (host / mirror_auth.CUDA_AUTH_FILE.lstrip("/")).read_text() == (
        "machine https://mirror.example:8443/nvidia/cuda/repos/ login *** password ***\n"
    )
    assert (
        host / mirror_auth.PYPI_NETRC.lstrip("/")
    ).read_text() == "machine pypi.mirror.example login *** password ***\n"
    written = "".join(p.read_text(errors="replace") for p in tmp_path.rglob("*") if p.is_file())
    assert not [secret for secret in _passwords() if secret in written]
    assert not [login for login in ("cuda-user", "pypi-user") if login in written]
