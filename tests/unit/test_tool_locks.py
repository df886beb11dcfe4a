"""Every download root installs with pip or uv is pinned by content (issue 53, item 1): the
rendered install commands of the deploy's plans all pass --require-hashes with a committed lock;
every committed lock hashes every entry; the builders' Dockerfiles install only from hashed locks;
and pip and uv themselves refuse a wheel whose sha256 is not the lock's (offline, a local wheel)."""

from __future__ import annotations

import base64
import hashlib
import re
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from roles.shared import tool_locks
from roles.shared.tool_locks import PIP_INSTALL_OPTIONS, TOOL_LOCKS
from roles.shared.wheel_plan import NO_TORCH_LOCK, WheelBuild, torch_lock_text
from roles.site import load_site
from roles.site import lock as site_lock
from tests.unit.conftest import PROJECT_ROOT, gpu_node
from tests.unit.test_gpu_stack_plans import STACK, plan
from tests.unit.test_site import assert_names, only_problem

# A pip or uv command that installs packages (not `pip wheel`, `uv pip compile` or `uv pip check`).
INSTALL = re.compile(r"\b(?:pip3? install|uv pip (?:install|sync))\b")
PLANS = [
    ("inventory_pins_ubuntu2404.py", "@fake/gpu-pins"),  # uv, cuobjdump, the weights tool
    ("inventory_ubuntu2404.py", "@fake/gpu-ubuntu2404"),  # uv, the engine environment
    ("inventory_gateway_ubuntu2404.py", "@fake/gw-ubuntu2404"),  # smg
    ("inventory_eagle3_ubuntu2404.py", "@fake/gpu-eagle3"),  # the training job's environment
    ("inventory_monitoring_installed.py", "@fake/gpu-watched"),  # the health checks' environment
]
COMMITTED_LOCKS = sorted(
    [
        *(PROJECT_ROOT / "inventory" / "locks").glob("*.txt"),
        *(PROJECT_ROOT / "tests" / "lab" / "inventories" / "locks").glob("*.txt"),
        *(PROJECT_ROOT / "roles").rglob("*.lock.txt"),
    ]
)


def install_clauses(command: str) -> list[str]:
    """Each install in a shell command, up to the end of its simple command."""
    return [re.split(r" && | \|\| |; |\)", command[m.start() :])[0] for m in INSTALL.finditer(command)]


def lock_argument(clause: str) -> str:
    words = clause.split()
    if clause.startswith("uv pip sync"):
        return words[-1]
    return words[words.index("-r") + 1]


def test_install_clauses_are_cut_at_the_end_of_their_command():
    command = "rm -rf -- /v && /v/bin/pip install --require-hashes -r /l || { rm -rf -- /v; exit 1; }"
    assert install_clauses(command) == ["pip install --require-hashes -r /l"]


@pytest.mark.parametrize(("inventory", "host"), PLANS)
def test_every_install_in_the_plan_requires_hashes_from_an_uploaded_lock(inventory, host):
    p = plan(inventory, host)
    clauses = [clause for command in p.commands for clause in install_clauses(command)]
    assert clauses, f"{inventory}: no install in the plan"
    for clause in clauses:
        if "--no-index" in clause and clause.endswith("/*.whl"):
            # The builder's own wheels (roles/engine_envs), from the wheelhouse: no index is asked.
            continue
        assert "--require-hashes" in clause, clause
        if clause.startswith("pip install") or "/bin/pip install" in clause:
            assert PIP_INSTALL_OPTIONS in clause, clause  # and wheels only: no sdist's build step
        lock = lock_argument(clause)
        assert lock in p.uploads, f"{clause}: {lock} is not written by the deploy"
        text = p.uploads[lock]
        assert site_lock.entries(text) and site_lock.unhashed_entries(text) == [], lock


def test_the_tool_installs_are_each_in_the_plan_from_their_committed_lock():
    p = plan(*PLANS[0])
    committed = {
        "/opt/uv/uv-0.13.9.lock.txt": site_lock.unsealed((PROJECT_ROOT / "inventory/locks/uv-0.13.9.txt").read_text()),
        "/var/lib/inference-host/wheelhouse/.tools/cuobjdump.lock.txt": TOOL_LOCKS["cuobjdump"].text(),
        "/opt/inference-host/weights-env.lock.txt": TOOL_LOCKS["weights-tool"].text(),
    }
    for path, text in committed.items():
        assert p.uploads[path] == text, path
        (install,) = [c for c in p.commands if f" -r {path}" in c]
        assert p.commands.index(install) > 0
    assert STACK.uv == "0.13.9"


