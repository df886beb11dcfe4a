"""SGLang's own start-up checks on the command lines the project renders, in each SGLang stack's
real environment: every package of its committed lock installed exactly (torch, the CUDA
libraries, cuDNN, the kernel packages: they import without a GPU), the project's patch queue
applied, and roles/serving/files/engine_preflight.py run in it, the program the deploy runs on
the host before a switch (roles/serving/preflight.py builds and caches the environments).

What stands in for the target, and nothing else (each is named where it is made):
1. the GPUs' answers, from the inventory: torch.cuda's availability, count, name, capability
   and memory, and `nvidia-smi --query-gpu` (engine_preflight.py --answer-gpus);
2. the driver's libcuda.so.1, which the kernel packages link: a library of the functions they
   name, each returning CUDA_ERROR_NO_DEVICE (none is called before a weight loads);
3. the model folder: Kimi-K2.5's config.json (tests/unit/data/eagle3) without its `auto_map`,
   because the repository's remote configuration code is not in the project: SGLang replaces
   that class by its own registered KimiK25Config anyway (srt/utils/hf_transformers_utils.py
   get_config, `config.model_type in _CONFIG_REGISTRY`), which is what loads here;
4. the API key: a placeholder in the --config file.
The CUDA, cuDNN and torch versions are the lock's own, read by torch from the installed libraries.

One engine process per stack checks all of that stack's renders (an import costs ~30 s). The
first run installs each stack (~4-10 GB through uv's cache; about 100 s for 0.5.9 with an empty
cache here); later runs reuse ~/.cache/inference-host/preflight-envs.
"""

from __future__ import annotations

import json
import os
import re
import shutil

import pytest

from roles.serving import preflight
from roles.shared import kv_cache
from roles.site import load_site, load_stack
from roles.site import lock as stack_lock
from tests.lab.harness import PROJECT_ROOT, REQUIRE_LAB_ENV
from tests.unit.conftest import InventoryFactory, gpu_node
from validation import ROLE_CHECKS  # the checks the inventories' hook runs

pytestmark = pytest.mark.lab

DATA = PROJECT_ROOT / "tests" / "unit" / "data" / "eagle3"
PROD = load_site(PROJECT_ROOT / "inventory" / "prod.py")
SGLANG_STACKS = [s for s in PROD.stack.stacks.values() if s.engine == "sglang"]
TP = {"gpu_count": 8, "serving_topology": "tensor_parallel", "nccl_ib_disable": True, "nccl_socket_ifname": "ens1f0"}
DRAFTER = {
    "draft_model_path": "/models/Kimi-K2.5-eagle3",
    "draft_config": "drafter.json",
    "target_config": "target.json",
}


@pytest.fixture(scope="module")
def python312():
    found = preflight.find_python("3.12")
    if not os.path.isabs(found):
        message = (
            "the engine preflight needs a CPython 3.12 (the stacks' Python) to install the locks:"
            " set INFERENCE_HOST_PREFLIGHT_PYTHON"
        )
        if os.environ.get(REQUIRE_LAB_ENV) == "1":
            pytest.fail(message)
        pytest.skip(message)
    return found


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    """Substitute 3: the model's config.json without auto_map; the drafter's config as is."""
    root = tmp_path_factory.mktemp("models")
    config = json.loads((DATA / "kimi-k2.5-config.json").read_text())
    config.pop("auto_map")
    config["text_config"].pop("auto_map", None)
    (root / "Kimi-K2.5").mkdir()
    (root / "Kimi-K2.5" / "config.json").write_text(json.dumps(config, indent=1))
    (root / "Kimi-K2.5-eagle3").mkdir()
    shutil.copy(DATA / "torchspec-kimi-k25-eagle3.json", root / "Kimi-K2.5-eagle3" / "config.json")
    return root / "Kimi-K2.5", root / "Kimi-K2.5-eagle3"


def _factory(tmp_path_factory, name: str) -> InventoryFactory:
    return InventoryFactory(tmp_path_factory.mktemp(name))


def _two_nodes(tmp_path_factory, active: str):
    inventory = _factory(tmp_path_factory, f"tp-{active}")
    inventory.edit_stack("active: sglang-0.5.9-cu128", f"active: {active}")
    site = load_site(
        inventory.groups(
            gpu_nodes=[("node-a", {**TP, "ssh_hostname": "10.0.0.11"}), ("node-b", {**TP, "ssh_hostname": "10.0.0.12"})]
        ),
        ROLE_CHECKS,
    )
    return [(f"two nodes, rank {rank}", site, site.hosts[name]) for rank, name in enumerate(("node-a", "node-b"))]


