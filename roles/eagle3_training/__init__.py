"""roles/eagle3_training: the EAGLE-3 drafter training job, laid down on a gpu node and started by
the user on demand (never by the deploy). Dispatched when eagle3_training_enabled is set.

What it lays down:

    <install_root>/eagle3-env/<lock>-<mode>-<stamp>/  SpecForge's environment, installed exactly from
                                                    files/specforge-<lock>.lock.txt (hashes required)
    <install_root>/eagle3-env/current -> <...>      switched once the new one is complete
    <install_root>/specforge/<commit>/              SpecForge's source at the pinned commit (git),
                                                    with patches/specforge/<commit>/*.patch applied
    /usr/local/libexec/inference-host/eagle3/       the job's driver (files/*.py: pipeline.py, its root
                                                    helper engine_helper.py) and roles/shared/eagle3.py
    /usr/local/sbin/inference-host-eagle3           `inference-host-eagle3 plan` (dry run)
    /etc/inference-host/eagle3-training.json        the job's inputs, from the site model
    /etc/systemd/system/inference-host-eagle3@.service   one unit per step: @regenerate,
                                                    @hidden-states, @train, @export, @ab, @all, run as
                                                    the job's own account (privileges.py)
    /etc/systemd/system/inference-host-eagle3-engine@.service   its root helper, one fixed verb each
    /etc/polkit-1/rules.d/60-inference-host-eagle3.rules        the job may start those, nothing else
    /etc/inference-host/eagle3/api-key.json         the client key, 0600 the job's (with a key set)
    <work_dir>/                                     data, hidden states, checkpoints, logs, stamps

SpecForge is pinned to the last commit of its main branch that pinned sglang 0.5.9, torch 2.9.1
and transformers 4.57.1 (82951a9, 2026-06-28; the next pins sglang 0.5.14 / torch 2.11, off the
CUDA 12.8 line). The serving stack is sglang 0.5.10 (transformers 5.3.0), so the job keeps its
own environment. Its SGLang 0.5.9 extracts Kimi-K2.5's hidden states through the same
deepseek_v2.py capture code as 0.5.10 (`val + 1`), but 0.5.9's kimi_k25.py lacks the hook that
reaches it: patches/sglang/0.5.9/0001 adds it to the job's environment (0.5.10's method).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.facts.server import Command

# pyinfra's `files` under another name: this package has a `files/` folder of its own, and Python
# binds an imported subpackage as an attribute of its package, that is, as a global of this very
# module, over anything named `files` here (a test that imports files/pipeline.py did, and the
# role's next deploy in that process called the folder's `directory`).
from pyinfra.operations import files as file_operations
from pyinfra.operations import server, systemd

from roles.eagle3_training import privileges
from roles.eagle3_training.checkout import (  # re-exported: the tests and the docs name them here
    JOB_SGLANG,
    patch_files,
    sglang_capture_hook,
    sglang_patch_files,
    source_dir,
    sources,
)
from roles.eagle3_training.lock_files import PYTHON, lock_file
from roles.shared import layout, templates
from roles.shared import systemd_syntax as sd
from roles.shared.engine_env import NO_GPU_COMPILED, RECIPE, no_gpu_subset
from roles.shared.locked_env import EnvironmentStamp, build_command, stamp
from roles.shared.shell import argv, sh
from roles.shared.uv import uv_environment
from roles.site import HostSettings, current_host
from roles.site import lock as site_lock

HERE = Path(__file__).resolve().parent
__all__ = ["JOB_SGLANG", "patch_files", "sglang_patch_files", "eagle3_training"]
LIBEXEC = "/usr/local/libexec/inference-host/eagle3"
CONFIG_FILE = f"{layout.ETC_DIR}/eagle3-training.json"
UNIT = "inference-host-eagle3@.service"
WRAPPER = "/usr/local/sbin/inference-host-eagle3"
BENCH = {
    "concurrency": [1, 4, 16, 64],
    "input_len": 1024,
    "output_len": 512,
    "prompts_per_stream": 4,
    "min_prompts": 8,
    "restart_timeout_s": 1800,
}


def short(commit: str) -> str:
    return commit[:7]


def requirements_text(settings: HostSettings) -> str:
    """What the job's environment installs: its lock, or in the lab's no-gpu-deps mode the
    lock's part that exists without a GPU (the engine's rule, roles/site/lock.py)."""
    # Without the seal line (roles/site/lock.py unsealed): hosts get the lock as it was before sealing.
    text = site_lock.unsealed(lock_file(settings.eagle3_training.specforge_lock).read_text())
    if settings.eagle3_training.env_mode == "no-gpu-deps":
        return no_gpu_subset(text, settings)
    return text


def python(settings: HostSettings) -> str:
    return settings.engine.python or PYTHON


def env_root(settings: HostSettings) -> str:
    return f"{settings.base.install_root}/eagle3-env"


def env_dir(settings: HostSettings) -> str:
    """<root>/eagle3-env/<lock>-<mode>-<stamp>: the stamp hashes what the environment is made
    of (the installed lock text, the interpreter), so any change builds a new folder."""
    job = settings.eagle3_training
    digest = stamp((RECIPE, job.env_mode, python(settings), requirements_text(settings)))
    return f"{env_root(settings)}/{job.specforge_lock}-{job.env_mode}-{digest}"


def live_env(settings: HostSettings) -> str:
    """The link the job's units and wrapper run through (switched after a complete build)."""
    return layout.current_link(env_root(settings))


