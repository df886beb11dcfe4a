"""The EAGLE-3 training job: its locked environment, its commands against SpecForge's real flags
(captured at the pinned commit), the plan with the disk budget on the real Kimi-K2.5 config, the
steps' resumability and refusals, the export, the unit, and the sglang 0.5.9 capture-hook patch."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from roles import eagle3_training as job
from roles.eagle3_training import lock as job_lock
from roles.eagle3_training import lock_files
from roles.eagle3_training.files import engine_helper, pipeline
from roles.eagle3_training.specforge_cli import data_file
from roles.shared import lock_compile, templates
from roles.site import load_site
from roles.site import lock as stack_lock
from tests.unit import systemd_verify
from tests.unit import upstream_sources as upstream
from tests.unit.conftest import PROJECT_ROOT, gpu_node
from validation import ROLE_CHECKS  # the checks the inventories' hook runs

DATA = PROJECT_ROOT / "tests" / "unit" / "data" / "eagle3"
SPECFORGE_CLI = json.loads(data_file().read_text())


@pytest.fixture
def host(inventory):
    site = load_site(
        inventory.groups(
            gpu_nodes=[
                gpu_node(
                    eagle3_training_enabled=True,
                    eagle3_training_dataset={"path": "/data/prompts.jsonl", "sha256": "0" * 64},
                    serving_api_key_secret=None,
                )
            ]
        ),
        ROLE_CHECKS,
    )
    return site.hosts["gpu1"]


@pytest.fixture
def cfg(host, tmp_path):
    """The job's config as the role writes it, pointed at a model dir with Kimi-K2.5's real
    config.json and a SpecForge checkout holding its real DeepSeek-V3 drafter template."""
    config = job.job_config(host)
    model = tmp_path / "models" / "Kimi-K2.5"
    model.mkdir(parents=True)
    shutil.copy(DATA / "kimi-k2.5-config.json", model / "config.json")
    specforge = tmp_path / "specforge"
    (specforge / "configs").mkdir(parents=True)
    shutil.copy(DATA / "specforge-deepseek-v3-671b-eagle3.json", specforge / pipeline.DRAFT_TEMPLATE)
    config.update(
        work_dir=str(tmp_path / "work"),
        specforge_dir=str(specforge),
        export_dir=str(tmp_path / "models" / "drafter-new"),
    )
    config["target"]["model_path"] = str(model)
    return config


def test_the_locked_environment_is_specforge_82951a9s_pins_with_hashes():
    text = job.lock_file("82951a9").read_text()
    pins = stack_lock.entries(text)
    assert (pins["torch"], pins["sglang"], pins["transformers"], pins["sgl-kernel"]) == (
        "2.9.1",
        "0.5.9",
        "4.57.1",
        "0.3.21",
    )
    assert len(pins) > 150  # the whole resolution of the .in file
    body = text.split(stack_lock.DIGEST_LINE, 1)[1].split("\n")[1:]
    starts = [i for i, line in enumerate(body) if line[:1].isalnum()]
    for start, end in zip(starts, [*starts[1:], len(body)], strict=True):
        assert "    --hash=sha256:" in "\n".join(body[start:end]), body[start]
    assert "# made by: uv run python -m roles.eagle3_training.lock 82951a9" in text
    assert job_lock.lock_problem("82951a9") is None  # made from the committed .in file


def test_an_edited_requirement_without_a_new_lock_is_refused(tmp_path, monkeypatch):
    for name in ("specforge-82951a9.in", "specforge-82951a9.lock.txt"):
        shutil.copy(job_lock.FILES / name, tmp_path / name)
    monkeypatch.setattr(lock_files, "FILES", tmp_path)
    (tmp_path / "specforge-82951a9.in").write_text(
        (tmp_path / "specforge-82951a9.in").read_text().replace("transformers==4.57.1", "transformers==4.57.2")
    )
    problem = job_lock.lock_problem("82951a9")
    assert "specforge-82951a9.lock.txt was not made from the current" in problem
    assert "`uv run python -m roles.eagle3_training.lock 82951a9`" in problem
    (tmp_path / "specforge-82951a9.lock.txt").unlink()
    assert "no lock specforge-82951a9.lock.txt" in job_lock.lock_problem("82951a9")


def test_lock_command_resolves_the_in_file_with_hashes(tmp_path, monkeypatch):
    """The job's lock command asks uv what the stacks' does (uv faked: argv and stdin recorded)."""
    from tests.unit.test_engine_lock import _fake_uv

    for name in ("specforge-82951a9.in", "specforge-82951a9.lock.txt"):
        shutil.copy(job_lock.FILES / name, tmp_path / name)
    body = stack_lock.body((tmp_path / "specforge-82951a9.lock.txt").read_text())
    (tmp_path / "specforge-82951a9.lock.txt").unlink()
    monkeypatch.setattr(lock_files, "FILES", tmp_path)
    monkeypatch.setattr(lock_compile, "uv_binary", lambda: _fake_uv(tmp_path, body))
    assert job_lock.main(["82951a9"]) == 0
    argv = (tmp_path / "argv").read_text()
    assert "pip compile - --quiet --no-header --generate-hashes --python-version 3.12" in argv
    assert "--python-platform x86_64-manylinux_2_39" in argv
    assert (tmp_path / "stdin").read_text().split() == job_lock.requirements("82951a9")
    assert job_lock.lock_problem("82951a9") is None
    assert job_lock.main(["fffffff"]) == 2


def test_lab_environment_is_the_no_gpu_subset_of_the_lock(host):
    import dataclasses

    lab = dataclasses.replace(host, eagle3_training=host.eagle3_training.model_copy(update={"env_mode": "no-gpu-deps"}))
    text = job.requirements_text(lab)
    names = stack_lock.entries(text)
    full = stack_lock.entries(job.lock_file("82951a9").read_text())
    assert {"openai", "tqdm", "huggingface-hub", "sglang", "transformers", "datasets"} <= set(names)
    assert not {"torch", "triton", "sgl-kernel", "flashinfer-python", "nvidia-nccl-cu12"} & set(names)
    assert all(full[name] == version for name, version in names.items())  # the lock's versions
    assert text.count("--hash=sha256:") > len(names)
    assert "/eagle3-env/82951a9-no-gpu-deps-" in job.env_dir(lab)
    assert job.env_dir(lab) != job.env_dir(host)  # the mode and the lock text shape the stamp
    assert job.job_config(lab)["env_python"] == "/opt/inference-host/eagle3-env/current/bin/python"


def test_job_config_comes_from_the_site(host):
    config = job.job_config(host)
    assert config["target"] == {
        **config["target"],
        "server": "127.0.0.1:30000",
        "unit": "inference-engine.service",
        "tp_size": 8,
        "attention_backend": "triton",
        # The job's own copy of the client key (privileges.py), not the engine's --config file.
        "api_key_file": "/etc/inference-host/eagle3/api-key.json",
    }
    assert config["job_user"] == "inference-host-eagle3"
    assert config["specforge_commit"] == "82951a9711c8c9bf9e146e426b2e956d9798ddc7"
    assert '"api-key"' not in json.dumps(config)  # no key in it, only the path of the job's copy


def _flags_problems(argv: list[str]) -> list[str]:
    script = next(a for a in argv if a.endswith(".py"))
    options = SPECFORGE_CLI["scripts"]["scripts/" + Path(script).name]
    problems, args = [], argv[argv.index(script) + 1 :]
    index = 0
    while index < len(args):
        option = options.get(args[index])
        if option is None:
            problems.append(f"{args[index]} is not an option of {Path(script).name}")
            index += 1
            continue
        if option["takes_value"]:
            if option["choices"] and args[index + 1] not in [str(c) for c in option["choices"]]:
                problems.append(f"{args[index]} {args[index + 1]} not in {option['choices']}")
            index += 2
        else:
            index += 1
    return problems


def test_every_step_uses_only_specforges_real_flags(cfg):
    commands = pipeline.step_commands(cfg)
    assert set(commands) == {"regenerate", "hidden-states", "train"}
    for step, argv in commands.items():
        assert _flags_problems(argv) == [], step


def test_hidden_states_use_sglangs_layer_convention_and_torchrun(cfg):
    argv = pipeline.step_commands(cfg)["hidden-states"]
    assert argv[argv.index("--aux-hidden-states-layers") + 1] == "1,29,57"  # captured as [2, 30, 58]
    assert argv[0].endswith("/torchrun") and argv[argv.index("--nproc_per_node") + 1] == "8"
    assert argv[argv.index("--sglang-attention-backend") + 1] == "triton"


def test_plan_prints_the_disk_budget_and_layer_convention(cfg, capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(pipeline, "free_bytes", lambda path: 500 * 1024**3)
    config_file = tmp_path / "job.json"
    config_file.write_text(json.dumps({**cfg, "samples": 10, "max_length": 128}))
    assert pipeline.main(["--config", str(config_file), "plan"]) == 0
    out = capsys.readouterr().out
    assert "config ids [1, 29, 57] = capture points [2, 30, 58]" in out
    assert "10 samples x 128 tokens (upper bound) x 57,360 B/token" in out
    assert "verdict: fits" in out
    assert "1. regenerate [pending]  systemctl start inference-host-eagle3@regenerate" in out
    assert "vocab 163840 (draft vocab 32000)" in out
    assert "checkpoints: 1 x " in out


def test_plan_on_the_target_scale(cfg, capsys, tmp_path, monkeypatch):
    """50,000 samples of 2,048 tokens: what `plan` says before the user commits 5.6 TiB."""
    monkeypatch.setattr(pipeline, "free_bytes", lambda path: 4 * 1024**4)
    config_file = tmp_path / "job.json"
    config_file.write_text(json.dumps(cfg))  # the defaults: 50000 x 2048, save every 5000 steps
    assert pipeline.main(["--config", str(config_file), "plan"]) == 3
    out = capsys.readouterr().out
    assert "50000 samples x 2048 tokens (upper bound) x 57,360 B/token = 5,470.3 GiB" in out
    assert "checkpoints: 11 x " in out and "verdict: REFUSED: " in out and "4,096.0 GiB free" in out


def test_plan_refuses_a_budget_the_disk_cannot_hold(cfg, capsys, tmp_path):
    config_file = tmp_path / "job.json"
    config_file.write_text(json.dumps({**cfg, "samples": 10**9}))
    assert pipeline.main(["--config", str(config_file), "plan"]) == 3
    assert "verdict: REFUSED: " in capsys.readouterr().out


def test_hidden_states_step_refuses_before_touching_the_service(cfg, monkeypatch, tmp_path):
    config = {**cfg, "samples": 10**9}
    _mark_done(config, "regenerate")
    calls = []
    monkeypatch.setattr(pipeline, "run_command", lambda log, argv, **kw: calls.append(argv))
    assert pipeline.run(config, "hidden-states") == 1
    assert calls == []  # neither systemctl stop nor the extraction ran
    assert "refused:" in (Path(config["work_dir"]) / "logs" / "hidden-states.log").read_text()


def _mark_done(config, step):
    state = Path(config["work_dir"]) / "state"
    state.mkdir(parents=True, exist_ok=True)
    (state / f"{step}.done").write_text(json.dumps({"key": pipeline.stamp_key(config, step)}))


def test_steps_run_in_order_and_done_steps_are_skipped(cfg):
    assert pipeline.run(cfg, "train") == 2  # hidden-states not done
    _mark_done(cfg, "regenerate")
    _mark_done(cfg, "hidden-states")
    _mark_done(cfg, "train")
    assert pipeline.done(cfg, "train")
    changed = {**cfg, "train": {**cfg["train"], "learning_rate": 5e-5}}
    assert not pipeline.done(changed, "train") and pipeline.done(changed, "hidden-states")
    changed_data = {**cfg, "samples": cfg["samples"] + 1}
    assert not pipeline.done(changed_data, "regenerate") and not pipeline.done(changed_data, "train")


def _root_helper_runs_here(cfg, monkeypatch) -> list[str]:
    """`systemctl start inference-host-eagle3-engine@<verb>` answered by the helper itself, in this
    process, with the staged files taken as the job user's (the test's own uid)."""
    verbs: list[str] = []

    def run_command(log, argv, **kwargs):
        assert argv[:3] == ["systemctl", "start", "--"], argv
        verb = argv[3].removeprefix("inference-host-eagle3-engine@").removesuffix(".service")
        verbs.append(verb)
        engine_helper.act(cfg, verb)

    monkeypatch.setattr(pipeline, "run_command", run_command)
    monkeypatch.setattr(engine_helper, "job_uid", lambda config: os.getuid())
    return verbs


def test_export_takes_the_newest_complete_checkpoint(cfg, monkeypatch):
    checkpoints = Path(cfg["work_dir"]) / "checkpoints"
    draft = pipeline.draft_config(cfg)
    for name, complete in (("epoch_0_step_500", True), ("epoch_1_step_1000", True), ("epoch_1_step_1500", False)):
        folder = checkpoints / name
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(json.dumps(draft))
        if complete:
            (folder / "model.safetensors").write_bytes(name.encode())
    _mark_done(cfg, "regenerate")
    _mark_done(cfg, "hidden-states")
    _mark_done(cfg, "train")
    _root_helper_runs_here(cfg, monkeypatch)
    assert pipeline.run(cfg, "export") == 0
    export = Path(cfg["export_dir"])
    assert (export / "model.safetensors").read_bytes() == b"epoch_1_step_1000"
    assert json.loads((export / "config.json").read_text())["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [
        1,
        29,
        57,
    ]
    assert pipeline.run(cfg, "export") == 0  # done: skipped
    assert "skipped" in (Path(cfg["work_dir"]) / "logs" / "export.log").read_text()


def test_export_refuses_a_checkpoint_that_does_not_fit_the_target(cfg):
    folder = Path(cfg["work_dir"]) / "checkpoints" / "epoch_0_step_1"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text((DATA / "specforge-deepseek-v3-671b-eagle3.json").read_text())
    (folder / "model.safetensors").write_bytes(b"x")
    for step in ("regenerate", "hidden-states", "train"):
        _mark_done(cfg, step)
    assert pipeline.run(cfg, "export") == 1
    assert "vocab_size 129280" in (Path(cfg["work_dir"]) / "logs" / "export.log").read_text()


def test_regenerate_checks_the_pinned_dataset(cfg, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    config = {**cfg, "dataset": {"path": str(prompts), "sha256": "1" * 64}}
    assert pipeline.run(config, "regenerate") == 1
    assert "expected 1111" in (Path(cfg["work_dir"]) / "logs" / "regenerate.log").read_text()


def _render(name: str, **kwargs) -> str:
    return templates.render(f"roles/eagle3_training/templates/{name}", **kwargs)


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze is not installed")
def test_unit_verifies_and_is_never_enabled(host, tmp_path):
    text = _render("inference-host-eagle3@.service.j2", **job.unit_kwargs(host))
    assert "[Install]" not in text  # cannot be enabled: started by hand only
    # The instance a step starts, `%i` = train.
    assert systemd_verify.verify({"/etc/systemd/system/inference-host-eagle3@train.service": text}, tmp_path) == []


def test_capture_hook_patch_applies_to_the_real_0_5_9_wheel(tmp_path):
    upstream.copy_release("sglang", "0.5.9", tmp_path)
    (patch,) = job.sglang_patch_files()
    for word in ("What:", "Why:", "Upstream:"):
        assert word in patch.read_text().split("\n--- ", 1)[0]
    for args in (["--dry-run"], [], ["-R", "--dry-run"]):
        result = subprocess.run(
            ["patch", "-p1", "-s", "-f", *args, "-d", str(tmp_path)], stdin=patch.open(), capture_output=True, text=True
        )
        assert result.returncode == 0, f"{args}: {result.stdout}{result.stderr}"
    text = (tmp_path / "sglang/srt/models/kimi_k25.py").read_text()
    assert "def set_eagle3_layers_to_capture" in text


def test_training_settings_are_checked_at_inventory_load(inventory):
    from roles.site import SiteError

    path = inventory.groups(
        gpu_nodes=[gpu_node(eagle3_training_enabled=True, eagle3_training_specforge_lock="fffffff")]
    )
    with pytest.raises(SiteError) as caught:
        load_site(path, ROLE_CHECKS)
    assert any("names no locked environment" in p for p in caught.value.problems)
    bad = inventory.groups(
        "site2.py", gpu_nodes=[gpu_node(eagle3_training_dataset={"repo": "a/b", "revision": "main", "file": "x"})]
    )
    with pytest.raises(SiteError) as caught:
        load_site(bad, ROLE_CHECKS)
    assert any("'<40-hex commit>'" in p for p in caught.value.problems)


@pytest.mark.skipif(
    not __import__("os").environ.get("INFERENCE_HOST_SPECFORGE_GIT"),
    reason="set INFERENCE_HOST_SPECFORGE_GIT to a SpecForge clone to re-capture its flags",
)
def test_captured_specforge_flags_match_the_pinned_source():
    import os

    from roles.eagle3_training.specforge_cli import capture

    assert capture(os.environ["INFERENCE_HOST_SPECFORGE_GIT"]) == SPECFORGE_CLI


def test_ab_compares_the_drafter_the_export_replaced(cfg):
    export = Path(cfg["export_dir"])
    assert pipeline.ab_drafters({**cfg, "current_drafter": "/models/published"}) == {
        "current": "/models/published",
        "new": str(export),
    }
    assert pipeline.ab_drafters({**cfg, "current_drafter": None})["current"] is None  # vs speculation off
    previous = export.with_name(export.name + ".previous")
    previous.mkdir(parents=True)
    assert pipeline.ab_drafters({**cfg, "current_drafter": str(export)})["current"] == str(previous)


def test_job_environment_is_built_exactly_from_its_lock_like_an_engine_environment():
    """The plan on a fresh host (tests/unit/plans): the hashed lock uploaded as committed, the
    engine's build command (exact sync, hashes required, byte-compiled, checked, beside the live
    one), the capture hook patched, then `current` switched."""
    from tests.unit.test_gpu_stack_plans import plan

    p = plan("inventory_eagle3_ubuntu2404.py", "@fake/gpu-eagle3")
    settings = load_site(PROJECT_ROOT / "tests/unit/plans/inventory_eagle3_ubuntu2404.py").group("gpu_nodes")[0]
    target = job.env_dir(settings)
    # the lock as committed, without its seal line (the control machine's check, not installed)
    assert p.uploads[f"{target}.lock.txt"] == stack_lock.unsealed(job.lock_file("82951a9").read_text())
    build = next(c for c in p.commands if f"{target}.building" in c and "uv pip sync" in c)
    for part in (
        "umask 022;",
        f"uv venv --quiet --python 3.12 {target}.building",
        f"uv pip sync --quiet --require-hashes --compile-bytecode --python {target}.building/bin/python"
        f" {target}.lock.txt",
        "uv pip check --quiet",
        f"mv -T {target}.building {target}",
        "FAILED to build",
        "was not touched and still serves",
    ):
        assert part in build, part
    assert "--no-deps" not in build and "uv pip install" not in build
    patch = next(i for i, c in enumerate(p.commands) if "patch -p1" in c and target in c)
    switch = p.index(
        f"ln -sfn -- {target} /opt/inference-host/eagle3-env/current.new"
        " && mv -T -- /opt/inference-host/eagle3-env/current.new /opt/inference-host/eagle3-env/current"
    )
    assert p.commands.index(build) < patch < switch
    assert job.job_config(settings)["env_python"] == "/opt/inference-host/eagle3-env/current/bin/python"
