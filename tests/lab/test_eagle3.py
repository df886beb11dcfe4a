"""EAGLE-3 in the lab: a deploy with a drafter configured on the 0.5.10 stack renders and validates
the speculative flags, the stand-in server exports the accept length and the health checks judge
it; the training job's environment, source checkout and units are laid down and never started;
its dry run prints the plan with the disk budget; a second deploy changes nothing; the steps run
under systemd: regenerate for real against the served (stand-in) target, hidden states and
training with the stand-in SpecForge scripts (they need a GPU), export for real, and the exported
drafter is then served."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest

import lab
from roles.site import load_site
from roles.site import lock as stack_lock
from tests.lab.harness import LAB_INVENTORY, PROJECT_ROOT, run_deploy

pytestmark = pytest.mark.lab

INVENTORY = PROJECT_ROOT / "tests" / "lab" / "inventories" / "eagle3.py"
DATA = PROJECT_ROOT / "tests" / "lab" / "data" / "eagle3"
STANDIN = PROJECT_ROOT / "lab" / "standins" / "specforge"
ENV_PREFIX = "/opt/inference-host/envs/sglang-0.5.10-cu128"  # <stack>-<lock stamp> (roles/engine_envs)
JOB_ENV = "/opt/inference-host/eagle3-env/current"  # -> <lock>-<mode>-<stamp> (roles/eagle3_training)
WORK = "/srv/eagle3/work"
MODELS = "/srv/eagle3-models"
LAB_HOST = load_site(LAB_INVENTORY).group("gpu_nodes")[0]
EXPORT = f"{MODELS}/tiny-kimi-eagle3-trained"


def _docker_cp(source: Path, dest: str) -> None:
    subprocess.run(["docker", "cp", str(source), f"{lab.container_name('gpu')}:{dest}"], check=True)


def _sh(gpu_guest, command: str) -> str:
    result = gpu_guest.run(command)
    assert result.rc == 0, f"{command}: rc {result.rc}\n{result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.fixture(scope="module")
def eagle3_env(gpu_guest, lab_second_deploy, tmp_path_factory):
    """The guest gets what weights and a SpecForge clone would give it; the control machine a
    stack file whose active stack is sglang-0.5.10-cu128 (the user's edit)."""
    # The guest's /models is the node's read-only model storage (roles/weights): the Kimi-shaped
    # configs go to a folder of the guest's own.
    _sh(gpu_guest, f"rm -rf /srv/eagle3 {MODELS} && mkdir -p /srv/eagle3 {MODELS}/tiny-kimi {MODELS}/tiny-kimi-eagle3")
    _docker_cp(DATA / "tiny-kimi-config.json", f"{MODELS}/tiny-kimi/config.json")
    _docker_cp(DATA / "tiny-kimi-eagle3.json", f"{MODELS}/tiny-kimi-eagle3/config.json")
    _docker_cp(DATA / "prompts.jsonl", "/srv/eagle3/prompts.jsonl")
    _docker_cp(STANDIN, "/srv/eagle3/specforge-src")
    commit = _sh(
        gpu_guest,
        (
            "cd /srv/eagle3 && git init -q specforge.git && cp -r specforge-src/. specforge.git/"
            " && cd specforge.git && git config uploadpack.allowAnySHA1InWant true && git add -A"
            " && GIT_AUTHOR_DATE=2026-06-28T00:00:00Z GIT_COMMITTER_DATE=2026-06-28T00:00:00Z"
            " git -c user.name=lab -c user.email=lab@localhost commit -qm stand-in && git rev-parse HEAD"
        ),
    ).strip()
    folder = tmp_path_factory.mktemp("eagle3")
    stack = folder / "stack.yml"
    shutil.copytree(PROJECT_ROOT / "inventory" / "locks", folder / "locks")  # the stacks' committed locks
    text = (PROJECT_ROOT / "inventory" / "stack.yml").read_text()
    stack.write_text(text.replace("active: sglang-0.5.9-cu128", "active: sglang-0.5.10-cu128"))
    env = {
        "EAGLE3_LAB_STACK_FILE": str(stack),
        "EAGLE3_LAB_SPECFORGE_REPO": "/srv/eagle3/specforge.git",
        "EAGLE3_LAB_SPECFORGE_COMMIT": commit,
        "EAGLE3_LAB_DATASET_SHA256": hashlib.sha256((DATA / "prompts.jsonl").read_bytes()).hexdigest(),
    }
    yield env
    run_deploy()  # the lab as the other tests know it (0.5.9, no drafter)


@pytest.fixture(scope="module")
def first(eagle3_env):
    run = run_deploy(INVENTORY, env=eagle3_env)
    assert run.returncode == 0, "EAGLE-3 lab deploy failed\n" + run.explain()
    return run


def _launcher(gpu_guest) -> str:
    env = gpu_guest.file("/opt/inference-host/current").linked_to
    assert env.startswith(ENV_PREFIX), env
    return gpu_guest.file(f"{env}/serving/launch").content_string  # roles/serving: per release


def test_deploy_renders_the_speculative_flags_for_0_5_10(gpu_guest, first):
    launcher = _launcher(gpu_guest)
    for part in (
        "--speculative-algorithm EAGLE3",
        f"--speculative-draft-model-path {MODELS}/tiny-kimi-eagle3",
        "--speculative-num-steps 3",
        "--speculative-eagle-topk 1",
        "--speculative-num-draft-tokens 4",
    ):
        assert part in launcher, launcher
    assert "SGLANG_ENABLE_SPEC_V2=0" in _sh(gpu_guest, "cat /opt/inference-host/current/serving/inference-engine.env")


def test_health_judged_the_accept_length(gpu_guest, first):
    text = first.stdout + first.stderr
    assert "accept length from metrics" in text and "accept length since start" in text, first.explain()
    assert "VERDICT: HEALTHY" in text
    log = _sh(gpu_guest, "journalctl -u inference-engine --no-pager -n 200")
    assert "accept len: " in log


def test_job_is_laid_down_and_never_started(gpu_guest, first):
    _sh(gpu_guest, "systemctl cat inference-host-eagle3@train.service >/dev/null")
    for step in ("regenerate", "hidden-states", "train", "export", "ab", "all"):
        state = gpu_guest.run(
            f"systemctl show -p ActiveState,InactiveExitTimestampMonotonic --value inference-host-eagle3@{step}.service"
        ).stdout.split()
        assert state[0] == "inactive" and state[1] == "0", f"{step} ran: {state}"
    assert not gpu_guest.file(f"{WORK}/state").exists
    assert gpu_guest.file(f"{JOB_ENV}/bin/python").exists
    assert "openai" in _sh(gpu_guest, f"{JOB_ENV}/bin/python -c 'import openai, tqdm; print(openai.__name__)'")
    # Installed exactly from SpecForge's hashed lock: the part without a GPU, at the lock's versions.
    # The host gets the lock without its seal line (roles/site/lock.py unsealed).
    lock = stack_lock.unsealed((PROJECT_ROOT / "roles/eagle3_training/files/specforge-82951a9.lock.txt").read_text())
    wanted = stack_lock.no_gpu_packages(lock, LAB_HOST.sglang.install_leave_out)
    frozen = _sh(gpu_guest, f"/usr/local/bin/uv pip freeze --python {JOB_ENV}/bin/python").splitlines()
    locked = stack_lock.entries(lock)
    assert {stack_lock.normalize(n): v for n, v in (line.split("==", 1) for line in frozen)} == {
        name: locked[name] for name in wanted
    }
    assert _sh(gpu_guest, f"cat {JOB_ENV}/inference-host-lock.txt") == stack_lock.select(lock, wanted)
    assert gpu_guest.file("/opt/inference-host/specforge").exists


def test_dry_run_prints_the_plan_with_the_disk_budget(gpu_guest, first):
    out = _sh(gpu_guest, "inference-host-eagle3 plan")
    print(out)
    assert "config ids [1, 3, 4] = capture points [2, 4, 5]" in out
    assert "4 samples x 64 tokens (upper bound) x 528 B/token" in out  # (1 + 3) x 64 x 2 + 16
    assert "verdict: fits" in out and "1. regenerate [pending]" in out


def test_second_deploy_changes_nothing(first, eagle3_env):
    run = run_deploy(INVENTORY, env=eagle3_env)
    assert run.returncode == 0, run.explain()
    assert run.changed == [], run.changed


def test_steps_run_under_systemd_and_the_export_is_served(gpu_guest, first, eagle3_env):
    _sh(gpu_guest, "systemctl start inference-host-eagle3@regenerate.service")
    lines = _sh(gpu_guest, f"cat {WORK}/data/regenerated.jsonl").splitlines()
    assert len(lines) == 4 and all('"status": "success"' in line for line in lines), lines
    _sh(gpu_guest, "systemctl start inference-host-eagle3@regenerate.service")  # done: skipped
    journal = _sh(gpu_guest, "journalctl -u inference-host-eagle3@regenerate --no-pager")
    assert "regenerate: done" in journal and "skipped" in journal
    # GPU steps with the stand-in scripts: the job stops the server, writes, resumes.
    for step in ("hidden-states", "train", "export"):
        _sh(gpu_guest, f"systemctl start inference-host-eagle3@{step}.service")
    assert gpu_guest.run("systemctl is-active inference-engine").stdout.strip() != "active"  # stopped for the GPU steps
    for step in ("hidden-states", "train", "export"):
        assert gpu_guest.file(f"{WORK}/state/{step}.done").exists, step
    assert gpu_guest.file(f"{WORK}/state/ab.done").exists is False  # bench_serving needs the full engine
    assert "export: done" in _sh(gpu_guest, f"cat {WORK}/logs/export.log")
    assert '"eagle_aux_hidden_state_layer_ids": [\n      1,\n      3,\n      4\n    ]' in _sh(
        gpu_guest, f"cat {EXPORT}/config.json"
    )
    # The exported directory is what --speculative-draft-model-path loads: serve it.
    run = run_deploy(INVENTORY, env={**eagle3_env, "EAGLE3_LAB_DRAFTER": EXPORT})
    assert run.returncode == 0, run.explain()
    assert f"--speculative-draft-model-path {EXPORT}" in _launcher(gpu_guest)
    assert gpu_guest.run("systemctl is-active inference-engine").stdout.strip() == "active"


def test_the_standin_checkout_is_the_pinned_commit(gpu_guest, first, eagle3_env):
    commit = eagle3_env["EAGLE3_LAB_SPECFORGE_COMMIT"]
    assert _sh(gpu_guest, f"git -C /opt/inference-host/specforge/{commit} rev-parse HEAD").strip() == commit
