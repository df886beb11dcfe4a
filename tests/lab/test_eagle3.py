"""EAGLE-3 in the lab: a deploy with a drafter configured on the 0.5.10 stack renders and validates
the speculative flags, the stand-in server exports the accept length and the health checks judge
it; the training job's environment, source checkout and units are laid down and never started;
its dry run prints the plan with the disk budget; a second deploy changes nothing; the steps run
under systemd: regenerate for real against the served (stand-in) target, hidden states and
training with the stand-in SpecForge scripts (they need a GPU), export for real, and the exported
drafter is then served. The job runs as its own user: what needs root it asks of its root helper
(inference-host-eagle3-engine@<verb>), which polkit opens to that user for the fixed verbs only;
the A/B step serves its baseline through it and restores the engine."""

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
JOB_USER = "inference-host-eagle3"  # roles/eagle3_training/privileges.py
HELPER = "inference-host-eagle3-engine"
DROPIN = "/etc/systemd/system/inference-engine.service.d"


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


def _as_job(gpu_guest, command: str):
    """A command as the job's user, as its unit's processes are (the bus sees that user's uid)."""
    return gpu_guest.run(f"runuser -u {JOB_USER} -- {command}")


def test_the_job_runs_as_its_own_user_with_its_own_key(gpu_guest, first):
    show = _sh(gpu_guest, "systemctl show -p User,NoNewPrivileges,ProtectSystem inference-host-eagle3@train.service")
    assert sorted(show.split()) == ["NoNewPrivileges=yes", "ProtectSystem=strict", f"User={JOB_USER}"], show
    assert gpu_guest.file(WORK).user == JOB_USER
    key = gpu_guest.file("/etc/inference-host/eagle3/api-key.json")  # the client key alone
    assert (key.user, key.mode) == (JOB_USER, 0o600)
    engine_config = "/etc/inference-host/engine/inference-engine-secret-args.yaml"  # admin key too
    assert gpu_guest.file(engine_config).exists and _as_job(gpu_guest, f"cat {engine_config}").rc != 0
    journal = _sh(gpu_guest, "journalctl -u inference-host-eagle3@regenerate --no-pager")
    assert "regenerate: done" in journal  # it sent that key: the lab's engine has one
    refused = gpu_guest.run("inference-host-eagle3 run train")
    assert refused.rc == 2 and "refused as root" in refused.stderr, refused.stderr


def test_only_the_helpers_fixed_verbs_are_open_to_the_job(gpu_guest, first):
    for command in (
        "systemctl stop inference-engine.service",
        "systemctl restart inference-engine.service",
        f"systemctl start {HELPER}@bogus.service",
        f"systemctl restart {HELPER}@stop.service",
        "systemctl daemon-reload",
    ):
        result = _as_job(gpu_guest, command)
        assert result.rc != 0, command
        assert "Access denied" in result.stderr or "authentication required" in result.stderr, (command, result.stderr)
    assert gpu_guest.run("systemctl is-active inference-engine").stdout.strip() == "active"
    # Root may start any instance; the helper itself refuses a verb outside its set.
    assert gpu_guest.run(f"systemctl start {HELPER}@bogus.service").rc != 0
    journal = _sh(gpu_guest, f"journalctl -u {HELPER}@bogus --no-pager")
    assert "refused: 'bogus' is not one of stop, baseline, candidate, restore, publish" in journal, journal


def test_ab_goes_through_the_root_helper_and_restores_the_engine(gpu_guest, first):
    """The A/B step as the job's user: the helper serves the baseline (the export is the drafter
    served now and replaced none: speculative decoding off), bench_serving then fails (sglang
    imports numpy, which the lab's no-GPU engine environment has not), and the engine is
    restored as deployed whatever happened. The candidate verb, started as the job's user, serves
    the export through the drop-in; restore removes it."""
    deployed = _launcher(gpu_guest)
    result = gpu_guest.run("systemctl start inference-host-eagle3@ab.service")
    log = _sh(gpu_guest, f"cat {WORK}/logs/ab.log")
    assert result.rc != 0 and "ab: FAILED" in log, log
    assert f"systemctl start -- {HELPER}@baseline.service" in log and f"{HELPER}@restore.service" in log, log
    assert "sglang.bench_serving" in log  # the baseline was served and answered /health first
    baseline = _sh(gpu_guest, f"journalctl -u {HELPER}@baseline --no-pager")
    assert "serving inference-engine.service with speculative decoding off" in baseline, baseline
    assert not gpu_guest.file(f"{DROPIN}/90-inference-host-eagle3-ab.conf").exists
    assert gpu_guest.run("systemctl is-active inference-engine").stdout.strip() == "active"
    assert _launcher(gpu_guest) == deployed
    assert _as_job(gpu_guest, f"systemctl start {HELPER}@candidate.service").rc == 0
    launch = _sh(gpu_guest, f"cat {DROPIN}/eagle3-ab-launch")
    assert f"--speculative-draft-model-path {EXPORT}" in launch, launch
    assert "eagle3-ab-launch" in _sh(gpu_guest, "systemctl show -p ExecStart --value inference-engine")
    assert _as_job(gpu_guest, f"systemctl start {HELPER}@restore.service").rc == 0
    assert not gpu_guest.file(f"{DROPIN}/eagle3-ab-launch").exists
    assert "eagle3-ab-launch" not in _sh(gpu_guest, "systemctl show -p ExecStart --value inference-engine")
    # A failed unit stays loaded: a later session on these containers (INFERENCE_HOST_LAB_REUSE=1)
    # would find the step "ran" before its deploy.
    _sh(gpu_guest, "systemctl reset-failed 'inference-host-eagle3*'")


def test_the_standin_checkout_is_the_pinned_commit(gpu_guest, first, eagle3_env):
    commit = eagle3_env["EAGLE3_LAB_SPECFORGE_COMMIT"]
    assert _sh(gpu_guest, f"git -C /opt/inference-host/specforge/{commit} rev-parse HEAD").strip() == commit
