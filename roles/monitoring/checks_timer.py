"""The periodic checks on a gpu node (roles/monitoring): their copy of `checks` and the site model,
their environment from uv.lock, their expectations and their copy of the client key, the timer.

They run as their own system user (layout.CHECKS_USER, made by roles/base before roles/serving
gives its group the engine's environment file): docs/security.md, "Units and their sandboxes".
"""

from __future__ import annotations

import io
import json

from pyinfra import host
from pyinfra.facts.files import Directory
from pyinfra.operations import files, server, systemd

from roles.monitoring import checks_env, units
from roles.shared import templates
from roles.shared.host_facts import UnitActiveState
from roles.shared.locked_env import EnvironmentStamp, build_command
from roles.shared.secret_files import secret_file
from roles.shared.shell import sh
from roles.shared.uv import uv_environment
from roles.site import PROJECT_ROOT, HostSettings, Site, secret_value


def install_checks_timer(settings: HostSettings, site: Site) -> None:
    """The checks (a copy of checks and the site model) and their environment, their copy of the
    client key, then the timer. A changed bundle or lock is a new directory; the unit points at
    the current one."""
    requirements = checks_env.requirements((PROJECT_ROOT / "uv.lock").read_text())
    env, bundle = units.env_dir(requirements), units.bundle_dir(checks_env.bundle_digest())
    for folder in (units.CHECKS_ROOT, units.CHECKS_ETC):
        files.directory(name=f"Create {folder}", path=folder, user="root", group="root", mode="0755")
    req_file = f"{env}.requirements.txt"
    uploaded = files.put(
        name=f"Upload the checks' requirements (from uv.lock) to {req_file}",
        src=io.StringIO(requirements),
        dest=req_file,
        mode="0644",
    )
    python, name, current = f"{env}/bin/python", env.rsplit("/", 1)[1], f"{units.CHECKS_ROOT}/env-current"
    built = host.get_fact(EnvironmentStamp, env_dir=env)
    server.shell(
        name=f"Build the checks' environment at {env} (exactly uv.lock's pins and hashes)",
        commands=[build_command(env, "python3", req_file, current, pip_check=True)],
        _env=uv_environment(settings),
        _if=lambda: built != name or uploaded.did_change(),
    )
    files.link(name=f"Link {current} to {env}", path=current, target=env, user="root", group="root")
    # One archive, unpacked once per bundle directory: a put per file (67) took about 33 s of the
    # lab's bare-to-healthy run, and costs a round trip each over SSH too.
    archive, unpacked = f"{units.CHECKS_ROOT}/bundle.tar", host.get_fact(Directory, path=bundle)
    sent = files.put(
        name=f"Upload the checks' bundle ({len(checks_env.bundle_files())} files) to {archive}",
        src=io.BytesIO(checks_env.bundle_archive()),
        dest=archive,
        mode="0644",
    )
    server.shell(
        name=f"Unpack {archive} into {bundle}",
        commands=[
            sh(
                "rm -rf -- {new} && mkdir -p -- {new} && tar -xf {archive} -C {new} --no-same-owner"
                " && rm -rf -- {bundle} && mv -- {new} {bundle}",
                new=f"{bundle}.new",
                archive=archive,
                bundle=bundle,
            )
        ],
        _if=lambda: not unpacked or sent.did_change(),
    )
    files.put(
        name=f"Write {units.EXPECT_FILE} (the checks' expectations, no secret)",
        src=io.StringIO(units.expect_text(settings, site)),
        dest=units.EXPECT_FILE,
        mode="0644",
    )
    _client_key(settings)
    # systemd reads only the unit files: a changed bundle or environment is picked up by the next
    # run. (The environment's build is a guarded shell: its will_change is true whether its _if runs or not.)
    unit_files = [
        files.template(
            name=f"Write {path}",
            src=template,
            dest=path,
            mode="0644",
            jinja_env_kwargs=templates.jinja_env_kwargs(template),
            **kwargs,
        )
        for path, template, kwargs in units.gpu_templates(settings, bundle, python)
    ]
    timer = f"{units.CHECKS_UNIT}.timer"
    state = host.get_fact(UnitActiveState, unit=timer)
    systemd.service(
        name=f"Enable {timer} (every {settings.monitoring.check_interval})",
        service=timer,
        enabled=True,
        daemon_reload=any(op.will_change for op in unit_files),
    )
    # Started by its ActiveState, not by pyinfra's running=True: that reads SubState and counts only
    # running/waiting/exited/listening/mounted as running, while an active timer can also be
    # "elapsed" (systemd src/core/timer.c, state_translation_table: TIMER_ELAPSED is UNIT_ACTIVE).
    server.shell(
        name=f"Start {timer} (it is {state})",
        commands=[sh("systemctl start -- {timer}", timer=timer)],
        _if=lambda: state != "active",
    )


def _client_key(settings: HostSettings) -> None:
    """The client key alone, as the engine's --config file spells it (the checks read it with jq),
    0600 the checks' user's: they send it and nothing else, never the admin key beside it in the
    engine's own file (docs/security.md, "Keys and their roles"). No key set: the file goes."""
    secret = settings.serving.api_key_secret
    if not secret:
        files.file(name=f"Remove {units.CHECKS_KEY_FILE} (no API key set)", path=units.CHECKS_KEY_FILE, present=False)
        return
    secret_file(
        label=f"the client key (secret {secret}) for the periodic checks",
        value=json.dumps({"api-key": secret_value(secret)}) + "\n",
        dest=units.CHECKS_KEY_FILE,
        user=units.CHECKS_USER,
        group=units.CHECKS_USER,
    )
