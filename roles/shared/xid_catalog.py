"""NVIDIA's Xid catalog (xid_catalog.yml, the rows quoted with their source): each code's
"Resolution Bucket (Immediate Action)", what this project tells a person to do for it, and
whether it pages. One table for the health check's advice and the GpuXidError alert.

Pages (critical): the buckets that need a person at the machine: a GPU reset, a reboot of the
bare metal or the VM, a workflow or support case, mechanics, a software update; and any code the
catalog file does not hold. Warning: RESTART_APP (the program on the GPU restarts; systemd
restarts the engine's unit) and XID_154 (it only restates another Xid's action, which alerts on
its own). IGNORE: no alert, and no failed check.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

import yaml

CATALOG = Path(__file__).with_name("xid_catalog.yml")

# bucket -> (severity, what to do). The words are this project's, for its nodes.
BUCKETS = {
    "IGNORE": ("none", "nothing: the catalog's action is IGNORE (the GPU stays healthy)"),
    "RESTART_APP": (
        "warning",
        "restart the program that ran on the GPU (the engine's unit: `systemctl restart` it if systemd has "
        "not) and read its log; the GPU needs no reset",
    ),
    "XID_154": ("warning", "follow the other Xid it names (it states that Xid's recovery action)"),
    "RESET_GPU": (
        "critical",
        "drain the GPU, stop what uses it, reset it (`nvidia-smi -r -i <bus id>`, or reboot the node); "
        "if it recurs, contact support",
    ),
    "RESTART_BM": (
        "critical",
        "drain and reboot the node (the bare metal, not only the guest); if it recurs, check slot, riser "
        "and power, then contact support",
    ),
    "RESTART_VM": ("critical", "restart the VM that holds the GPU"),
    "CHECK_MECHANICALS": ("critical", "check the GPU's power cables and seating"),
    "UPDATE_SWFW": ("critical", "update the driver and the GPU's firmware"),
    "CONTACT_SUPPORT": ("critical", "contact NVIDIA or the hardware vendor with `nvidia-bug-report.sh`"),
}
WORKFLOW = ("critical", "follow the catalog's workflow for this code (a person decides: reset, reboot or RMA)")
UNKNOWN = ("critical", "not in this project's copy of the catalog: look the code up before acting")


@dataclass(frozen=True)
class XidRow:
    code: int
    mnemonic: str
    description: str
    immediate: str
    investigatory: str

    @property
    def severity(self) -> str:
        return _bucket(self.immediate)[0]

    @property
    def next_step(self) -> str:
        return _bucket(self.immediate)[1]


def _bucket(name: str) -> tuple[str, str]:
    if name in BUCKETS:
        return BUCKETS[name]
    return WORKFLOW if name.startswith("WORKFLOW_") else UNKNOWN


@cache
def catalog() -> dict:
    """The catalog file: source, retrieved, rows by code."""
    data = yaml.safe_load(CATALOG.read_text())
    rows = {int(r[0]): XidRow(int(r[0]), *(str(v) for v in r[1:])) for r in data["rows"]}
    return {"source": data["source"], "retrieved": data["retrieved"], "rows": rows}


def row(code: int) -> XidRow | None:
    return catalog()["rows"].get(code)


def severity(code: int) -> str:
    """critical, warning or none (no alert): the code's bucket's; critical for a code not held."""
    found = row(code)
    return found.severity if found else UNKNOWN[0]


def advice(code: int) -> str:
    """One phrase: the code's catalog row and what to do."""
    found = row(code)
    if found is None:
        return f"Xid {code}: {UNKNOWN[1]} ({catalog()['source']})"
    return f"Xid {code} {found.mnemonic} ({found.description}; catalog: {found.immediate}): {found.next_step}"


def codes(level: str) -> tuple[int, ...]:
    """The catalog's codes whose bucket has this severity, ascending."""
    return tuple(sorted(code for code, r in catalog()["rows"].items() if r.severity == level))
