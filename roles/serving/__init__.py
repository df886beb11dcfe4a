"""roles/serving: the engine (SGLang or vLLM, per stack) as a systemd service, switched between
stacks with health-gated rollback. Both engines run under the same unit name, conventions and
scripts, so switching the active stack from one engine to the other is an upgrade like any
other, and only one engine holds the GPUs at a time (one unit; its cleanup stops stale ones).

What it lays down on a gpu node, per engine environment (one per stack, built by roles/engine_envs):

    <env>/serving/launch                        the release's command line
    <env>/serving/<unit>.env                    NCCL + engine environment of that release (0600)
    <env>/serving/<unit>-secret-args.yaml       --config file with the API key (0600, service user)
    <env>/serving/<unit>.service                the unit, naming only that environment's files

and once per host:

    /etc/systemd/system/<unit>.service     -> <install_root>/current/serving/<unit>.service
    /etc/inference-host/engine/<unit>-secret-args.yaml    -> <install_root>/current/serving/... (health checks)
    /usr/local/libexec/inference-host/inference-engine-*  cleanup, readiness wait, switch-with-rollback

An upgrade (a new `active` stack) is built beside the old one by roles/engine_envs and configured
in its own folder, so nothing the running release uses is rewritten; this role then points
`current` at it, reloads systemd and restarts; if /health_generate never answers 200 within
serving_ready_timeout it points `current` back, which brings back the previous release's
unit, environment file, secret arguments and launcher together, restarts it, and fails the
deploy saying so. The service restarts only when something it runs with changed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.facts.files import File, Link
from pyinfra.operations import files, server

from roles.serving.command import (
    VLLM_LAUNCHER,
    node_topology,
    pcie_allreduce_env,
    server_arguments,
)
from roles.serving.keys import key_files, tenant_keys_env
from roles.serving.keys import secret_args_content as secret_args_content  # its readers' name
from roles.serving.speculative import kv_estimate_note, release_cli, speculative_environment
from roles.serving.tls import probe_address, probe_tls_options, rolling_tls_options, tls_operations, tls_probe_url
from roles.shared import layout, nccl, templates
from roles.shared import systemd_syntax as sd
from roles.shared.engine_env import cpu_build, env_dir, install_mode
from roles.shared.host_facts import UnitActiveState
from roles.shared.layout import LIBEXEC
from roles.shared.legacy_account import (
    AccountMigration,
    ServiceAccountState,
    account_migration,
    drop_former_names,
    fact_arguments,
)
from roles.shared.legacy_layout import (
    LEGACY_SCRIPTS,
    LEGACY_SECRET_DIR,
    LegacyEngine,
    legacy_engine,
    moves_root,
)
from roles.shared.note import note
from roles.shared.replicas import control_plane_key_secret, gateway_url, gateways, replicas, worker_url
from roles.shared.secret_files import secret_file
from roles.shared.shell import Shell, argv, comment, sh
from roles.shared.unit_owner import refuse_foreign_units
from roles.site import (
    EngineStack,
    HostSettings,
    Site,
    current_host,
    current_site,
    secret_value,
    served_weight_manifests,
)
from roles.site import lock as stack_lock
from roles.site.errors import display

PREFLIGHT_SOURCE = Path(__file__).parent / "files" / "engine_preflight.py"
PREFLIGHT_SCRIPT = f"{LIBEXEC}/engine-preflight.py"
# Model load takes ~10 minutes on the target; serving_ready_timeout stays below this.
TIMEOUT_START_S = 1200
RESTART_SEC_S = 30
START_LIMIT_BURST = 3
# systemd refuses a start when START_LIMIT_BURST starts already happened within the interval.
# One failed start of this unit lasts up to TimeoutStartSec (the readiness wait runs inside
# it) and the next begins RestartSec later, so the (burst + 1)-th start comes at most
# burst x (TimeoutStartSec + RestartSec) after the first: the interval must be longer.
START_LIMIT_INTERVAL_S = START_LIMIT_BURST * (TIMEOUT_START_S + RESTART_SEC_S) + RESTART_SEC_S


def config_dir(settings: HostSettings, stack: EngineStack, site: Site | None = None) -> str:
    """Where one release's serving configuration lives: inside its own environment."""
    return f"{env_dir(settings, stack, site)}/{layout.RELEASE_DIR_NAME}"