def _eagle3(tmp_path_factory, **extra):
    inventory = _factory(tmp_path_factory, "eagle3")
    shutil.copy(DATA / "kimi-k2.5-config.json", inventory.dir / "target.json")
    shutil.copy(DATA / "torchspec-kimi-k25-eagle3.json", inventory.dir / "drafter.json")
    inventory.edit_stack("active: sglang-0.5.9-cu128", "active: sglang-0.5.10-cu128")
    # 256 tokens: with the drafter, the model's 262144 do not fit the KV cache, 64 x 264 do (roles/serving/memory.py).
    site = load_site(
        inventory.groups(gpu_nodes=[gpu_node(serving_speculative=DRAFTER, serving_context_length=256, **extra)]),
        ROLE_CHECKS,
    )
    return site, site.hosts["gpu1"]


def _renders(tmp_path_factory, stack_id: str) -> list[tuple[str, object, object]]:
    """(label, site, host) of every render the project's tests make, for one stack."""
    prod_host = PROD.group("gpu_nodes")[0]
    renders = [("prod", PROD, prod_host), *_two_nodes(tmp_path_factory, stack_id)]
    if stack_id == "sglang-0.5.10-cu128":
        renders.append(("EAGLE-3", *_eagle3(tmp_path_factory)))
        renders.append(
            ("EAGLE-3, max running requests 64", *_eagle3(tmp_path_factory, serving_max_running_requests=64))
        )
        renders.append(("EAGLE-3, 6 draft tokens planted", *_eagle3(tmp_path_factory)))
    return renders


def _plant_draft_tokens(monkeypatch, planted_host) -> None:
    """Planted past the site model (which refuses it, roles/serving/speculative.py): 6 draft
    tokens with topk 1 and 3 steps, which SGLang 0.5.10 replaces by steps + 1 = 4
    (server_args.py _handle_speculative_decoding, with a warning)."""
    render = preflight.render_arguments

    def planted(settings, *args):
        argv = render(settings, *args)
        if settings is planted_host:
            argv[argv.index("--speculative-num-draft-tokens") + 1] = "6"
        return argv

    monkeypatch.setattr(preflight, "render_arguments", planted)


@pytest.fixture(scope="module")
def verdicts(python312, model_dirs, tmp_path_factory):
    found = {}
    patch = pytest.MonkeyPatch()
    for stack in SGLANG_STACKS:
        renders = _renders(tmp_path_factory, stack.id)
        for label, _, host in renders:
            if label == "EAGLE-3, 6 draft tokens planted":
                _plant_draft_tokens(patch, host)
        results = preflight.run_many(stack, [(site, host) for _, site, host in renders], *model_dirs, python=python312)
        for (label, _, _), verdict in zip(renders, results, strict=True):
            found[(stack.id, label)] = verdict
    patch.undo()
    return found


@pytest.mark.parametrize("stack_id", [s.id for s in SGLANG_STACKS])
def test_every_sglang_stack_starts_with_the_prod_render(verdicts, stack_id):
    verdict = verdicts[(stack_id, "prod")]
    assert verdict["ok"], verdict.get("refusal") or verdict["overridden"]
    assert "check_server_args" in verdict["steps"] and verdict["steps"][-2] in ("get_model_config", "model_config_of")
    assert verdict["steps"][-1].startswith("tokenizer, processor and chat template not loaded")  # config files only
    # The release's own model class decided the multimodal question (the cuDNN check's input).
    assert verdict["model"] == {"model_architecture": ["KimiK25ForConditionalGeneration"], "is_multimodal": True}
    assert verdict["resolved"]["tp_size"] == 8 and verdict["resolved"]["api_key"] == "***"
    assert preflight.PLACEHOLDER_KEY not in json.dumps(verdict)
    # The fraction the release itself would choose for the card (the same command line without
    # --mem-fraction-static), as the inventory's own arithmetic has it (roles/shared/kv_cache.py).
    stack = PROD.stack.stacks[stack_id]
    facts = kv_cache.model_facts(json.loads((DATA / "kimi-k2.5-config.json").read_text()))
    reserve = kv_cache.sglang_reserve(stack.sglang, 97887, 8, model=facts)
    own = verdict["engine_default"]["mem_fraction_static"]
    assert own == pytest.approx(kv_cache.sglang_default_fraction(reserve, facts), abs=1e-9)


@pytest.mark.parametrize("stack_id", [s.id for s in SGLANG_STACKS])
def test_both_ranks_of_two_node_tensor_parallel_start(verdicts, stack_id):
    for rank in (0, 1):
        verdict = verdicts[(stack_id, f"two nodes, rank {rank}")]
        assert verdict["ok"], verdict.get("refusal") or verdict["overridden"]
        resolved = verdict["resolved"]
        assert (resolved["tp_size"], resolved["nnodes"], resolved["node_rank"]) == (16, 2, rank)
        assert resolved["dist_init_addr"] == "10.0.0.11:50000"


