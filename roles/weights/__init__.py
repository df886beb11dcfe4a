"""roles/weights: the served model's weights (and its EAGLE-3 drafter's), pinned and verified.

On the host that keeps them -- the Proxmox node when the gpu node is an LXC guest whose
guest_mount_points entry holds the directory (mounted read-only in the guest, one copy for
every guest), else the gpu node itself -- it lays down:

    /opt/inference-host/weights-env                 huggingface_hub + hf_xet at the pins below, from the
                                                    hashed lock files/weights-tool.lock.txt
    /usr/local/bin/inference-host-weights           download / verify / status tool (files/)
    /etc/inference-host/weights/<name>.json         what to fetch (repository, commit, patterns)
    /etc/inference-host/weights/<secret>.token      the Hugging Face token (0600, the download's user)
    /etc/systemd/system/inference-host-weights-<name>.service

The unit runs as a system user of its own (USER below), not root: a bad release of the
downloader or one of its dependencies gets that user's store and state, not the node. The store
and the state folder are that user's (an older root-owned store is given to it once, recursively);
everything else it sees read-only.

then starts the unit when the directory is not a complete, verified copy of the pinned commit
(or weights_verify asks for a full re-hash), and follows it: a progress line (bytes, files,
rate, ETA) every weights_progress_interval_s until it is done. The download belongs to the
unit, not to the deploy's SSH connection: interrupting the deploy leaves it running, and
`inference-host-weights status` on the host shows it at any time. A deploy with nothing to do
reads the manifest and the files' sizes only (facts.WeightsManifestState).
"""

from __future__ import annotations

import json
import sys
import time
from io import StringIO

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import apt, files, python, server, systemd

from roles.shared import locked_env, templates
from roles.shared import systemd_syntax as sd
from roles.shared.extra_cas import trust_extra_cas
from roles.shared.layout import ETC_DIR, OPT_DIR
from roles.shared.pip import pip_environment
from roles.shared.refusal import Refused, status_of
from roles.shared.secret_files import secret_file
from roles.shared.shell import chain, sh
from roles.shared.system_account import system_account
from roles.shared.tool_locks import WEIGHTS_TOOL, tool_lock_text
from roles.site import (
    HostSettings,
    WeightSet,
    current_host,
    current_site,
    secret_value,
    weight_sets_kept_by,
)
from roles.weights.facts import FileText, WeightsManifestState

# huggingface_hub 1.17.0 is the last release that resumes a partial download across processes
# (file_download._download_to_tmp_and_move appends to `<etag>.incomplete` and asks for
# `Range: bytes=<size>-`); 1.18.0 moved to a per-process temporary file that is deleted on
# failure (huggingface_hub PR #4306, "Alternative to #4228"), so a killed download of a 10 GB shard would start over.
# hf_xet is its fast backend (hf_transfer is no longer used in 1.x): used when the Hub answers
# with Xet headers; a plain HTTP mirror is downloaded by huggingface_hub's own http_get. Only
# http_get resumes (xet_get is given no resume offset; hf_xet 1.8.0 truncates the file and keeps no
# chunk cache on that path): HF_HUB_DISABLE_XET=1 unless weights_xet (docs/weights-resume.md,
# measured on both paths against the stand-in Hub).
HF_HUB_VERSION = "1.17.0"
HF_XET_VERSION = "1.8.0"
ENV_DIR = f"{OPT_DIR}/weights-env"
ENV_LOCK = f"{OPT_DIR}/weights-env.lock.txt"  # what ENV_DIR was installed from
TOOL = "/usr/local/bin/inference-host-weights"
CONFIG_DIR = f"{ETC_DIR}/weights"
STATE_DIR = "/var/lib/inference-host/weights"
USER = "inference-host-weights"  # the download's own system user (and group)
RESTART_SEC = 15
STALL_S = 600  # the deploy stops following a unit that only fails for this long
# Phases of the unit that mean "still working".
BUSY_STATES = ("active", "activating", "reloading")


@deploy("Weights")
def weights() -> None:
    settings = current_host()
    kept = weight_sets_kept_by(current_site(), settings.name)
    if not kept:
        return
    _tools(settings)
    for secret in sorted({ws.token_secret for ws in kept if ws.token_secret}):
        secret_file(
            label=f"the Hugging Face token (secret {secret})",
            value=secret_value(secret),
            dest=token_file(secret),
            user=USER,
            group=USER,
        )
    for ws in kept:
        _weight_set(ws)


def token_file(secret: str) -> str:
    return f"{CONFIG_DIR}/{secret}.token"


def unit_name(ws: WeightSet) -> str:
    return f"inference-host-weights-{ws.name}"


def patterns_key(ws: WeightSet) -> str:
    """As the tool computes it (files/inference-host-weights, patterns_key)."""
    return json.dumps({"allow": sorted(ws.allow_patterns), "ignore": sorted(ws.ignore_patterns)}, sort_keys=True)


