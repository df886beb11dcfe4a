"""The lab's pyinfra connector: a lab inventory names its hosts `@lab/<role>` (lab.HOSTS), and
the lab is brought up by the command that connects to them, not by loading the inventory.

    gpu_nodes = [("@lab/gpu", {...})]        # inventory/lab.py

- make_names_data (while the inventory loads: reads, starts nothing) names the host as pyinfra's
  own connector for it would, `@docker/<prefix>-<role>` (or `<prefix>-<role>` over SSH,
  INFERENCE_HOST_LAB_CONNECT=ssh; `@local` for `@lab/local`, the kernel wheel builder), so
  --limit, every message and the health checks (testinfra's docker:// or ssh://) keep the names
  they had, and gives it the data that connector reads (docker_identifier, or the ssh_* keys).
- connect() brings up what the host needs (lab.bring_up: its container and the ones it needs,
  what the lab copies in, the stand-in servers its deploy reaches), puts the running
  container's address into the host's ssh_hostname when the host has one (and, for
  `@lab/local`, the pushed CUDA image's digest into build_base_image), then connects
  through pyinfra's own connector (docker, ssh or local), to which everything else is handed.

pyinfra connects hosts in parallel greenlets (pyinfra/api/connect.py connect_all); one bring-up
runs at a time (a gevent semaphore: pyinfra's CLI monkey-patches subprocess, so a greenlet
waiting on `docker` lets the next one run), and lab.bring_up does each part once per process.

The interface mirrors pyinfra 3.10's pyinfra/connectors/base.py (BaseConnector) and
pyinfra/connectors/docker.py (DockerConnector), which this connector drives.
"""

from __future__ import annotations

import io
import os
from typing import Any

import click
import gevent.lock
from pyinfra.api.exceptions import ConnectError, InventoryError
from pyinfra.api.util import get_file_io
from pyinfra.connectors.base import BaseConnector, DataMeta
from pyinfra.connectors.docker import DockerConnector
from pyinfra.connectors.local import LocalConnector
from pyinfra.connectors.ssh import SSHConnector
from pyinfra.connectors.util import extract_control_arguments, make_unix_command_for_host
from typing_extensions import TypedDict

from inference_host_lab_connector.shell import ShellSession, command_output

LOCAL = "local"  # `@lab/local`: this machine, as the lab's kernel wheel builder


class ConnectorData(TypedDict):
    lab_role: str


connector_data_meta: dict[str, DataMeta] = {
    "lab_role": DataMeta("The lab host this is (lab.HOSTS, or local); set from the name @lab/<role>"),
}

# Larger uploads (an engine wheel, the checks' bundle may grow) go by `docker cp`: the session's
# shell reads a here-document into memory.
SESSION_UPLOAD_LIMIT = 4 * 1024 * 1024

# One bring-up at a time in this process (see the module's docstring).
_one_at_a_time = gevent.lock.Semaphore()


def _lab_shell_wanted(arguments) -> bool:
    """Commands go through the host's open shell (shell.py) unless they send stdin or ask for a
    terminal, or INFERENCE_HOST_LAB_SHELL=exec asks for pyinfra's docker exec per command."""
    if os.environ.get("INFERENCE_HOST_LAB_SHELL", "session") == "exec":
        return False
    return not arguments.get("_stdin") and not arguments.get("_get_pty")


def _lab():
    """The project's lab package (lab/): importable wherever a lab inventory is, which imports it
    itself; this distribution does not import it at entry-point load (see pyproject.toml)."""
    try:
        import lab
    except ImportError as error:
        raise InventoryError(
            f"@lab hosts need the project's lab package on the import path"
            f" (run pyinfra from the project's root): {error}"
        ) from None
    return lab