def config_paths(settings: HostSettings, stack: EngineStack, site: Site | None = None) -> dict[str, str]:
    return layout.release_files(env_dir(settings, stack, site), settings.serving.unit_name)


def launch_command(settings: HostSettings, stack: EngineStack, site: Site) -> list[str]:
    """The argv of the server for one stack; {env} in the launcher is its env dir.
    serving_launch_command replaces SGLang's launcher (the lab's stand-in); vLLM always runs
    its own API server module."""
    env, hosts = env_dir(settings, stack, site), site.hosts
    if stack.engine == "vllm":
        launcher = VLLM_LAUNCHER
    else:
        launcher = settings.serving.launch_command or ["{env}/bin/python", "-m", "sglang.launch_server"]
    secret_args = config_paths(settings, stack, site)["secret_args"]
    return [part.replace("{env}", env) for part in launcher] + server_arguments(
        settings, hosts, stack, secret_args_file=secret_args
    )


# Readiness per engine. SGLang's /health_generate runs a 1-token generation. vLLM has no such
# endpoint: its /health (vllm 0.16.0 entrypoints/serve/instrumentator/health.py) answers 200
# once the engine core is alive, and its HTTP server binds only after the model is loaded.
READY_PATHS = {"sglang": "/health_generate", "vllm": "/health"}


def probe_url(settings: HostSettings, path: str = READY_PATHS["sglang"]) -> str:
    """The readiness probe's URL: a wildcard bind is probed on loopback of the same family,
    an IPv6 address goes in brackets (RFC 3986); https, for the name the certificate covers, with TLS."""
    if settings.serving.tls_enabled:
        return tls_probe_url(settings, path)
    return f"http://{probe_address(settings)}:{settings.serving.port}{path}"


def readiness_path(settings: HostSettings, hosts: dict[str, HostSettings] | None, engine: str = "sglang") -> str:
    """Rank 0 (and a replica) is ready when the engine's READY_PATHS answers (SGLang's
    /health_generate: a real generation).
    A tensor-parallel node of rank >= 1 serves no API: sglang 0.5.9 starts its dummy health
    server (srt/utils/common.py launch_dummy_health_check_server: /ping, /health,
    /health_generate, all 200 without looking at anything) only after its schedulers
    reported ready (srt/entrypoints/engine.py _launch_subprocesses, node_rank >= 1), which
    needs every rank of the group joined in torch.distributed: its /health answering means
    "scheduler joined", and that is all it can say."""
    return "/health" if hosts and node_topology(settings, hosts)[2] >= 1 else READY_PATHS[engine]


def restart_policy(settings: HostSettings, hosts: dict[str, HostSettings] | None) -> str:
    """A tensor-parallel node of rank >= 1 restarts whatever its exit: when rank 0 stops, its
    schedulers lose the group and end (sglang 0.5.9 engine.py joins them and returns, with no
    failure status promised), and it must come back to rejoin when rank 0 does. Rank 0 and
    replicas restart on failure only (a deliberate stop stays stopped)."""
    return "always" if hosts and node_topology(settings, hosts)[2] >= 1 else "on-failure"


