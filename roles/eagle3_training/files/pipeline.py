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
                  recorded; the serving unit is restored as deployed afterwards (ab.py)
The job runs as its own user (inference-host-eagle3); what needs root, it asks of its root helper
by a fixed verb (engine_control.py, engine_helper.py): stop the engine, serve an A/B variant,
restore the engine, publish the export the engine reads.
A step whose inputs did not change since it finished is skipped (a stamp under <work_dir>/state);
an interrupted step resumes (SpecForge skips finished hidden-state files and resumes training from
its last checkpoint; regeneration appends with --resume).
Standard library only; roles/shared/eagle3.py and this folder's modules are installed beside it.
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
from pathlib import Path

try:
    from . import ab, engine_control, jobspec
    from .jobspec import (
        DRAFT_TEMPLATE,
        GPU_STEPS,
        STEPS,
        Log,
        StepError,
        ab_drafters,
        budget,
        done,
        draft_config,
        eagle3,
        layer_ids,
        paths,
        stamp_key,
        step_commands,
        step_inputs,
        target_config,
    )
except ImportError:  # a script on the host: its folder is sys.path[0]
    import ab  # type: ignore[no-redef]
    import engine_control  # type: ignore[no-redef]
    import jobspec  # type: ignore[no-redef]
    from jobspec import (  # type: ignore[no-redef]
        DRAFT_TEMPLATE,
        GPU_STEPS,
        STEPS,
        Log,
        StepError,
        ab_drafters,
        budget,
        done,
        draft_config,
        eagle3,
        layer_ids,
        paths,
        stamp_key,
        step_commands,
        step_inputs,
        target_config,
    )

__all__ = ["DRAFT_TEMPLATE", "ab_drafters", "done", "draft_config", "stamp_key", "step_commands"]
# Module globals, so a test can stand in for them.
run_command = jobspec.run_command


def free_bytes(path: Path) -> int:
    probe = path
    while not probe.exists():
        probe = probe.parent
    return shutil.disk_usage(probe).free


def helper(log: Log, verb: str) -> None:
    """The root helper's verb (engine_control.py), through this module's run_command."""
    engine_control.ask(log, verb, run_command)


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
    key = engine_control.api_key(cfg)
    if engine_control.http_status(f"http://{cfg['target']['server']}/v1/models", key) != 200:
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
    helper(log, "stop")
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
    helper(log, "stop")
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
    """The newest checkpoint, checked against the target, staged in the job's own folder; the root
    helper checks it again and publishes it to export_dir (engine_helper.py: the engine's model
    folder is not this user's to write)."""
    checkpoint = newest_checkpoint(cfg)
    drafter = eagle3.Drafter.from_config(eagle3.read_config(checkpoint / "config.json"))
    problems = eagle3.drafter_problems(drafter, eagle3.Target.from_config(target_config(cfg)))
    if problems:
        raise StepError(f"{checkpoint} does not fit the target: " + "; ".join(problems))
    staged, export = paths(cfg)["staged"], paths(cfg)["export"]
    shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir(parents=True)
    for name in ("config.json", "model.safetensors"):
        shutil.copyfile(checkpoint / name, staged / name)
    helper(log, "publish")
    log(
        f"exported {checkpoint} -> {export}: serve it with --speculative-draft-model-path {export}"
        f" (serving_speculative draft_model_path)"
    )
    return {"checkpoint": str(checkpoint), "export": str(export)}


RUNNERS = {
    "regenerate": step_regenerate,
    "hidden-states": step_hidden_states,
    "train": step_train,
    "export": step_export,
    "ab": ab.step_ab,
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
    if os.geteuid() == 0:
        # Root would leave root's files in the job's folder and skip its unit's sandbox.
        print(
            f"inference-host-eagle3 run {args.step}: refused as root; the job runs as its own user:"
            f" systemctl start inference-host-eagle3@{args.step}",
            file=sys.stderr,
        )
        return 2
    return run(cfg, args.step)


if __name__ == "__main__":
    raise SystemExit(main())