def job_config(settings: HostSettings) -> dict:
    """/etc/inference-host/eagle3-training.json: everything the driver reads (no secret)."""
    job, serving = settings.eagle3_training, settings.serving
    spec = settings.speculative
    address = "127.0.0.1" if serving.host in ("0.0.0.0", "127.0.0.1") else serving.host
    return {
        "work_dir": job.work_dir,
        "env_mode": job.env_mode,
        "env_python": f"{live_env(settings)}/bin/python",
        "specforge_dir": source_dir(settings),
        "specforge_commit": job.specforge_commit,
        "dataset": job.dataset,
        "samples": job.samples,
        "max_length": job.max_length,
        "chat_template": job.chat_template,
        "regenerate": {"concurrency": job.regenerate_concurrency, "max_tokens": job.regenerate_max_tokens},
        "train": {"num_epochs": job.num_epochs, "learning_rate": job.learning_rate, "save_interval": job.save_interval},
        "export_dir": job.export_dir,
        "current_drafter": spec.draft_model_path if spec else None,
        "engine_python": f"{layout.current_link(settings.base.install_root)}/bin/python",
        "target": {
            "model_path": serving.model_path,
            "served_model_name": serving.served_model_name,
            "server": f"{address}:{serving.port}",
            "unit": f"{serving.unit_name}.service",
            "api_key_file": privileges.KEY_FILE,
            "tp_size": settings.gpu.count,
            # SpecForge's SGLang backend defaults to fa3 (SM90 only); triton works on SM120.
            "attention_backend": serving.attention_backend or ("fa3" if settings.gpu.arch == "sm90" else "triton"),
        },
        "bench": BENCH,
        "job_user": privileges.JOB_USER,  # the root helper takes staged files of this user's only
    }


@deploy("EAGLE-3 training job")
def eagle3_training() -> None:
    settings = current_host()
    job = settings.eagle3_training
    privileges.accounts(settings)
    # The job's (its unit writes nothing else). pyinfra's files.directory chowns recursively only
    # when the folder's own owner differs: once, for a folder root's job filled before, then never;
    # the mode on the folder alone (a recursive chmod would make every file executable).
    file_operations.directory(
        name=f"Create {job.work_dir} (training data, hidden states, checkpoints), the job's (recursively, once)",
        path=job.work_dir,
        user=privileges.JOB_USER,
        group=privileges.JOB_USER,
        recursive=True,
    )
    file_operations.directory(
        name=f"Set {job.work_dir}'s mode to 0750", path=job.work_dir, mode="0750", recursive=False
    )
    _environment(settings)
    sources(settings)
    _driver(settings)


def _environment(settings: HostSettings) -> None:
    """Built like an engine environment (roles/shared/engine_env.py): exactly from the lock,
    hashes required, byte-compiled, beside the live one; switched once complete (and patched,
    in full mode); the previous ones removed after the switch."""
    target, job, root = env_dir(settings), settings.eagle3_training, env_root(settings)
    name, current = target.rsplit("/", 1)[1], live_env(settings)
    file_operations.directory(name=f"Create {root}", path=root, user="root", group="root", mode="0755")
    text = requirements_text(settings)
    requirements = f"{target}.lock.txt"
    built = host.get_fact(EnvironmentStamp, env_dir=target)
    uploaded = file_operations.put(
        name=f"Upload the job's lock (SpecForge {job.specforge_lock}, {job.env_mode},"
        f" {len(_names(text))} packages) to {requirements}",
        src=io.BytesIO(text.encode()),
        dest=requirements,
        user="root",
        group="root",
        mode="0644",
    )
    build = server.shell(
        name=f"Build the training job's environment (SpecForge lock {job.specforge_lock}, {job.env_mode},"
        f" exactly from its lock) at {target}",
        commands=[
            build_command(
                target,
                python(settings),
                requirements,
                current,
                pip_check=job.env_mode == "full",
                compile_only=None if job.env_mode == "full" else NO_GPU_COMPILED,
            )
        ],
        _env=uv_environment(settings),
        _if=lambda: built != name or uploaded.did_change(),
    )
    if job.env_mode == "full":
        sglang_capture_hook(target, build)
    live = host.get_fact(Command, command=sh("readlink -- {current} || true", current=current))
    server.shell(
        name=f"Switch {current} to {name}",
        commands=[
            sh(
                "ln -sfn -- {target} {new} && mv -T -- {new} {current}",
                target=target,
                new=f"{current}.new",
                current=current,
            )
        ],
        _if=lambda: live != target or build.did_change(),
    )
    others = host.get_fact(
        Command,
        command=sh(
            "cd -- {root} 2>/dev/null && ls -1d -- * | grep -vx -e current -e {name} -e {lock} || true",
            root=root,
            name=name,
            lock=f"{name}.lock.txt",
        ),
    )
    if others:
        server.shell(
            name=f"Remove the job's previous environments in {root} ({', '.join(others.split())})",
            commands=[sh("cd -- {root} && rm -rf -- {others}", root=root, others=others.split())],
        )


