"""Who holds the GPUs: the engine's processes, a stray, or a party this host cannot name.

What NVML reports depends on where the checks run (facts and sources in
docs/health-and-benchmark.md, "Processes on the GPUs"):

- a KVM guest with the GPUs passed through (vfio-pci on the node), or bare metal: the NVIDIA
  driver runs in this kernel, so `nvidia-smi --query-compute-apps` lists this host's own PIDs and
  `/proc/<pid>/cgroup` says whose each one is;
- an LXC guest (a Proxmox LXC container has its own PID namespace): the driver runs in the node's
  kernel and knows no PID namespace, so NVML lists the node's PIDs, which here are another
  process or none at all, or nvidia-smi lists no process because it cannot name them
  (NVIDIA/nvidia-docker#179, #1460 and #1483; canonical/lxd#9755). The GPUs' memory used is
  still right (lxd#9755).

So the check attributes by PID only where PIDs are this host's; in an LXC guest it can still tell
that memory is held while the engine is not running (nobody's but a stray's), and otherwise says
that the attribution cannot be made here and how to make it on the node: a SKIP with its
reason, neither a failure for ever nor a silent pass.
"""

from __future__ import annotations

from dataclasses import dataclass

from checks.gpu_parsers import ComputeApp

# systemd-detect-virt --container (systemd's src/basic/virt.c reads PID 1's `container=`, which
# LXC sets): the guests whose NVML answers carry the node's PIDs. Docker and podman containers
# report the node's PIDs too, but are no target of this project: the lab's docker containers
# stand for hosts with their own driver, and say so with their nvidia-smi stand-in.
NODE_PID_CONTAINERS = ("lxc", "lxc-libvirt")
# Memory used on the GPUs above this is "held" (an idle H200 shows 0 MiB used, 616 MiB reserved
# apart: tests/unit/data/gpu/h200-1gpu/nvidia-smi-q.txt).
HELD_MIB = 1024
NODE_ADVICE = (
    "on the node, `nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv` "
    "lists the PIDs as the node numbers them and `cat /proc/<pid>/cgroup` there says whose each is "
    "(this guest's engine: lxc/<vmid>/.../{unit}.service)"
)


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
) -> Judgement:
    """The verdict on the GPUs' processes. used_mib: memory used over all GPUs (None: unknown);
    container: systemd-detect-virt --container's answer ("none", "lxc", ...); engine_active:
    the unit's state (None: no systemd to ask)."""
    held = used_mib is not None and used_mib >= HELD_MIB
    used_text = f"{used_mib} MiB used on the GPUs" if used_mib is not None else "memory used unknown"
    what_to_do = (
        "stop the stray processes (orphans of an old server pin GPU memory): "
        "`nvidia-smi --query-compute-apps=pid,process_name --format=csv`, then kill them"
    )
    if engine_active is False and (listed or held):
        return Judgement(
            "FAIL",
            f"expected no GPU memory held while {unit}.service is not running; found "
            + (_apps_text(listed) + "; " if listed else "no process listed; ")
            + used_text
            + f"; what to do: {what_to_do}"
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
            + f"; what to do: {what_to_do}",
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
