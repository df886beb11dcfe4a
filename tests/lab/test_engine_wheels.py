"""Kernel wheels from a separate builder to the gpu guest (inventory/lab.py with
INFERENCE_HOST_LAB_ENGINE_WHEEL_SOURCE): this machine's Docker engine builds a small real CUDA
extension (lab/fixtures/tiny_cuda_ext) as the stack's flash-attn through the real
Dockerfile; the deploy carries the wheel from that builder's wheelhouse to the guest's and
installs it with --no-deps --no-index. A stack that builds flash-attn from source and finds no
wheel stops with its message; a rebuilt wheel (new inputs, new key) reaches a new environment."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

import lab
from roles.site import PROJECT_ROOT
from tests.lab.harness import LAB_INVENTORY, require_lab_tool, run_deploy

pytestmark = pytest.mark.lab

FIXTURE = PROJECT_ROOT / "lab" / "fixtures" / "tiny_cuda_ext"
ROOT = "/opt/inference-host"
GUEST_WHEELHOUSE = "/var/lib/inference-host/wheelhouse/flash-attn"


class Scenario:
    def __init__(self, tmp: Path):
        self.wheelhouse = tmp / "wheelhouse"
        self.source = tmp / "tiny_cuda_ext"
        shutil.copytree(FIXTURE, self.source, ignore=shutil.ignore_patterns("build", "*.egg-info"))
        self.mark("first")

    def mark(self, label: str) -> str:
        """A distinct source (a new key) whose wheel carries the mark in its Python code."""
        value = f"{label}-{time.time_ns()}"
        init = self.source / "tiny_cuda_ext" / "__init__.py"
        text = init.read_text().split("\nBUILD_MARK")[0].rstrip("\n")
        init.write_text(f"{text}\nBUILD_MARK = {value!r}\n")
        return value

    def deploy(self, *extra: str):
        return run_deploy(
            LAB_INVENTORY,
            *extra,
            timeout=1500,
            env={
                "INFERENCE_HOST_LAB_ENGINE_WHEEL_SOURCE": str(self.source),
                "INFERENCE_HOST_LAB_WHEELHOUSE": str(self.wheelhouse),
            },
        )


@pytest.fixture(scope="module")
def scenario(tmp_path_factory) -> Scenario:
    from lab.cuda_image import CUDA_ROOT

    require_lab_tool(
        (CUDA_ROOT / "bin" / "nvcc").exists(),
        f"no CUDA toolkit at {CUDA_ROOT} (nvcc) for the lab's wheel builder image;"
        " set INFERENCE_HOST_LAB_CUDA (docs/lab.md: Prerequisites)",
    )
    return Scenario(tmp_path_factory.mktemp("engine-wheels"))


def _installed_mark(gpu_guest) -> str:
    return gpu_guest.check_output(
        f"cat {ROOT}/current/lib/python3*/site-packages/tiny_cuda_ext/__init__.py | sed -n 's/^BUILD_MARK = //p'"
    )


def test_wheels_travel_from_the_builder_and_never_from_an_index(gpu_guest, lab_second_deploy, scenario):
    live = gpu_guest.file(f"{ROOT}/current").linked_to
    try:
        # Only the guest: the builder has built nothing, so its wheelhouse holds no wheel.
        missing = scenario.deploy("--limit", lab.pyinfra_name("gpu"))
        text = missing.stdout + missing.stderr
        assert missing.returncode != 0, "a source-built flash-attn without a wheel must stop the deploy"
        assert "flash-attn 2.8.3" in text and "holds no wheel; it is never taken from an index" in text, (
            missing.explain()
        )
        assert "deploy.py --limit @local" in text
        assert gpu_guest.file(f"{ROOT}/current").linked_to == live  # the live one kept serving

        first = scenario.deploy()
        assert first.returncode == 0, first.explain()
        assert _installed_mark(gpu_guest).startswith("'first-")
        freeze = gpu_guest.check_output(f"/usr/local/bin/uv pip freeze --python {ROOT}/current/bin/python")
        lines = freeze.splitlines()
        assert "sglang==0.5.9" in lines  # from the lock (its GPU-free subset in the lab)
        (wheel,) = [line for line in lines if line.startswith("tiny-cuda-ext")]
        assert wheel.startswith(f"tiny-cuda-ext @ file://{GUEST_WHEELHOUSE}/")  # the guest's copy
        copies = gpu_guest.check_output(f"ls {GUEST_WHEELHOUSE}").split()
        assert len(copies) == 1 and list(scenario.wheelhouse.glob(f"flash-attn/{copies[0]}/*.whl"))
        before = gpu_guest.file(f"{ROOT}/current").linked_to

        mark = scenario.mark("rebuilt")
        rebuilt = scenario.deploy()
        assert rebuilt.returncode == 0, rebuilt.explain()
        assert _installed_mark(gpu_guest) == repr(mark)
        assert gpu_guest.file(f"{ROOT}/current").linked_to != before
    finally:
        assert run_deploy().returncode == 0
    assert gpu_guest.file(f"{ROOT}/current").linked_to == live
