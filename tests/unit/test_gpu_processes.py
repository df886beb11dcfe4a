"""checks/gpu_processes.py: the stray-process check where it runs. In a KVM guest (or on bare
metal) NVML lists the host's own PIDs; in an LXC guest it lists the node's PIDs or none
(NVIDIA/nvidia-docker#1483, canonical/lxd#9755): one case each, judged on what nvidia-smi
prints there."""

from __future__ import annotations

import pytest

from checks import gpu_parsers as parse
from checks.gpu_processes import HELD_MIB, OUTSIDE_TOLERANCE_MIB, Listed, judge, translates_pids

UNIT = "inference-engine"
# As nvidia-smi prints them (--query-compute-apps=pid,process_name,used_memory,gpu_bus_id
# --format=csv,noheader,nounits): in a KVM guest the engine's own PIDs and names; in an LXC guest
# the node's PIDs, which the guest's /proc cannot name.
KVM_ENGINE = "4242, /opt/inference-host/current/bin/python3, 81234, 00000000:01:00.0\n"
KVM_STRAY = KVM_ENGINE + "5151, python3, 20480, 00000000:01:00.0\n"
LXC_NODE_PIDS = "913377, [Not Found], 81234, 00000000:01:00.0\n913378, [Not Found], 20480, 00000000:01:00.0\n"


def listed(text: str, here: dict[int, bool]) -> list[Listed]:
    """here: pid -> in the unit's cgroup (a pid absent: /proc/<pid> does not exist here)."""
    return [Listed(app, app.pid in here, here.get(app.pid, False)) for app in parse.parse_compute_apps(text)]


def test_kvm_guest_engine_only_passes():
    verdict = judge(listed(KVM_ENGINE, {4242: True}), 81234, "none", UNIT, True, True)
    assert verdict.verdict == "PASS" and "all in inference-engine.service" in verdict.text


def test_kvm_guest_stray_process_fails_naming_it():
    verdict = judge(listed(KVM_STRAY, {4242: True, 5151: False}), 101714, "none", UNIT, True, True)
    assert verdict.verdict == "FAIL"
    assert "pid 5151 python3 20480 MiB" in verdict.text and "pid 4242" not in verdict.text
    assert "kill them" in verdict.text


def test_kvm_guest_a_process_that_ended_while_checked_is_no_stray():
    verdict = judge(listed(KVM_STRAY, {4242: True}), 101714, "none", UNIT, True, True)
    assert verdict.verdict == "PASS" and "1 ended while checked" in verdict.text


def test_kvm_guest_memory_without_a_process_is_said_not_passed():
    verdict = judge([], 20480, "none", UNIT, True, True)
    assert verdict.verdict == "SKIP" and "cannot attribute" in verdict.text and "20480 MiB" in verdict.text


def test_lxc_guest_node_pids_are_not_called_strays():
    """The node's PIDs do not exist in the guest (or are other processes there): the old check
    failed for ever on a healthy machine. Now: SKIP, saying why and how to tell on the node."""
    verdict = judge(listed(LXC_NODE_PIDS, {}), 101714, "lxc", UNIT, True, True)
    assert verdict.verdict == "SKIP"
    assert "cannot attribute GPU memory in an LXC guest" in verdict.text
    assert "nvidia-docker#1483" in verdict.text and "on the node" in verdict.text
    assert "pid 913377" in verdict.text and "101714 MiB used" in verdict.text


def test_lxc_guest_node_pid_that_happens_to_exist_here_is_no_stray_either():
    verdict = judge(listed(LXC_NODE_PIDS, {913377: False}), 101714, "lxc", UNIT, True, True)
    assert verdict.verdict == "SKIP"


def test_lxc_guest_empty_list_with_memory_used_says_so():
    """nvidia-smi lists no process it cannot name: an empty list is no pass while 20 GB are held."""
    verdict = judge([], 20480, "lxc", UNIT, True, True)
    assert verdict.verdict == "SKIP" and "NVML lists no process" in verdict.text and "20480 MiB" in verdict.text


def test_lxc_guest_idle_gpus_pass():
    verdict = judge([], 0, "lxc", UNIT, True, True)
    assert verdict.verdict == "PASS" and "no process holds a GPU" in verdict.text


def test_lxc_guest_memory_held_while_the_engine_is_stopped_fails():
    """Whatever the PIDs: with the engine not running, held memory is nobody's but a stray's."""
    for text, used in ((LXC_NODE_PIDS, 101714), ("", HELD_MIB)):
        verdict = judge(listed(text, {}), used, "lxc", UNIT, False, True)
        assert verdict.verdict == "FAIL", verdict
        assert "while inference-engine.service is not running" in verdict.text and "on the node" in verdict.text


def test_lxc_guest_with_pids_of_its_own_attributes_them():
    """A driver or runtime that translates PIDs into the guest's namespace: attribution works."""
    verdict = judge(listed(KVM_ENGINE, {4242: True}), 81234, "lxc", UNIT, True, True)
    assert verdict.verdict == "PASS"


def test_without_systemd_every_listed_process_is_outside_the_unit():
    verdict = judge(listed(KVM_ENGINE, {4242: False}), 81234, "unknown", UNIT, None, False)
    assert verdict.verdict == "FAIL" and "no cgroup for inference-engine" in verdict.text


# -- the driver model: which driver translates PIDs into the caller's namespace ------------------


