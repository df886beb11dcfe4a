#!/usr/bin/env python3
"""The EAGLE-3 drafter training job on the gpu node: five steps on SpecForge, each a systemd unit
(inference-host-eagle3@<step>.service), started by the user, never by the deploy.

    inference-host-eagle3 plan                 # dry run: inputs, layer convention, disk budget, steps
    systemctl start inference-host-eagle3@regenerate      # or @all: every step not done yet
    journalctl -u inference-host-eagle3@train -f          # logs (also <work_dir>/logs/<step>.log)

Steps (SpecForge scripts at the pinned commit, in the job's own locked environment):
 1 regenerate     the pinned prompts answered again by the served target through its API
                  (scripts/regenerate_train_data.py); needs the serving unit up
 2 hidden-states  the target's hidden states extracted with SGLang as the backend
                  (scripts/prepare_hidden_states.py, aux layers in SGLang's convention); refused
                  when the disk cannot hold them; stops the serving unit (it needs the GPUs)
 3 train          offline training of the drafter on those states (scripts/train_eagle3.py --resume)
 4 export         the newest checkpoint, checked against the target, copied to the directory
                  --speculative-draft-model-path loads
 5 ab             the new drafter against the current one (or none), same workload, accept length
                  recorded; the serving unit is restored as deployed afterwards
A step whose inputs did not change since it finished is skipped (a stamp under <work_dir>/state);
an interrupted step resumes (SpecForge skips finished hidden-state files and resumes training from
its last checkpoint; regeneration appends with --resume).
Standard library only; roles/shared/eagle3.py is installed beside this file.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
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


def free_bytes(path: Path) -> int:
    probe = path
    while not probe.exists():
        probe = probe.parent
    return shutil.disk_usage(probe).free


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


# -- plan (dry run) ------------------------------------------------------------------------------


def plan(cfg: dict) -> tuple[list[str], bool]:
    p = paths(cfg)
    lines = [
        f"EAGLE-3 drafter training job (SpecForge {cfg['specforge_commit'][:12]},"
        f" environment {cfg['env_mode']}: {cfg['env_python']})"
    ]
    target = eagle3.Target.from_config(target_config(cfg))
    ids = layer_ids(cfg)
    dataset = json.dumps(cfg["dataset"], sort_keys=True) if cfg["dataset"] else "NOT SET (eagle3_training_dataset)"
    lines += [
        f"target: {cfg['target']['model_path']} ({target.architecture}, {target.num_layers} layers,"
        f" hidden {target.hidden_size}, vocab {target.vocab_size}, {target.dtype})",
        f"layer convention: SGLang captures the input of layer id+1 for each config id"
        f" (deepseek_v2.py set_eagle3_layers_to_capture); config ids {ids} = capture points"
        f" {eagle3.sglang_capture_points(ids, target.num_layers)} = SGLang's default for"
        f" {target.num_layers} layers",
        f"dataset: {dataset}; {cfg['samples']} samples, max length {cfg['max_length']}",
    ]
    draft = draft_config(cfg)
    problems = eagle3.drafter_problems(eagle3.Drafter.from_config(draft), target)
    lines.append(
        f"drafter to train: {draft['architectures'][0]}, hidden {draft['hidden_size']},"
        f" vocab {draft['vocab_size']} (draft vocab {draft['draft_vocab_size']}),"
        f" {eagle3.drafter_parameters(draft) / 1e9:.2f} B parameters"
        + (f"; PROBLEMS: {'; '.join(problems)}" if problems else "")
    )
    estimate = budget(cfg)
    free = free_bytes(p["work"])
    refusal = eagle3.disk_problem(estimate, free, str(p["work"]))
    lines.append(f"disk budget ({p['work']}, {free / 1024**3:,.1f} GiB free):")
    lines += [f"  {line}" for line in estimate.lines()]
    lines.append(f"  verdict: {'REFUSED: ' + refusal if refusal else 'fits'}")
    commands = step_commands(cfg)
    for number, step in enumerate(STEPS, 1):
        status = "done" if done(cfg, step) else "pending"
        lines.append(f"{number}. {step} [{status}]  systemctl start inference-host-eagle3@{step}")
        if step in commands:
            lines.append(f"     {shlex.join(commands[step])}")
        if step == "regenerate":
            lines.append(f"     needs {cfg['target']['unit']} serving {cfg['target']['server']}")
        if step in GPU_STEPS:
            lines.append(f"     stops {cfg['target']['unit']} (the GPUs are needed)")
        if step == "export":
            lines.append(f"     newest checkpoint of {p['checkpoints']} -> {p['export']}")
        if step == "ab":
            current = ab_drafters(cfg)["current"]
            lines.append(
                f"     bench_serving: drafter {current or '(none: speculation off)'}"
                f" vs {p['export']}, concurrency {cfg['bench']['concurrency']}"
            )
    ok = not problems and not refusal and bool(cfg["dataset"])
    return lines, ok


# -- running a step --------------------------------------------------------------------------------


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


def api_key(cfg: dict) -> str | None:
    path = Path(cfg["target"]["api_key_file"])
    return json.loads(path.read_text()).get("api-key") if path.is_file() else None


def http_status(url: str, key: str | None = None, timeout: float = 10) -> int:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return 0


def systemctl(log: Log, *args: str) -> None:
    run_command(log, ["systemctl", *args])


def wait_healthy(cfg: dict, log: Log, timeout_s: int) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if http_status(f"http://{cfg['target']['server']}/health") == 200:
            return
        time.sleep(5)
    raise StepError(f"{cfg['target']['unit']} did not answer /health within {timeout_s} s")


def fetch_prompts(cfg: dict, log: Log) -> None:
    """The pinned dataset as SpecForge's input: one {"id", "conversations": [...]} per line."""
    p, dataset = paths(cfg), cfg["dataset"]
    if not dataset:
        raise StepError("eagle3_training_dataset is not set: no prompts to regenerate")
    p["prompts"].parent.mkdir(parents=True, exist_ok=True)
    if "path" in dataset:
        source = Path(dataset["path"])
        digest = hashlib.sha256(source.read_bytes()).hexdigest()
        if digest != dataset["sha256"]:
            raise StepError(f"{source}: sha256 {digest}, expected {dataset['sha256']} (the pinned file)")
    else:
        code = (
            "import sys; from huggingface_hub import hf_hub_download; print(hf_hub_download("
            "repo_id=sys.argv[1], filename=sys.argv[2], revision=sys.argv[3], repo_type='dataset'))"
        )
        result = subprocess.run(
            [cfg["env_python"], "-c", code, dataset["repo"], dataset["file"], dataset["revision"]],
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            raise StepError(f"could not download {dataset['repo']}@{dataset['revision']}: {result.stderr[-800:]}")
        source = Path(result.stdout.strip().splitlines()[-1])
    rows = read_rows(cfg, source)
    written = 0
    with open(p["prompts"], "w") as out:
        for index, row in enumerate(rows):
            messages = row.get("conversations") or row.get("messages")
            if not messages:
                continue
            out.write(
                json.dumps({"id": str(row.get("id", row.get("prompt_id", index))), "conversations": messages}) + "\n"
            )
            written += 1
            if written >= cfg["samples"]:
                break
    log(f"prompts: {written} conversations from {source} -> {p['prompts']}")


def read_rows(cfg: dict, source: Path):
    if source.suffix == ".parquet":  # datasets (SpecForge's environment) reads parquet
        code = (
            "import sys, json; import datasets; d = datasets.load_dataset('parquet', data_files=sys.argv[1],"
            " split='train'); [print(json.dumps(r, default=str)) for r in d]"
        )
        result = subprocess.run([cfg["env_python"], "-c", code, str(source)], capture_output=True, text=True)
        if result.returncode != 0:
            raise StepError(f"could not read {source}: {result.stderr[-800:]}")
        return (json.loads(line) for line in result.stdout.splitlines() if line.strip())
    text = source.read_text()
    if source.suffix == ".json":
        return iter(json.loads(text))
    return (json.loads(line) for line in text.splitlines() if line.strip())


def step_regenerate(cfg: dict, log: Log) -> dict:
    fetch_prompts(cfg, log)
    key = api_key(cfg)
    if http_status(f"http://{cfg['target']['server']}/v1/models", key) != 200:
        raise StepError(
            f"the served target at {cfg['target']['server']} does not answer /v1/models;"
            f" start {cfg['target']['unit']} first (systemctl start {cfg['target']['unit']})"
        )
    # Patch 0001 makes SpecForge's client send OPENAI_API_KEY; the key never reaches a command line.
    run_command(log, step_commands(cfg)["regenerate"], env={"OPENAI_API_KEY": key or "None"})
    lines = [json.loads(line) for line in paths(cfg)["regenerated"].read_text().splitlines() if line.strip()]
    ok = sum(1 for line in lines if line.get("status", "success") == "success")
    if not ok:
        raise StepError("no conversation was regenerated (see the log)")
    return {"regenerated": ok, "failed": len(lines) - ok}


def step_hidden_states(cfg: dict, log: Log) -> dict:
    estimate = budget(cfg)
    for line in estimate.lines():
        log(f"disk budget: {line}")
    refusal = eagle3.disk_problem(estimate, free_bytes(paths(cfg)["work"]), str(paths(cfg)["work"]))
    if refusal:
        raise StepError(f"refused: {refusal}")
    systemctl(log, "stop", cfg["target"]["unit"])
    paths(cfg)["hidden"].mkdir(parents=True, exist_ok=True)
    run_command(log, step_commands(cfg)["hidden-states"], cwd=cfg["specforge_dir"])
    files = [f for f in paths(cfg)["hidden"].rglob("data_*.ckpt*")]
    return {"files": len(files), "bytes": sum(f.stat().st_size for f in files)}


def step_train(cfg: dict, log: Log) -> dict:
    draft = draft_config(cfg)
    problems = eagle3.drafter_problems(eagle3.Drafter.from_config(draft), eagle3.Target.from_config(target_config(cfg)))
    if problems:
        raise StepError("the draft config does not fit the target: " + "; ".join(problems))
    paths(cfg)["draft_config"].write_text(json.dumps(draft, indent=2) + "\n")
    systemctl(log, "stop", cfg["target"]["unit"])
    run_command(log, step_commands(cfg)["train"], cwd=cfg["specforge_dir"])
    return {"checkpoint": str(newest_checkpoint(cfg))}


def newest_checkpoint(cfg: dict) -> Path:
    """SpecForge's train_eagle3.py saves <output-dir>/epoch_<e>_step_<s>/ (config.json, model.safetensors)."""

    def order(path: Path):
        parts = path.name.split("_")
        return (
            (int(parts[1]), int(parts[3]))
            if len(parts) == 4 and parts[1].isdigit() and parts[3].isdigit()
            else (-1, -1)
        )

    found = sorted((d for d in paths(cfg)["checkpoints"].glob("epoch_*_step_*") if d.is_dir()), key=order)
    complete = [d for d in found if (d / "config.json").is_file() and (d / "model.safetensors").is_file()]
    if not complete:
        raise StepError(f"no complete checkpoint (config.json + model.safetensors) under {paths(cfg)['checkpoints']}")
    return complete[-1]


def step_export(cfg: dict, log: Log) -> dict:
    checkpoint = newest_checkpoint(cfg)
    drafter = eagle3.Drafter.from_config(eagle3.read_config(checkpoint / "config.json"))
    problems = eagle3.drafter_problems(drafter, eagle3.Target.from_config(target_config(cfg)))
    if problems:
        raise StepError(f"{checkpoint} does not fit the target: " + "; ".join(problems))
    export = paths(cfg)["export"]
    staging = export.with_name(export.name + ".exporting")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for name in ("config.json", "model.safetensors"):
        shutil.copy2(checkpoint / name, staging / name)
    if export.exists():
        previous = export.with_name(export.name + ".previous")
        shutil.rmtree(previous, ignore_errors=True)
        export.rename(previous)
    staging.rename(export)
    os.chmod(export, 0o755)
    log(
        f"exported {checkpoint} -> {export}: serve it with --speculative-draft-model-path {export}"
        f" (serving_speculative draft_model_path)"
    )
    return {"checkpoint": str(checkpoint), "export": str(export)}


def exec_start(unit: str) -> str:
    text = subprocess.run(
        ["systemctl", "show", "-p", "ExecStart", "--value", unit], capture_output=True, text=True
    ).stdout
    for part in text.replace("{", " ").split(";"):
        if part.strip().startswith("path="):
            return part.strip().removeprefix("path=").strip()
    raise StepError(f"could not read the ExecStart of {unit}")


def serve_variant(cfg: dict, log: Log, drafter: str | None) -> None:
    """Restart the serving unit with the deployed command, speculation off (drafter None) or with
    the given drafter, through a drop-in that overrides ExecStart (removed by restore())."""
    unit = cfg["target"]["unit"]
    folder = Path(f"/etc/systemd/system/{unit}.d")
    argv = eagle3.speculative_variant(
        eagle3.launcher_argv(Path(exec_start(unit)).read_text()), drafter is not None, drafter
    )
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "eagle3-ab-launch"
    script.write_text(
        f"#!/bin/sh\n# EAGLE-3 A/B (inference-host-eagle3@ab); removed afterwards.\nexec {shlex.join(argv)}\n"
    )
    script.chmod(0o755)
    (folder / "90-inference-host-eagle3-ab.conf").write_text(f"[Service]\nExecStart=\nExecStart={script}\n")
    systemctl(log, "daemon-reload")
    systemctl(log, "restart", unit)
    wait_healthy(cfg, log, cfg["bench"]["restart_timeout_s"])


def restore(cfg: dict, log: Log) -> None:
    folder = Path(f"/etc/systemd/system/{cfg['target']['unit']}.d")
    for name in ("90-inference-host-eagle3-ab.conf", "eagle3-ab-launch"):
        (folder / name).unlink(missing_ok=True)
    systemctl(log, "daemon-reload")
    systemctl(log, "restart", cfg["target"]["unit"])


def bench(cfg: dict, log: Log, label: str) -> list[dict]:
    key, b, target = api_key(cfg), cfg["bench"], cfg["target"]
    results = []
    for concurrency in b["concurrency"]:
        out = paths(cfg)["reports"] / f"bench-{label}-{concurrency}.jsonl"
        out.unlink(missing_ok=True)
        prompts = max(b["min_prompts"], concurrency * b["prompts_per_stream"])
        run_command(
            log,
            [
                cfg["engine_python"],
                "-m",
                "sglang.bench_serving",
                "--backend",
                "sglang-oai-chat",
                "--base-url",
                f"http://{target['server']}",
                "--model",
                target["served_model_name"],
                "--tokenizer",
                target["model_path"],
                "--dataset-name",
                "random-ids",
                "--random-input-len",
                str(b["input_len"]),
                "--random-output-len",
                str(b["output_len"]),
                "--random-range-ratio",
                "1",
                "--num-prompts",
                str(prompts),
                "--max-concurrency",
                str(concurrency),
                "--output-file",
                str(out),
            ],
            env={"OPENAI_API_KEY": key} if key else None,
        )
        row = json.loads(out.read_text().splitlines()[-1])
        results.append(
            {
                "concurrency": concurrency,
                "output_throughput": row.get("output_throughput"),
                "accept_length": row.get("accept_length"),
            }
        )
    return results


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


def step_ab(cfg: dict, log: Log) -> dict:
    paths(cfg)["reports"].mkdir(parents=True, exist_ok=True)
    variants = ab_drafters(cfg)
    results: dict[str, list[dict]] = {}
    record = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "variants": variants, "results": results}
    try:
        for label, drafter in variants.items():
            log(f"== {label}: {drafter or 'speculative decoding off'}")
            serve_variant(cfg, log, drafter)
            results[label] = bench(cfg, log, label)
    finally:
        restore(cfg, log)
    for label, rows in results.items():
        for row in rows:
            log(
                f"{label:8} concurrency {row['concurrency']:>3}: {row['output_throughput']} tok/s,"
                f" accept length {row['accept_length']}"
            )
    with open(paths(cfg)["reports"] / "ab-history.jsonl", "a") as history:
        history.write(json.dumps(record) + "\n")
    return record


