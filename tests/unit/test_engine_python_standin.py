"""The lab's stand-in engine python (lab/standins/sglang_server/engine_python.py): its all-reduce
runs for real over CPU processes and answers in checks/programs/allreduce.py's lines, which the
interconnect suite's own judge reads back; anything else runs with the real engine python."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from checks import gpu_parsers as parse
from checks import test_interconnect

ROOT = Path(__file__).resolve().parents[2]
STANDIN = ROOT / "lab" / "standins" / "sglang_server" / "engine_python.py"
PROGRAM = ROOT / "checks" / "programs" / "allreduce.py"


def run(tmp_path, *args: str, gpus: int = 2, env: dict | None = None) -> subprocess.CompletedProcess:
    """The stand-in with an nvidia-smi that lists `gpus` GPUs (as the lab's stand-in answers it)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    indexes = " ".join(str(i) for i in range(gpus))
    smi.write_text(f'#!/bin/sh\n[ "$1" = --query-gpu=index ] || exit 9\nfor i in {indexes}; do echo $i; done\n')
    smi.chmod(0o755)
    program = tmp_path / "allreduce.py"  # run_program copies the program to a temporary folder
    program.write_text(PROGRAM.read_text())
    return subprocess.run(
        [sys.executable, str(STANDIN), *[str(program) if a == "PROGRAM" else a for a in args]],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", **(env or {})},
    )


def test_the_all_reduce_is_real_and_judged_by_the_suites_own_judge(tmp_path):
    result = run(tmp_path, "PROGRAM", "1", gpus=3)
    assert result.returncode == 0, result.stderr
    found = parse.parse_json_line(result.stdout, "IH-ALLREDUCE ")
    assert found["world_size"] == 3 and found["size_mib"] == 1 and found["correct"] is True
    assert 0 < found["busbw_gbps"] == pytest.approx(found["algbw_gbps"] * 2 * 2 / 3)
    assert "lab stand-in" in found["nccl_version"]
    expect = SimpleNamespace(
        gpu_count=3, allreduce_timeout_s=120, allreduce_min_busbw_gbps=1e-6, allreduce_floor_source="x", gpu_link="PHB"
    )
    detail = test_interconnect.judge_allreduce({"result": SimpleNamespace(rc=0, stdout=result.stdout)}, expect)
    assert "over 3 GPUs, 1 MiB" in detail and not detail.startswith("busbw 0.0 ")


def test_visible_devices_narrow_the_ranks_and_one_gpu_has_no_collective(tmp_path):
    two = run(tmp_path, "PROGRAM", "1", gpus=4, env={"CUDA_VISIBLE_DEVICES": "0,1"})
    assert parse.parse_json_line(two.stdout, "IH-ALLREDUCE ")["world_size"] == 2
    one = run(tmp_path, "PROGRAM", "1", gpus=1)
    assert parse.parse_json_line(one.stdout, "IH-ALLREDUCE ")["world_size"] == 1
    assert "IH-ALLREDUCE-STAGE collective" not in one.stdout


def test_a_size_beyond_the_stand_in_is_refused_in_one_line(tmp_path):
    result = run(tmp_path, "PROGRAM", "256")
    assert result.returncode == 1 and "IH-ALLREDUCE " not in result.stdout
    assert "set health_allreduce_size_mib" in result.stderr and len(result.stderr.splitlines()) == 1


def test_anything_else_runs_with_the_real_engine_python(tmp_path):
    result = run(
        tmp_path,
        "-c",
        "import sys; print(sys.argv[1:])",
        "x",
        env={"INFERENCE_HOST_STANDIN_ENGINE_PYTHON": sys.executable},
    )
    assert result.returncode == 0 and result.stdout.strip() == "['x']", result.stderr
