#!/usr/bin/env python3
"""The EAGLE-3 training job's root helper: what the job (its own unprivileged user) cannot do
itself, as root, one verb per instance of inference-host-eagle3-engine@<verb>.service:

    stop       stop the engine's unit (the GPU steps need the GPUs)
    baseline   serve the drafter the export replaced (or speculative decoding off) } the A/B run,
    candidate  serve the export                                                    } a drop-in
    restore    remove that drop-in and restart the engine as deployed
    publish    copy the export staged in <work_dir>/export (the job's folder) to export_dir

Its one input is the verb, the unit's instance name: a name not in engine_control.VERBS is
refused. Every path (the engine's unit, the drafters, the folders) comes from the root-owned
config the deploy wrote (/etc/inference-host/eagle3-training.json), never from the job. What it
reads in the job's folder it opens without following a link and takes only as the job's own
regular files: the job could otherwise point root at a file it may not read itself.
Standard library only; run by /usr/bin/python3 (-E -s), not the job's environment, whose packages
the job's user may not write but root has no reason to load.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

try:
    from . import engine_control, jobspec
    from .jobspec import eagle3
except ImportError:  # a script on the host: its folder is sys.path[0]
    import engine_control  # type: ignore[no-redef]
    import jobspec  # type: ignore[no-redef]
    from jobspec import eagle3

DROPIN = "90-inference-host-eagle3-ab.conf"
LAUNCH = "eagle3-ab-launch"
PUBLISHED = ("config.json", "model.safetensors")
CONFIG_LIMIT = 1 << 20  # a drafter's config.json is a few KiB
NOFOLLOW_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class HelperError(Exception):
    pass


def systemctl(*args: str) -> None:
    print(f"$ systemctl {shlex.join(args)}", flush=True)
    if subprocess.run(["systemctl", *args]).returncode != 0:
        raise HelperError(f"systemctl {' '.join(args)} failed")


def dropin_dir(cfg: dict) -> Path:
    return Path(f"/etc/systemd/system/{cfg['target']['unit']}.d")


def exec_start(unit: str) -> str:
    text = subprocess.run(
        ["systemctl", "show", "-p", "ExecStart", "--value", "--", unit], capture_output=True, text=True
    ).stdout
    for part in text.replace("{", " ").split(";"):
        if part.strip().startswith("path="):
            return part.strip().removeprefix("path=").strip()
    raise HelperError(f"could not read the ExecStart of {unit}")


def serve(cfg: dict, drafter: str | None) -> None:
    """Restart the engine with its deployed command, speculation off (drafter None) or with the
    given drafter, through a drop-in that overrides ExecStart (removed by restore). The command
    is the deployed launcher's (root's file): only the drafter's path changes."""
    unit = cfg["target"]["unit"]
    # A drop-in already there is this helper's own from a variant before: its launcher is not
    # the deployed one, so read the unit's command without it.
    restore_files(cfg)
    systemctl("daemon-reload")
    argv = eagle3.speculative_variant(
        eagle3.launcher_argv(Path(exec_start(unit)).read_text()), drafter is not None, drafter
    )
    folder = dropin_dir(cfg)
    folder.mkdir(mode=0o755, parents=True, exist_ok=True)
    script = folder / LAUNCH
    script.write_text(
        f"#!/bin/sh\n# EAGLE-3 A/B (inference-host-eagle3@ab); removed afterwards.\nexec {shlex.join(argv)}\n"
    )
    script.chmod(0o755)
    (folder / DROPIN).write_text(f"[Service]\nExecStart=\nExecStart={script}\n")
    systemctl("daemon-reload")
    print(f"serving {unit} with {drafter or 'speculative decoding off'}", flush=True)
    systemctl("restart", "--", unit)


def restore_files(cfg: dict) -> None:
    for name in (DROPIN, LAUNCH):
        (dropin_dir(cfg) / name).unlink(missing_ok=True)


def restore(cfg: dict) -> None:
    restore_files(cfg)
    systemctl("daemon-reload")
    systemctl("restart", "--", cfg["target"]["unit"])


def job_uid(cfg: dict) -> int:
    return pwd.getpwnam(cfg["job_user"]).pw_uid


def staged_files(cfg: dict) -> dict[str, int]:
    """Open descriptors of the staged files: reached from work_dir without following a link, each
    a regular file of the job's user with one link (a hard link to a file of root's would have
    another owner, or a second link)."""
    work = os.open(cfg["work_dir"], NOFOLLOW_DIR)
    try:
        staged = os.open(jobspec.paths(cfg)["staged"].name, NOFOLLOW_DIR, dir_fd=work)
    finally:
        os.close(work)
    found: dict[str, int] = {}
    try:
        for name in PUBLISHED:
            where = f"{jobspec.paths(cfg)['staged']}/{name}"
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=staged)
            except OSError as error:
                raise HelperError(f"{where}: {error.strerror}; expected the export step's file") from None
            found[name] = fd
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_uid != job_uid(cfg) or info.st_nlink != 1:
                raise HelperError(f"{where}: not a regular file of {cfg['job_user']}'s with one link; refused")
    except BaseException:
        for fd in found.values():
            os.close(fd)
        raise
    finally:
        os.close(staged)
    return found


