"""The EAGLE-3 training job's inputs, as data: its folders, what each step depends on (the stamps),
the SpecForge commands (pure: unit-tested against SpecForge's captured CLI), which drafters an A/B
run compares; and the log and the command runner every step shares. Read by the job
(pipeline.py, as its own user) and by its root helper (engine_helper.py). Standard library only.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
import time
from pathlib import Path

try:
    import eagle3  # installed beside this file on the host
except ImportError:  # the project's tests
    from roles.shared import eagle3

STEPS = ("regenerate", "hidden-states", "train", "export", "ab")
GPU_STEPS = ("hidden-states", "train")
DRAFT_TEMPLATE = "configs/deepseek-v3-671b-eagle3.json"


class StepError(Exception):
    pass


# -- paths and inputs ---------------------------------------------------------------------------


def paths(cfg: dict) -> dict[str, Path]:
    work = Path(cfg["work_dir"])
    return {
        "work": work,
        "prompts": work / "data" / "prompts.jsonl",
        "regenerated": work / "data" / "regenerated.jsonl",
        "hidden": work / "hidden-states",
        "checkpoints": work / "checkpoints",
        "draft_config": work / "draft-config.json",
        "state": work / "state",
        "logs": work / "logs",
        "reports": work / "reports",
        # The export staged here, in the job's own folder; its root helper publishes it (engine_helper.py).
        "staged": work / "export",
        "export": Path(cfg["export_dir"]),
    }


def target_config(cfg: dict) -> dict:
    return eagle3.read_config(Path(cfg["target"]["model_path"]) / "config.json")


def layer_ids(cfg: dict) -> list[int]:
    return eagle3.default_config_ids(eagle3.Target.from_config(target_config(cfg)).num_layers)


def draft_config(cfg: dict) -> dict:
    template = eagle3.read_config(Path(cfg["specforge_dir"]) / DRAFT_TEMPLATE)
    return eagle3.drafter_config_for(target_config(cfg), template)


def budget(cfg: dict) -> eagle3.DiskBudget:
    target = eagle3.Target.from_config(target_config(cfg))
    saves = eagle3.checkpoint_count(cfg["samples"], cfg["train"]["num_epochs"], cfg["train"]["save_interval"])
    return eagle3.disk_budget(target, draft_config(cfg), cfg["samples"], cfg["max_length"], saves)


def step_inputs(cfg: dict, step: str) -> dict:
    """What a step's result depends on: a change re-runs it and every later step."""
    common = {"specforge": cfg["specforge_commit"], "model": cfg["target"]["model_path"]}
    return {
        "regenerate": {
            **common,
            "dataset": cfg["dataset"],
            "samples": cfg["samples"],
            "served": cfg["target"]["served_model_name"],
            **cfg["regenerate"],
        },
        "hidden-states": {
            **common,
            "max_length": cfg["max_length"],
            "template": cfg["chat_template"],
            "tp": cfg["target"]["tp_size"],
        },
        "train": {**common, **cfg["train"]},
        "export": {**common, "export_dir": cfg["export_dir"]},
        "ab": {**common, "current": cfg.get("current_drafter"), **cfg["bench"]},
    }[step]


def stamp_key(cfg: dict, step: str) -> str:
    index = STEPS.index(step)
    chain = [step_inputs(cfg, s) for s in STEPS[: index + 1]]
    return hashlib.sha256(json.dumps(chain, sort_keys=True, default=str).encode()).hexdigest()[:16]


def done(cfg: dict, step: str) -> bool:
    stamp = paths(cfg)["state"] / f"{step}.done"
    return stamp.is_file() and json.loads(stamp.read_text()).get("key") == stamp_key(cfg, step)


# -- the commands (pure: unit-tested against SpecForge's captured CLI) ----------------------------


def launcher(cfg: dict, gpu: bool) -> list[str]:
    env = cfg["env_python"]
    if gpu and cfg["env_mode"] == "full":
        torchrun = str(Path(env).parent / "torchrun")
        return [torchrun, "--standalone", "--nproc_per_node", str(cfg["target"]["tp_size"])]
    return [env]  # no-gpu-deps (lab): the stand-in checkout's scripts, one process


