"""roles/engine_envs's environments in the lab: installed exactly from the committed lock (the lab's
no-gpu-deps mode: every locked package that exists without a GPU, hash-checked; its freeze is
exactly that part of the lock, names and versions), byte-compiled and readable by the service
user, rebuilt beside the live one, a failed install leaving the live one serving, a stale lock
refused before any host is contacted, old environments pruned."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from roles.shared.engine_env import env_dir
from roles.site import load_site
from roles.site import lock as stack_lock
from tests.lab.harness import LAB_INVENTORY, PROJECT_ROOT, run_deploy

pytestmark = pytest.mark.lab

SITE = load_site(LAB_INVENTORY)
HOST = SITE.group("gpu_nodes")[0]
STACK = SITE.stack.active
ROOT = HOST.base.install_root
LIVE = env_dir(HOST, STACK, SITE)
UV = "/usr/local/bin/uv"


def _inventory(tmp_path: Path, edit=None, lock_edit=None) -> Path:
    """inventory/lab.py with a copy of the stack file and its locks, edited as a user would."""
    folder = tmp_path / "inventory"
    shutil.copytree(PROJECT_ROOT / "inventory/locks", folder / "locks")
    shutil.copy(LAB_INVENTORY, folder / "lab.py")
    text = (PROJECT_ROOT / "inventory/stack.yml").read_text()
    (folder / "stack.yml").write_text(edit(text) if edit else text)
    if lock_edit:
        lock = folder / "locks" / f"{STACK.id}.txt"
        # Resealed, as if the lock command had written it (a corrupt index, not a hand edit: the
        # seal would refuse that at load, before any host).
        lock.write_text(stack_lock.sealed(stack_lock.unsealed(lock_edit(lock.read_text()))))
    return folder / "lab.py"


def _freeze(gpu_guest, env: str) -> str:
    return gpu_guest.check_output(f"{UV} pip freeze --python {env}/bin/python")


def _main_pid(gpu_guest) -> str:
    return gpu_guest.check_output("systemctl show -p MainPID --value inference-engine.service")


def _frozen(text: str) -> dict[str, str]:
    pins = dict(line.split("==", 1) for line in text.splitlines() if "==" in line)
    return {stack_lock.normalize(name): version for name, version in pins.items()}


def test_environment_is_exactly_the_lock(gpu_guest, lab_second_deploy):
    """`uv pip freeze` of the live environment is the lab's part of the committed lock, no more,
    no less, at the lock's versions: what makes two environments from one lock comparable."""
    assert gpu_guest.file(f"{ROOT}/current").linked_to == LIVE
    lock = SITE.stack.lock_text(STACK.id)
    wanted = stack_lock.no_gpu_packages(lock, HOST.sglang.install_leave_out)
    assert gpu_guest.file(f"{LIVE}/inference-host-lock.txt").content_string == stack_lock.select(lock, wanted)
    frozen = _frozen(_freeze(gpu_guest, LIVE))
    locked = stack_lock.entries(lock)
    assert frozen == {name: locked[name] for name in wanted}, (
        f"not in the lock's subset: {sorted(set(frozen) - wanted)}; missing: {sorted(wanted - set(frozen))}"
    )
    # The subset is the lock's CPU side (sglang, transformers, fastapi, ...), not a token of it.
    assert {"sglang", "transformers", "fastapi", "pydantic", "uvicorn"} <= set(frozen)
    assert not any(name == "torch" or name.startswith(("nvidia-cu", "flashinfer", "triton")) for name in frozen)
    assert len(frozen) > 100 and len(locked) > len(frozen)


def test_environment_is_byte_compiled_and_readable_by_the_service_user(gpu_guest, lab_second_deploy):
    site = gpu_guest.check_output(f"echo {LIVE}/lib/python3*/site-packages")
    # <env>/serving holds the release's env file and secret arguments (roles/serving): root-only
    # by design; everything else in the environment is readable.
    unreadable = gpu_guest.check_output(f"find {LIVE} -path {LIVE}/serving -prune -o ! -perm -o=r -print -quit")
    assert unreadable == "", f"not readable by the service user: {unreadable}"
    # A start compiles nothing: every module (the patched ones too) already has a fresh .pyc,
    # so compileall, which only writes stale or missing ones, writes none.
    gpu_guest.check_output("touch /run/ih-compile-mark && sleep 1")
    version = gpu_guest.check_output(
        f"runuser -u {HOST.base.service_user} -- {LIVE}/bin/python -c"
        " 'import importlib.metadata as m; print(m.version(\"sglang\"))'"
    )
    assert version == STACK.sglang
    gpu_guest.check_output(f"{LIVE}/bin/python -m compileall -q {site}/sglang")
    rewritten = gpu_guest.check_output(f"find {site} -name '*.pyc' -newer /run/ih-compile-mark | head -5")
    assert rewritten == "", f"stale or missing bytecode: {rewritten}"