def checked_config(cfg: dict, fd: int) -> None:
    """The staged config.json as the engine will read it: a drafter that fits the target, and no
    auto_map (the engine runs with --trust-remote-code: an auto_map would name code in this
    folder for it to import)."""
    where = f"{jobspec.paths(cfg)['staged']}/config.json"
    data = os.read(fd, CONFIG_LIMIT + 1)
    if len(data) > CONFIG_LIMIT:
        raise HelperError(f"{where}: larger than {CONFIG_LIMIT} bytes; refused")
    try:
        config = json.loads(data)
    except ValueError as error:
        raise HelperError(f"{where}: not valid JSON ({error})") from None
    if not isinstance(config, dict) or "auto_map" in config:
        raise HelperError(f"{where}: not a JSON object without auto_map (code the engine would import); refused")
    target = eagle3.Target.from_config(jobspec.target_config(cfg))
    problems = eagle3.drafter_problems(eagle3.Drafter.from_config(config), target)
    if problems:
        raise HelperError(f"{where} does not fit the target: " + "; ".join(problems))
    os.lseek(fd, 0, os.SEEK_SET)


def remove(name: str, parent: int) -> None:
    """<parent>/<name> gone, whatever it is; a link is removed, never followed."""
    try:
        info = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(info.st_mode):
        shutil.rmtree(name, dir_fd=parent)  # fd-based on Linux: follows no link (shutil.rmtree.avoids_symlink_attacks)
    else:
        os.unlink(name, dir_fd=parent)


def publish(cfg: dict) -> None:
    """The staged drafter, checked, copied into <export_dir>.publishing (root's, 0755/0644) and
    swapped in; the one it replaces kept as <export_dir>.previous (the A/B baseline)."""
    export = jobspec.paths(cfg)["export"]
    sources = staged_files(cfg)
    try:
        checked_config(cfg, sources["config.json"])
        export.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        parent = os.open(export.parent, NOFOLLOW_DIR)
        try:
            new, previous = f"{export.name}.publishing", f"{export.name}.previous"
            remove(new, parent)
            os.mkdir(new, 0o755, dir_fd=parent)
            folder = os.open(new, NOFOLLOW_DIR, dir_fd=parent)
            try:
                for name, source in sources.items():
                    out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=folder)
                    with os.fdopen(out, "wb") as target, os.fdopen(os.dup(source), "rb") as reading:
                        shutil.copyfileobj(reading, target, 1 << 20)
                        target.flush()
                        os.fsync(target.fileno())
                    os.chmod(name, 0o644, dir_fd=folder)
                os.chmod(new, 0o755, dir_fd=parent)
            finally:
                os.close(folder)
            try:
                os.stat(export.name, dir_fd=parent, follow_symlinks=False)
            except FileNotFoundError:
                pass
            else:
                remove(previous, parent)
                os.rename(export.name, previous, src_dir_fd=parent, dst_dir_fd=parent)
            os.rename(new, export.name, src_dir_fd=parent, dst_dir_fd=parent)
        finally:
            os.close(parent)
    finally:
        for fd in sources.values():
            os.close(fd)
    print(f"published {jobspec.paths(cfg)['staged']} -> {export}", flush=True)


def act(cfg: dict, verb: str) -> None:
    if verb == "stop":
        systemctl("stop", "--", cfg["target"]["unit"])
    elif verb in ("baseline", "candidate"):
        drafters = jobspec.ab_drafters(cfg)
        drafter = drafters["current"] if verb == "baseline" else drafters["new"]
        if drafter and not Path(drafter).is_dir():
            raise HelperError(f"{drafter}: no such drafter folder (run inference-host-eagle3@export first)")
        serve(cfg, drafter)
    elif verb == "restore":
        restore(cfg)
    else:
        publish(cfg)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="inference-host-eagle3-engine", description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="/etc/inference-host/eagle3-training.json")
    parser.add_argument("verb")
    args = parser.parse_args(argv)
    if args.verb not in engine_control.VERBS:
        print(
            f"{engine_control.HELPER_UNIT}@{args.verb}: refused: {args.verb!r} is not one of"
            f" {', '.join(engine_control.VERBS)}",
            file=sys.stderr,
        )
        return 2
    cfg = json.loads(Path(args.config).read_text())
    try:
        act(cfg, args.verb)
    except (HelperError, eagle3.ConfigError, OSError) as error:
        print(f"{engine_control.HELPER_UNIT}@{args.verb}: FAILED: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
