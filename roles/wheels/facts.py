"""Facts of roles/wheels: what the builder has and what its wheelhouse holds."""

from __future__ import annotations

import re

from pyinfra.api import FactBase

from roles.shared.shell import Shell, sh
from roles.wheels.jobcap import Resources

_KIB = 1024


class BuilderResources(FactBase):
    """Returns the builder's cores and memory (roles.wheels.jobcap.Resources), cgroup limits
    included: inside an LXC guest or a container these are what a compile can really use."""

    def command(self) -> str:
        return (
            'echo "cores $(nproc)"; cat /proc/meminfo;'
            " for f in memory.max memory.current cpu.max memory/memory.limit_in_bytes"
            " memory/memory.usage_in_bytes cpu/cpu.cfs_quota_us cpu/cpu.cfs_period_us; do"
            ' [ -r /sys/fs/cgroup/$f ] && echo "cgroup $f $(cat /sys/fs/cgroup/$f)"; done; true'
        )

    def process(self, output) -> Resources:
        cores = 1
        meminfo: dict[str, int] = {}
        cgroup: dict[str, str] = {}
        for line in output:
            parts = line.split()
            if len(parts) >= 2 and parts[0] == "cores":
                cores = int(parts[1])
            elif len(parts) >= 3 and parts[0] == "cgroup":
                cgroup[parts[1]] = " ".join(parts[2:])
            elif len(parts) >= 2 and parts[0].endswith(":") and parts[1].isdigit():
                meminfo[parts[0][:-1]] = int(parts[1]) * _KIB  # /proc/meminfo is in kB (KiB)
        total = meminfo.get("MemTotal", 0)
        limit = _bytes_or_none(cgroup.get("memory.max") or cgroup.get("memory/memory.limit_in_bytes"))
        if limit is not None and limit >= total:
            limit = None  # cgroup v1 reports "no limit" as a huge number
        usage = _bytes_or_none(cgroup.get("memory.current") or cgroup.get("memory/memory.usage_in_bytes"))
        return Resources(
            cores=cores,
            mem_total_bytes=total,
            mem_available_bytes=meminfo.get("MemAvailable", meminfo.get("MemFree", 0)),
            swap_total_bytes=meminfo.get("SwapTotal", 0),
            cgroup_memory_limit_bytes=limit,
            cgroup_memory_usage_bytes=usage if limit is not None else None,
            cgroup_cpu_limit=_cpu_limit(cgroup.get("cpu.max") or _v1_cpu_max(cgroup)),
        )


def _bytes_or_none(value: str | None) -> int | None:
    if value is None or not value.strip().isdigit():
        return None  # "max" or absent
    return int(value)


def _v1_cpu_max(cgroup: dict[str, str]) -> str | None:
    """cgroup v1 quota/period in cgroup v2's cpu.max form ("-1" quota: no limit)."""
    quota, period = cgroup.get("cpu/cpu.cfs_quota_us"), cgroup.get("cpu/cpu.cfs_period_us")
    return f"{quota} {period}" if quota and period else None


def _cpu_limit(value: str | None) -> float | None:
    """cgroup v2 cpu.max is "QUOTA PERIOD" or "max PERIOD"."""
    if not value:
        return None
    quota, _, period = value.partition(" ")
    if not quota.isdigit() or not period.strip().isdigit():
        return None
    return int(quota) / int(period)


_CLIENT_RE = re.compile(r"^client (\S+) (\S+)$")


class DockerBuildClient(FactBase):
    """Returns the docker client that can run BuildKit builds on this builder, as
    {"path", "version", "buildx", "server"}, or None when there is none.

    Docker-CE 23+ clients build with BuildKit only through the buildx plugin; the 20.10 client
    (Debian's docker.io) has BuildKit built in (DOCKER_BUILDKIT=1). A client without either,
    or whose engine does not answer, cannot run these builds."""

    def command(self) -> str:
        return (
            'for c in $(command -v docker) /usr/bin/docker; do [ -x "$c" ] || continue;'
            ' echo "client $c $($c version --format "{{.Client.Version}}" 2>/dev/null || echo none)";'
            ' echo "server $($c version --format "{{.Server.Version}}" 2>/dev/null || echo none)";'
            ' echo "buildx $($c buildx version >/dev/null 2>&1 && echo yes || echo no)"; done; true'
        )

    def process(self, output) -> dict | None:
        candidates: list[dict] = []
        for line in output:
            line = line.strip()
            match = _CLIENT_RE.match(line)
            if match:
                candidates.append({"path": match.group(1), "version": match.group(2)})
            elif candidates and line.startswith("server "):
                candidates[-1]["server"] = line.split(" ", 1)[1]
            elif candidates and line.startswith("buildx "):
                candidates[-1]["buildx"] = line.split(" ", 1)[1] == "yes"
        for client in candidates:
            if client.get("server", "none") == "none" or client["version"] == "none":
                continue
            if client.get("buildx") or _major(client["version"]) < 23:
                return client
        return None


def _major(version: str) -> int:
    match = re.match(r"(\d+)", version)
    return int(match.group(1)) if match else 0


class CuobjdumpPath(FactBase):
    """Returns the path of a cuobjdump on the builder (PATH, the CUDA toolkit, or the copy
    roles/wheels installs from PyPI under tools_dir), or None."""

    def command(self, tools_dir: str) -> Shell:
        return sh(
            "for c in $(command -v cuobjdump) /usr/local/cuda/bin/cuobjdump"
            " {tools_dir}/cuobjdump/bin/cuobjdump; do"
            ' [ -x "$c" ] && "$c" --version >/dev/null 2>&1 && {{ echo "$c"; break; }}; done; true',
            tools_dir=tools_dir,
        )

    def process(self, output) -> str | None:
        for line in output:
            if line.strip().startswith("/"):
                return line.strip()
        return None
