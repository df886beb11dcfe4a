"""Once per host and run: a step several roles may ask for (gpg, the CUDA repository, a mirror's
credential) is planned the first time only. Kept per pyinfra State, not per process, so that a
second deploy in the same process (the preview records the deploy in-process, roles/recording.py)
plans it again, as each pass of the CLI, a process of its own, does."""

from __future__ import annotations

import weakref

from pyinfra import host
from pyinfra.context import ctx_state

_seen: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # State -> {(what, host name)}


def first_time(what: str) -> bool:
    """True the first time this run asks it for the current host."""
    seen = _seen.setdefault(ctx_state.get(), set())
    key = (what, host.name)
    if key in seen:
        return False
    seen.add(key)
    return True
