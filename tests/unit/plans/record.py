"""Run the real pyinfra CLI against @fake hosts and record what the deploy would do.

    python tests/unit/plans/record.py INVENTORY deploy.py > plan.jsonl
    python tests/unit/plans/record.py --stated INVENTORY deploy.py > files.json

pyinfra's @fake connector executes nothing: facts answer from the inventory's
`fake_responses` (empty output otherwise, i.e. a fresh host) and operations "succeed".
This wrapper records every operation command (with the environment pyinfra exports in front
of it, `_env`) and every uploaded file's content, one JSON object a line on stdout, so that
plan tests can check the exact commands and files the roles issue against the real
repositories, without any host.

With --stated, any inventory (the examples' real host names and connectors included) is
recorded by the preview's recorder (roles/recording.py) against the preview's stated state
(roles/stated_state.py), under pyinfra's own CLI: the output is one JSON object, host -> the
preview's files of that host (roles/render.py's files_of), for tests/unit/test_preview_is_the_deploy.py.
"""

from __future__ import annotations

import inspect
import json
import sys

from pyinfra.connectors.fake import FakeConnector

_record = sys.stdout
sys.stdout = sys.stderr  # pyinfra's own output must not mix with the record


def _is_fact() -> bool:
    return any(frame.filename.endswith("pyinfra/api/facts.py") for frame in inspect.stack())


_run_shell_command = FakeConnector.run_shell_command
_put_file = FakeConnector.put_file


def run_shell_command(self, command, *args, **kwargs):
    text = command if isinstance(command, str) else command.get_masked_value()
    if not _is_fact():
        record = {"host": self.host.name, "command": text}
        if kwargs.get("_env"):  # pyinfra exports these in front of the command (connectors/util.py)
            record["env"] = {key: str(value) for key, value in kwargs["_env"].items()}
        _record.write(json.dumps(record) + "\n")
    return _run_shell_command(self, command, *args, **kwargs)


def put_file(self, filename_or_io, remote_filename, *args, **kwargs):
    if hasattr(filename_or_io, "read"):
        filename_or_io.seek(0)
        content = filename_or_io.read()
        filename_or_io.seek(0)
    else:
        with open(filename_or_io, "rb") as handle:
            content = handle.read()
    if isinstance(content, bytes):
        content = content.decode()
    _record.write(json.dumps({"host": self.host.name, "upload": remote_filename, "content": content}) + "\n")
    return _put_file(self, filename_or_io, remote_filename, *args, **kwargs)


def _record_plainly() -> None:
    FakeConnector.run_shell_command = run_shell_command
    FakeConnector.put_file = put_file


def _stated(inventory_file: str) -> dict:
    """Points the inventory pyinfra's CLI makes at the stated state; returns what it records."""
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the project (pyinfra adds it later)
    from pyinfra_cli import cli

    import validation
    from roles import recording, stated_state
    from roles.site import current, load_site, loading

    site = load_site(inventory_file, validation.ROLE_CHECKS)
    current.STATED_SECRETS.update(stated_state.secrets(site))
    # The stated vault is never opened: the CLI's load would ask for its password.
    loading._require_decryptable = lambda site: None
    recorded: dict = {}
    make_inventory = cli.make_inventory

    def make_stated(*args, **kwargs):
        inventory = make_inventory(*args, **kwargs)
        answers = lambda name: stated_state.answers(site.hosts[name], site)  # noqa: E731
        block = recording.recording(inventory, answers, stated_state.LOCAL)
        recorded["hosts"] = block.__enter__()  # until the process ends (held: its end restores)
        recorded["block"] = block
        recorded["names"] = [host.name for host in inventory]
        return inventory

    cli.make_inventory = make_stated
    return {"site": site, "recorded": recorded}


def _write_stated(stated: dict) -> None:
    import base64

    from roles import recording, render

    out = {}
    for name in stated["recorded"].get("names", []):
        host = stated["recorded"]["hosts"].get(name, recording.Recording())
        files = render.files_of(host, stated["site"].hosts[name])
        out[name] = {
            path: {"base64": base64.b64encode(text).decode()} if isinstance(text, bytes) else text
            for path, text in files.items()
        }
    _record.write(json.dumps(out, sort_keys=True) + "\n")


if __name__ == "__main__":
    import os

    from pyinfra_cli.main import main

    stated = None
    if sys.argv[1] == "--stated":
        del sys.argv[1]
        # The fact batch remembers each host's facts in the user's cache (roles/shared/fact_batch.py):
        # the examples' real host names are not written there, and no earlier run is batched.
        import tempfile

        os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="record-stated-")
        stated = _stated(sys.argv[1])
    else:
        _record_plainly()

    # One pass is recorded: the node's continuation (roles/proxmox_host, continue_in_guests)
    # would start the real CLI again, on the same fake hosts, writing to this record: this
    # says the last pass (PASS_ENV = MAX_PASSES there) is running.
    if stated is None:  # (the stated deploy records its continuation, which never runs)
        os.environ["INFERENCE_HOST_DEPLOY_PASS"] = "3"

    sys.argv = ["pyinfra", "-y", *sys.argv[1:]]
    try:
        main()
    finally:
        if stated is not None:
            _write_stated(stated)
