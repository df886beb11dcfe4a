"""How many compile jobs, and how many nvcc threads each, a kernel wheel build may use.

The builder has no swap: a compile that runs out of memory is killed, hours into a build. So
the cap comes from memory first, then cores:

    usable      = available memory - safety margin        (swap is never counted)
    per job     = budget per nvcc thread x nvcc threads    (the package's measured appetite)
    jobs        = min(usable // per job, cores // nvcc threads), at least 1
    jobs x nvcc threads <= cores, always

Budgets per nvcc thread (peak resident memory of one nvcc/cicc/ptxas thread on the heaviest
translation units, CUDA 12.8, torch 2.9):
  flash-attn  5 GiB: flash-attention PR #2079 measured 3.2-5 GB per nvcc thread; its own
              auto formula (free GB / (5 x NVCC_THREADS)) left no headroom and OOMed a host
              (issue #2493), hence the separate margin below.
  sgl-kernel  6 GiB, one nvcc thread per job (-DSGL_KERNEL_COMPILE_THREADS=1): CUTLASS 3.x
              grouped-GEMM and FlashInfer units; upstream notes that its default of 32 nvcc
              threads "triggers OOM with low memory host". An estimate with headroom, not a
              measurement: lower build_max_jobs if a compile is still killed.
Safety margin: max(4 GiB, 10% of the memory limit) for the kernel, dockerd/BuildKit, the
page cache and whatever else runs on the builder (it is usually the gpu node itself).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

GIB = 1024**3
MIN_MARGIN_GIB = 4.0
MARGIN_FRACTION = 0.10


class JobCapError(Exception):
    """The builder cannot run even one compile job of a package within its memory."""


@dataclass(frozen=True)
class PackageBudget:
    package: str
    gib_per_nvcc_thread: float
    default_nvcc_threads: int  # upper bound before the core count is applied
    fixed_nvcc_threads: int | None = None  # the package's build pins it (sgl-kernel: 1)


BUDGETS = {
    "flash-attn": PackageBudget("flash-attn", gib_per_nvcc_thread=5.0, default_nvcc_threads=4),
    "sgl-kernel": PackageBudget("sgl-kernel", gib_per_nvcc_thread=6.0, default_nvcc_threads=1, fixed_nvcc_threads=1),
}


@dataclass(frozen=True)
class Resources:
    """What the builder really has (roles/wheels/facts.py BuilderResources)."""

    cores: int
    mem_total_bytes: int
    mem_available_bytes: int
    swap_total_bytes: int = 0
    cgroup_memory_limit_bytes: int | None = None  # None: no limit ("max")
    cgroup_memory_usage_bytes: int | None = None
    cgroup_cpu_limit: float | None = None  # cpu.max quota/period; None: no limit

    @property
    def effective_cores(self) -> int:
        if self.cgroup_cpu_limit is None:
            return max(1, self.cores)
        return max(1, min(self.cores, math.floor(self.cgroup_cpu_limit)))

    @property
    def memory_limit_bytes(self) -> int:
        if self.cgroup_memory_limit_bytes is None:
            return self.mem_total_bytes
        return min(self.mem_total_bytes, self.cgroup_memory_limit_bytes)

    @property
    def available_bytes(self) -> int:
        available = self.mem_available_bytes
        if self.cgroup_memory_limit_bytes is not None:
            used = self.cgroup_memory_usage_bytes or 0
            available = min(available, self.cgroup_memory_limit_bytes - used)
        return max(0, available)


@dataclass(frozen=True)
class JobCap:
    package: str
    max_jobs: int
    nvcc_threads: int
    cores: int
    available_gib: float
    margin_gib: float
    per_job_gib: float
    notes: list[str] = field(default_factory=list)

    @property
    def usable_gib(self) -> float:
        return max(0.0, self.available_gib - self.margin_gib)

    def describe(self) -> str:
        text = (
            f"{self.package}: MAX_JOBS={self.max_jobs} x NVCC_THREADS={self.nvcc_threads}"
            f" on {self.cores} cores; {self.available_gib:.1f} GiB available - "
            f"{self.margin_gib:.1f} GiB margin = {self.usable_gib:.1f} GiB for compiles,"
            f" {self.per_job_gib:.1f} GiB budget per job"
        )
        return "; ".join([text, *self.notes])


def safety_margin_gib(resources: Resources) -> float:
    return max(MIN_MARGIN_GIB, MARGIN_FRACTION * resources.memory_limit_bytes / GIB)


def compute_job_cap(
    package: str, resources: Resources, max_jobs: int | None = None, nvcc_threads: int | None = None
) -> JobCap:
    """The cap for one package; max_jobs / nvcc_threads are the user's overrides (or None)."""
    budget = BUDGETS[package]
    cores = resources.effective_cores
    available = resources.available_bytes / GIB
    margin = safety_margin_gib(resources)
    usable = max(0.0, available - margin)
    notes: list[str] = []
    if resources.swap_total_bytes:
        notes.append(f"{resources.swap_total_bytes / GIB:.1f} GiB swap not counted")

    threads = _nvcc_threads(budget, cores, nvcc_threads, notes)
    if max_jobs is None:
        # Without an override, fewer nvcc threads per job is better than no job at all.
        while threads > 1 and usable < budget.gib_per_nvcc_thread * threads:
            threads -= 1
            notes.append(f"NVCC_THREADS lowered to {threads} to fit one job in memory")
    per_job = budget.gib_per_nvcc_thread * threads
    by_memory = math.floor(usable / per_job)
    by_cores = max(1, cores // threads)

    if max_jobs is None:
        if by_memory < 1:
            raise JobCapError(
                f"{package}: one compile job needs {per_job:.1f} GiB but the builder has"
                f" {available:.1f} GiB available, {margin:.1f} GiB of which is kept as safety"
                f" margin (no swap is counted); free memory on the builder, or set"
                f" build_max_jobs=1 to build anyway at the risk of an OOM kill"
            )
        jobs = min(by_memory, by_cores)
    else:
        jobs = max_jobs
        if jobs > by_cores:
            notes.append(
                f"build_max_jobs={max_jobs} lowered to {by_cores}: {max_jobs} jobs x"
                f" {threads} nvcc threads would exceed {cores} cores"
            )
            jobs = by_cores
        if jobs > by_memory:
            notes.append(
                f"WARNING: build_max_jobs={jobs} exceeds the memory cap of"
                f" {max(by_memory, 0)} job(s); a compile may be OOM-killed"
            )
    return JobCap(package, jobs, threads, cores, round(available, 1), round(margin, 1), per_job, notes)


def _nvcc_threads(budget: PackageBudget, cores: int, override: int | None, notes: list[str]) -> int:
    if budget.fixed_nvcc_threads is not None:
        if override is not None and override != budget.fixed_nvcc_threads:
            notes.append(
                f"build_nvcc_threads={override} ignored: {budget.package} is always"
                f" built with {budget.fixed_nvcc_threads} nvcc thread(s) per job"
            )
        return budget.fixed_nvcc_threads
    threads = override if override is not None else budget.default_nvcc_threads
    if threads > cores:
        if override is not None:
            notes.append(f"build_nvcc_threads={override} lowered to {cores}: never above the cores")
        threads = cores
    return max(1, threads)
