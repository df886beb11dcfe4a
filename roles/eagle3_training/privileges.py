"""Who the EAGLE-3 training job runs as, and the little it may ask of root (docs/security.md, "Units
and their sandboxes"; docs/speculative-decoding.md).

The job runs as its own system account (JOB_USER): SpecForge, its SGLang and the target's code
(--trust-remote-code) on downloaded data never run as root. Four things it did as root need root:
stopping the engine for the GPU steps, serving an A/B variant through a drop-in on the engine's
unit, restoring the engine, and writing the export into the folder the engine reads. Those are the
verbs of a root helper (files/engine_helper.py) behind a template unit, HELPER_UNIT@<verb>.service:
the job starts an instance through systemd's D-Bus API, which a polkit rule opens to JOB_USER for
exactly those instances and the verb "start". The helper takes nothing from the job but the verb
(a name outside engine_control.VERBS is refused); every path is in the root-owned job config.

Why polkit and not sudo: the job's unit has NoNewPrivileges=yes, under which a set-uid sudo cannot
raise it; a D-Bus call to systemd is a request, not a privilege gained. Why not the export folder
made the job's: the engine runs with --trust-remote-code, so a drafter folder the job may write is
code the engine's account may be made to import (an auto_map in its config.json); the helper copies
only config.json and model.safetensors, checks the config (no auto_map, fits the target) and keeps
the folder root's.
"""

from __future__ import annotations

import json

from pyinfra.operations import apt, files

from roles.shared import layout
from roles.shared import systemd_syntax as sd
from roles.shared.secret_files import secret_file
from roles.shared.system_account import system_account
from roles.site import HostSettings, secret_value

JOB_USER = "inference-host-eagle3"
HELPER_UNIT = "inference-host-eagle3-engine"  # files/engine_control.py HELPER_UNIT
VERBS = ("stop", "baseline", "candidate", "restore", "publish")  # files/engine_control.py VERBS
JOB_ETC = f"{layout.ETC_DIR}/eagle3"
# The client key alone, 0600 the job's: regenerate and the A/B benchmark send it (/v1 routes),
# nothing it does needs the admin key beside it in the engine's own --config file.
KEY_FILE = f"{JOB_ETC}/api-key.json"
POLKIT_RULE = "/etc/polkit-1/rules.d/60-inference-host-eagle3.rules"
POLKIT_TEMPLATE = "roles/eagle3_training/templates/60-inference-host-eagle3.rules.j2"
HELPER_TEMPLATE = f"roles/eagle3_training/templates/{HELPER_UNIT}@.service.j2"
# systemd's polkit action for starting and stopping units (org.freedesktop.systemd1.policy).
MANAGE_UNITS = "org.freedesktop.systemd1.manage-units"
# Stopping the engine, or restarting it with a variant (the model loads before it reports ready,
# when its unit is Type=notify), or copying a drafter: the BENCH restart bound, and a margin.
HELPER_TIMEOUT_S = 2100


def helper_units() -> list[str]:
    return [f"{HELPER_UNIT}@{verb}.service" for verb in VERBS]


def accounts(settings: HostSettings) -> None:
    """The job's account and the polkit daemon its requests go through (Debian 12 and Ubuntu 24.04
    both package polkitd with JavaScript rules in /etc/polkit-1/rules.d; the lab's Debian
    minbase has none)."""
    system_account(JOB_USER, "the EAGLE-3 training job")
    apt.packages(name="Install polkitd (the training job asks its root helper through it)", packages=["polkitd"])


def client_key(settings: HostSettings) -> None:
    """The job's own copy of the client key, as the checks have theirs (roles/monitoring); and
    the engine's drop-in folder, which the helper's unit may write but not make (ProtectSystem)."""
    dropins = layout.unit_dropin_dir(settings.serving.unit_name)
    for folder in (JOB_ETC, dropins):
        files.directory(name=f"Create {folder}", path=folder, user="root", group="root", mode="0755")
    secret = settings.serving.api_key_secret
    if not secret:
        files.file(name=f"Remove {KEY_FILE} (no API key set)", path=KEY_FILE, present=False)
        return
    secret_file(
        label=f"the client key (secret {secret}) for the EAGLE-3 training job",
        value=json.dumps({"api-key": secret_value(secret)}) + "\n",
        dest=KEY_FILE,
        user=JOB_USER,
        group=JOB_USER,
    )


def polkit_kwargs() -> dict:
    """JSON literals, which are JavaScript's: the rule's only inputs."""
    return {"job_user": json.dumps(JOB_USER), "units": json.dumps(helper_units())}


def helper_kwargs(settings: HostSettings, libexec: str, config_file: str) -> dict:
    """The helper's unit, encoded for systemd. Writable: the engine's drop-in folder (the A/B
    variant) and the export's parent folder (the swap beside it); `-`: one not there yet is no
    error (the helper makes the drop-in folder; the export's parent is the site's)."""
    export_parent = settings.eagle3_training.export_dir.rstrip("/").rsplit("/", 1)[0] or "/"
    dropins = layout.unit_dropin_dir(settings.serving.unit_name)
    return dict(
        documentation=sd.word_list([f"file://{libexec}/engine_helper.py"], "Documentation="),
        exec_start=sd.argv(
            ["/usr/bin/python3", "-E", "-s", f"{libexec}/engine_helper.py", "--config", config_file],
            "ExecStart= (the training job's root helper)",
        ),
        polkit_rule=sd.comment(POLKIT_RULE),
        timeout_s=sd.number(HELPER_TIMEOUT_S, "TimeoutStartSec="),
        writable_paths=sd.UnitText(
            " ".join(
                "-" + sd.path_list([folder], "ReadWritePaths= (eagle3_training_export_dir)")
                for folder in (dropins, export_parent)
            )
        ),
    )


def unit_kwargs_extra(settings: HostSettings) -> dict:
    return dict(
        job_user=sd.text(JOB_USER, "User="),
        home=sd.environment("HOME", settings.eagle3_training.work_dir, "Environment=HOME (eagle3_training_work_dir)"),
        model_group=sd.text(settings.base.service_group, "SupplementaryGroups= (base_service_group)"),
    )
