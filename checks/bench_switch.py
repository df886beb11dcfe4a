"""The A/B switch: the live unit restarted with another environment or command line through a
temporary systemd drop-in, for python -m checks.bench's --ab-* runs, and restored afterwards."""

from __future__ import annotations

import time

from roles.shared import eagle3
from roles.shared.layout import unit_dropin_dir
from roles.shared.shell import Shell, argv, sh

AB_DROPIN = "90-inference-host-bench-ab.conf"
AB_ENV = "bench-ab.env"
SPEC_DROPIN = "90-inference-host-bench-spec.conf"
SPEC_LAUNCHER = "bench-spec-launch"

# -- the A/B switch on the host --------------------------------------------------------------------


def _wait_healthy(host, expect, timeout_s: int) -> None:
    from checks import server_checks

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server_checks.request(host, expect, "/health", with_key=False, timeout_s=10).status == 200:
            return
        time.sleep(10)
    raise RuntimeError(f"{expect.unit_name} did not answer /health within {timeout_s} s after a restart")


def _restart(host, script: Shell, unit: str, timeout_s: int):
    """script, then the unit restarted: `systemctl restart` waits for the stop and the start job
    (a notify unit: the model's load), so its bound is the restart timeout, not systemctl's 60 s."""
    from checks import bounded

    return bounded.run(host, _then_restart(script, unit), what="systemctl", bound_s=timeout_s + 60)


def set_p2p(host, expect, disabled: bool | None, timeout_s: int) -> None:
    """disabled None: remove the A/B drop-in (as deployed). Restarts the unit and waits."""
    set_environment(host, expect, None if disabled is None else f"NCCL_P2P_DISABLE={int(disabled)}", timeout_s)


def set_environment(host, expect, assignment: str | None, timeout_s: int) -> None:
    """One VAR=value over the unit's environment (None: the drop-in removed, as deployed)."""
    folder = unit_dropin_dir(expect.unit_name)
    dropin, env_file = f"{folder}/{AB_DROPIN}", f"{folder}/{AB_ENV}"
    if assignment is None:
        script = sh("rm -f -- {dropin} {env_file}", dropin=dropin, env_file=env_file)
    else:
        # printf's format is ours: the assignment is an argument, written as given.
        script = sh(
            "mkdir -p -- {folder} && printf '%s\\n' {assignment} > {env_file}"
            " && printf '%s\\n' '[Service]' {line} > {dropin}",
            folder=folder,
            assignment=assignment,
            env_file=env_file,
            line=f"EnvironmentFile={env_file}",
            dropin=dropin,
        )
    result = _restart(host, script, expect.unit_name, timeout_s)
    if result.rc != 0:
        raise RuntimeError(f"could not set {assignment} on {expect.unit_name}: {result.stderr.strip()}")
    _wait_healthy(host, expect, timeout_s)


def _then_restart(script: Shell, unit: str) -> Shell:
    """script, then the unit restarted on its new drop-in, as one bash command."""
    full = sh("{script} && systemctl daemon-reload && systemctl restart -- {unit}", script=script, unit=unit)
    return sh("bash -c {full}", full=str(full))


def _exec_start_path(host, unit: str) -> str:
    """The script the unit runs (`systemctl show -p ExecStart`: "{ path=/... ; argv[]=... }")."""
    text = host.run(sh("systemctl show -p ExecStart --value -- {unit}", unit=unit)).stdout
    for part in text.replace("{", " ").split(";"):
        part = part.strip()
        if part.startswith("path="):
            return part.removeprefix("path=").strip()
    raise RuntimeError(f"could not read the ExecStart of {unit}: {text.strip()!r}")


def set_speculative(
    host, expect, speculative: bool | None, timeout_s: int, draft_model_path: str | None = None
) -> None:
    """speculative None: remove the A/B drop-in (as deployed). Else run the deployed command with
    speculative decoding on (optionally another drafter) or off. Restarts the unit and waits."""
    import base64

    folder = unit_dropin_dir(expect.unit_name)
    dropin, variant = f"{folder}/{SPEC_DROPIN}", f"{folder}/{SPEC_LAUNCHER}"
    if speculative is None:
        script = sh("rm -f -- {dropin} {variant}", dropin=dropin, variant=variant)
    else:
        launcher = _exec_start_path(host, expect.unit_name)
        text = host.run(sh("cat -- {file}", file=launcher)).stdout
        words = eagle3.speculative_variant(eagle3.launcher_argv(text), speculative, draft_model_path)
        content = (
            "#!/bin/sh\n# A/B variant of the deployed launcher (checks/bench.py); removed after the run.\n"
            f"exec {argv(*words)}\n"
        )
        encoded = base64.b64encode(content.encode()).decode()
        script = sh(
            "mkdir -p -- {folder} && echo {encoded} | base64 -d > {variant} && chmod 0755 -- {variant}"
            " && printf '%s\\n' '[Service]' 'ExecStart=' {line} > {dropin}",
            folder=folder,
            encoded=encoded,
            variant=variant,
            line=f"ExecStart={variant}",
            dropin=dropin,
        )
    result = _restart(host, script, expect.unit_name, timeout_s)
    if result.rc != 0:
        raise RuntimeError(f"could not switch speculative decoding on {expect.unit_name}: {result.stderr.strip()}")
    _wait_healthy(host, expect, timeout_s)


def speculative_figures(host, expect) -> dict | None:
    """sglang:spec_accept_length after a run (None when the server does not speculate)."""
    from checks import server_checks, speculative_checks

    if not expect.enable_metrics:
        return None
    answer = server_checks.request(host, expect, "/metrics", with_key=False)
    value = speculative_checks.metrics_accept_length(answer.body) if answer.status == 200 else None
    return {"metrics_accept_length": value} if value else None
