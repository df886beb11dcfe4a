"""An operation that only tells: a line logged when the deploy reaches it, no change reported.

pyinfra 3 counts an operation as changed when its generator yields a command
(pyinfra/api/operations.py, run_host_op, 3.10); python.call always yields one, so a python.call
that only logs shows as a change on every deploy. This one logs while executing and yields
nothing (its generator also runs once while preparing, when it logs nothing).
"""

from __future__ import annotations

from pyinfra import host, logger, state
from pyinfra.api import operation


@operation(is_idempotent=True)
def note(message: str):
    """Log message for this host at this point of the deploy; changes nothing."""
    if state.is_executing:
        logger.info(f"{host.print_prefix}{message}")
    yield from ()