def unit_text_kwargs(settings: HostSettings, stack: EngineStack, site: Site | None = None) -> dict:
    """Keyword arguments of roles/serving/templates/inference-engine.service.j2 (also used by the unit tests)."""
    hosts = site.hosts if site else None
    serving, base = settings.serving, settings.base
    paths = config_paths(settings, stack, site)
    unit = f"{serving.unit_name}.service"
    cleanup, wait_script = f"{LIBEXEC}/inference-engine-cleanup", f"{LIBEXEC}/inference-engine-wait-ready"
    probe, tls = probe_url(settings, readiness_path(settings, hosts, stack.engine)), probe_tls_options(settings)
    # Encoded for systemd (roles/shared/systemd_syntax.py): the template takes nothing else.
    return dict(
        unit_name=sd.comment(serving.unit_name, "a comment of the unit (serving_unit_name)"),
        stack_id=sd.comment(stack.id),
        probe_url=sd.comment(probe),
        start_limit_burst_text=sd.comment(START_LIMIT_BURST),
        service_user_text=sd.comment(base.service_user, "a comment of the unit (base_service_user)"),
        **_unit_settings(settings, stack),
        env_file=sd.path(paths["env_file"], "EnvironmentFile="),
        exec_start_pre=sd.argv([cleanup, base.service_user, unit], "ExecStartPre="),
        exec_start=sd.argv([paths["launcher"]], "ExecStart="),
        exec_start_post=sd.argv([wait_script, probe, str(serving.ready_timeout), *tls], "ExecStartPost="),
        exec_stop_post=sd.argv([cleanup, base.service_user, unit], "ExecStopPost="),
        timeout_start=sd.number(TIMEOUT_START_S),
        restart_sec=sd.number(RESTART_SEC_S),
        restart_policy=sd.text(restart_policy(settings, hosts), "Restart="),
        start_limit_interval=sd.number(START_LIMIT_INTERVAL_S),
        start_limit_burst=sd.number(START_LIMIT_BURST),
        limit_nofile=sd.number(base.limit_nofile, "LimitNOFILE= (base_limit_nofile)"),
        # roles/weights: the engine starts only on complete, verified weights.
        weights_manifests=[sd.path(m, "AssertPathExists= (weights)") for m in served_weight_manifests(settings)],
    )


def _unit_settings(settings: HostSettings, stack: EngineStack) -> dict:
    """The unit's values that come from the inventory, encoded: the template's and the validation's."""
    serving, base = settings.serving, settings.base
    engine_name = {"sglang": "SGLang", "vllm": "vLLM"}[stack.engine]
    return dict(
        data_dir_text=sd.comment(base.data_dir, "a comment of the unit (base_data_dir)"),
        description=sd.text(
            f"{engine_name} inference server ({serving.served_model_name}, stack {stack.id}, {stack.label})",
            "Description= (serving_served_model_name)",
        ),
        service_user=sd.text(base.service_user, "User= (base_service_user)"),
        service_group=sd.text(base.service_group, "Group= (base_service_group)"),
        syslog_identifier=sd.text(serving.unit_name, "SyslogIdentifier="),
        data_dir=sd.path(base.data_dir, "WorkingDirectory= (base_data_dir)"),
        writable_paths=sd.path_list([base.data_dir, base.log_dir], "ReadWritePaths= (base_data_dir, base_log_dir)"),
    )


def env_file_kwargs(
    settings: HostSettings,
    stack: EngineStack,
    hosts: dict[str, HostSettings] | None = None,
    tenants: dict | None = None,
) -> dict:
    serving = settings.serving
    nnodes = node_topology(settings, hosts or {settings.name: settings})[1]
    # EAGLE-3's environment is SGLang's (its release CLI); a vLLM stack takes its speculative
    # settings on the command line only.
    spec_env = (
        speculative_environment(settings.speculative, release_cli(stack.sglang) or {})
        if stack.engine == "sglang"
        else {}
    )
    data_dir = settings.base.data_dir
    pcie = pcie_allreduce_env(stack.sglang) if stack.engine == "sglang" and serving.custom_all_reduce_pcie else {}
    ib = (
        "TCP sockets (nccl_ib_disable = True)"
        if settings.nccl.ib_disable
        else "InfiniBand/RoCE (nccl_ib_disable = False)"
    )
    # Encoded for an EnvironmentFile (roles/shared/systemd_syntax.py): the template takes nothing else;
    # the conditions ({% if %}) read the plain values.
    return dict(
        unit_name=sd.env_comment(serving.unit_name, "a comment of the environment file (serving_unit_name)"),
        stack_id=sd.env_comment(stack.id),
        engine=stack.engine,
        engine_label=sd.env_comment(stack.label),
        nccl=settings.nccl,  # its ib_disable, for the comment
        ib_comment=sd.env_comment(ib),
        nccl_env={key: sd.env_assignment(key, value) for key, value in nccl.environment(settings.nccl).items()},
        nnodes=nnodes,
        nnodes_text=sd.env_comment(nnodes),
        gpu_arch=settings.gpu.arch,
        pcie_allreduce={key: sd.env_assignment(key, value) for key, value in pcie.items()},
        hf_home=sd.env_assignment("HF_HOME", f"{data_dir}/.cache/huggingface", "HF_HOME (base_data_dir)"),
        # in the unit's writable home
        torch_cache_dir=sd.env_assignment(
            "TORCHINDUCTOR_CACHE_DIR", f"{data_dir}/.cache/torchinductor", "TORCHINDUCTOR_CACHE_DIR (base_data_dir)"
        ),
        extra_env={
            key: sd.env_assignment(key, value, f"serving_extra_env {key}")
            for key, value in {**spec_env, **(tenants or {}), **serving.extra_env}.items()
        },
    )


