"""STAND-IN for a dead man's switch service (server.py), served to the lab containers: the
heartbeat receiver Alertmanager's Watchdog reaches (monitoring_heartbeat_url_secret).

inventory/lab.py's vault holds `ping_url(prefix)` as monitoring_heartbeat_url (lab/vault.py); a
lab test starts the stand-in with `serving(prefix)` for as long as it needs it and reads the pings
it recorded. When nothing serves it (the walk, other tests), Alertmanager logs a failed delivery
per beat, as it would with the service unreachable.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[3]
STATE_ROOT = PROJECT_ROOT / ".lab" / "heartbeat"  # git-ignored


def port_for(prefix: str) -> int:
    """Stable per lab prefix (the URL is in the guest's alertmanager.yml), away from the apt
    stand-in's (20000-39999) and the Hub stand-in's (40000-49999) ranges."""
    return 50000 + int(hashlib.sha256(prefix.encode()).hexdigest(), 16) % 5000


def check_uuid(prefix: str) -> str:
    """The check's UUID, stable per prefix (a real service mints a random one: the URL's secret)."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"inference-host-lab-heartbeat/{prefix}"))


def _address() -> str:
    from lab.standins.nvidia_apt_repo.repo import bridge_gateway

    try:
        return bridge_gateway()
    except (RuntimeError, OSError):
        return "172.17.0.1"  # Docker's default; validation must work without an engine


def ping_url(prefix: str) -> str:
    return f"http://{_address()}:{port_for(prefix)}/ping/{check_uuid(prefix)}"


class Pings:
    def __init__(self, log: Path):
        self.log = log

    def all(self) -> list[dict]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]

    def since(self, when: float) -> list[dict]:
        return [p for p in self.all() if p["at"] >= when]


@contextlib.contextmanager
def serving(prefix: str):
    """The stand-in on the Docker bridge while the block runs; yields its Pings (a fresh log)."""
    folder = STATE_ROOT / prefix
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "pings.jsonl"
    log.unlink(missing_ok=True)
    address, port = _address(), port_for(prefix)
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "lab.standins.heartbeat.server",
            "--bind",
            address,
            "--port",
            str(port),
            "--check",
            check_uuid(prefix),
            "--log",
            str(log),
        ],
        cwd=PROJECT_ROOT,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                urllib.request.urlopen(f"http://{address}:{port}/ready", timeout=1).read()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the heartbeat stand-in could not be served on {address}:{port}: "
                        + (
                            process.stderr.read().decode()
                            if process.stderr and process.poll() is not None
                            else "no answer in 10 s"
                        )
                    ) from None
                time.sleep(0.1)
        yield Pings(log)
    finally:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
