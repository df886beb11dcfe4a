"""The job's side of the engine: it runs as its own unprivileged user, so what needs root (stopping
the engine for the GPU steps, serving an A/B variant through a drop-in, restoring it, publishing
the export where the engine reads it) is asked of the root helper, one fixed verb at a time:
`systemctl start inference-host-eagle3-engine@<verb>.service`, which a polkit rule lets this user
start for exactly these instances (roles/eagle3_training/templates/60-inference-host-eagle3.rules.j2).
The helper takes no argument from here but its verb: every path it acts on is in the root-owned
config the deploy wrote. The rest (the engine's health, its client key) needs no privilege.
Standard library only.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

try:
    from . import jobspec
except ImportError:  # a script on the host: its folder is sys.path[0]
    import jobspec  # type: ignore[no-redef]

HELPER_UNIT = "inference-host-eagle3-engine"
# The helper's fixed interface (engine_helper.py refuses any other instance; the polkit rule
# allows no other): stop the engine, serve the drafter the export replaced or the export itself
# for an A/B run, restore the deployed engine, publish the staged export.
VERBS = ("stop", "baseline", "candidate", "restore", "publish")


def helper_argv(verb: str) -> list[str]:
    if verb not in VERBS:
        raise ValueError(f"{verb!r} is not a verb of {HELPER_UNIT}@ ({', '.join(VERBS)})")
    # Blocks until the helper's oneshot finished; its failure is this command's.
    return ["systemctl", "start", "--", f"{HELPER_UNIT}@{verb}.service"]


def ask(log: jobspec.Log, verb: str, run: Callable | None = None) -> None:
    """The helper's verb, done (or a StepError that says where its own log is)."""
    try:
        (run or jobspec.run_command)(log, helper_argv(verb))
    except jobspec.StepError:
        raise jobspec.StepError(
            f"the root helper's {verb} failed: journalctl -u {HELPER_UNIT}@{verb}.service"
        ) from None


def api_key(cfg: dict) -> str | None:
    """The client key from the job's own copy (0600, its user's; written by the deploy only when
    the engine has a key): {"api-key": "<client key>"}. Never the engine's --config file, which
    holds the admin key too, and is a list with tenant keys (docs/security.md)."""
    path = Path(cfg["target"]["api_key_file"])
    if not path.is_file():
        return None
    key = json.loads(path.read_text()).get("api-key")
    if not isinstance(key, str) or not key:
        raise ValueError(f"{path}: api-key is not a non-empty string (the deploy writes one)")
    return key


def http_status(url: str, key: str | None = None, timeout: float = 10) -> int:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return 0


def healthy_within(cfg: dict, timeout_s: int) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if http_status(f"http://{cfg['target']['server']}/health") == 200:
            return True
        time.sleep(5)
    return False
