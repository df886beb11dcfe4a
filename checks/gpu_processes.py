"""Who holds the GPUs: the engine's processes, a stray, or a party this host cannot name.

What NVML reports depends on where the checks run and on the driver (facts and sources in
docs/health-and-benchmark.md, "Processes on the GPUs", and docs/upstream.md, "NVIDIA driver:
PIDs in a PID namespace"):

- a KVM guest with the GPUs passed through (vfio-pci on the node), or bare metal: the NVIDIA
  driver runs in this kernel, so `nvidia-smi --query-compute-apps` lists this host's own PIDs and
  `/proc/<pid>/cgroup` says whose each one is;
- an LXC guest (its own PID namespace, the driver in the node's kernel) on a driver that
  translates PIDs (535.113.01 and later, 535.43.24 and later on the 535.43 branch, every 545 and
  later): the driver reports each process under its PID in the caller's namespace and leaves out
  those it cannot name there (open-gpu-kernel-modules `os_find_ns_pid`, `gpuGetProcWithObject`).
  The PIDs listed are this guest's, judged by cgroup as in a VM; memory used on the GPUs beyond
  what the listed processes hold is held outside this guest (the node or another guest): a FAIL
  naming the node's command that finds it;
- an LXC guest on an older driver (or one whose version is unknown): the driver knows no PID
  namespace, so NVML lists the node's PIDs, which here are another process or none at all, or
  nvidia-smi lists no process because it cannot name them (NVIDIA/nvidia-docker#179, #1460 and
  #1483; canonical/lxd#9755). The check can still tell that memory is held while the engine is
  not running (nobody's but a stray's), and otherwise says that the attribution cannot be made
  here and how to make it on the node: a SKIP with its reason, neither a failure for ever nor a
  silent pass.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from checks.gpu_parsers import ComputeApp

# systemd-detect-virt --container (systemd's src/basic/virt.c reads PID 1's `container=`, which
# LXC sets): the guests with their own PID namespace on the node's driver, whose NVML answers
# depend on the driver (translates_pids). Docker and podman containers are such guests too, but
# no target of this project: the lab's docker containers stand for hosts with their own driver,
# and say so with their nvidia-smi stand-in.
NODE_PID_CONTAINERS = ("lxc", "lxc-libvirt")
# Memory used on the GPUs above this is "held" (an idle H200 shows 0 MiB used, 616 MiB reserved
# apart: tests/unit/data/gpu/h200-1gpu/nvidia-smi-q.txt).
HELD_MIB = 1024
# In an LXC guest on a translating driver: memory used on the GPUs beyond the sum NVML attributes
# to the processes it lists, above this (over all GPUs), is held outside this guest. memory.used
# runs a little above the listed processes' sum: 9 MiB with one context, 15 MiB with two, 0 with
# none (captured on an H100 with the open module 580.159.04 from a PID namespace,
# tests/unit/data/nvidia-smi-pidns); eight GPUs at that margin are about 120 MiB, and 1 GiB (as
# HELD_MIB) leaves room for more contexts per GPU than the engine makes.
OUTSIDE_TOLERANCE_MIB = 1024
NODE_ADVICE = (
    "on the node, `nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv` "
    "lists the PIDs as the node numbers them and `cat /proc/<pid>/cgroup` there says whose each is "
    "(this guest's engine: lxc/<vmid>/.../{unit}.service)"
)


def translates_pids(driver_version: str | None) -> bool | None:
    """Whether this driver reports processes under their PIDs in the caller's PID namespace (and
    leaves out those it cannot name there): open-gpu-kernel-modules added `os_find_ns_pid` in
    535.113.01 on the 535 production branch (535.54.03 to 535.104.12 lack it), in 535.43.24 on the
    535.43 branch, and every 545 and later release has it (docs/upstream.md). None: no version."""
    found = re.fullmatch(r"(\d+)\.(\d+)(?:\.(\d+))?", (driver_version or "").strip())
    if not found:
        return None
    major, minor, patch = int(found[1]), int(found[2]), int(found[3] or 0)
    if major != 535:
        return major > 535
    return patch >= 24 if minor == 43 else minor >= 113


@dataclass(frozen=True)
class Listed:
    """One process NVML lists, as seen from this host."""

    app: ComputeApp
    exists_here: bool  # /proc/<pid> readable here
    in_unit: bool  # its /proc/<pid>/cgroup is inside the unit's ControlGroup


@dataclass(frozen=True)
class Judgement:
    verdict: str  # PASS, FAIL, SKIP
    text: str


WHAT_TO_DO = (
    "stop the stray processes (orphans of an old server pin GPU memory): "
    "`nvidia-smi --query-compute-apps=pid,process_name --format=csv`, then kill them"
)
OUTSIDE_ADVICE = (
    "on the Proxmox node, `nvidia-smi --query-compute-apps=pid,used_memory --format=csv` names every "
    "holder as the node numbers it and `cat /proc/<pid>/cgroup` there says whose it is (another "
    "guest: lxc/<vmid>/...; the node itself: anything else); stop it"
)


def _apps_text(listed: list[Listed]) -> str:
    return "; ".join(
        f"pid {item.app.pid} {item.app.process_name or '(no name)'} {item.app.used_memory_mib} MiB" for item in listed
    )


def judge(
    listed: list[Listed],
    used_mib: int | None,
    container: str,
    unit: str,
    engine_active: bool | None,
    has_cgroup: bool,
    driver_version: str | None = None,
) -> Judgement:
    """The verdict on the GPUs' processes. used_mib: memory used over all GPUs (None: unknown);
    container: systemd-detect-virt --container's answer ("none", "lxc", ...); engine_active:
    the unit's state (None: no systemd to ask); driver_version: the driver's (nvidia-smi's
    driver_version), which decides what NVML lists in an LXC guest."""
    if container in NODE_PID_CONTAINERS and translates_pids(driver_version):
        return _judge_guest_pids(listed, used_mib, container, unit, has_cgroup, driver_version or "")
    held = used_mib is not None and used_mib >= HELD_MIB
    used_text = f"{used_mib} MiB used on the GPUs" if used_mib is not None else "memory used unknown"
    if engine_active is False and (listed or held):
        return Judgement(
            "FAIL",
            f"expected no GPU memory held while {unit}.service is not running; found "
            + (_apps_text(listed) + "; " if listed else "no process listed; ")
            + used_text
            + f"; what to do: {WHAT_TO_DO}"
            + ("; in an LXC guest the holder may be another guest or the node: " + NODE_ADVICE.format(unit=unit))
            * (container in NODE_PID_CONTAINERS),
        )
    if container in NODE_PID_CONTAINERS:
        return _judge_node_pids(listed, held, used_text, container, unit)
    if not listed:
        if held:
            return Judgement(
                "SKIP",
                f"cannot attribute: {used_text} but NVML lists no process (a context the driver "
                "still holds, or a process it does not report); `nvidia-smi -q` (Processes) and "
                "the kernel log",
            )
        return Judgement("PASS", f"no process holds a GPU ({used_text})")
    outside = [item for item in listed if item.exists_here and not item.in_unit]
    if not has_cgroup:
        outside = [item for item in listed if item.exists_here]
    if outside:
        return Judgement(
            "FAIL",
            f"expected only {unit}.service's processes on the GPUs; found {_apps_text(outside)}"
            + ("" if has_cgroup else f" (no cgroup for {unit}: systemd missing or unit not running)")
            + f"; what to do: {WHAT_TO_DO}",
        )
    gone = [item for item in listed if not item.exists_here]
    return Judgement(
        "PASS",
        f"{len(listed) - len(gone)} process(es), all in {unit}.service"
        + (f" ({len(gone)} ended while checked)" if gone else ""),
    )


def _judge_node_pids(listed: list[Listed], held: bool, used_text: str, container: str, unit: str) -> Judgement:
    if listed and all(item.exists_here and item.in_unit for item in listed):
        return Judgement("PASS", f"{len(listed)} process(es), all in {unit}.service (PIDs of this guest)")
    if not listed and not held:
        return Judgement("PASS", f"no process holds a GPU ({used_text})")
    found = (
        f"NVML lists {_apps_text(listed)}, PIDs as the node numbers them"
        if listed
        else "NVML lists no process (nvidia-smi cannot name the node's PIDs here)"
    )
    return Judgement(
        "SKIP",
        f"cannot attribute GPU memory in an LXC guest ({container}: the driver reports the node's "
        f"PIDs, NVIDIA/nvidia-docker#1483, canonical/lxd#9755): {found}; {used_text}; whether it is "
        f"all {unit}.service's cannot be told here; to tell: " + NODE_ADVICE.format(unit=unit),
    )


def _judge_guest_pids(
    listed: list[Listed], used_mib: int | None, container: str, unit: str, has_cgroup: bool, driver: str
) -> Judgement:
    """An LXC guest on a driver that names processes in this PID namespace: the listed PIDs are
    this guest's (judged by cgroup as in a VM); memory beyond theirs is held outside the guest."""
    strays = [item for item in listed if item.exists_here and not (has_cgroup and item.in_unit)]
    problems = []
    if strays:
        problems.append(
            f"expected only {unit}.service's processes on the GPUs; found {_apps_text(strays)} in this guest"
            + ("" if has_cgroup else f" (no cgroup for {unit}: systemd missing or unit not running)")
            + f"; what to do: {WHAT_TO_DO}"
        )
    unknown = [item for item in listed if item.app.used_memory_mib is None]
    attributed = sum(item.app.used_memory_mib or 0 for item in listed)
    beyond = None if used_mib is None or unknown else used_mib - attributed
    if beyond is not None and beyond > OUTSIDE_TOLERANCE_MIB:
        problems.append(
            f"expected no GPU memory held outside this guest; found {beyond} MiB held by a process outside "
            f"this guest ({used_mib} MiB used on the GPUs, {attributed} MiB by the {len(listed)} process(es) "
            f"listed here, tolerance {OUTSIDE_TOLERANCE_MIB} MiB; driver {driver} lists only this guest's "
            f"processes in an {container} guest); what to do: {OUTSIDE_ADVICE}"
        )
    if problems:
        return Judgement("FAIL", "; ".join(problems))
    if beyond is None:
        why = "memory used unknown" if used_mib is None else f"no memory figure for pid {unknown[0].app.pid}"
        return Judgement(
            "SKIP",
            f"cannot tell whether a process outside this guest holds GPU memory ({why}); to tell: {OUTSIDE_ADVICE}",
        )
    gone = [item for item in listed if not item.exists_here]
    mine = len(listed) - len(gone)
    return Judgement(
        "PASS",
        (f"{mine} process(es), all in {unit}.service" if mine else "no process of this guest on the GPUs")
        + (f" ({len(gone)} ended while checked)" if gone else "")
        + f"; {used_mib} MiB used, {beyond} MiB beyond them (tolerance {OUTSIDE_TOLERANCE_MIB} MiB: "
        f"none held outside this guest; driver {driver} names this guest's PIDs)",
    )