@pytest.mark.parametrize("lock", COMMITTED_LOCKS, ids=lambda p: str(p.relative_to(PROJECT_ROOT)))
def test_every_committed_lock_hashes_every_entry(lock):
    text = lock.read_text()
    assert site_lock.entries(text)
    assert site_lock.unhashed_entries(text) == []
    assert re.search(r"--hash=sha256:[0-9a-f]{64}", text)


@pytest.mark.parametrize("name", sorted(TOOL_LOCKS))
def test_the_tool_locks_are_fresh_sealed_and_wheels_only(name):
    lock = TOOL_LOCKS[name]
    assert lock.problem() is None
    assert site_lock.TOOL_TARGET in lock.path.read_text()


def test_the_uv_locks_match_their_stack_files():
    for stack_file in (
        PROJECT_ROOT / "inventory" / "stack.yml",
        PROJECT_ROOT / "tests" / "lab" / "inventories" / "engine_wheels.stack.yml",
    ):
        assert site_lock.stale_uv_lock_problems(stack_file, stack_file.name, "0.13.9") == []


def test_the_pins_the_roles_name_are_the_locked_ones():
    from roles import weights, wheels

    weights_lock = site_lock.entries(TOOL_LOCKS["weights-tool"].text())
    assert weights_lock["huggingface-hub"] == weights.HF_HUB_VERSION
    assert weights_lock["hf-xet"] == weights.HF_XET_VERSION
    name, version = wheels.CUOBJDUMP_PYPI.split("==")
    assert site_lock.entries(TOOL_LOCKS["cuobjdump"].text())[name] == version


def test_an_entry_without_a_hash_is_found():
    text = TOOL_LOCKS["weights-tool"].text()
    planted = re.sub(r"(hf-xet==1\.8\.0) \\\n(    --hash=\S+( \\)?\n)+", r"\1\n", text)
    assert planted != text
    assert site_lock.unhashed_entries(planted) == ["hf-xet==1.8.0"]


def test_a_hand_edited_tool_lock_is_refused_with_the_command_that_remakes_it(tmp_path):
    lock = TOOL_LOCKS["cuobjdump"]
    edited = tmp_path / lock.path.name
    text = lock.path.read_text()
    edited.write_text(re.sub(r"sha256:[0-9a-f]{64}", "sha256:" + "0" * 64, text, count=1))
    problem = site_lock.tool_lock_problem(edited, lock.requirements(), lock.remake)
    assert_names(problem or "", "cuobjdump.lock.txt", "edited after its lock command", lock.remake)
    # made from other requirements
    problem = site_lock.tool_lock_problem(lock.path, ["nvidia-cuda-cuobjdump==13.0.0"], lock.remake)
    assert_names(problem or "", "not made from its current requirements", lock.remake)


def test_a_uv_pin_without_its_lock_stops_the_inventory(inventory):
    inventory.edit_stack('uv: "0.13.9"', 'uv: "0.13.8"')
    message = only_problem(inventory.groups(gpu_nodes=[gpu_node()]))
    assert_names(message, "uv 0.13.8", "no lock uv-0.13.8.txt", "python -m roles.shared.tool_locks --uv")


def test_a_refused_tool_lock_stops_the_deploy_in_one_line(tmp_path, monkeypatch):
    from roles.shared.refusal import Refused

    lock = tool_locks.ToolLock("cuobjdump", tmp_path)
    (tmp_path / "cuobjdump.in").write_text("nvidia-cuda-cuobjdump==13.4.92\n")
    monkeypatch.setattr(tool_locks, "ROLES", tmp_path.parent)
    with pytest.raises(Refused, match=r"no lock cuobjdump\.lock\.txt; make it with `uv run python -m"):
        tool_locks.tool_lock_text(lock)


# --- the builders' Dockerfiles -----------------------------------------------------------------


@pytest.mark.parametrize("dockerfile", sorted((PROJECT_ROOT / "roles" / "wheels" / "docker").glob("*.Dockerfile")))
def test_the_builders_install_only_from_hashed_locks_in_the_context(dockerfile):
    text = dockerfile.read_text().replace("\\\n", " ")
    runs = [line for line in text.splitlines() if line.startswith("RUN ") and INSTALL.search(line)]
    assert runs
    copied = " ".join(line for line in text.splitlines() if line.startswith("COPY "))
    for run in runs:
        for clause in install_clauses(run):
            assert PIP_INSTALL_OPTIONS in clause, clause
            lock = lock_argument(clause)
            assert Path(lock).name in copied, f"{dockerfile.name}: {lock} is not copied from the context"
    assert "wheels/build-tools.lock.txt" in copied and "torch.lock.txt" in copied