class LabConnector(BaseConnector):
    """Hosts of the inference-host lab: `@lab/<role>` brings its container up as pyinfra
    connects, then works through pyinfra's docker (or ssh, or local) connector."""

    handles_execution = True

    data_cls = ConnectorData
    data_meta = connector_data_meta
    data: ConnectorData

    # pyinfra's docker, ssh or local connector, made at connect (Any: the open shell reads the
    # docker connector's own docker_cmd and container_id, which BaseConnector does not declare).
    delegate: Any = None
    session: ShellSession | None = None  # this host's open shell (shell.py), once a command ran

    @staticmethod
    def make_names_data(name=None):
        lab = _lab()
        role = name or ""
        if role != LOCAL and role not in lab.HOSTS:
            raise InventoryError(
                f"@lab/{role}: no such lab host; expected @lab/ followed by one of " + ", ".join([*lab.HOSTS, LOCAL])
            )
        if role == LOCAL:
            yield "@local", {"lab_role": role}, ["@lab"]
        elif lab.CONNECT == "ssh":
            yield lab.pyinfra_name(role), {"lab_role": role, **lab.ssh_connection_data(role)}, ["@lab"]
        else:
            yield lab.pyinfra_name(role), {"lab_role": role, "docker_identifier": lab.container_name(role)}, ["@lab"]

    def _delegate_class(self) -> type[BaseConnector]:
        if self.data["lab_role"] == LOCAL:
            return LocalConnector
        return SSHConnector if _lab().CONNECT == "ssh" else DockerConnector

    def connect(self) -> None:
        lab = _lab()
        role = self.data["lab_role"]
        with _one_at_a_time:
            try:
                lab.bring_up(role)
                named = self.host.data.get("build_base_image")
                if role == LOCAL and lab.pinned_base_image(named) != named:
                    # The same way as ssh_hostname below: the lab's CUDA image has a digest only
                    # once pushed, after the inventory loaded (lab/cuda_image.py PENDING).
                    self.host.data.build_base_image = lab.pinned_base_image(named)
                if role != LOCAL and self.host.data.get("ssh_hostname"):
                    # pyinfra's way to set host data after loading (HostData.__setattr__): the
                    # deploy's site, built after every host connected, reads the live address.
                    self.host.data.ssh_hostname = lab.container_address(role)
            except Exception as error:  # whatever stopped it fails this host, in one line
                raise ConnectError(f"the lab could not bring up {role}: {type(error).__name__}: {error}") from None
        if self.delegate is None:
            # Made now, not in __init__: pyinfra's connectors read their data from the host's data
            # as they are made (BaseConnector.__init__), and ssh_hostname was only just set.
            self.delegate = self._delegate_class()(self.state, self.host)
        elif "ssh_hostname" in self.delegate.data:
            self.delegate.data["ssh_hostname"] = self.host.data.get("ssh_hostname")
        # A reconnect (after the node's reboot) keeps the same one, as pyinfra keeps a host's
        # connector: DockerConnector remembers that it found the container running (no_stop); a
        # new one that found it stopped mid-restart would commit and remove it on disconnect.
        self.delegate.connect()

    def disconnect(self) -> None:
        if self.session is not None:
            self.session.close()
            self.session = None
        if self.delegate is not None:
            self.delegate.disconnect()

    def run_shell_command(self, command, print_output=False, print_input=False, **arguments):
        if not isinstance(self.delegate, DockerConnector) or not _lab_shell_wanted(arguments):
            return self.delegate.run_shell_command(
                command, print_output=print_output, print_input=print_input, **arguments
            )
        return self._run_in_session(command, print_output, print_input, arguments)

    def _session(self) -> ShellSession:
        if self.session is None:
            self.session = ShellSession([self.delegate.docker_cmd, "exec", "-i", self.delegate.container_id, "sh"])
        return self.session

    def _run_in_session(self, command, print_output, print_input, arguments):
        """The command through this host's open shell (shell.py says why and what stays as
        docker exec made it), with pyinfra's wrapping, timeout and exit codes."""
        control = extract_control_arguments(arguments)
        unix_command = make_unix_command_for_host(self.state, self.host, command, **arguments)
        if print_input:
            click.echo(f"{self.host.print_prefix}>>> {unix_command}", err=True)
        status, stdout, stderr = self._session().run(unix_command.get_raw_value(), timeout=control.get("_timeout"))
        if print_output:
            for line in stdout:
                click.echo(f"{self.host.print_prefix}{line}", err=True)
            for line in stderr:
                click.echo(f"{self.host.print_prefix}{click.style(line, 'red')}", err=True)
        codes = control.get("_success_exit_codes")
        return (status in codes if codes else status == 0), command_output(stdout, stderr)

    def put_file(
        self,
        filename_or_io,
        remote_filename,
        remote_temp_filename=None,
        print_output=False,
        print_input=False,
        **arguments,
    ):
        if isinstance(self.delegate, DockerConnector) and _lab_shell_wanted(arguments):
            with get_file_io(filename_or_io) as file_io:
                data = file_io.read()
            data = data.encode() if isinstance(data, str) else data
            if len(data) <= SESSION_UPLOAD_LIMIT:
                status, _, stderr = self._session().put(data, remote_filename)
                if status != 0:
                    raise OSError("\n".join(stderr))  # as pyinfra's docker connector fails an upload
                return True
            filename_or_io = io.BytesIO(data)
        return self.delegate.put_file(
            filename_or_io, remote_filename, remote_temp_filename, print_output, print_input, **arguments
        )

    def get_file(
        self,
        remote_filename,
        filename_or_io,
        remote_temp_filename=None,
        print_output=False,
        print_input=False,
        **arguments,
    ):
        return self.delegate.get_file(
            remote_filename, filename_or_io, remote_temp_filename, print_output, print_input, **arguments
        )

    def check_can_rsync(self) -> None:
        return self.delegate.check_can_rsync()

    def rsync(self, src, dest, flags, print_output=False, print_input=False, **arguments):
        return self.delegate.rsync(src, dest, flags, print_output=print_output, print_input=print_input, **arguments)