RUNNERS = {
    "regenerate": step_regenerate,
    "hidden-states": step_hidden_states,
    "train": step_train,
    "export": step_export,
    "ab": step_ab,
}


def run(cfg: dict, step: str) -> int:
    steps = STEPS if step == "all" else (step,)
    for name in steps:
        log = Log(cfg, name)
        if done(cfg, name):
            log(f"{name}: done with these inputs (stamp {stamp_key(cfg, name)}); skipped")
            continue
        before = STEPS[STEPS.index(name) - 1] if STEPS.index(name) else None
        if before and not done(cfg, before):
            log(
                f"{name}: refused: step {before} has not finished with these inputs;"
                f" systemctl start inference-host-eagle3@{before}"
            )
            return 2
        log(f"{name}: starting (inputs {json.dumps(step_inputs(cfg, name), sort_keys=True, default=str)})")
        try:
            outputs = RUNNERS[name](cfg, log)
        except (StepError, eagle3.ConfigError) as error:
            log(f"{name}: FAILED: {error}")
            return 1
        state = paths(cfg)["state"]
        state.mkdir(parents=True, exist_ok=True)
        (state / f"{name}.done").write_text(
            json.dumps(
                {"key": stamp_key(cfg, name), "outputs": outputs, "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
            )
            + "\n"
        )
        log(f"{name}: done: {json.dumps(outputs, default=str)}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="inference-host-eagle3", description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="/etc/inference-host/eagle3-training.json")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("plan", help="print the plan with the disk budget (changes nothing)")
    runner = sub.add_parser("run", help="run one step (or all steps not done yet)")
    runner.add_argument("step", choices=(*STEPS, "all"))
    args = parser.parse_args(argv)
    cfg = json.loads(Path(args.config).read_text())
    if args.command == "plan":
        try:
            lines, ok = plan(cfg)
        except eagle3.ConfigError as error:
            print(f"cannot plan: {error}", file=sys.stderr)
            return 2
        print("\n".join(lines))
        return 0 if ok else 3
    return run(cfg, args.step)


if __name__ == "__main__":
    raise SystemExit(main())
