"""roles/wheels on a real Docker engine: the builder rehearsal (inventory/lab_builder.py).

The deploy builds lab/fixtures/tiny_cuda_ext through roles/wheels/docker/flash-attn.Dockerfile and
roles/wheels/docker/sgl-kernel.Dockerfile on this machine's engine, with the real job cap, cuobjdump check
and wheelhouse. Each test session uses a fresh wheelhouse, so the first deploy really builds.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import yaml

from lab import registry
from lab.cuda_image import PENDING, REPOSITORY
from roles.shared.wheel_plan import context_tar, planned_builds
from roles.site import PROJECT_ROOT, BuildSettings, load_stack
from tests.lab.harness import require_docker, require_lab_tool, run_deploy

pytestmark = pytest.mark.lab

INVENTORY = PROJECT_ROOT / "inventory" / "lab_builder.py"
LAB_STACK = PROJECT_ROOT / "inventory" / "lab_builder.stack.yml"
FIXTURE = PROJECT_ROOT / "lab" / "fixtures" / "tiny_cuda_ext"
PACKAGES = ("flash-attn", "sgl-kernel")
BUILD_OP = "Wheels | Build the {package} "


class Builder:
    """Deploys of the builder rehearsal against one wheelhouse, timed."""

    def __init__(self, wheelhouse: Path, tmp: Path):
        self.wheelhouse = wheelhouse
        self.tmp = tmp
        # A source unique to this session: BuildKit's layer cache cannot serve the compile,
        # so the first deploy really runs nvcc (and its log shows the job cap it got).
        self.source = tmp / "tiny_cuda_ext"
        shutil.copytree(FIXTURE, self.source, ignore=shutil.ignore_patterns("build", "*.egg-info"))
        scale = self.source / "csrc" / "scale.cu"
        scale.write_text(scale.read_text() + f"// session {time.time_ns()}\n")

    def deploy(self, stack: Path | None = None, source: Path | None = None, base_image: str | None = None):
        env = {"INFERENCE_HOST_LAB_WHEELHOUSE": str(self.wheelhouse)}
        if base_image:
            env["INFERENCE_HOST_LAB_BUILDER_BASE_IMAGE"] = base_image
        if stack:
            env["INFERENCE_HOST_LAB_BUILDER_STACK"] = str(stack)
        env["INFERENCE_HOST_LAB_BUILDER_SOURCE"] = str(source or self.source)
        started = time.monotonic()
        run = run_deploy(INVENTORY, env=env, timeout=1200)
        run.seconds = time.monotonic() - started
        return run

    def entries(self, package: str) -> list[Path]:
        folder = self.wheelhouse / package
        return sorted(p for p in folder.iterdir() if (p / "inputs.json").exists()) if folder.exists() else []

    def stack_with(self, name: str, **pins) -> Path:
        raw = yaml.safe_load(LAB_STACK.read_text())
        raw["stacks"][raw["active"]].update(pins)
        path = self.tmp / f"{name}.stack.yml"
        path.write_text(yaml.safe_dump(raw))
        return path

    @property
    def cuobjdump(self) -> str:
        ours = self.wheelhouse / ".tools" / "cuobjdump" / "bin" / "cuobjdump"
        return str(ours) if ours.exists() else shutil.which("cuobjdump") or "/usr/local/cuda/bin/cuobjdump"


def built(run, package: str) -> bool:
    return any(name.startswith(BUILD_OP.format(package=package)) for name in run.changed)


@pytest.fixture(scope="module")
def builder(tmp_path_factory) -> Builder:
    require_docker()
    from lab.cuda_image import CUDA_ROOT

    require_lab_tool(
        (CUDA_ROOT / "bin" / "nvcc").exists(),
        f"no CUDA toolkit at {CUDA_ROOT} (nvcc) to build the lab's wheel builder image;"
        " set INFERENCE_HOST_LAB_CUDA (docs/lab.md: Prerequisites)",
    )
    tmp = tmp_path_factory.mktemp("wheels")
    return Builder(tmp / "wheelhouse", tmp)


@pytest.fixture(scope="module")
def first_build(builder):
    run = builder.deploy()
    assert run.returncode == 0, "first builder deploy failed\n" + run.explain()
    print(f"\n[wheels] first build of both wheels: {run.seconds:.1f}s", file=sys.stderr)
    return run


def test_first_deploy_builds_both_wheels_into_the_wheelhouse(builder, first_build):
    for package in PACKAGES:
        assert built(first_build, package), f"{package} was not built: {first_build.changed}"
        (entry,) = builder.entries(package)
        wheels = list(entry.glob("*.whl"))
        assert len(wheels) == 1, f"expected one wheel in {entry}"
        inputs = json.loads((entry / "inputs.json").read_text())
        assert inputs["key"] == entry.name and inputs["inputs"]["package"] == package
        # Built FROM the lab's image in its registry, by the digest its push reported (the
        # connector put it in place of the inventory's placeholder): BuildKit resolved that.
        base = inputs["inputs"]["build_args"]["BASE_IMAGE"]
        assert base == _lab_base_image() and base != PENDING, base
        assert re.fullmatch(rf"{re.escape(registry.ADDRESS)}/{REPOSITORY}@sha256:[0-9a-f]{{64}}", base), base


def test_every_admitted_wheel_holds_sm120_code(builder, first_build):
    for package in PACKAGES:
        (entry,) = builder.entries(package)
        (wheel,) = entry.glob("*.whl")
        with zipfile.ZipFile(wheel) as archive:
            (so,) = [n for n in archive.namelist() if n.endswith(".so")]
            target = archive.extract(so, builder.tmp / package)
        listing = subprocess.run(
            [builder.cuobjdump, "--list-elf", target], capture_output=True, text=True, check=True
        ).stdout
        assert re.search(r"\.sm_120\.cubin", listing), listing
        assert "sm_120" in (entry / "elf-check.txt").read_text()


def test_job_cap_reached_the_compiler(builder, first_build):
    for package in PACKAGES:
        (entry,) = builder.entries(package)
        cap = json.loads((entry / "inputs.json").read_text())["job_cap"]
        jobs, threads = map(int, re.match(r"\S+ MAX_JOBS=(\d+) x NVCC_THREADS=(\d+)", cap).groups())
        assert jobs * threads <= os.cpu_count()
        log = (entry / "build.log").read_text()
        # what the compiler saw: the fixture prints its MAX_JOBS and every nvcc command line
        assert f"tiny_cuda_ext: MAX_JOBS={jobs} NVCC_THREADS={threads}" in log
        compiles = [line for line in log.splitlines() if "compile:" in line and ".cu " in line]
        assert compiles and all(f"--threads={threads}" in line for line in compiles)
        assert "-gencode=arch=compute_120,code=sm_120" in compiles[0]
    # and it was printed in the deploy output before the build
    assert "job cap flash-attn: MAX_JOBS=" in first_build.stderr


def test_second_deploy_is_a_cache_hit_in_seconds(builder, first_build):
    run = builder.deploy()
    assert run.returncode == 0, run.explain()
    assert run.changed == [], f"a cache hit must change nothing: {run.changed}"
    assert "in the wheelhouse" in run.stderr
    assert run.seconds < 30, f"cache hit took {run.seconds:.1f}s"
    print(f"\n[wheels] cache-hit deploy: {run.seconds:.1f}s", file=sys.stderr)


def test_engine_upgrade_that_keeps_kernel_inputs_rebuilds_nothing(builder, first_build):
    stack = builder.stack_with("flashinfer-only", flashinfer="0.6.4")
    run = builder.deploy(stack=stack)
    assert run.returncode == 0, run.explain()
    assert run.changed == [], run.changed


def test_changed_input_rebuilds_exactly_the_affected_wheel(builder, first_build):
    before = {p: builder.entries(p) for p in PACKAGES}
    stack = builder.stack_with("flash-attn-bump", flash_attn="2.8.2")
    run = builder.deploy(stack=stack)
    assert run.returncode == 0, run.explain()
    assert built(run, "flash-attn") and not built(run, "sgl-kernel"), run.changed
    assert len(builder.entries("flash-attn")) == len(before["flash-attn"]) + 1
    assert builder.entries("sgl-kernel") == before["sgl-kernel"]


def test_failed_compile_fails_the_deploy_with_the_log_tail(builder, first_build):
    broken = builder.tmp / "broken_ext"
    shutil.copytree(FIXTURE, broken, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    scale = broken / "csrc" / "scale.cu"
    scale.write_text(scale.read_text() + "\nthis is not CUDA;\n")
    run = builder.deploy(source=broken)
    assert run.returncode != 0
    assert "docker build failed" in run.stderr
    assert "wheel build FAILED" in run.stderr and "scale.cu" in run.stderr  # the tail
    assert "nothing entered the wheelhouse" in run.stderr


def test_a_base_image_digest_the_registry_lacks_stops_the_build_in_one_line(builder, first_build):
    pinned = _lab_base_image()
    # Valid-looking, the right repository, one hex digit changed: what a mistyped or stale pin is.
    wrong = pinned[:-1] + ("0" if pinned[-1] != "0" else "1")
    before = {p: builder.entries(p) for p in PACKAGES}
    run = builder.deploy(base_image=wrong)
    assert run.returncode != 0, run.explain()
    line = rf"\[wheels\] (flash-attn|sgl-kernel): base image {re.escape(wrong)}: no image with this digest at its"
    assert re.search(line + r" registry \(not found\); build_base_image", run.stderr), run.explain()
    assert "nothing entered the wheelhouse" in run.stderr
    assert {p: builder.entries(p) for p in PACKAGES} == before


def _build_script(builder, package: str, source: Path, timeout_s: int, **extra_args):
    settings = BuildSettings(source_overrides={package: str(source)}, with_torch=False, base_image=_lab_base_image())
    stack = load_stack(LAB_STACK).active
    (wheel,) = [w for w in planned_builds(stack, settings) if w.package == package]
    context = builder.tmp / f"{package}-{source.name}.tar"
    context.write_bytes(context_tar(wheel, [os.environ.get("SSL_CERT_FILE", "/etc/ssl/certs/ca-certificates.crt")]))
    args = {**wheel.build_args, "MAX_JOBS": "1", "NVCC_THREADS": "1", **extra_args}
    command = [
        sys.executable,
        str(PROJECT_ROOT / "roles" / "wheels" / "files" / "build_wheel.py"),
        "--package",
        package,
        "--key",
        "test-" + source.name,
        "--context",
        str(context),
        "--dockerfile",
        wheel.dockerfile.name,
        "--wheelhouse",
        str(builder.wheelhouse),
        "--docker",
        "/usr/bin/docker",
        "--cuobjdump",
        builder.cuobjdump,
        "--timeout-s",
        str(timeout_s),
        "--job-cap",
        "test",
    ]
    for name, value in args.items():
        command += ["--build-arg", f"{name}={value}"]
    started = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s + 120, check=False)
    return result, time.monotonic() - started


def _lab_base_image() -> str:
    from lab.cuda_image import cuda_devel_image

    return cuda_devel_image()


def test_wheel_for_another_arch_is_refused(builder, first_build):
    result, _ = _build_script(builder, "flash-attn", FIXTURE, 600, CUDA_ARCHS="90")
    assert result.returncode == 3, result.stdout + result.stderr
    assert "REFUSED" in result.stderr and "no sm_120 code" in result.stderr
    assert "sm_90" in result.stderr
    assert not (builder.wheelhouse / "flash-attn" / f"test-{FIXTURE.name}").exists()


def test_hung_build_is_stopped_at_the_timeout(builder, first_build):
    slow = builder.tmp / "slow_ext"
    shutil.copytree(FIXTURE, slow, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    setup = slow / "setup.py"
    setup.write_text("import time\ntime.sleep(3600)  # a compile that never ends\n" + setup.read_text())
    result, seconds = _build_script(builder, "flash-attn", slow, 25)
    assert result.returncode == 4, result.stdout + result.stderr
    assert "ran past 25s and was stopped" in result.stderr
    assert seconds < 90