def _names(text: str) -> list[str]:
    return [line.split("==")[0] for line in text.splitlines() if "==" in line and not line.startswith((" ", "#"))]


def _driver(settings: HostSettings) -> None:
    file_operations.directory(name=f"Create {LIBEXEC}", path=LIBEXEC, user="root", group="root", mode="0755")
    # Root's, 0755/0644: the job runs them as its user, the helper as root (files/engine_helper.py).
    for module in sorted((HERE / "files").glob("*.py")):
        if module.name != "__init__.py":
            file_operations.put(
                name=f"Install {LIBEXEC}/{module.name} (the job's driver and its root helper)",
                src=str(module),
                dest=f"{LIBEXEC}/{module.name}",
                user="root",
                group="root",
                mode="0755" if module.name in ("pipeline.py", "engine_helper.py") else "0644",
            )
    file_operations.put(
        name=f"Install {LIBEXEC}/eagle3.py (layer convention, config checks, disk budget)",
        src=str(HERE.parent / "shared" / "eagle3.py"),
        dest=f"{LIBEXEC}/eagle3.py",
        user="root",
        group="root",
        mode="0644",
    )
    file_operations.directory(
        name=f"Create {layout.ETC_DIR}", path=layout.ETC_DIR, user="root", group="root", mode="0755"
    )
    file_operations.put(
        name=f"Write {CONFIG_FILE} (the job's inputs)",
        src=io.StringIO(json.dumps(job_config(settings), indent=2, sort_keys=True) + "\n"),
        dest=CONFIG_FILE,
        user="root",
        group="root",
        mode="0644",
    )
    python = f"{live_env(settings)}/bin/python"
    file_operations.template(
        name=f"Write {WRAPPER}",
        src="roles/eagle3_training/templates/inference-host-eagle3.j2",
        dest=WRAPPER,
        user="root",
        group="root",
        mode="0755",
        command=argv(python, f"{LIBEXEC}/pipeline.py", "--config", CONFIG_FILE),  # one shell word each
        jinja_env_kwargs=templates.jinja_env_kwargs("roles/eagle3_training/templates/inference-host-eagle3.j2"),
    )
    privileges.client_key(settings)
    written = [
        file_operations.template(
            name=f"Write {dest} ({what})",
            src=template,
            dest=dest,
            user="root",
            group="root",
            mode="0644",
            **kwargs,
            jinja_env_kwargs=templates.jinja_env_kwargs(template),
        )
        for dest, template, what, kwargs in rendered(settings)
    ]
    systemd.daemon_reload(name="Reload systemd units", _if=lambda: any(op.did_change() for op in written[:2]))


def rendered(settings: HostSettings) -> list[tuple[str, str, str, dict]]:
    """(destination, template, what, keyword arguments) of the job's units and its polkit rule."""
    helper = f"{privileges.HELPER_UNIT}@.service"
    return [
        (
            f"/etc/systemd/system/{UNIT}",
            f"roles/eagle3_training/templates/{UNIT}.j2",
            "one unit per step, never started here",
            unit_kwargs(settings),
        ),
        (
            f"/etc/systemd/system/{helper}",
            privileges.HELPER_TEMPLATE,
            "the job's root helper",
            privileges.helper_kwargs(settings, LIBEXEC, CONFIG_FILE),
        ),
        (
            privileges.POLKIT_RULE,
            privileges.POLKIT_TEMPLATE,
            "the job may start its helper's units",
            privileges.polkit_kwargs(),
        ),
    ]


def unit_kwargs(settings: HostSettings) -> dict:
    """Encoded for systemd (roles/shared/systemd_syntax.py): the template takes nothing else;
    `%i` (the step) is the template's own specifier, after the encoded words."""
    driver = f"{LIBEXEC}/pipeline.py"
    return dict(
        documentation=sd.word_list([f"file://{driver}"], "Documentation="),
        exec_start=sd.argv(
            [f"{live_env(settings)}/bin/python", driver, "--config", CONFIG_FILE, "run"], "ExecStart= (eagle3_training)"
        ),
        work_dir=sd.path(settings.eagle3_training.work_dir, "WorkingDirectory= (eagle3_training_work_dir)"),
        writable_paths=sd.path_list([settings.eagle3_training.work_dir], "ReadWritePaths= (eagle3_training_work_dir)"),
        **privileges.unit_kwargs_extra(settings),
    )
