"""Job-cap arithmetic of roles/wheels across machine sizes, cgroup limits and no-swap edges."""

from __future__ import annotations

import pytest

from roles.wheels.jobcap import GIB, JobCapError, Resources, compute_job_cap, safety_margin_gib


def machine(
    cores: int, total_gib: float, available_gib: float | None = None, swap_gib: float = 0, **cgroup
) -> Resources:
    available = total_gib * 0.95 if available_gib is None else available_gib
    return Resources(
        cores=cores,
        mem_total_bytes=int(total_gib * GIB),
        mem_available_bytes=int(available * GIB),
        swap_total_bytes=int(swap_gib * GIB),
        **cgroup,
    )


def test_lab_machine_2_cores_24_gb_no_swap():
    lab = machine(2, 24, available_gib=22.6)
    flash = compute_job_cap("flash-attn", lab)
    assert (flash.max_jobs, flash.nvcc_threads) == (1, 2)  # 10 GiB per job, 2 cores
    sgl = compute_job_cap("sgl-kernel", lab)
    assert (sgl.max_jobs, sgl.nvcc_threads) == (2, 1)  # 6 GiB per job fits 3, cores allow 2
    assert safety_margin_gib(lab) == 4.0


def test_big_builder_64_cores_512_gb():
    big = machine(64, 512, available_gib=500)
    flash = compute_job_cap("flash-attn", big)
    # margin 51.2 GiB -> 448.8 usable / 20 GiB per 4-thread job = 22; cores allow 64/4 = 16
    assert (flash.max_jobs, flash.nvcc_threads) == (16, 4)
    sgl = compute_job_cap("sgl-kernel", big)
    assert (sgl.max_jobs, sgl.nvcc_threads) == (64, 1)
    assert safety_margin_gib(big) == pytest.approx(51.2)


def test_memory_not_cores_limits_a_many_core_small_memory_builder():
    cap = compute_job_cap("flash-attn", machine(64, 64, available_gib=60))
    # 60 - 6.4 margin = 53.6 usable / 20 per job = 2 jobs, though 64 cores would allow 16
    assert (cap.max_jobs, cap.nvcc_threads) == (2, 4)


@pytest.mark.parametrize("cores", [1, 2, 3, 8, 16, 64, 192])
@pytest.mark.parametrize("total_gib", [16, 24, 128, 512, 2048])
@pytest.mark.parametrize("package", ["flash-attn", "sgl-kernel"])
def test_never_above_cores_nor_memory(cores, total_gib, package):
    resources = machine(cores, total_gib)
    try:
        cap = compute_job_cap(package, resources)
    except JobCapError:
        assert total_gib <= 16
        return
    assert cap.max_jobs >= 1 and cap.nvcc_threads >= 1
    assert cap.max_jobs * cap.nvcc_threads <= max(1, cores)
    assert cap.max_jobs * cap.per_job_gib <= cap.usable_gib


def test_no_swap_too_little_memory_refuses_with_a_clear_message():
    starved = machine(8, 16, available_gib=7)  # 7 - 4 margin = 3 GiB < 5 GiB for one thread
    with pytest.raises(JobCapError) as error:
        compute_job_cap("flash-attn", starved)
    message = str(error.value)
    assert "flash-attn" in message and "5.0 GiB" in message and "7.0 GiB available" in message
    assert "build_max_jobs=1" in message


def test_no_swap_tight_memory_lowers_nvcc_threads_before_giving_up():
    tight = machine(8, 16, available_gib=15)  # 11 usable: one 4-thread job (20) does not fit
    cap = compute_job_cap("flash-attn", tight)
    assert (cap.max_jobs, cap.nvcc_threads) == (1, 2)
    assert any("NVCC_THREADS lowered to 2" in note for note in cap.notes)


def test_available_memory_exactly_at_margin_is_no_memory():
    with pytest.raises(JobCapError):
        compute_job_cap("sgl-kernel", machine(4, 24, available_gib=4.0))


def test_swap_is_never_counted():
    without = compute_job_cap("flash-attn", machine(64, 64, available_gib=60))
    with_swap = compute_job_cap("flash-attn", machine(64, 64, available_gib=60, swap_gib=256))
    assert (with_swap.max_jobs, with_swap.nvcc_threads) == (without.max_jobs, without.nvcc_threads)
    assert any("swap not counted" in note for note in with_swap.notes)


def test_cgroup_memory_limit_of_a_guest_wins_over_meminfo():
    # A container on a 512 GB host limited to 32 GiB, 8 GiB of it in use.
    guest = machine(64, 512, available_gib=500, cgroup_memory_limit_bytes=32 * GIB, cgroup_memory_usage_bytes=8 * GIB)
    cap = compute_job_cap("flash-attn", guest)
    assert cap.available_gib == 24.0 and cap.margin_gib == 4.0
    assert (cap.max_jobs, cap.nvcc_threads) == (1, 4)


def test_cgroup_cpu_quota_limits_cores():
    cap = compute_job_cap("sgl-kernel", machine(64, 512, available_gib=500, cgroup_cpu_limit=4.0))
    assert cap.cores == 4 and cap.max_jobs == 4


def test_override_max_jobs_is_used_but_never_above_cores():
    lab = machine(2, 24, available_gib=22.6)
    cap = compute_job_cap("flash-attn", lab, max_jobs=8)
    assert (cap.max_jobs, cap.nvcc_threads) == (1, 2)
    assert any("build_max_jobs=8 lowered to 1" in note for note in cap.notes)
    cap = compute_job_cap("flash-attn", lab, max_jobs=1, nvcc_threads=1)
    assert (cap.max_jobs, cap.nvcc_threads) == (1, 1)
    cap = compute_job_cap("sgl-kernel", lab, max_jobs=1)
    assert cap.max_jobs == 1


def test_override_beyond_memory_builds_with_a_warning_instead_of_refusing():
    cap = compute_job_cap("flash-attn", machine(8, 16, available_gib=7), max_jobs=1)
    assert cap.max_jobs == 1
    assert any(note.startswith("WARNING") for note in cap.notes)


def test_nvcc_threads_override_never_above_cores():
    cap = compute_job_cap("flash-attn", machine(2, 64, available_gib=60), nvcc_threads=8)
    assert cap.nvcc_threads == 2 and cap.max_jobs == 1
    assert any("lowered to 2" in note for note in cap.notes)


def test_sgl_kernel_always_uses_one_nvcc_thread():
    cap = compute_job_cap("sgl-kernel", machine(16, 128), nvcc_threads=4)
    assert cap.nvcc_threads == 1
    assert any("ignored" in note for note in cap.notes)


def test_describe_names_the_numbers_printed_before_a_build():
    text = compute_job_cap("flash-attn", machine(2, 24, available_gib=22.6)).describe()
    assert text.startswith("flash-attn: MAX_JOBS=1 x NVCC_THREADS=2 on 2 cores")
    assert "4.0 GiB margin" in text and "10.0 GiB budget per job" in text
