"""EAGLE-3 layer mapping, drafter/target checks and the disk budget, on real config.json files
(tests/unit/data/eagle3/README.md says where each comes from)."""

from __future__ import annotations

import pytest

from roles.shared import eagle3
from tests.unit.conftest import PROJECT_ROOT

DATA = PROJECT_ROOT / "tests" / "unit" / "data" / "eagle3"
KIMI = eagle3.read_config(DATA / "kimi-k2.5-config.json")
TORCHSPEC_DRAFTER = eagle3.read_config(DATA / "torchspec-kimi-k25-eagle3.json")
SPECFORGE_TEMPLATE = eagle3.read_config(DATA / "specforge-deepseek-v3-671b-eagle3.json")


def test_kimi_target_shape_comes_from_its_text_config():
    target = eagle3.Target.from_config(KIMI)
    assert (target.architecture, target.hidden_size, target.num_layers, target.vocab_size) == (
        "KimiK25ForConditionalGeneration",
        7168,
        61,
        163840,
    )
    assert (target.bos_token_id, target.eos_token_id, target.dtype) == (163584, 163585, "bfloat16")


def test_sglang_adds_one_to_config_ids_and_defaults_to_2_30_58_on_kimi():
    assert eagle3.sglang_capture_points([1, 29, 57], 61) == [2, 30, 58]
    assert eagle3.sglang_capture_points(None, 61) == [2, 30, 58]
    assert eagle3.default_config_ids(61) == [1, 29, 57]
    assert eagle3.config_ids_for_points([2, 30, 58]) == [1, 29, 57]


def test_specforge_default_ids_capture_sglang_default_points():
    # SpecForge 82951a9 eagle3_target_model.py: [1, N//2 - 1, N - 4]
    n = 61
    assert eagle3.sglang_capture_points([1, n // 2 - 1, n - 4], n) == eagle3.sglang_default_capture_points(n)


def test_published_kimi_drafter_fits_kimi():
    drafter = eagle3.Drafter.from_config(TORCHSPEC_DRAFTER)
    assert drafter.layer_ids is None  # no eagle_config: SGLang's default points
    assert eagle3.drafter_problems(drafter, eagle3.Target.from_config(KIMI)) == []


def test_deepseek_template_is_refused_on_kimi_for_its_vocabulary():
    problems = eagle3.drafter_problems(eagle3.Drafter.from_config(SPECFORGE_TEMPLATE), eagle3.Target.from_config(KIMI))
    assert len(problems) == 1 and "vocab_size 129280" in problems[0] and "163840" in problems[0]


def test_capture_points_written_as_config_ids_are_refused():
    config = {**TORCHSPEC_DRAFTER, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 30, 58]}}
    problems = eagle3.drafter_problems(eagle3.Drafter.from_config(config), eagle3.Target.from_config(KIMI))
    assert len(problems) == 1
    assert "captures [3, 31, 59]" in problems[0] and "expected [1, 29, 57]" in problems[0]


@pytest.mark.parametrize(
    "change, words",
    [
        ({"hidden_size": 4096}, "hidden size 4096"),
        ({"target_hidden_size": 5120}, "hidden size 5120"),
        ({"architectures": ["LlamaForCausalLMEagle"]}, "not an EAGLE-3 drafter"),
        ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 29, 60]}}, "capture points [2, 30, 61]"),
        ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 29]}}, "has 2 ids"),
        ({"draft_vocab_size": 200000}, "exceeds vocab_size"),
    ],
)
def test_drafter_mismatches_are_named(change, words):
    problems = eagle3.drafter_problems(
        eagle3.Drafter.from_config({**TORCHSPEC_DRAFTER, **change}), eagle3.Target.from_config(KIMI)
    )
    assert any(words in p for p in problems), problems


def test_eagle3_drafter_under_algorithm_eagle_is_refused():
    problems = eagle3.drafter_problems(
        eagle3.Drafter.from_config(TORCHSPEC_DRAFTER), eagle3.Target.from_config(KIMI), algorithm="EAGLE"
    )
    assert any("accept length 1.0" in p for p in problems)


def test_training_config_is_the_template_with_kimis_vocabulary_and_sglang_ids():
    config = eagle3.drafter_config_for(KIMI, SPECFORGE_TEMPLATE)
    assert config["vocab_size"] == 163840 and config["draft_vocab_size"] == 32000
    assert (config["bos_token_id"], config["eos_token_id"]) == (163584, 163585)
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 29, 57]
    assert eagle3.drafter_problems(eagle3.Drafter.from_config(config), eagle3.Target.from_config(KIMI)) == []


