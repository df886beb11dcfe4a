"""checks/gpu_processes.py judged on what a real driver printed from a PID namespace.

tests/unit/data/nvidia-smi-pidns holds nvidia-smi's answers on an H100 with the open kernel module
580.159.04, from the machine's PID namespace, from `unshare --pid --fork --mount-proc` and from
`unshare --user --map-root-user --pid --fork --mount-proc`, with a holder outside, one inside,
both or none (README there). An LXC guest is such a namespace on the node's driver; these tests
read the captures as the check would see them in a guest and hold its four cases (stray inside,
holder outside, the engine's own, nothing) to them, with and without a user namespace.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from checks import gpu_parsers as parse
from checks.gpu_processes import OUTSIDE_TOLERANCE_MIB, Listed, judge, translates_pids

DATA = Path(__file__).parent / "data" / "nvidia-smi-pidns"
UNIT = "inference-engine"
APPS_QUERY = "nvidia-smi --query-compute-apps=pid,used_memory,name --format=csv"
GPU_QUERY = "nvidia-smi --query-gpu=memory.used,driver_version --format=csv"


def answers(name: str) -> dict[str, str]:
    """Each command's output in a capture file: {command: output}, as capture.sh frames them
    ("## $ COMMAND", the output, "## rc=N")."""
    text = (DATA / name).read_text()
    return {command: output for command, output in re.findall(r"^## \$ ([^\n]+)\n(.*?)^## rc=\d+$", text, re.M | re.S)}


def seen(name: str) -> tuple[list[parse.ComputeApp], int, str]:
    """The processes nvidia-smi listed (as the checks' parser reads the checks' own query), the
    memory used and the driver, in one capture file. The capture asked for pid, used_memory and
    name with a header and units; the checks ask for pid, process_name, used_memory and the bus
    id without either: the same fields, rewritten in the checks' order."""
    found = answers(name)
    bus = re.search(r"^GPU (\S+)$", found["nvidia-smi -q -d PIDS"], re.M)
    assert bus, name
    rows = []
    for line in found[APPS_QUERY].splitlines()[1:]:
        pid, used, process = (cell.strip() for cell in line.split(",", 2))
        rows.append(f"{pid}, {process}, {used.removesuffix(' MiB')}, {bus[1]}\n")
    used_mib, driver = (cell.strip() for cell in found[GPU_QUERY].splitlines()[1].split(","))
    return parse.parse_compute_apps("".join(rows)), int(used_mib.removesuffix(" MiB")), driver


def in_guest(apps: list[parse.ComputeApp], engine_pids: set[int]) -> list[Listed]:
    """As the check sees them in the namespace: every listed PID exists there (the driver named it
    there); those in engine_pids are in the engine unit's cgroup."""
    return [Listed(app, True, app.pid in engine_pids) for app in apps]


def verdict(name: str, engine_pids: set[int], engine_active: bool = True):
    apps, used, driver = seen(name)
    return judge(in_guest(apps, engine_pids), used, "lxc", UNIT, engine_active, True, driver)


def test_the_captured_driver_is_one_the_check_judges_as_translating():
    for name in ("03-pidns-inside.txt", "04-userns-inside.txt", "07-pidns-alone-inside.txt"):
        assert translates_pids(seen(name)[2]) is True


@pytest.mark.parametrize("prefix", ["03-pidns", "04-userns"])
def test_the_driver_lists_only_the_namespaces_own_process_under_its_own_pid(prefix):
    """The machine sees both holders; the namespace sees only its own, under its own PID (24,
    the machine's 624 or 747: NSpid in the machine view), and memory.used counts both."""
    machine, machine_used, _ = seen(f"{prefix}-machine-view.txt")
    inside, inside_used, _ = seen(f"{prefix}-inside.txt")
    outside_pid = int(re.search(r"machine pid (\d+)", (DATA / f"{prefix}-inside.txt").read_text())[1])
    assert outside_pid in {app.pid for app in machine} and len(machine) == 2
    assert [(app.pid, app.used_memory_mib) for app in inside] == [(24, 2658)]
    assert inside_used == machine_used == 2 * 2658 + 15


@pytest.mark.parametrize("prefix", ["03-pidns", "04-userns"])
def test_holder_outside_with_nothing_of_the_guests_own_is_a_fail_naming_the_memory(prefix):
    result = verdict(f"{prefix}-before.txt", set(), engine_active=False)
    assert result.verdict == "FAIL"
    assert "found 2667 MiB held by a process outside this guest" in result.text
    assert "on the Proxmox node" in result.text


@pytest.mark.parametrize("prefix", ["03-pidns", "04-userns"])
def test_holder_outside_beside_the_engine_is_a_fail_too(prefix):
    result = verdict(f"{prefix}-inside.txt", {24})
    assert result.verdict == "FAIL" and "in this guest" not in result.text
    assert f"found {5331 - 2658} MiB held by a process outside this guest" in result.text


def test_stray_inside_is_a_fail_naming_it_and_not_an_outside_holder():
    result = verdict("07-pidns-alone-inside.txt", set())
    assert result.verdict == "FAIL"
    assert "found pid 24 /opt/torch/.venv/bin/python3 2658 MiB in this guest" in result.text
    assert "outside this guest" not in result.text


def test_the_engines_own_process_passes_with_the_drivers_few_mib_beyond_it():
    result = verdict("07-pidns-alone-inside.txt", {24})
    assert result.verdict == "PASS" and "1 process(es), all in inference-engine.service" in result.text
    assert "9 MiB beyond them" in result.text


def test_nothing_held_passes():
    result = verdict("07-pidns-alone-before.txt", set())
    assert result.verdict == "PASS" and "no process of this guest" in result.text


def test_the_tolerance_covers_the_drivers_own_margin_with_room():
    """What memory.used holds beyond the listed processes, as captured: 9 MiB with one context,
    15 with two, 0 with none: eight GPUs at the two-context margin stay under the tolerance."""
    margins = {}
    for name in ("01-root-none.txt", "02-root-outside-holder.txt", "03-pidns-machine-view.txt"):
        apps, used, _ = seen(name)
        margins[len(apps)] = used - sum(app.used_memory_mib or 0 for app in apps)
    assert margins == {0: 0, 1: 9, 2: 15}
    assert 8 * margins[2] < OUTSIDE_TOLERANCE_MIB
