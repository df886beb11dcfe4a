"""What every test process needs: a lab prefix of its own per pytest-xdist worker, and the
worker loop kept off gevent's patched locks."""

from __future__ import annotations

import os

# Each pytest-xdist worker but the first drives a lab of its own: the replicas lab runs on one
# beside the main lab (tests/lab/conftest.py's scheduler), and two labs under one prefix would
# share container names, the models volume and the stand-ins' ports. Set here, in the first
# conftest a worker loads, before anything imports `lab` (lab/docker_engine.py reads the prefix
# once) and so that every deploy it starts inherits it.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
if _WORKER != "gw0":
    os.environ["INFERENCE_HOST_LAB_PREFIX"] = os.environ.get("INFERENCE_HOST_LAB_PREFIX", "ih-lab") + _WORKER[2:]


class _OsEvent:
    """threading.Event's set/clear/wait on the interpreter's own locks, whatever gevent patched.

    An xdist worker waits for its next test on an Event (xdist/remote.py TestQueue), set by
    execnet's receiver thread, a real OS thread. The site model imports pyinfra_cli, which
    patches threading with gevent's cooperative locks (monkey.patch_all, its __init__.py); a
    patched Event's wait then blocks the worker's only greenlet on a lock no greenlet releases:
    gevent's LoopExit, "This operation would block forever" (pytest-xdist#254)."""

    def __init__(self) -> None:
        from gevent import monkey

        allocate = monkey.get_original("_thread", "allocate_lock")
        self._guard = allocate()  # the flag and the gate change together
        self._gate = allocate()  # held while the flag is clear: wait() blocks on it
        self._gate.acquire()
        self._flag = False

    def set(self) -> None:
        with self._guard:
            if not self._flag:
                self._flag = True
                self._gate.release()

    def clear(self) -> None:
        with self._guard:
            if self._flag:
                self._flag = False
                self._gate.acquire()

    def is_set(self) -> bool:
        return self._flag

    def wait(self, timeout: float | None = None) -> bool:
        if self._gate.acquire(timeout=-1 if timeout is None else timeout):
            self._gate.release()
        return self._flag


def pytest_configure(config):
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    # By name: execnet runs xdist/remote.py as its own module (__channelexec__), so its class is
    # not xdist.remote's.
    for plugin in config.pluginmanager.get_plugins():
        if type(plugin).__name__ == "WorkerInteractor":
            # tests/unit/conftest.py patches gevent before xdist builds its queue: its lock too
            # must be the interpreter's own (execnet's receiver thread takes it as well).
            from gevent import monkey

            queue = plugin.torun
            event = _OsEvent()
            if queue._items:
                event.set()
            queue._lock = monkey.get_original("threading", "RLock")()
            queue._has_items_event = event