def test_eagle3_on_0_5_10_caps_running_requests_and_turns_the_overlap_scheduler_off(verdicts):
    verdict = verdicts[("sglang-0.5.10-cu128", "EAGLE-3")]
    assert verdict["ok"], verdict.get("refusal") or verdict["overridden"]
    # The cap SGLang would choose under EAGLE-3 (48) is rendered explicitly (roles/serving), so the
    # engine keeps it; the overlap scheduler it turns off on its own (server_args.py
    # _handle_speculative_decoding), and the preflight prints that.
    assert "max_running_requests" in verdict["given"] and verdict["resolved"]["max_running_requests"] == 48
    assert verdict["chosen"]["disable_overlap_schedule"]["engine"] is True
    assert "sets disable_overlap_schedule = True on its own" in verdict["output"]


def test_an_explicit_value_the_engine_keeps_passes(verdicts):
    """SGLang caps running requests at 48 under EAGLE-3 only when none is given."""
    verdict = verdicts[("sglang-0.5.10-cu128", "EAGLE-3, max running requests 64")]
    assert verdict["ok"], verdict.get("refusal") or verdict["overridden"]
    assert verdict["resolved"]["max_running_requests"] == 64


def test_an_explicit_value_the_engine_would_change_is_refused(verdicts):
    verdict = verdicts[("sglang-0.5.10-cu128", "EAGLE-3, 6 draft tokens planted")]
    assert not verdict["ok"]
    assert verdict["overridden"]["speculative_num_draft_tokens"] == {"given": 6, "engine": 4}
    assert (
        "PREFLIGHT REFUSED: the command line sets speculative_num_draft_tokens = 6, SGLang would run"
        " with 4" in verdict["output"]
    )


def test_0_5_23_switches_piecewise_cuda_graphs_on_for_prefill(verdicts):
    """0.5.9 leaves them off; 0.5.23 captures prefill graphs up to 8192 tokens (more graph
    memory and capture time at start), and says so in its log."""
    before = verdicts[("sglang-0.5.9-cu128", "prod")]
    after = verdicts[("sglang-0.5.23-cu130", "prod")]
    assert before["resolved"]["enable_piecewise_cuda_graph"] is False
    assert after["resolved"]["cuda_graph_config.prefill.backend"] == "breakable"
    assert after["resolved"]["cuda_graph_config.prefill.max_bs"] == 8192
    assert "Piecewise CUDA graph is enabled" in after["output"]
    rows = {name: (old, new) for name, old, new in preflight.diff(before, after)}
    assert rows["cuda_graph_config.prefill.max_bs"] == ("(no such setting)", 8192)


def test_the_0_5_9_lock_with_torchs_own_cudnn_pin_is_refused(python312, model_dirs, tmp_path_factory):
    """The refusal that stopped the active stack, reproduced: the same 0.5.9 lock with torch
    2.9.1's own nvidia-cudnn-cu12 pin (9.10.2.21; its entry, hashes and all, from the vLLM
    0.16.0 lock, which resolves the same torch) and no override. The preflight must fail it
    with SGLang's own message; the committed lock (9.16.0.29) passes above."""
    inventory = _factory(tmp_path_factory, "cudnn-9-10")
    text = (PROJECT_ROOT / "inventory/stack.yml").read_text()
    without = re.sub(r"\n    overrides:\n(      .*\n)+", "\n", text, count=1)
    assert without != text
    (inventory.dir / "stack.yml").write_text(without)
    old_entry = _entry(PROD.stack.lock_text("vllm-0.16.0-cu128"), "nvidia-cudnn-cu12")
    from roles.engine_envs.lock import committed_body

    lock_file = PROJECT_ROOT / "inventory" / "locks" / "sglang-0.5.9-cu128.txt"
    body = committed_body(lock_file).replace(_entry(lock_file.read_text(), "nvidia-cudnn-cu12"), old_entry)
    stack = load_stack(inventory.dir / "stack.yml").stacks["sglang-0.5.9-cu128"]
    # Written as the lock command writes a lock: header, body, seal.
    (inventory.dir / "locks" / "sglang-0.5.9-cu128.txt").write_text(
        stack_lock.sealed(stack_lock.header(stack, "stack.yml") + body)
    )
    site = load_site(inventory.groups(gpu_nodes=[gpu_node()]), ROLE_CHECKS)
    assert stack_lock.entries(site.stack.lock_text(stack.id))["nvidia-cudnn-cu12"] == "9.10.2.21"
    verdict = preflight.run(site, site.hosts["gpu1"], site.stack.active, *model_dirs, python=python312)
    assert not verdict["ok"]
    assert "PyTorch 2.9.1 & CuDNN Compatibility Issue Detected" in verdict["refusal"]
    assert "CuDNN 9.10" in verdict["refusal"] and "check_torch_2_9_1_cudnn_compatibility" in verdict["refusal"]


def _entry(lock: str, name: str) -> str:
    """One package's block of a lock: its `name==version \\` line through its `# via` lines."""
    match = re.search(rf"^{re.escape(name)}==.*?(?=^[A-Za-z0-9])", lock, re.M | re.S)
    assert match, name
    return match.group(0)