def config_of(ws: WeightSet) -> dict:
    return {
        "name": ws.name,
        "unit": f"{unit_name(ws)}.service",
        "kind": ws.kind,
        "repo": ws.repo,
        "revision": ws.revision,
        "allow_patterns": list(ws.allow_patterns),
        "ignore_patterns": list(ws.ignore_patterns),
        "local_dir": ws.store_dir,
        "source_dir": ws.source_dir,
        "endpoint": ws.endpoint,
        "margin_bytes": int(ws.settings.free_space_margin_gib * 1024**3),
        "max_workers": ws.settings.max_workers,
    }


def config_text(ws: WeightSet) -> str:
    return json.dumps(config_of(ws), indent=1, sort_keys=True) + "\n"


def unit_kwargs(ws: WeightSet) -> dict:
    """Encoded for systemd (roles/shared/systemd_syntax.py): the template takes nothing else."""
    name = unit_name(ws)
    return dict(
        unit=sd.comment(f"{name}.service"),
        unit_name=sd.text(name, "SyslogIdentifier="),
        description=sd.text(
            f"Download and verify {ws.repo}@{ws.revision} into {ws.store_dir}",
            "Description= (weights repo, revision, store)",
        ),
        service_user=sd.text(USER, "User= (weights)"),
        exec_start=sd.argv(
            [f"{ENV_DIR}/bin/python", TOOL, "run", "--config", f"{CONFIG_DIR}/{ws.name}.json"], "ExecStart= (weights)"
        ),
        hf_home=sd.environment("HF_HOME", f"{STATE_DIR}/hf-home"),
        token_file=sd.environment("HF_TOKEN_PATH", token_file(ws.token_secret)) if ws.token_secret else None,
        endpoint=sd.environment("HF_ENDPOINT", ws.endpoint, "Environment=HF_ENDPOINT (weights endpoint)")
        if ws.endpoint
        else None,
        restart_sec=sd.number(RESTART_SEC),
        disable_xet=not ws.settings.xet,
        writable_paths=sd.path_list([ws.store_dir, STATE_DIR], "ReadWritePaths= (weights store and state)"),
    )


def _tools(settings: HostSettings) -> None:
    apt.packages(
        name="Install python3-venv, rsync and ca-certificates for the weights tool",
        packages=["python3-venv", "rsync", "ca-certificates"],
        no_recommends=True,
        update=True,
        cache_time=24 * 3600,
    )
    if not settings.in_group("gpu_nodes"):
        trust_extra_cas(settings)  # roles/base does it on gpu nodes
    system_account(USER, "the weights download")
    for path, mode in ((CONFIG_DIR, "0755"), (OPT_DIR, "0755")):
        files.directory(name=f"Create {path}", path=path, user="root", group="root", mode=mode)
    _own_folder(STATE_DIR)
    # From the committed hashed lock (roles/shared/tool_locks.py): every file pip fetches must
    # match a sha256 in it, wheels only; a new lock is a new stamp, so the environment is rebuilt.
    lock = tool_lock_text(WEIGHTS_TOOL)
    pins = f"huggingface_hub=={HF_HUB_VERSION} hf_xet=={HF_XET_VERSION} (lock {locked_env.stamp([lock])})"
    stamp = f"{ENV_DIR}/.inference-host-pins"
    installed = host.get_fact(FileText, path=stamp)
    files.put(
        name=f"Write {ENV_LOCK} ({WEIGHTS_TOOL.path.name})",
        src=StringIO(lock),
        dest=ENV_LOCK,
        user="root",
        group="root",
        mode="0644",
    )
    server.shell(
        name=f"Install {pins} into {ENV_DIR}",
        commands=[
            sh(
                "rm -rf -- {env} && python3 -m venv -- {env}"
                " && {env}/bin/pip install --quiet --no-cache-dir --require-hashes --only-binary :all: -r {lock}"
                " && echo {pins} > {stamp} || {{ rm -rf -- {env}; exit 1; }}",
                env=ENV_DIR,
                lock=ENV_LOCK,
                pins=pins,
                stamp=stamp,
            )
        ],
        _env=pip_environment(settings),
        _if=lambda: installed != pins,
    )
    files.put(
        name=f"Install {TOOL}",
        src="roles/weights/files/inference-host-weights",
        dest=TOOL,
        user="root",
        group="root",
        mode="0755",
    )


def _own_folder(path: str) -> None:
    """A folder of the download's user, 0755 (the guests' users read the weights). pyinfra's
    files.directory chowns recursively only when the folder's own owner differs
    (pyinfra/operations/files.py, directory): once, for a store root wrote before, then never;
    the mode is set on the folder alone (a recursive chmod would make every file executable)."""
    files.directory(
        name=f"Create {path}, {USER}'s (recursively, once)", path=path, user=USER, group=USER, recursive=True
    )
    files.directory(name=f"Set {path}'s mode to 0755", path=path, mode="0755", recursive=False)


