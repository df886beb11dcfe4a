"""Loading a lab inventory starts nothing: the lab is brought up by the command that needs it (the
lab's pyinfra connector, lab/pyinfra-connector, as pyinfra connects to each `@lab/<role>` host).

Each lab inventory is loaded as pyinfra's CLI loads it (pyinfra.is_cli true, config.py's hooks
installed, pyinfra_cli.inventory.make_inventory), and as the checks load it (is_cli false), over
Docker and over SSH. A guard fails the load on the first program started (Docker's CLI included),
any use of Docker's socket, and any port bound or listened on.
"""

from __future__ import annotations

import os
import socket
import subprocess
import traceback
from pathlib import Path

import pytest

import lab
from lab import cuda_image

PROJECT_ROOT = Path(__file__).resolve().parents[2]
LAB_INVENTORIES = [
    "inventory/lab.py",
    "inventory/lab.py (engine wheels)",  # INFERENCE_HOST_LAB_ENGINE_WHEEL_SOURCE: @lab/local too
    "inventory/lab_replicas.py",
    "inventory/lab_builder.py",
    "tests/lab/inventories/eagle3.py",
    "tests/lab/inventories/proxmox_move.py",
    "tests/lab/inventories/replicas_vllm.py",
]


class SideEffect(AssertionError):
    pass


@pytest.fixture
def no_side_effects(monkeypatch):
    """Every way the lab starts something, refused with what was attempted (and from where).

    One program is run by a library, not by the lab, and is let run before the guard: importing
    ansible's vault (the inventory decrypts the lab's vault) imports ansible/utils/display.py
    (ansible-core 2.18), which finds libc with ctypes.util.find_library, and that runs
    `/sbin/ldconfig -p` once per process to read the linker's cache."""
    import ansible.utils.display  # noqa: F401

    def refuse(what):
        def refused(*args, **kwargs):
            project = [
                f"{Path(f.filename).relative_to(PROJECT_ROOT)}:{f.lineno}"
                for f in traceback.extract_stack()
                if f.filename.startswith(str(PROJECT_ROOT))
                and "/.venv/" not in f.filename
                and "tests/unit" not in f.filename
            ]
            raise SideEffect(f"loading the inventory {what} ({' < '.join(reversed(project))}): {args[1:2] or args[:1]}")

        return refused

    monkeypatch.setattr(subprocess.Popen, "_execute_child", refuse("started a program"))
    for name in ("system", "fork", "forkpty", "posix_spawn", "posix_spawnp", "execv", "execve"):
        monkeypatch.setattr(os, name, refuse(f"called os.{name}"))
    monkeypatch.setattr(socket.socket, "bind", refuse("bound a port"))
    monkeypatch.setattr(socket.socket, "listen", refuse("listened on a port"))
    connect = socket.socket.connect

    def connect_unless_docker(self, address, *args):
        if isinstance(address, str | bytes) and "docker" in os.fsdecode(address):
            raise SideEffect(f"loading the inventory talked to Docker's socket {address}")
        return connect(self, address, *args)

    monkeypatch.setattr(socket.socket, "connect", connect_unless_docker)


@pytest.fixture
def cuda_toolkit(tmp_path, monkeypatch):
    """A CUDA toolkit's files where the lab reads its version (bin/nvcc, include/cuda.h): the
    kernel wheel builder's inventories name their image after it, on any machine."""
    toolkit = tmp_path / "cuda-13.0"
    (toolkit / "bin").mkdir(parents=True)
    (toolkit / "bin" / "nvcc").write_text("")
    (toolkit / "include").mkdir()
    (toolkit / "include" / "cuda.h").write_text("#define CUDA_VERSION 13000\n")
    monkeypatch.setattr(cuda_image, "CUDA_ROOT", toolkit)
    return toolkit


@pytest.fixture
def engine_wheel_builder(cuda_toolkit, tmp_path, monkeypatch):
    """inventory/lab.py with its @lab/local builder, as tests/lab/test_engine_wheels.py runs it."""
    monkeypatch.setenv("INFERENCE_HOST_LAB_ENGINE_WHEEL_SOURCE", str(tmp_path / "flash-attn"))
    monkeypatch.setenv("INFERENCE_HOST_LAB_WHEELHOUSE", str(tmp_path / "wheelhouse"))