def test_edited_pin_without_a_new_lock_is_refused_before_contact(gpu_guest, lab_second_deploy, tmp_path):
    before = _main_pid(gpu_guest)
    inventory = _inventory(tmp_path, edit=lambda t: t.replace('torch: "2.9.1"', 'torch: "2.9.0"', 1))
    run = run_deploy(inventory)
    text = run.stdout + run.stderr
    assert run.returncode == 2, run.explain()
    assert "no host was contacted" in text and "torch==2.9.0" in text
    assert "uv run python -m roles.engine_envs.lock" in text and "stack.yml" in text
    assert "Connected" not in text and run.results is None
    assert _main_pid(gpu_guest) == before


def test_failed_install_leaves_the_live_environment_serving(gpu_guest, lab_second_deploy, tmp_path):
    """The lock's sglang hash no longer matches the file the index serves (a corrupted lock, or
    an index serving other bytes): the new environment fails to install; nothing live moves."""
    before = _main_pid(gpu_guest)
    wanted = stack_lock.select(SITE.stack.lock_text(STACK.id), {"sglang"})
    digests = [line.split("sha256:")[1][:64] for line in wanted.splitlines() if line.startswith("    --hash=sha256:")]

    def corrupt(text: str) -> str:
        for digest in digests:  # the wheel's and the sdist's: uv accepts a file matching any
            text = text.replace(digest, "0" * 64)
        return text

    inventory = _inventory(tmp_path, lock_edit=corrupt)
    run = run_deploy(inventory)
    try:
        text = run.stdout + run.stderr
        assert run.returncode != 0, "an install with a wrong hash must fail the deploy"
        assert "FAILED to build" in text and "was not touched and still serves" in text, run.explain()
        assert "hash" in text.lower()
        assert gpu_guest.file(f"{ROOT}/current").linked_to == LIVE
        assert _main_pid(gpu_guest) == before
        assert gpu_guest.run(f"curl -sf -o /dev/null http://127.0.0.1:{HOST.serving.port}/health_generate").rc == 0
        assert gpu_guest.check_output(f"ls -d {ROOT}/envs/*.building 2>/dev/null || true") == ""
    except AssertionError:
        run_deploy()  # put the lab back for the next tests (nothing to undo when it passed)
        raise


def test_two_builds_from_one_lock_are_identical_and_old_ones_are_pruned(gpu_guest, lab_second_deploy, tmp_path):
    """A second environment from the same lock, built after the uv cache is emptied (nothing
    shared with the first but the lock), freezes identically; keep_environments bounds the
    folders, never removing the live one."""
    # Another interpreter path to the same Python makes another environment from the same lock.
    inventory = _inventory(tmp_path)
    text = inventory.read_text().replace(
        '"engine_python": "/usr/bin/python3"', '"engine_python": "/usr/bin/python3.11", "engine_keep_environments": 2'
    )
    assert text != inventory.read_text()
    inventory.write_text(text)
    other = dataclasses.replace(HOST, engine=HOST.engine.model_copy(update={"python": "/usr/bin/python3.11"}))
    second = env_dir(other, STACK, SITE)
    assert second != LIVE
    # Emptied, not removed: in the lab the cache folder may be a bind mount of the machine's
    # (lab.LAB_UV_CACHE), whose mount point cannot be removed from inside.
    gpu_guest.check_output(f"find {ROOT}/uv-cache -mindepth 1 -delete")
    try:
        run = run_deploy(inventory)
        assert run.returncode == 0, run.explain()
        assert gpu_guest.file(f"{ROOT}/current").linked_to == second
        assert _freeze(gpu_guest, second) == _freeze(gpu_guest, LIVE)
        names = gpu_guest.check_output(f"ls {ROOT}/envs").split()
        assert sorted(names) == sorted([Path(LIVE).name, Path(second).name]), names
    finally:
        assert run_deploy().returncode == 0
    assert gpu_guest.file(f"{ROOT}/current").linked_to == LIVE