def test_bytes_per_token_is_four_hidden_states_in_bf16_plus_ids():
    # (1 + 3) x 7168 x 2 = 57,344 B of hidden states, + 16 B of input_ids and loss_mask
    assert eagle3.bytes_per_token(7168) == 57_360
    assert eagle3.bytes_per_token(eagle3.Target.from_config(KIMI).hidden_size, "float32") == 114_704


def test_disk_budget_on_kimi_and_the_refusal():
    draft = eagle3.drafter_config_for(KIMI, SPECFORGE_TEMPLATE)
    budget = eagle3.disk_budget(eagle3.Target.from_config(KIMI), draft, samples=100_000, max_length=2048)
    assert budget.hidden_states_bytes == 100_000 * 2048 * 57_360  # ~10.7 TiB
    assert 1.4e9 < eagle3.drafter_parameters(draft) < 3.5e9  # one-layer 7168-wide drafter
    assert budget.total_bytes > budget.hidden_states_bytes
    assert eagle3.checkpoint_count(100_000, 1, 5000) == 21 and eagle3.checkpoint_count(10, 2, 5000) == 2
    assert "GiB" in budget.lines()[0] and "57,360 B/token" in budget.lines()[0]
    assert eagle3.disk_problem(budget, budget.total_bytes, "/data") is None
    problem = eagle3.disk_problem(budget, budget.total_bytes - 1, "/data")
    assert problem.startswith("/data has") and "expected fewer samples" in problem


def test_speculative_variants_of_the_deployed_command():
    argv = [
        "/opt/inference-host/envs/x/bin/python",
        "-m",
        "sglang.launch_server",
        "--model-path",
        "/models/k",
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-draft-model-path",
        "/models/d",
        "--speculative-num-steps",
        "3",
        "--enable-metrics",
        "--config",
        "/etc/inference-host/engine/s.yaml",
    ]
    off = eagle3.speculative_variant(argv, speculative=False)
    assert not any(a.startswith("--speculative") for a in off) and "/models/d" not in off
    assert off[-3:] == ["--enable-metrics", "--config", "/etc/inference-host/engine/s.yaml"]
    other = eagle3.speculative_variant(argv, speculative=True, draft_model_path="/models/new")
    assert other[other.index("--speculative-draft-model-path") + 1] == "/models/new"
    assert len(other) == len(argv)
    with pytest.raises(eagle3.ConfigError):
        eagle3.speculative_variant(off, speculative=True)


def test_launcher_argv_reads_the_exec_line():
    text = "#!/bin/sh\n# comment\nexec /e/bin/python -m sglang.launch_server --port 30000\n"
    assert eagle3.launcher_argv(text)[-2:] == ["--port", "30000"]


def test_accept_length_from_prometheus_metrics():
    from checks.answer_parsers import parse_prometheus

    text = (
        'sglang:spec_accept_length{model_name="kimi-k2.5",tp_rank="0"} 2.71\n'
        'sglang:spec_accept_rate{model_name="kimi-k2.5",tp_rank="0"} 0.57\n'
    )
    assert eagle3.accept_length_from_metrics(parse_prometheus(text)) == 2.71
    assert eagle3.accept_length_from_metrics(parse_prometheus("sglang:num_running_reqs 0\n")) is None


def test_the_config_specforge_saved_on_the_h200_passes_the_drafter_check():
    """save_pretrained of SpecForge's drafter after the H200 training run (transformers 5.17)."""
    saved = eagle3.read_config(DATA / "h200-offline-train" / "drafter-config.json")
    drafter = eagle3.Drafter.from_config(saved)
    assert drafter.layer_ids == (1, 3, 4) and drafter.draft_vocab_size == 512
    target = eagle3.Target.from_config(
        {
            "architectures": ["KimiK25ForConditionalGeneration"],
            "text_config": {"hidden_size": 256, "num_hidden_layers": 8, "vocab_size": 2048},
        }
    )
    assert eagle3.drafter_problems(drafter, target) == []
    report = eagle3.read_config(DATA / "h200-offline-train" / "report.json")
    assert report["disk_bytes_per_token_measured"] == eagle3.bytes_per_token(7168)