def load_as_pyinfra_cli(inventory: str, is_cli: bool = True):
    """What pyinfra_cli/cli.py (3.10) does before it connects: config.py, then make_inventory."""
    import runpy

    import pyinfra
    from pyinfra.api import State
    from pyinfra.context import ctx_state
    from pyinfra_cli.inventory import make_inventory

    was = pyinfra.is_cli
    pyinfra.is_cli = is_cli
    try:
        runpy.run_path(str(PROJECT_ROOT / "config.py"))
        with ctx_state.use(State()):
            return make_inventory(str(PROJECT_ROOT / inventory), cwd=str(PROJECT_ROOT))
    finally:
        pyinfra.is_cli = was


@pytest.mark.parametrize("connect", ["docker", "ssh"])
@pytest.mark.parametrize("is_cli", [True, False], ids=["pyinfra", "checks"])
@pytest.mark.parametrize("inventory", LAB_INVENTORIES)
def test_loading_a_lab_inventory_starts_nothing(
    inventory, is_cli, connect, cuda_toolkit, request, monkeypatch, no_side_effects
):
    if inventory.endswith("(engine wheels)"):
        request.getfixturevalue("engine_wheel_builder")
    monkeypatch.setattr(lab, "CONNECT", connect)
    hosts = load_as_pyinfra_cli(inventory.split()[0], is_cli)
    lab_hosts = [h for h in hosts if h.data.get("lab_role")]
    assert lab_hosts, f"{inventory} names no @lab/<role> host"
    for host in lab_hosts:
        assert host.connector_cls.__name__ == "LabConnector"
        role = host.data.lab_role
        expected = "@local" if role == "local" else lab.pyinfra_name(role)
        assert host.name == expected


def test_lab_py_names_its_hosts_as_before_and_the_local_builder(engine_wheel_builder, no_side_effects):
    hosts = {h.name: h.data.lab_role for h in load_as_pyinfra_cli("inventory/lab.py")}
    assert hosts == {lab.pyinfra_name("pve"): "pve", lab.pyinfra_name("gpu"): "gpu", "@local": "local"}


@pytest.mark.parametrize("planted", ["serve", "address"])
def test_the_guard_sees_a_planted_bring_up(planted, monkeypatch, no_side_effects):
    """The guard is not blind: inventory/lab.py as it was (its apt stand-in served while it
    loaded), or one asking Docker for a container's address, fails the load."""
    from lab.standins.nvidia_apt_repo import repo

    # A prefix no lab serves: a server already answering on the port would be reused, not started.
    monkeypatch.setattr(lab, "PREFIX", f"ih-unit-guard-{os.getpid()}")
    if planted == "serve":
        real_url_for, real_serve = repo.url_for, repo.serve

        def served(prefix):  # serve() names its URL with url_for: the real one from here on
            monkeypatch.setattr(repo, "url_for", real_url_for)
            return real_serve(prefix)

        monkeypatch.setattr(repo, "url_for", served)
    else:
        monkeypatch.setattr(repo, "url_for", lambda prefix: f"http://{lab.container_address('gpu')}:1")
    with pytest.raises(Exception) as raised:  # pyinfra wraps it: UnexpectedExternalError(error, file)
        load_as_pyinfra_cli("inventory/lab.py")
    error = raised.value.args[0] if raised.value.args and isinstance(raised.value.args[0], Exception) else raised.value
    assert isinstance(error, SideEffect), repr(raised.value)
    assert "started a program" in str(error) and "inventory/lab.py" in str(error), error


def test_the_guard_sees_docker_asked_for_an_address(monkeypatch, no_side_effects):
    with pytest.raises(SideEffect, match="started a program"):
        lab.container_address("gpu")


def test_an_unknown_lab_role_is_one_line(tmp_path, no_side_effects):
    from inference_host_lab_connector import LabConnector
    from pyinfra.api.exceptions import InventoryError

    with pytest.raises(InventoryError) as raised:
        list(LabConnector.make_names_data("gpu0"))
    assert str(raised.value) == (
        "@lab/gpu0: no such lab host; expected @lab/ followed by one of " + ", ".join([*lab.HOSTS, "local"])
    )


def test_lab_down_removes_every_lab_of_the_prefix(monkeypatch):
    """`inference-host lab down` removes the replica labs' containers too, not only the main lab's."""
    import lab
    from lab.__main__ import main

    calls = []
    monkeypatch.setattr(lab, "_docker", lambda *args, **kwargs: calls.append(args))
    assert main(["down"]) == 0
    removed = {args[-1] for args in calls if args[:2] == ("rm", "-f")}
    assert removed == {lab.container_name(role) for role in lab.HOSTS}
    assert {"rep-a", "gw", "vgw"} <= set(lab.HOSTS)
    assert ("volume", "rm", "-f", lab.models_volume()) in calls
