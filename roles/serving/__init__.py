"""roles/serving: SGLang as a systemd service, switched between stacks with health-gated rollback.

What it lays down on a gpu node:

    /etc/sglang/<unit>.env                      NCCL + engine environment (0600)
    /etc/sglang/<unit>-secret-args.yaml         --config file with the API key (0600, service user)
    <env>/inference-host-launch                 the release's command line (one per environment)
    /etc/systemd/system/<unit>.service          Type=exec, readiness wait, cleanup, limits
    /usr/local/libexec/inference-host/sglang-*  cleanup, readiness wait, switch-with-rollback

An upgrade (a new `active` stack) is built beside the old one by roles/sglang; this role then
points `current` at it and restarts; if /health_generate never answers 200 within
serving_ready_timeout it points `current` back, restarts the previous release and fails the
deploy saying so. The service restarts only when something it runs with changed.
"""

from __future__ import annotations

import json
import shlex

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import files, server, systemd

from roles.serving.command import SECRET_ARGS_DIR, secret_args_file, server_arguments
from roles.serving.facts import LinkTarget, UnitActiveState
from roles.serving.speculative import release_cli, speculative_environment
from roles.shared.layout import env_dir
from roles.shared.secret_files import secret_file
from roles.site import (
    EngineStack,
    HostSettings,
    current_host,
    current_site,
    secret_value,
    served_weight_manifests,
)

LIBEXEC = "/usr/local/libexec/inference-host"
LAUNCHER_NAME = "inference-host-launch"
TIMEOUT_START_S = 1200
START_LIMIT_INTERVAL_S = 600
START_LIMIT_BURST = 3


def launch_command(settings: HostSettings, stack: EngineStack) -> list[str]:
    """The argv of the server for one stack; {env} in serving_launch_command is its env dir."""
    env = env_dir(settings, stack)
    launcher = settings.serving.launch_command or ["{env}/bin/python", "-m", "sglang.launch_server"]
    hosts = current_site().hosts
    return [part.replace("{env}", env) for part in launcher] + server_arguments(settings, hosts, stack)


def unit_text_kwargs(settings: HostSettings) -> dict:
    """Keyword arguments of roles/serving/templates/sglang.service.j2 (also used by the unit tests)."""
    serving, base = settings.serving, settings.base
    unit = serving.unit_name
    return dict(
        unit_name=unit,
        served_model_name=serving.served_model_name,
        service_user=base.service_user,
        service_group=base.service_group,
        data_dir=base.data_dir,
        env_file=f"{SECRET_ARGS_DIR}/{unit}.env",
        cleanup_script=f"{LIBEXEC}/sglang-cleanup",
        wait_script=f"{LIBEXEC}/sglang-wait-ready",
        launcher=f"{base.install_root}/current/{LAUNCHER_NAME}",
        probe_host="127.0.0.1" if serving.host in ("0.0.0.0", "127.0.0.1") else serving.host,
        port=serving.port,
        ready_timeout=serving.ready_timeout,
        timeout_start=TIMEOUT_START_S,
        start_limit_interval=START_LIMIT_INTERVAL_S,
        start_limit_burst=START_LIMIT_BURST,
        limit_nofile=base.limit_nofile,
        # roles/weights: the engine starts only on complete, verified weights.
        weights_manifests=served_weight_manifests(settings),
    )


def env_file_kwargs(settings: HostSettings, stack: EngineStack | None = None) -> dict:
    spec_env = speculative_environment(settings.speculative, release_cli(stack.sglang) or {}) if stack else {}
    return dict(
        unit_name=settings.serving.unit_name,
        nccl=settings.nccl,
        gpu_arch=settings.gpu.arch,
        custom_all_reduce_pcie=settings.serving.custom_all_reduce_pcie,
        hf_home=f"{settings.base.data_dir}/.cache/huggingface",
        extra_env={**spec_env, **settings.serving.extra_env},
    )


