"""Unit-test helpers: write throwaway inventories (with their stack file) into tmp folders."""

from __future__ import annotations

import shutil
import signal
import textwrap
import warnings
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def as_a_shell_starts_it() -> None:
    """preexec_fn for a command a test interrupts as a terminal does: SIGINT at its default action
    and unblocked, as a shell starts a foreground command. A child inherits an ignored or blocked
    signal from the process that forks it, and pytest inherits them from whatever started it: a
    non-interactive shell ignores SIGINT in what it starts with `&` (POSIX, "Asynchronous Lists"),
    so `nohup .ci/run &` gave every worker, and every command a test started, SIGINT ignored, and
    a Python that starts with SIGINT ignored never raises KeyboardInterrupt (seen 2026-12-07: six
    Ctrl-C tests failed so, each passing when pytest ran in the foreground)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


@pytest.fixture(scope="session")
def signals_of_this_worker():
    """One warning, in pytest's summary, when this process has SIGINT blocked or not at Python's
    own handler: what a child started without as_a_shell_starts_it would inherit."""
    blocked = signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    handler = signal.getsignal(signal.SIGINT)
    if blocked or handler is not signal.default_int_handler:
        warnings.warn(f"this process has SIGINT blocked={blocked}, handler={handler!r}", stacklevel=1)


REAL_STACK = PROJECT_ROOT / "inventory" / "stack.yml"
PASSWORD = b"unit-test-password"


class InventoryFactory:
    """Builds inventory/<name>.py + stack.yml (+ optional vault) in a tmp folder."""

    def __init__(self, root: Path):
        self.dir = root / "inventory"
        self.dir.mkdir()
        shutil.copy(REAL_STACK, self.dir / "stack.yml")
        shutil.copytree(REAL_STACK.parent / "locks", self.dir / "locks")  # the stacks' locks

    def stack(self, text: str) -> None:
        (self.dir / "stack.yml").write_text(textwrap.dedent(text))

    def edit_stack(self, old: str, new: str) -> None:
        path = self.dir / "stack.yml"
        text = path.read_text()
        assert old in text, f"{old!r} not in stack.yml"
        path.write_text(text.replace(old, new, 1))

    def vault(self, **values: str) -> str:
        from roles.site import vault

        path = self.dir / "secrets.vault.yml"
        for name, value in values.items():
            vault.set_secret(path, name, value, PASSWORD)
        return path.name

    def write(self, source: str, name: str = "site.py") -> Path:
        path = self.dir / name
        path.write_text(textwrap.dedent(source))
        return path

    def groups(self, name: str = "site.py", **groups) -> Path:
        body = "\n".join(f"{group} = {hosts!r}" for group, hosts in groups.items())
        return self.write(body + "\n", name)


@pytest.fixture
def inventory(tmp_path) -> InventoryFactory:
    return InventoryFactory(tmp_path)


# A listener beyond loopback without TLS is refused unless acknowledged (roles/site/rules_tls.py):
# the fixtures that bind one say so as an inventory would.
SERVING_PLAINTEXT = {"serving_plaintext_acknowledged": "unit test: a private network"}
GATEWAY_PLAINTEXT = {"gateway_plaintext_acknowledged": "unit test: a private network"}


def gpu_node(name: str = "gpu1", **data):
    """A minimal valid gpu node."""
    return (name, {"gpu_count": 8, **data})


@pytest.fixture
def short_tmp():
    """A folder with a short path: a message shows a value of up to 80 characters whole (longer
    ones are cut, with their length), and pytest's own tmp_path is longer under pytest-xdist
    (<basetemp>/popen-gw0/...), which would cut the paths these tests expect whole."""
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="ih-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def pytest_configure(config):
    """gevent's patching first, as pyinfra's CLI does it "as early as possible" (pyinfra_cli's
    __init__.py). The site model imports pyinfra_cli when it first loads an inventory; patching
    threading while a test's threads were still alive (a bounded command's abandoned wait, a status
    run's per-host threads) broke that load with "cannot release un-acquired lock". A hook, not a
    module-level import: a test's own subprocess that imports this module (the Xet stand-in's
    download) must stay unpatched, or hf_xet's threads hang under gevent."""
    import pyinfra_cli  # noqa: F401


# One key per role (docs/security.md#keys-and-their-roles): a keyed SGLang gpu node also has an
# admin key, a gateway in front of it a control-plane key; each at least 32 characters.
ADMIN = {"serving_admin_api_key_secret": "engine_admin_api_key"}
CONTROL = {"gateway_control_plane_api_key_secret": "gateway_control_plane_api_key"}
ROLE_KEYS = {
    "engine_admin_api_key": "admin-key-of-the-unit-tests-0123456789",
    "gateway_control_plane_api_key": "control-plane-key-of-the-unit-tests-01",
}
CLIENT_KEY = "client-key-of-the-unit-tests-0123456789"
