"""roles/wheels facts and the cuobjdump parser, on real output captured on the lab machine."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from roles.shared.host_facts import WheelhouseEntry
from roles.site import PROJECT_ROOT
from roles.wheels.facts import BuilderResources, CuobjdumpPath, DockerBuildClient
from roles.wheels.jobcap import GIB, compute_job_cap

DATA = Path(__file__).parent / "data" / "wheels"


def lines(name: str) -> list[str]:
    return (DATA / name).read_text().splitlines()


def load_build_wheel():
    spec = importlib.util.spec_from_file_location(
        "build_wheel", PROJECT_ROOT / "roles" / "wheels" / "files" / "build_wheel.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_builder_resources_of_the_lab_machine():
    resources = BuilderResources().process(lines("builder-resources-lab-2core-24g.txt"))
    assert resources.cores == 2
    assert resources.mem_total_bytes == 24684084 * 1024
    assert resources.swap_total_bytes == 0
    assert resources.cgroup_memory_limit_bytes is None  # v1 "unlimited" is a huge number
    assert resources.cgroup_cpu_limit is None  # cfs_quota_us -1
    assert 20 * GIB < resources.available_bytes < resources.mem_total_bytes
    cap = compute_job_cap("flash-attn", resources)
    assert (cap.max_jobs, cap.nvcc_threads) == (1, 2)


def test_builder_resources_inside_a_limited_container():
    resources = BuilderResources().process(lines("builder-resources-container-2g-1.5cpu.txt"))
    assert resources.cgroup_memory_limit_bytes == 2 * GIB
    assert resources.memory_limit_bytes == 2 * GIB
    assert resources.available_bytes <= 2 * GIB
    assert resources.cgroup_cpu_limit == 1.5 and resources.effective_cores == 1


def test_docker_build_client_prefers_a_client_that_can_use_buildkit():
    # The 28.x client has no buildx here: only the 20.10 client can run BuildKit builds.
    client = DockerBuildClient().process(lines("docker-clients-lab.txt"))
    assert client == {
        "path": "/usr/bin/docker",
        "version": "20.10.24+dfsg1",
        "server": "20.10.24+dfsg1",
        "buildx": False,
    }


def test_docker_build_client_takes_docker_ce_with_buildx():
    output = ["client /usr/bin/docker 28.2.2", "server 28.2.2", "buildx yes"]
    assert DockerBuildClient().process(output)["path"] == "/usr/bin/docker"


def test_docker_build_client_none_without_engine_or_buildkit():
    assert DockerBuildClient().process(["client /usr/bin/docker 20.10.24", "server none", "buildx no"]) is None
    assert DockerBuildClient().process(["client /usr/local/bin/docker 28.2.2", "server 28.2.2", "buildx no"]) is None
    assert DockerBuildClient().process([]) is None


def test_wheelhouse_entry_complete_absent_incomplete():
    fact = WheelhouseEntry()
    listing = ["present", "build.log", "elf-check.txt", "inputs.json", "b-1-cp312.whl", "a-1.whl"]
    assert fact.process(listing) == ["a-1.whl", "b-1-cp312.whl"]
    assert fact.process([]) is None  # no inputs.json: absent or interrupted
    assert "inputs.json" in fact.command(path="/w/flash-attn/k")


def test_cuobjdump_path():
    assert CuobjdumpPath().process(["/usr/local/cuda/bin/cuobjdump"]) == "/usr/local/cuda/bin/cuobjdump"
    assert CuobjdumpPath().process([]) is None


def test_list_elf_parser_on_real_output():
    build_wheel = load_build_wheel()
    text = (DATA / "cuobjdump-list-elf-sm120-sm90.txt").read_text()
    assert build_wheel.parse_list_elf(text) == ["sm_120", "sm_90"]
    assert build_wheel.parse_list_elf((DATA / "cuobjdump-list-elf-no-device-code.txt").read_text()) == []
    assert build_wheel.parse_list_elf("ELF file    1: common_ops.1.sm_120a.cubin") == ["sm_120a"]


def test_required_arch_accepts_sm120_variants_only():
    build_wheel = load_build_wheel()
    accepted = [
        a
        for a in ("sm_120", "sm_120a", "sm_120f", "sm_12", "sm_121a", "sm_90", "sm_100a")
        if build_wheel.REQUIRED_ARCH_RE.fullmatch(a)
    ]
    assert accepted == ["sm_120", "sm_120a", "sm_120f"]
