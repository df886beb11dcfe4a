"""The engines' own start-up checks on the control machine, for a host whose GPUs are elsewhere:
the preview's engine diff (`python -m roles.render INVENTORY --engine-diff STACK`) and the lab
tier run files/engine_preflight.py here, the deploy runs it on the host (roles/serving: the
preflight gate, with the host's own GPUs and driver).

Here the program runs in an environment installed exactly from the stack's committed lock
(`uv pip sync --require-hashes`, every package of the target, torch and the kernel packages
included: they import without a GPU) with the stack's patch queue applied, cached under
~/.cache/inference-host/preflight-envs/<stack>-<digest of lock and patches>/. It gets one
host's rendered arguments and environment file, the model's config files from a folder of the
operator's (the Hub repository's *.json and *.py, no weights), and --answer-gpus from the
inventory (gpu_count, gpu_model, gpu_memory_gib, gpu_arch). The lock is for x86_64 Linux: the
control machine must be one (a Mac cannot install CUDA wheels).
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from roles.serving.command import server_arguments
from roles.shared import kv_cache
from roles.shared.engine_env import SGLANG_PATCHES
from roles.shared.patches import patch_queue
from roles.site import EngineStack, HostSettings, Site, SiteError
from roles.site import lock as stack_lock
from roles.site.sections.gpu import GPU_ARCHS

PROGRAM = Path(__file__).parent / "files" / "engine_preflight.py"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "inference-host" / "preflight-envs"
PLACEHOLDER_KEY = "preview-placeholder-key"  # the --config file's api-key: its value is never read
PREFLIGHT_TIMEOUT_S = 900


def gpu_answers(settings: HostSettings) -> dict:
    """What the host's GPUs would answer, from the inventory: the memory as nvidia-smi reports
    it for a known card (97,887 MiB for the RTX PRO 6000, not 96 x 1024), which SGLang's default
    mem_fraction_static is computed from (roles/shared/kv_cache.py CARD_MEMORY_MIB)."""
    major, minor = GPU_ARCHS[settings.gpu.arch].split(".")
    return {
        "count": settings.gpu.count,
        "name": settings.gpu.model,
        "memory_mib": kv_cache.card_mib(settings.gpu.model, settings.gpu.memory_gib),
        "capability": [int(major), int(minor)],
    }


def environment(site: Site, stack: EngineStack, python: str | None = None, log=print) -> Path:
    """The stack's full environment on this machine, exactly from its lock, patched; cached."""
    lock_text = site.stack.lock_text(stack.id)
    patches = patch_queue(SGLANG_PATCHES, stack.engine, stack.version)
    digest = hashlib.sha256(lock_text.encode() + b"".join(p.read_bytes() for p in patches)).hexdigest()[:12]
    folder = CACHE / f"{stack.id}-{digest}"
    if (folder / ".complete").exists():
        return folder
    if sys.platform != "linux" or os.uname().machine != "x86_64":
        raise SiteError(
            [
                f"the engine preflight installs stack {stack.id}'s lock ({stack_lock.TARGET_PLATFORM});"
                " run it on an x86_64 Linux machine"
            ]
        )
    shutil.rmtree(folder, ignore_errors=True)
    interpreter = find_python(stack.python, python)
    log(f"installing stack {stack.id} exactly from its lock into {folder} (once; several GB)")
    _run(["uv", "venv", "--quiet", "--python", interpreter, str(folder)], f"uv venv for {stack.id}")
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as lock:
        lock.write(lock_text)
        lock.flush()
        _run(
            ["uv", "pip", "sync", "--quiet", "--require-hashes", "--python", str(folder / "bin" / "python"), lock.name],
            f"uv pip sync of {stack.id}'s lock",
        )
    site_packages = next((folder / "lib").glob("python3*/site-packages"))
    for patch in patches:
        with patch.open("rb") as text:
            _run(["patch", "-p1", "-s", "-f", "-d", str(site_packages)], f"patch {patch.name}", stdin=text)
    (folder / ".complete").write_text(lock_text[:200])
    return folder


def find_python(version: str, given: str | None = None) -> str:
    """A CPython of the stack's version: given, INFERENCE_HOST_PREFLIGHT_PYTHON, one uv finds,
    one pyenv installed, else the version itself (uv downloads it where it may)."""
    chosen = given or os.environ.get("INFERENCE_HOST_PREFLIGHT_PYTHON")
    if chosen:
        return chosen
    found = subprocess.run(["uv", "python", "find", version], capture_output=True, text=True)
    if found.returncode == 0 and found.stdout.strip():
        return found.stdout.strip()
    pyenv = sorted(glob.glob(str(Path.home() / ".pyenv" / "versions" / f"{version}.*" / "bin" / f"python{version}")))
    return pyenv[-1] if pyenv else version


def render_arguments(
    settings: HostSettings, site: Site, stack: EngineStack, model_dir: Path, draft_dir: Path | None, secret_args: Path
) -> list[str]:
    """The host's rendered arguments for stack, with the model (and drafter) read from local
    config folders and the API key from a placeholder file."""
    args = server_arguments(settings, site.hosts, stack, secret_args_file=str(secret_args))
    swaps = {"--model-path": model_dir, "--model": model_dir, "--speculative-draft-model-path": draft_dir}
    for index, arg in enumerate(args[:-1]):
        if arg in swaps and swaps[arg] is not None:
            args[index + 1] = str(swaps[arg])
        if arg == "--speculative-config" and draft_dir is not None:
            args[index + 1] = json.dumps(
                {**json.loads(args[index + 1]), "model": str(draft_dir)}, separators=(",", ":")
            )
    return args