def test_driver_versions_that_translate_pids_follow_the_tags_of_open_gpu_kernel_modules():
    """os_find_ns_pid at each tag (docs/upstream.md): a numerically later 535 release is no proof."""
    cases = {
        "580.95.05": True,
        "545.23.06": True,
        "535.113.01": True,
        "535.43.24": True,
        "535.43.23": False,
        "535.104.12": False,
        "535.54.03": False,
        "530.41.03": False,
        "525.147.05": False,
        "610.43.02": True,
        "": None,
        None: None,
        "N/A": None,
    }
    assert {version: translates_pids(version) for version in cases} == cases


# -- the four cases in an LXC guest, for each driver model -------------------------------------
# Engine inside: its PID in the guest 4242 (on the node 913377), 81234 MiB. A stray inside: guest
# PID 5151 (node 913378), 20480 MiB. A holder outside (the node or another guest): node PID
# 777001, 2048 MiB. What nvidia-smi prints in the guest, as --query-compute-apps=pid,process_name,
# used_memory,gpu_bus_id --format=csv,noheader,nounits:
NEW_DRIVER, OLD_DRIVER = "580.95.05", "535.104.05"
ROW = "{pid}, {name}, {mib}, 00000000:01:00.0\n"
ENGINE_OWN = ROW.format(pid=4242, name="/opt/inference-host/current/bin/python3", mib=81234)
STRAY_OWN = ROW.format(pid=5151, name="python3", mib=20480)
ENGINE_NODE = ROW.format(pid=913377, name="[Not Found]", mib=81234)
STRAY_NODE = ROW.format(pid=913378, name="[Not Found]", mib=20480)
OUTSIDE_NODE = ROW.format(pid=777001, name="[Not Found]", mib=2048)
IN_GUEST = {4242: True, 5151: False}  # /proc/<pid> here, and in the unit's cgroup
CASES = {  # case: (new driver's list, old driver's list, memory.used)
    "stray inside": (ENGINE_OWN + STRAY_OWN, ENGINE_NODE + STRAY_NODE, 81234 + 20480),
    "holder outside": (ENGINE_OWN, ENGINE_NODE + OUTSIDE_NODE, 81234 + 2048),
    "engine's own": (ENGINE_OWN, ENGINE_NODE, 81234 + 300),
    "nothing": ("", "", 0),
}


@pytest.mark.parametrize("case", list(CASES))
def test_lxc_guest_on_a_driver_that_names_the_guests_pids(case):
    listed_text, _, used = CASES[case]
    verdict = judge(listed(listed_text, IN_GUEST), used, "lxc", UNIT, True, True, NEW_DRIVER)
    if case == "stray inside":
        assert verdict.verdict == "FAIL" and "found pid 5151 python3 20480 MiB in this guest" in verdict.text
        assert "outside this guest" not in verdict.text
    elif case == "holder outside":
        assert verdict.verdict == "FAIL"
        assert "found 2048 MiB held by a process outside this guest" in verdict.text
        assert "nvidia-smi --query-compute-apps=pid,used_memory --format=csv" in verdict.text
        assert "on the Proxmox node" in verdict.text
    elif case == "engine's own":
        assert verdict.verdict == "PASS" and "1 process(es), all in inference-engine.service" in verdict.text
        assert "300 MiB beyond them" in verdict.text
    else:
        assert verdict.verdict == "PASS" and "no process of this guest" in verdict.text


@pytest.mark.parametrize("case", list(CASES))
def test_lxc_guest_on_an_older_driver_that_reports_the_nodes_pids(case):
    """The node's PIDs, which the guest cannot name: a SKIP saying so, unless nothing is held."""
    _, listed_text, used = CASES[case]
    verdict = judge(listed(listed_text, {}), used, "lxc", UNIT, True, True, OLD_DRIVER)
    if case == "nothing":
        assert verdict.verdict == "PASS"
    else:
        assert verdict.verdict == "SKIP" and "cannot attribute GPU memory in an LXC guest" in verdict.text
        assert "PIDs as the node numbers them" in verdict.text and "on the node" in verdict.text


def test_the_outside_tolerance_is_the_boundary():
    at = judge(listed(ENGINE_OWN, IN_GUEST), 81234 + OUTSIDE_TOLERANCE_MIB, "lxc", UNIT, True, True, NEW_DRIVER)
    above = judge(listed(ENGINE_OWN, IN_GUEST), 81235 + OUTSIDE_TOLERANCE_MIB, "lxc", UNIT, True, True, NEW_DRIVER)
    assert (at.verdict, above.verdict) == ("PASS", "FAIL")


def test_new_driver_with_the_engine_stopped_names_the_outside_holder():
    verdict = judge([], 2048, "lxc", UNIT, False, True, NEW_DRIVER)
    assert verdict.verdict == "FAIL" and "2048 MiB held by a process outside this guest" in verdict.text


def test_new_driver_without_a_memory_figure_is_said_not_passed():
    assert judge(listed(ENGINE_OWN, IN_GUEST), None, "lxc", UNIT, True, True, NEW_DRIVER).verdict == "SKIP"


def test_the_driver_model_applies_only_in_an_lxc_guest():
    """In a KVM guest or on bare metal the driver is this kernel's: the version changes nothing."""
    for driver in (NEW_DRIVER, OLD_DRIVER, None):
        assert judge(
            listed(KVM_STRAY, {4242: True, 5151: False}), 101714, "none", UNIT, True, True, driver
        ).verdict == ("FAIL")