def systemd_problems(settings: HostSettings, hosts: dict[str, HostSettings], stack: EngineStack) -> list[str]:
    """Validation-time check: the unit and the environment file can hold this host's values as
    systemd reads them back (roles/shared/systemd_syntax.py refuses what it would change)."""
    try:
        _unit_settings(settings, stack)
        env_file_kwargs(settings, stack, hosts)
    except sd.EncodingError as error:
        return [f"{error}; systemd would not read it back unchanged"]
    return []


@deploy("Serving")
def serving() -> None:
    settings = current_host()
    stack = current_site().stack.active
    unit = f"{settings.serving.unit_name}.service"
    # Before any operation of any host: a name the host has as someone else's unit is refused.
    refuse_foreign_units({"serving_unit_name": settings.serving.unit_name}, settings.base.install_root)
    # A host deployed before the engine-neutral names: its old unit serves until the switch.
    legacy = legacy_engine(host, settings)
    # A host deployed before the engine-neutral service account: roles/base gave the account
    # its new names beside the former ones, which go once the engine serves under the new.
    account = account_migration(host.get_fact(ServiceAccountState, **fact_arguments(settings.base)), settings.base)
    changes = [_scripts(), _release_config(settings, stack), tls_operations(settings, current_site().hosts)]
    # Enabled at boot by _host_links (the multi-user.target.wants link to the unit's link);
    # started and restarted only by the switch below, which waits for readiness.
    _host_links(settings)
    _control_plane_key(settings, current_site().hosts)
    switching = _switch_condition(settings, stack, unit, changes, account)
    _preflight(settings, stack, switching)
    _switch_and_restart(settings, stack, unit, switching, legacy)
    _kv_estimate_note(settings, stack)
    if legacy:
        _remove_legacy(settings, legacy)
    drop_former_names(account, f"{unit} serves as {settings.base.service_user}")


def _kv_estimate_note(settings: HostSettings, stack: EngineStack) -> None:
    if stack.engine != "sglang":
        return
    line = kv_estimate_note(settings, stack.sglang, Path(current_site().inventory_file).parent)
    if line:
        note(name=f"Print the KV cache estimate for {stack.label}", message=line)


def _scripts() -> list:
    files.directory(name=f"Create {LIBEXEC}", path=LIBEXEC, user="root", group="root", mode="0755")
    return [
        *(
            files.template(
                name=f"Install {LIBEXEC}/{name}",
                src=f"roles/serving/templates/{name}.j2",
                dest=f"{LIBEXEC}/{name}",
                user="root",
                group="root",
                mode="0755",
            )
            for name in SCRIPTS
        ),
        files.put(
            name=f"Install {PREFLIGHT_SCRIPT} (the engines' own start-up checks, run before a switch)",
            src=str(PREFLIGHT_SOURCE),
            dest=PREFLIGHT_SCRIPT,
            user="root",
            group="root",
            mode="0644",
        ),
    ]


def release_templates(settings: HostSettings, stack: EngineStack, site: Site) -> list[tuple[str, str, str, dict]]:
    """(path, template, mode, keyword arguments) of one release's templated files; the deploy
    writes them (the preview, `python -m roles.render`, records that)."""
    paths = config_paths(settings, stack, site)
    return [
        (
            paths["env_file"],
            "roles/serving/templates/inference-engine.env.j2",
            "0640",
            env_file_kwargs(settings, stack, site.hosts, tenant_keys_env(settings, stack.engine, paths)),
        ),
        (
            paths["launcher"],
            "roles/serving/templates/launch.j2",
            "0755",
            dict(
                stack_id=comment(stack.id),
                engine_label=comment(stack.label),
                command=argv(*launch_command(settings, stack, site)),
            ),
        ),
        (
            paths["unit"],
            "roles/serving/templates/inference-engine.service.j2",
            "0644",
            unit_text_kwargs(settings, stack, site),
        ),
    ]