@deploy("Serving")
def serving() -> None:
    settings = current_host()
    stack = current_site().stack.active
    unit = f"{settings.serving.unit_name}.service"
    changes = [_scripts(), _environment_file(settings, stack), _secret_args(settings),
               _launcher(settings, stack), _unit(settings)]
    # Started (and restarted) only by the switch below, which waits for readiness.
    systemd.service(name=f"Enable {unit} at boot", service=unit, enabled=True, running=None)
    _switch_and_restart(settings, stack, unit, changes)


def _scripts() -> list:
    files.directory(name=f"Create {LIBEXEC}", path=LIBEXEC, user="root", group="root", mode="0755")
    return [
        files.template(name=f"Install {LIBEXEC}/{name}", src=f"roles/serving/templates/{name}.j2",
                       dest=f"{LIBEXEC}/{name}", user="root", group="root", mode="0755")
        for name in ("sglang-cleanup", "sglang-wait-ready", "sglang-switch")
    ]


def _environment_file(settings: HostSettings, stack: EngineStack) -> list:
    files.directory(name=f"Create {SECRET_ARGS_DIR}", path=SECRET_ARGS_DIR, user="root",
                    group="root", mode="0755")
    path = f"{SECRET_ARGS_DIR}/{settings.serving.unit_name}.env"
    return [files.template(name=f"Write {path} (NCCL and engine environment, mode 0600)",
                           src="roles/serving/templates/sglang.env.j2", dest=path, user="root",
                           group="root", mode="0600", **env_file_kwargs(settings, stack))]


def _secret_args(settings: HostSettings) -> list:
    secret = settings.serving.api_key_secret
    if not secret:
        return [files.file(name=f"Remove {secret_args_file(settings)} (no API key set)",
                           path=secret_args_file(settings), present=False)]
    # JSON is YAML: SGLang's --config parser reads {"api-key": ...} like `api-key: ...`.
    content = json.dumps({"api-key": secret_value(secret)}) + "\n"
    deployed = secret_file(label=f"the API key (secret {secret}) as an SGLang --config file",
                           value=content, dest=secret_args_file(settings),
                           user=settings.base.service_user, group=settings.base.service_group)
    return [deployed] if deployed is not None else []


def _launcher(settings: HostSettings, stack: EngineStack) -> list:
    path = f"{env_dir(settings, stack)}/{LAUNCHER_NAME}"
    return [files.template(
        name=f"Write {path} (sglang {stack.sglang} command line)",
        src=f"roles/serving/templates/{LAUNCHER_NAME}.j2", dest=path, user="root", group="root",
        mode="0755", stack_id=stack.id, sglang_version=stack.sglang,
        command=shlex.join(launch_command(settings, stack)),
    )]


def _unit(settings: HostSettings) -> list:
    unit = f"{settings.serving.unit_name}.service"
    written = files.template(name=f"Write /etc/systemd/system/{unit}",
                             src="roles/serving/templates/sglang.service.j2",
                             dest=f"/etc/systemd/system/{unit}", user="root", group="root",
                             mode="0644", **unit_text_kwargs(settings))
    systemd.daemon_reload(name="Reload systemd units", _if=written.did_change)
    return [written]


def _switch_and_restart(settings: HostSettings, stack: EngineStack, unit: str, changes) -> None:
    current = f"{settings.base.install_root}/current"
    target = env_dir(settings, stack)
    linked = host.get_fact(LinkTarget, path=current)
    state = host.get_fact(UnitActiveState, unit=unit)
    operations = [op for group in changes for op in group]
    reason = (f"switch {current} to stack {stack.id}" if linked != target
              else "restart for changed settings" if state == "active" else "start")
    server.shell(
        name=f"{reason[0].upper()}{reason[1:]}: restart {unit} and wait until /health_generate"
             f" answers (rollback to the previous stack if it never does)",
        commands=[f"{LIBEXEC}/sglang-switch {unit} {current} {target}"],
        _if=lambda: linked != target or state != "active" or any(op.did_change() for op in operations),
    )