def _weight_set(ws: WeightSet) -> None:
    unit = f"{unit_name(ws)}.service"
    _own_folder(ws.store_dir)
    config = files.put(
        name=f"Write {CONFIG_DIR}/{ws.name}.json ({ws.kind} {ws.repo}@{ws.revision})",
        src=StringIO(config_text(ws)),
        dest=f"{CONFIG_DIR}/{ws.name}.json",
        user="root",
        group="root",
        mode="0644",
    )
    written = files.template(
        name=f"Write /etc/systemd/system/{unit}",
        src="roles/weights/templates/inference-host-weights.service.j2",
        dest=f"/etc/systemd/system/{unit}",
        user="root",
        group="root",
        mode="0644",
        **unit_kwargs(ws),
        jinja_env_kwargs=templates.jinja_env_kwargs("roles/weights/templates/inference-host-weights.service.j2"),
    )
    systemd.daemon_reload(name="Reload systemd units", _if=written.did_change)
    systemd.service(name=f"Enable {unit} (a reboot resumes the download)", service=unit, enabled=True, running=None)
    state = host.get_fact(
        WeightsManifestState,
        tool=TOOL,
        directory=ws.store_dir,
        repo=ws.repo,
        revision=ws.revision,
        patterns=patterns_key(ws),
    )
    verify = ws.settings.verify
    why = (
        "full re-verification requested (weights_verify)"
        if verify
        else "first download"
        if state.get("state") == "no-tool"
        else f"{state.get('state')}: {state.get('detail', '')}".rstrip(": ")
    )
    python.call(
        name=f"Download and verify {ws.repo}@{ws.revision} into {ws.store_dir} ({why})",
        function=_follow,
        unit=unit,
        config=f"{CONFIG_DIR}/{ws.name}.json",
        verify=verify,
        # A running download continues (start is a no-op); new settings restart it (it resumes).
        restart=lambda: config.did_change() or written.did_change(),
        interval=ws.settings.progress_interval_s,
        _if=lambda: verify or state.get("state") != "verified" or config.did_change() or written.did_change(),
    )


def _follow(state, host, **arguments) -> bool:
    """python.call's callback: follow() as pyinfra runs a callback (its config and this host as the
    context, pyinfra/api/command.py FunctionCommand.execute), its failure the host's error line,
    not a traceback (roles/shared/refusal.py)."""
    from pyinfra.context import ctx_config, ctx_host

    with ctx_config.use(state.config.copy()), ctx_host.use(host):
        return status_of(host, follow, **arguments)


def _status(config: str) -> dict:
    ok, output = host.run_shell_command(sh("{tool} status --json --config={config}", tool=TOOL, config=config))
    if not ok:
        raise Refused(f"{host.name}: `{TOOL} status` failed: {output.stderr}")
    return json.loads(output.stdout)[0]


def _say(line: str) -> None:
    # stderr: stdout is pyinfra's own (JSON with --json).
    print(f"[{host.name}] {line}", file=sys.stderr, flush=True)


def follow(unit: str, config: str, verify: bool, restart, interval: int) -> None:
    """Start the unit (it resumes what is on disk) and print its progress until it is done.
    `restart`: a callable, asked at execution time (did the config or the unit change?)."""
    ok, output = host.run_shell_command("date +%s")
    started = float(output.stdout.strip() or 0)
    steps = [sh("systemctl reset-failed -- {unit} 2>/dev/null || true", unit=unit)]
    if verify:
        name = config.rsplit("/", 1)[-1].removesuffix(".json")
        steps.append(sh("touch -- {requested}", requested=f"{STATE_DIR}/{name}.verify-requested"))
    steps.append(sh("systemctl {verb} --no-block -- {unit}", verb="restart" if restart() else "start", unit=unit))
    ok, output = host.run_shell_command(chain(*steps))
    if not ok:
        raise Refused(f"{host.name}: could not start {unit}: {output.stderr}")
    last_print, idle_since = 0.0, time.monotonic()
    progress_mark, progress_at = None, time.monotonic()
    while True:
        time.sleep(min(2.0, interval))
        d = _status(config)
        s = d["status"]
        fresh = float(s.get("updated") or 0) >= started
        mark = (s.get("phase"), s.get("bytes_done"), s.get("bytes_hashed"), s.get("verify_index"))
        if mark != progress_mark:
            progress_mark, progress_at = mark, time.monotonic()
        elif s.get("phase") == "failed" and time.monotonic() - progress_at > STALL_S:
            # The unit keeps retrying on its own; the deploy stops waiting and says why.
            raise Refused(
                f"{host.name}: {unit} made no progress for {STALL_S // 60} minutes: {s.get('message')};"
                f" it keeps retrying every {RESTART_SEC} s (follow it: {TOOL} status)"
            )
        printed = time.monotonic() - last_print >= interval and fresh
        if printed:
            _say(d["line"])  # the tool's own wording (inference-host-weights status)
            last_print = time.monotonic()
        if fresh and s.get("phase") == "failed" and s.get("permanent"):
            break
        if d["unit_state"] in BUSY_STATES:
            idle_since = time.monotonic()
            continue
        if fresh or time.monotonic() - idle_since > 60:
            break
    if fresh and s.get("phase") == "done" and d["manifest"]["state"] == "verified":
        if not printed:
            _say(d["line"])
        return
    raise Refused(
        f"{host.name}: {unit} did not finish: {s.get('message') or d['unit_state']}"
        f" (journalctl -u {unit}; {TOOL} status)"
    )