def env_file_text(settings: HostSettings, stack: EngineStack, site: Site) -> str:
    """The environment file of one release, as the deploy writes it."""
    _, template, _, kwargs = release_templates(settings, stack, site)[0]
    return templates.render(template, **kwargs)


SCRIPTS = (
    "inference-engine-cleanup",
    "inference-engine-wait-ready",
    "inference-engine-switch",
    "inference-engine-rolling",
)


def _release_config(settings: HostSettings, stack: EngineStack) -> list:
    """Everything the unit runs with, for this release only: a rollback brings it back."""
    folder, paths = config_dir(settings, stack), config_paths(settings, stack)
    files.directory(name=f"Create {folder}", path=folder, user="root", group="root", mode="0755")
    what = {
        paths["env_file"]: f"NCCL and engine environment of {stack.label}, mode 0640, group {layout.CHECKS_USER}",
        paths["launcher"]: f"{stack.label} command line",
        paths["unit"]: f"the unit of stack {stack.id}",
    }
    written = [
        files.template(
            name=f"Write {path} ({what[path]})",
            src=template,
            dest=path,
            user="root",
            group=layout.CHECKS_USER if path == paths["env_file"] else "root",  # the checks run with it
            mode=mode,
            jinja_env_kwargs=templates.jinja_env_kwargs(template),
            **kwargs,
        )
        for path, template, mode, kwargs in release_templates(settings, stack, current_site())
    ]
    return written + _key_files(settings, stack)


def _key_files(settings: HostSettings, stack: EngineStack) -> list:
    found = []
    for path, what, content in key_files(settings, stack.engine, config_paths(settings, stack), secret_value):
        if content is None:
            found.append(files.file(name=f"Remove {path} ({what})", path=path, present=False))
            continue
        user, group = settings.base.service_user, settings.base.service_group
        found.append(secret_file(label=what, value=content, dest=path, user=user, group=group))
    return [op for op in found if op is not None]


def _host_links(settings: HostSettings) -> None:
    """The names systemd and the health checks use, through `current`."""
    name, unit = settings.serving.unit_name, f"{settings.serving.unit_name}.service"
    serving_files, stable = layout.serving_files(settings.base.install_root, name), layout.secret_args_link(name)
    files.directory(name=f"Create {layout.STABLE_DIR}", path=layout.STABLE_DIR, user="root", group="root", mode="0755")
    links = [
        (layout.unit_file(name), serving_files["unit"]),
        # What `systemctl enable` makes; explicit, because the unit file is itself a link.
        (f"{layout.SYSTEMD_DIR}/multi-user.target.wants/{unit}", layout.unit_file(name)),
    ]
    if settings.serving.api_key_secret or settings.serving.admin_api_key_secret:
        links.append((stable, serving_files["secret_args"]))
    else:
        files.file(name=f"Remove {stable} (no API key set)", path=stable, present=False)
    for path, target in links:
        files.link(name=f"Link {path} to {target}", path=path, target=target, user="root", group="root")


def _control_plane_key(settings: HostSettings, hosts: dict[str, HostSettings]) -> None:
    """The gateways' control-plane key, root only, for the rolling upgrade's drain (a replica
    behind gateways); the engine never reads it (docs/security.md#keys-and-their-roles)."""
    path, secret = layout.REPLICA_CONTROL_PLANE_KEY_FILE, control_plane_key_secret(hosts)
    if not secret or not rolling_argv(settings, hosts):
        files.file(name=f"Remove {path} (behind no gateway with a control-plane key)", path=path, present=False)
        return
    secret_file(
        label=f"the gateways' control-plane key (secret {secret}) for the rolling upgrade",
        value=secret_value(secret) + "\n",
        dest=path,
        user="root",
        group="root",
    )


# A rolling step that did not finish (inference-engine-rolling's exits 5, 6 and 7: the replica
# left out of the gateways, or not restarted because it was the last healthy worker or its own
# load could not be read) leaves
# this file; the next deploy runs the switch again although its settings were written by the
# earlier one, and the step's success removes it. Only this role names it.
restart_pending_file = layout.restart_pending_file