def test_the_build_image_gets_torch_and_what_it_requires_from_the_stack_lock():
    stack_lock = STACK.lock_text(STACK.active.id)
    wheel = WheelBuild(
        "flash-attn", "2.8.3", Path("x"), "pypi", None, (), {"TORCH_VERSION": STACK.active.torch}, {}, "k"
    )
    text = torch_lock_text(wheel, stack_lock)
    locked = site_lock.entries(text)
    assert locked["torch"] == STACK.active.torch and "triton" in locked and "nvidia-nccl-cu12" in locked
    assert "sglang" not in locked and site_lock.unhashed_entries(text) == []
    none = WheelBuild("flash-attn", "2.8.3", Path("x"), "pypi", None, (), {"TORCH_VERSION": ""}, {}, "k")
    assert torch_lock_text(none, stack_lock) == NO_TORCH_LOCK


# --- pip and uv refuse a file whose hash is not the lock's (offline: a wheel made here) -----------


def _wheel(folder: Path) -> Path:
    """A minimal valid wheel of one module (PEP 427: METADATA, WHEEL, RECORD)."""
    path = folder / "ihp_probe-1.0-py3-none-any.whl"
    files = {
        "ihp_probe.py": b"VALUE = 1\n",
        "ihp_probe-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: ihp-probe\nVersion: 1.0\n",
        "ihp_probe-1.0.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append("ihp_probe-1.0.dist-info/RECORD,,")
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
        archive.writestr("ihp_probe-1.0.dist-info/RECORD", "\n".join(record) + "\n")
    return path


def _bundled_pip() -> Path:
    """The pip wheel the interpreter's ensurepip carries (what `python3 -m venv` installs), run
    from the wheel itself (pip supports `python pip.whl/pip`)."""
    found = sorted(Path(sysconfig.get_paths()["stdlib"], "ensurepip", "_bundled").glob("pip-*.whl"))
    assert found, "no bundled pip wheel in this interpreter's ensurepip"
    return found[-1]


@pytest.fixture
def probe(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    wheel = _wheel(wheels)
    return wheels, hashlib.sha256(wheel.read_bytes()).hexdigest()


def _pip(tmp_path: Path, wheels: Path, requirement: str) -> subprocess.CompletedProcess:
    lock = tmp_path / "lock.txt"
    lock.write_text(requirement)
    command = [sys.executable, f"{_bundled_pip()}/pip", "install", "--quiet", "--no-index", "--find-links", str(wheels)]
    command += [*PIP_INSTALL_OPTIONS.split(), "--target", str(tmp_path / "target"), "-r", str(lock)]
    env = {"PATH": "/usr/bin:/bin", "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_CACHE_DIR": "1"}
    return subprocess.run(command, capture_output=True, text=True, timeout=120, env=env, check=False)


def test_pip_installs_the_wheel_whose_hash_the_lock_has(tmp_path, probe):
    wheels, sha = probe
    done = _pip(tmp_path, wheels, f"ihp-probe==1.0 --hash=sha256:{sha}\n")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "target" / "ihp_probe.py").is_file()


def test_pip_refuses_a_wheel_whose_hash_the_lock_has_not(tmp_path, probe):
    wheels, sha = probe
    wrong = ("0" if sha[0] != "0" else "1") + sha[1:]
    done = _pip(tmp_path, wheels, f"ihp-probe==1.0 --hash=sha256:{wrong}\n")
    assert done.returncode != 0
    assert "DO NOT MATCH THE HASHES" in done.stderr and sha in done.stderr
    assert not (tmp_path / "target" / "ihp_probe.py").exists()


def test_pip_refuses_an_entry_without_a_hash(tmp_path, probe):
    wheels, _ = probe
    done = _pip(tmp_path, wheels, "ihp-probe==1.0\n")
    assert done.returncode != 0 and "Hashes are required in --require-hashes mode" in done.stderr


def test_uv_refuses_a_wheel_whose_hash_the_lock_has_not(tmp_path, probe):
    from roles.shared.lock_compile import uv_binary

    wheels, sha = probe
    wrong = ("0" if sha[0] != "0" else "1") + sha[1:]
    lock = tmp_path / "lock.txt"
    lock.write_text(f"ihp-probe==1.0 --hash=sha256:{wrong}\n")
    command = [uv_binary(), "pip", "install", "--require-hashes", "--no-index", "--find-links", str(wheels)]
    command += ["--no-cache", "--python", sys.executable, "--target", str(tmp_path / "target"), "-r", str(lock)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode != 0 and "Hash mismatch" in done.stderr and sha in done.stderr, done.stderr
    assert not (tmp_path / "target" / "ihp_probe.py").exists()
    lock.write_text(f"ihp-probe==1.0 --hash=sha256:{sha}\n")
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr


def test_load_site_of_the_lab_inventory_is_unaffected():
    # The lab's inventory uses the stack file beside it: its uv lock is committed.
    assert load_site(PROJECT_ROOT / "inventory" / "lab.py").stack.uv == STACK.uv
