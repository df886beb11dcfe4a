"""roles/wheels facts and the cuobjdump parser, on real output captured on the lab machine."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

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


def _fake_docker(tmp_path, log_text: str) -> str:
    """A docker client that prints what BuildKit printed and fails, as docker build does."""
    output = tmp_path / "docker-output.txt"
    output.write_text(log_text)
    fake = tmp_path / "docker"
    fake.write_text(f"#!/bin/sh\ncat {output}\nexit 1\n")
    fake.chmod(0o755)
    return str(fake)


@pytest.mark.parametrize("base_ok", [False, True], ids=["wrong-digest", "other-failure"])
def test_a_base_image_digest_its_registry_lacks_fails_in_one_line(tmp_path, capsys, base_ok):
    # Real output of moby 20.10's BuildKit for a FROM whose digest the registry (distribution
    # 2.8.2) does not have: the lab's registry, the right name, the last hex digit changed.
    real = (DATA / "buildkit-from-digest-not-found.txt").read_text()
    wrong = "127.0.0.1:5055/exp/lab-cuda-devel@sha256:e1eb906b8466bc183b44a4bb620835918287954e43bcc884f9235b7d550780c9"
    assert wrong in real
    build_wheel = load_build_wheel()
    context = tmp_path / "context.tar"
    context.write_bytes(b"")
    (tmp_path / "wheelhouse").mkdir()
    base = wrong if not base_ok else wrong[:-1] + "8"  # the pushed digest: its failure is another one
    argv = ["--package", "flash-attn", "--key", "k", "--context", str(context), "--dockerfile", "f"]
    argv += ["--wheelhouse", str(tmp_path / "wheelhouse"), "--docker", _fake_docker(tmp_path, real)]
    argv += ["--build-arg", f"BASE_IMAGE={base}", "--build-arg", "SOURCE=context"]
    with pytest.raises(SystemExit) as exited:
        build_wheel.main(argv)
    assert exited.value.code == build_wheel.EXIT_BUILD_FAILED
    last = capsys.readouterr().err.strip().splitlines()[-2]  # before "full build log kept at"
    if base_ok:
        assert "docker build failed with exit 1" in last, last
        return
    assert last == (
        f"[wheels] flash-attn: base image {wrong}: no image with this digest at its registry (not found);"
        " build_base_image (or the stack's default) must name a digest its registry serves"
        " (`docker buildx imagetools inspect IMAGE`); nothing entered the wheelhouse"
    )