def step_commands(cfg: dict) -> dict[str, list[str]]:
    p, sf, target = paths(cfg), Path(cfg["specforge_dir"]), cfg["target"]
    ids = ",".join(str(i) for i in layer_ids(cfg))
    sglang_backend = ["--sglang-attention-backend", target["attention_backend"]]
    return {
        "regenerate": [
            cfg["env_python"],
            str(sf / "scripts/regenerate_train_data.py"),
            "--model",
            target["served_model_name"],
            "--server-address",
            target["server"],
            "--input-file-path",
            str(p["prompts"]),
            "--output-file-path",
            str(p["regenerated"]),
            "--concurrency",
            str(cfg["regenerate"]["concurrency"]),
            "--max-tokens",
            str(cfg["regenerate"]["max_tokens"]),
            "--temperature",
            "0",
            "--num-samples",
            str(cfg["samples"]),
            "--resume",
        ],
        "hidden-states": [
            *launcher(cfg, True),
            str(sf / "scripts/prepare_hidden_states.py"),
            "--target-model-path",
            target["model_path"],
            "--trust-remote-code",
            "--enable-aux-hidden-states",
            "--aux-hidden-states-layers",
            ids,
            "--data-path",
            str(p["regenerated"]),
            "--chat-template",
            cfg["chat_template"],
            "--max-length",
            str(cfg["max_length"]),
            "--tp-size",
            str(target["tp_size"]),
            "--batch-size",
            "1",
            "--num-samples",
            str(cfg["samples"]),
            "--output-path",
            str(p["hidden"]),
            *sglang_backend,
        ],
        "train": [
            *launcher(cfg, True),
            str(sf / "scripts/train_eagle3.py"),
            "--target-model-path",
            target["model_path"],
            "--trust-remote-code",
            "--draft-model-config",
            str(p["draft_config"]),
            "--train-data-path",
            str(p["regenerated"]),
            "--train-hidden-states-path",
            str(p["hidden"]),
            "--output-dir",
            str(p["checkpoints"]),
            "--chat-template",
            cfg["chat_template"],
            "--max-length",
            str(cfg["max_length"]),
            "--num-epochs",
            str(cfg["train"]["num_epochs"]),
            "--learning-rate",
            str(cfg["train"]["learning_rate"]),
            "--batch-size",
            "1",
            "--save-interval",
            str(cfg["train"]["save_interval"]),
            "--tp-size",
            str(target["tp_size"]),
            "--resume",
            *sglang_backend,
        ],
    }


def ab_drafters(cfg: dict) -> dict[str, str | None]:
    """The drafter served before this export against the new one. When the served drafter IS the
    export directory, the one it replaced is <export_dir>.previous (step 4 keeps it); no drafter
    served: the new one against speculative decoding off."""
    export = paths(cfg)["export"]
    current = cfg.get("current_drafter")
    if current and Path(current) == export:
        previous = export.with_name(export.name + ".previous")
        current = str(previous) if previous.is_dir() else None
    return {"current": current, "new": str(export)}


# -- logging and running -----------------------------------------------------------------------------


class Log:
    def __init__(self, cfg: dict, step: str):
        folder = paths(cfg)["logs"]
        folder.mkdir(parents=True, exist_ok=True)
        self.file = open(folder / f"{step}.log", "a", buffering=1)

    def __call__(self, text: str) -> None:
        line = f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {text}"
        print(line, flush=True)
        self.file.write(line + "\n")


def run_command(log: Log, argv: list[str], env: dict | None = None, cwd: str | None = None) -> None:
    log(f"$ {shlex.join(argv)}")
    process = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, **(env or {})}, cwd=cwd
    )
    assert process.stdout is not None  # stdout=PIPE
    for line in process.stdout:
        log(line.rstrip())
    if process.wait() != 0:
        raise StepError(f"{Path(argv[1] if len(argv) > 1 else argv[0]).name} exited with {process.returncode}")