@dataclass(frozen=True)
class Switching:
    """Whether the switch runs: another environment, a stopped unit, a restart an earlier
    rolling step left pending, the service account between its former and its new names (the
    engine may still run as it started, under the former: roles/shared/legacy_account.py), or
    anything the unit runs with changed in this deploy. Called while executing (pyinfra's _if),
    after those operations ran; the preflight and the switch share it, so one runs exactly when
    the other does."""

    linked: str | None
    state: str | None
    target: str
    operations: tuple
    pending: bool = False
    renaming: bool = False

    def __call__(self) -> bool:
        return (
            self.linked != self.target
            or self.state != "active"
            or self.pending
            or self.renaming
            or any(op.did_change() for op in self.operations)
        )


def _switch_condition(
    settings: HostSettings, stack: EngineStack, unit: str, changes, account: AccountMigration | None = None
) -> Switching:
    # pyinfra's files.Link fact: None where nothing is there, False where it is not a link.
    link = host.get_fact(Link, path=layout.current_link(settings.base.install_root))
    return Switching(
        linked=link.get("link_target") if link else None,
        state=host.get_fact(UnitActiveState, unit=unit),
        target=env_dir(settings, stack),
        operations=tuple(op for group in changes for op in group),
        pending=bool(host.get_fact(File, path=restart_pending_file(settings.serving.unit_name))),
        renaming=bool(account),
    )


def preflight_command(settings: HostSettings, stack: EngineStack, site: Site) -> Shell | None:
    """The engine's own start-up validation (files/engine_preflight.py) in the new environment,
    with the exact rendered arguments, as the service user with the unit's environment file
    (a transient unit: systemd-run reads EnvironmentFile= as the unit does). None where the
    environment cannot import its engine: the lab's GPU-free SGLang subset has no torch
    (tests/lab/test_engine_preflight.py runs SGLang's preflight in the lock's full environment)."""
    if stack.engine == "sglang" and install_mode(settings, stack) == "no-gpu-deps":
        return None
    paths, base = config_paths(settings, stack, site), settings.base
    lock = display(
        (stack_lock.cpu_lock_path if cpu_build(settings, stack) else stack_lock.lock_path)(
            Path(site.stack.path), stack.id
        )
    )
    origin = (
        f"{site.inventory_file} (host {settings.name}: its serving_*, {stack.engine}_* and gpu_* settings)"
        f" and {site.stack.file} (stack {stack.id}; its environment is {lock})"
    )
    return argv(
        *[
            "systemd-run",
            "--quiet",
            "--wait",
            "--pipe",
            "--collect",
            "--service-type=exec",
            f"--unit=inference-host-preflight-{settings.serving.unit_name}",
            "-p",
            f"User={base.service_user}",
            "-p",
            f"Group={base.service_group}",
            "-p",
            f"WorkingDirectory={base.data_dir}",
            "-p",
            f"EnvironmentFile={paths['env_file']}",
            # The command is expanded like ExecStart=: a `$` in a served model name stays a `$`.
            *sd.transient_argv(
                [
                    f"{env_dir(settings, stack, site)}/bin/python",
                    PREFLIGHT_SCRIPT,
                    "--engine",
                    stack.engine,
                    "--origin",
                    origin,
                    "--",
                    *server_arguments(settings, site.hosts, stack, secret_args_file=paths["secret_args"]),
                ],
                "the engine preflight's command",
            ),
        ]
    )


def _preflight(settings: HostSettings, stack: EngineStack, switching: Switching) -> None:
    command = preflight_command(settings, stack, current_site())
    if command is None:
        note(
            name=f"Preflight of {stack.label}: not run (sglang_install_mode = no-gpu-deps: no torch to"
            " import the engine with)",
            message=f"{stack.label}'s start-up checks are not run here: the GPU-free environment cannot import it",
        )
        return
    server.shell(
        name=f"Preflight: {stack.label}'s own start-up checks of the new command line and environment,"
        f" before the switch (the running service is not touched)",
        commands=[command],
        _if=switching,
    )


