"""How a deploy stops on a finding of its own: one line that says what and what to do, no traceback.

pyinfra's CLI prints a PyinfraError raised while it loads the deploy (the roles run there,
asking facts and planning operations) as one line, `--> pyinfra error in FILE line N: MESSAGE`,
and any other exception with its whole traceback (pyinfra_cli/util.py `exec_file`,
pyinfra_cli/exceptions.py `WrappedError`, pyinfra 3.x). A refusal is raised while planning, before
any operation runs on any host, so it is a DeployError. It is also a RuntimeError, what these
refusals were before: callers and tests that catch RuntimeError still do.

A failure found while the operations run (a python.call callback: the health verdict, the wheel
relay, the weights download's follower) cannot be
raised at all without a traceback: pyinfra logs one for every exception a callback raises
(pyinfra/api/operations.py `_run_host_op`). A callback that takes `state` and `host` first has its
return value taken as the command's status instead (pyinfra/api/command.py
`FunctionCommand.execute`), so `failed` logs the message on the host's line and returns False:
the operation fails, the host stops, the exit status is 1.
"""

from __future__ import annotations

from pyinfra import logger
from pyinfra.api.exceptions import DeployError


class Refused(DeployError, RuntimeError):
    """The deploy stops here, while planning: the message is the whole report."""


def failed(host, message: str) -> bool:
    """A callback's failure as its host's error line; False is the failed command's status."""
    host.log_styled(message, fg="red", log_func=logger.error)
    return False


def status_of(host, function, *args, **kwargs) -> bool:
    """function(*args, **kwargs) as a callback's status: True, or False with its Refused as the
    host's error line."""
    try:
        function(*args, **kwargs)
    except Refused as refusal:
        return failed(host, str(refusal))
    return True
