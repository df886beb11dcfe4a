"""Run the real pyinfra CLI against @fake hosts and record what the deploy would do.

    python tests/unit/plans/record.py INVENTORY deploy.py > plan.jsonl

pyinfra's @fake connector executes nothing: facts answer from the inventory's
`fake_responses` (empty output otherwise, i.e. a fresh host) and operations "succeed".
This wrapper records every operation command (with the environment pyinfra exports in front
of it, `_env`) and every uploaded file's content, one JSON object a line on stdout, so that
plan tests can check the exact commands and files the roles issue against the real
repositories, without any host.
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


FakeConnector.run_shell_command = run_shell_command
FakeConnector.put_file = put_file

if __name__ == "__main__":
    import os

    from pyinfra_cli.main import main

    # One pass is recorded: the node's continuation (roles/proxmox_host, continue_in_guests)
    # would start the real CLI again, on the same fake hosts, writing to this record: this
    # says the last pass (PASS_ENV = MAX_PASSES there) is running.
    os.environ["INFERENCE_HOST_DEPLOY_PASS"] = "3"

    sys.argv = ["pyinfra", "-y", *sys.argv[1:]]
    main()
