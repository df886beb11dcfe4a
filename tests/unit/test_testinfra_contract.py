"""testinfra 10.2.2's backend interface, as checks/bounded.py relies on it.

bounded.bound() replaces `run` and `run_local` on one backend instance and calls the backend's own
`quote`, `encode` and `result` (testinfra/backend/base.py). That bounds every command only while
these hold: each process backend's `run` ends in `self.run_local` (so the bounded run_local kills
what overruns), every other backend is one bounded.py waits for in a thread, the helpers keep their
shapes, and testinfra's modules (host.file, ...) run through `backend.run`. pyproject.toml pins
testinfra exactly (tests/unit/test_pyinfra_public_contract.py); an upgrade that breaks one of these
fails here, naming it, instead of a check that hangs on the target.
"""

from __future__ import annotations

import base64
import inspect

import pytest
import testinfra.backend
from testinfra.backend import base

from checks import bounded

# Backends that talk to the host from a library in this process (no local process to kill):
# bounded.py runs their `run` in a thread it gives up at the local bound (Runner._call).
LIBRARY_BACKENDS = {"paramiko", "salt", "ansible", "winrm"}


def test_every_backend_testinfra_has_is_one_bounded_py_knows():
    """A backend added upstream must be sorted into one kind or the other before it is used."""
    assert set(testinfra.backend.BACKENDS) == bounded.RUN_LOCAL_BACKENDS | LIBRARY_BACKENDS
    assert not bounded.RUN_LOCAL_BACKENDS & LIBRARY_BACKENDS


def _backend(name: str, tmp_path):
    cls = testinfra.backend.get_backend_class(name)
    assert cls.NAME == name
    if name == "local":
        return cls()
    return cls(str(tmp_path) if name == "chroot" else "somehost")


@pytest.mark.parametrize("name", sorted(bounded.RUN_LOCAL_BACKENDS))
def test_a_process_backends_run_ends_in_its_own_run_local(name, tmp_path):
    """Each process backend's run hands the whole command line to self.run_local, the method
    bound() replaces; the words given to run arrive quoted by the backend's own quote."""
    backend = _backend(name, tmp_path)
    seen: list[str] = []
    # safe-ssh parses its framed answer ("TESTINFRA_START;rc;b64 out;b64 err;TESTINFRA_END")
    framed = f"TESTINFRA_START;0;{base64.b64encode(b'out').decode()};;TESTINFRA_END\n".encode()

    def run_local(command, *args):
        seen.append(backend.quote(command, *args))
        return backend.result(0, backend.encode(seen[-1]), framed, b"")

    backend.run_local = run_local
    backend.run("printf %s", "two words")
    assert len(seen) == 1, seen
    assert "two words" in seen[0] and "printf" in seen[0]


def test_the_helpers_bounded_calls_keep_their_shapes():
    assert list(inspect.signature(base.BaseBackend.run_local).parameters) == ["self", "command", "args"]
    assert list(inspect.signature(base.BaseBackend.result).parameters) == ["self", "rc", "cmd", "stdout", "stderr"]
    assert base.BaseBackend.quote("echo %s %s", "a b", "$(x)") == "echo 'a b' '$(x)'"
    assert base.BaseBackend.quote("echo 100%") == "echo 100%"  # no args: the text as it is
    backend = _backend("local", None)
    assert backend.encode("echo hi") == b"echo hi"
    result = backend.result(3, b"cmd", b"out\n", b"err\n")
    assert (result.rc, result.command, result.stdout_bytes, result.stderr_bytes) == (3, b"cmd", b"out\n", b"err\n")
    assert (result.stdout, result.stderr) == ("out\n", "err\n")


def test_testinfras_own_modules_run_through_the_bounded_run():
    """host.file(...) and host.run(...) both reach backend.run, so bound() covers them."""
    host = bounded.own_host("local://")
    runner = host.backend._ih_runner
    seen: list[str] = []
    plain = runner.run

    def recording(command):
        seen.append(command)
        return plain(command)

    runner.run = recording
    try:
        assert host.file("/").is_directory
        assert host.run("echo %s", "a b").stdout == "a b\n"
    finally:
        bounded.release(host)
    assert any("/" in command and "test" in command for command in seen), seen
    assert "echo 'a b'" in seen