def _switch_and_restart(
    settings: HostSettings, stack: EngineStack, unit: str, switching: Switching, legacy: LegacyEngine | None = None
) -> None:
    current = layout.current_link(settings.base.install_root)
    # Facts read before anything ran, and the environment the switch points at.
    linked, state, target = switching.linked, switching.state, switching.target
    reason = (
        f"migrate from {legacy.unit} (the names before the rename) to {unit}, stack {stack.id}"
        if legacy
        else f"switch {current} to stack {stack.id}"
        if linked != target
        else "start"
        if state != "active"
        else "restart left pending by an earlier rolling step, or for changed settings"
        if switching.pending
        else f"restart as {settings.base.service_user} (the service account's new names), and for changed settings"
        if switching.renaming
        else "restart for changed settings"
    )
    command, behind = switch_command(
        settings, current_site().hosts, unit, current, target, legacy.unit if legacy else None
    )
    server.shell(
        name=f"{reason[0].upper()}{reason[1:]}: restart {unit} ({stack.label}) and wait until"
        f" {READY_PATHS[stack.engine]} answers (rollback to the previous stack and its"
        f" configuration if it never does)"
        + (f"; one replica at a time, drained at {', '.join(behind)} first" if behind else ""),
        commands=[command],
        # Behind a gateway: host by host, so the other replicas serve while this one restarts.
        _serial=bool(behind),
        _if=switching,
    )


def rolling_argv(settings: HostSettings, hosts: dict[str, HostSettings], mode: str | None = None) -> list[str]:
    """inference-engine-rolling's arguments up to `--` for this replica (empty when it is behind no
    gateway); mode: None (wraps the switch), "--drain-only" or "--undrain-only" (`inference-host
    drain` / `undrain`, which run the same script so a drain is the rolling upgrade's drain)."""
    rolling = settings.serving.topology == "replicas" and settings.name in [n.name for n in replicas(hosts)]
    behind = [gateway_url(g) for g in gateways(hosts)] if rolling else []
    if not behind:
        return []
    return [
        f"{LIBEXEC}/inference-engine-rolling",
        *([mode] if mode else []) + rolling_tls_options(settings, hosts),
        layout.secret_args_link(settings.serving.unit_name),
        layout.REPLICA_CONTROL_PLANE_KEY_FILE if control_plane_key_secret(hosts) else "-",
        worker_url(settings),
        str(settings.serving.drain_timeout_s),
        settings.serving.served_model_name,
        str(len(replicas(hosts))),
        restart_pending_file(settings.serving.unit_name),
        *behind,
        "--",
    ]


def switch_command(
    settings: HostSettings,
    hosts: dict[str, HostSettings],
    unit: str,
    current: str,
    target: str,
    legacy_unit: str | None = None,
) -> tuple[Shell, list[str]]:
    """The switch, wrapped in inference-engine-rolling when this node is a replica behind gateways;
    legacy_unit: the pre-rename unit it stops (and starts again on a rollback)."""
    switch = [f"{LIBEXEC}/inference-engine-switch", unit, current, target, *([legacy_unit] if legacy_unit else [])]
    rolling = rolling_argv(settings, hosts)
    if not rolling:
        return argv(*switch), []
    return argv(*rolling, *switch), [gateway_url(g) for g in gateways(hosts)]


def _remove_legacy(settings: HostSettings, legacy: LegacyEngine) -> None:
    """After the new unit passed its health gate (a failed switch stops the deploy before
    this): the old unit off boot and out of systemd, its names outside the root, and the old
    root (roles/shared/legacy_layout.py says why its environments are rebuilt, not moved)."""
    removed = [
        files.link(
            name=f"Remove {path} (the unit {legacy.unit} before the rename;"
            f" {settings.serving.unit_name}.service serves)",
            path=path,
            present=False,
        )
        for path in (legacy.wants_link, legacy.unit_link)
    ]
    server.shell(
        name=f"Reload systemd: {legacy.unit} is gone",
        commands=[
            "systemctl daemon-reload",
            sh("systemctl reset-failed -- {unit} 2>/dev/null || true", unit=legacy.unit),
        ],
        _if=lambda: any(op.did_change() for op in removed),
    )
    for name in LEGACY_SCRIPTS:
        files.file(
            name=f"Remove {LIBEXEC}/{name} (now {LIBEXEC}/{name.replace('sglang-', 'inference-engine-')})",
            path=f"{LIBEXEC}/{name}",
            present=False,
        )
    gone = [LEGACY_SECRET_DIR] + ([legacy.root] if moves_root(legacy, settings) else [])
    for path in gone:
        files.directory(
            name=f"Remove {path} (the layout before the rename; now {settings.base.install_root}"
            f" and {layout.STABLE_DIR})",
            path=path,
            present=False,
        )
