"""The A/B switch: the live unit restarted with another environment or command line through a
temporary systemd drop-in, for python -m checks.bench's --ab-* runs, and restored afterwards."""

from __future__ import annotations

import shlex
import time

from roles.shared import eagle3
from roles.shared.layout import unit_dropin_dir

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


def _restart(host, script: str, unit: str, timeout_s: int):
    """script, then the unit restarted: `systemctl restart` waits for the stop and the start job
    (a notify unit: the model's load), so its bound is the restart timeout, not systemctl's 60 s."""
    from checks import bounded

    command = f"bash -c {shlex.quote(script + f' && systemctl daemon-reload && systemctl restart {unit}')}"
    return bounded.run(host, command, what="systemctl", bound_s=timeout_s + 60)


def set_p2p(host, expect, disabled: bool | None, timeout_s: int) -> None:
    """disabled None: remove the A/B drop-in (as deployed). Restarts the unit and waits."""
    set_environment(host, expect, None if disabled is None else f"NCCL_P2P_DISABLE={int(disabled)}", timeout_s)


def set_environment(host, expect, assignment: str | None, timeout_s: int) -> None:
    """One VAR=value over the unit's environment (None: the drop-in removed, as deployed)."""
    folder = unit_dropin_dir(expect.unit_name)
    if assignment is None:
        script = f"rm -f {folder}/{AB_DROPIN} {folder}/{AB_ENV}"
    else:
        script = (
            f"mkdir -p {folder} && printf '{assignment}\\n' > {folder}/{AB_ENV} && "
            f"printf '[Service]\\nEnvironmentFile={folder}/{AB_ENV}\\n' > {folder}/{AB_DROPIN}"
        )
    result = _restart(host, script, expect.unit_name, timeout_s)
    if result.rc != 0:
        raise RuntimeError(f"could not set {assignment} on {expect.unit_name}: {result.stderr.strip()}")
    _wait_healthy(host, expect, timeout_s)


def _exec_start_path(host, unit: str) -> str:
    """The script the unit runs (`systemctl show -p ExecStart`: "{ path=/... ; argv[]=... }")."""
    text = host.run(f"systemctl show -p ExecStart --value {shlex.quote(unit)}").stdout
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
    if speculative is None:
        script = f"rm -f {folder}/{SPEC_DROPIN} {folder}/{SPEC_LAUNCHER}"
    else:
        launcher = _exec_start_path(host, expect.unit_name)
        text = host.run(f"cat {shlex.quote(launcher)}").stdout
        argv = eagle3.speculative_variant(eagle3.launcher_argv(text), speculative, draft_model_path)
        content = (
            "#!/bin/sh\n# A/B variant of the deployed launcher (checks/bench.py); removed after the run.\n"
            f"exec {shlex.join(argv)}\n"
        )
        encoded = base64.b64encode(content.encode()).decode()
        script = (
            f"mkdir -p {folder} && echo {encoded} | base64 -d > {folder}/{SPEC_LAUNCHER} && "
            f"chmod 0755 {folder}/{SPEC_LAUNCHER} && "
            f"printf '[Service]\\nExecStart=\\nExecStart={folder}/{SPEC_LAUNCHER}\\n' > {folder}/{SPEC_DROPIN}"
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
