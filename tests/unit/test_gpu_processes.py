"""checks/gpu_processes.py: the stray-process check where it runs. In a KVM guest (or on bare
metal) NVML lists the host's own PIDs; in an LXC guest it lists the node's PIDs or none
(NVIDIA/nvidia-docker#1483, canonical/lxd#9755): one case each, judged on what nvidia-smi
prints there."""

from __future__ import annotations

from checks import gpu_parsers as parse
from checks.gpu_processes import HELD_MIB, Listed, judge, translates_pids

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
