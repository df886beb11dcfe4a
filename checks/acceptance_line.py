"""What the acceptance report is made of: a Line (what was expected, what was found, the verdict
and who answered), the verdicts, and how a line tells a lab stand-in's answer from the target's.
checks/acceptance.py collects the lines, checks/acceptance_node.py the Proxmox node's,
checks/acceptance_report.py turns them into the report.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from roles.shared.shell import sh

PASS, FAIL, UNREACHED, NOT_APPLICABLE = "PASS", "FAIL", "UNREACHED", "N/A"
TARGET = "target"
# A stand-in in the lab names itself in its own file (lab/standins/...): the report reads that
# mark on the host instead of trusting a flag the inventory could get wrong.
STANDIN_MARK = "STAND-IN"
STANDIN_SOURCE = "stand-in"  # how every line answered by one begins its source


@dataclass
class Line:
    area: str
    host: str
    expectation: str
    observed: str
    verdict: str
    source: str = TARGET
    figure: float | None = None
    expected_figure: float | None = None
    unit: str = ""
    details: list[str] = field(default_factory=list)


# The collection running now (area, host): an interrupted run's report names it "not judged"
# rather than leaving it out (as checks/conftest.py does for the check an interruption stopped).
_RUNNING: list[tuple[str, str]] = []
NOT_JUDGED = "not judged: the run was interrupted (Ctrl-C or SIGTERM) while this ran"


def running(area: str, host: str) -> None:
    _RUNNING[:] = [(area, host)]


def standin(host, path: str) -> bool:
    """Whether the program at `path` on the host is one of the lab's stand-ins (it says so)."""
    return host.run(sh("head -c 8192 {path} 2>/dev/null | grep -q {mark}", path=path, mark=STANDIN_MARK)).rc == 0