def env_file_values(text: str) -> dict[str, str]:
    """KEY=VALUE lines of a systemd EnvironmentFile as roles/serving renders it (no quoting)."""
    values = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    return values


def run(
    site: Site,
    settings: HostSettings,
    stack: EngineStack,
    model_dir: Path,
    draft_dir: Path | None = None,
    python: str | None = None,
    log=print,
) -> dict:
    """The engine's verdict on this host's command line for stack (engine_preflight.py's report)."""
    return run_many(stack, [(site, settings)], model_dir, draft_dir, python, log)[0]


def run_many(
    stack: EngineStack,
    hosts: list[tuple[Site, HostSettings]],
    model_dir: Path,
    draft_dir: Path | None = None,
    python: str | None = None,
    log=print,
) -> list[dict]:
    """The verdicts on several hosts' command lines (each with its site) for one stack, in one
    engine process (an import of the engine costs half a minute). The GPUs are answered from
    the first host's settings: the hosts of one site have the same GPUs (a tensor-parallel
    group must); the environment is the first site's lock of the stack."""
    from roles.serving import env_file_text

    folder = environment(hosts[0][0], stack, python, log)
    with tempfile.TemporaryDirectory(prefix="inference-host-preflight-") as scratch:
        secret = Path(scratch, "secret-args.yaml")
        secret.write_text(json.dumps({"api-key": PLACEHOLDER_KEY}) + "\n")
        items: list[dict[str, Any]] = [
            {
                "argv": render_arguments(settings, site, stack, model_dir, draft_dir, secret),
                "env": env_file_values(env_file_text(settings, stack, site)),
                "report": str(Path(scratch, f"report-{index}.json")),
                "origin": settings.name,
            }
            for index, (site, settings) in enumerate(hosts)
        ]
        Path(scratch, "batch.json").write_text(json.dumps(items))
        command = [
            str(folder / "bin" / "python"),
            str(PROGRAM),
            "--engine",
            stack.engine,
            "--answer-gpus",
            json.dumps(gpu_answers(hosts[0][1])),
            # The operator's folder holds the model's config files, not its tokenizer files: the
            # host's gate loads the tokenizer and chat template from the weights.
            "--no-tokenizer",
            "--batch",
            str(Path(scratch, "batch.json")),
            "--",
        ]
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            cwd=scratch,
            timeout=PREFLIGHT_TIMEOUT_S,
            env={**os.environ, "HOME": scratch},
        )
        verdicts = []
        for (_, settings), item in zip(hosts, items, strict=True):
            report = Path(item["report"])
            if not report.exists():
                raise SiteError(
                    [
                        f"the preflight of {stack.id} for {settings.name} wrote no verdict"
                        f" (exit {done.returncode}):\n{done.stderr[-3000:]}"
                    ]
                )
            verdict = json.loads(report.read_text())
            verdict.update(stack=stack.id, host=settings.name, argv=item["argv"], output=done.stdout + done.stderr)
            verdicts.append(verdict)
        return verdicts


# Drawn anew at every start: never a difference between releases.
UNSTABLE = {"random_seed"}


def diff(before: dict, after: dict) -> list[tuple[str, object, object]]:
    """(setting, before, after) for every resolved setting that differs, watched ones first. A
    setting one release lacks is shown when it is watched (engine_preflight.py WATCHED: what
    changes capacity or speed, such as 0.5.23's prefill CUDA graphs, on by default) or where
    a side sets it (the command line gave it or the engine chose a non-default value); the
    other new options at their defaults are left out."""
    old_values, new_values = before.get("resolved", {}), after.get("resolved", {})
    watched = list(dict.fromkeys([*before.get("watched", {}), *after.get("watched", {})]))
    names = watched + sorted((set(old_values) | set(new_values)) - set(watched) - UNSTABLE)
    rows = []
    for name in names:
        one_sided = name not in old_values or name not in new_values
        if one_sided and name not in watched and not (_set_by(before, name) or _set_by(after, name)):
            continue
        old, new = old_values.get(name, "(no such setting)"), new_values.get(name, "(no such setting)")
        if old != new:
            rows.append((name, old, new))
    return rows


def _set_by(verdict: dict, name: str) -> bool:
    return name in verdict.get("chosen", {}) or name in verdict.get("given", [])


def diff_text(before: dict, after: dict) -> str:
    lines = [
        f"Engine diff for {after['host']}: {before['stack']} -> {after['stack']}"
        " (each engine's own resolved settings, GPUs answered from the inventory)"
    ]
    for verdict in (before, after):
        state = "accepts" if verdict["ok"] else "REFUSES"
        lines.append(
            f"  {verdict['stack']}: the engine {state} the command line"
            + (f": {verdict['refusal'].splitlines()[0]}" if verdict.get("refusal") else "")
        )
    if not (before["ok"] and after["ok"]):
        return "\n".join(lines) + "\n"  # a refused command line resolves nothing to compare
    rows = diff(before, after)
    width = max([len(r[0]) for r in rows] + [7])
    lines.append(f"  {'setting':<{width}}  {before['stack']:<28}  {after['stack']}")
    lines += [f"  {name:<{width}}  {_short(old):<28}  {_short(new)}" for name, old, new in rows]
    return "\n".join(lines) + "\n"


def _short(value, limit: int = 60) -> str:
    text = json.dumps(value) if not isinstance(value, str) else value
    return text if len(text) <= limit else f"{text[: limit - 1]}…"


def _run(command: list[str], what: str, stdin=None) -> None:
    done = subprocess.run(command, capture_output=True, text=True, stdin=stdin)
    if done.returncode != 0:
        raise SiteError([f"{what} failed ({' '.join(command[:4])} ...):\n{done.stderr.strip()[-2000:]}"])
