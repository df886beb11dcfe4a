"""Facts of roles/docker_engine."""

from __future__ import annotations

import json

from pyinfra.api import FactBase

from roles.shared.fact_batch import batched

DAEMON_JSON = "/etc/docker/daemon.json"


def parse_daemon_json(text: str) -> dict:
    """daemon.json text -> dict ({} for an empty file); TypeError for JSON that is not an object."""
    if not text.strip():
        return {}
    value = json.loads(text)
    if not isinstance(value, dict):
        raise TypeError(f"{DAEMON_JSON} holds {type(value).__name__}, expected a JSON object")
    return value


@batched
class DockerDaemonConfig(FactBase):
    """Returns /etc/docker/daemon.json as a dict, or None when the file does not exist."""

    def command(self) -> str:
        return f"test -e {DAEMON_JSON} && {{ echo present; cat {DAEMON_JSON}; }} || true"

    def process(self, output) -> dict | None:
        if not output or output[0].strip() != "present":
            return None
        return parse_daemon_json("\n".join(output[1:]))
