"""Which wheels a stack builds, their input keys, and the build context (roles/shared/wheel_plan.py)."""

from __future__ import annotations

import dataclasses
import io
import re
import shutil
import tarfile
from pathlib import Path

import pytest
from pydantic import ValidationError

from roles.shared import wheel_plan as plan
from roles.shared.wheel_plan import CUDA_DEVEL_IMAGES, ROLE_DIR, WheelPlanError, context_tar, planned_builds
from roles.site import PROJECT_ROOT, BuildSettings, load_stack

STACK = load_stack(PROJECT_ROOT / "inventory" / "stack.yml")
ACTIVE = STACK.active  # sglang 0.5.9, CUDA 12.8: flash-attn built, sgl-kernel prebuilt
BOTH = dataclasses.replace(ACTIVE, kernel=dataclasses.replace(ACTIVE.kernel, source="build"))
FIXTURE = PROJECT_ROOT / "lab" / "fixtures" / "tiny_cuda_ext"
CUDA_12_8 = (
    "nvidia/cuda:12.8.1-devel-ubuntu24.04@sha256:520292dbb4f755fd360766059e62956e9379485d9e073bbd2f6e3c20c270ed66"
)


def keys(stack, build=None):
    return {wheel.package: wheel.key for wheel in planned_builds(stack, build or BuildSettings())}


def test_production_stack_builds_flash_attn_from_the_cuda_12_8_devel_image():
    (wheel,) = planned_builds(ACTIVE, BuildSettings())
    assert wheel.package == "flash-attn" and wheel.version == "2.8.3"
    assert wheel.build_args == {
        "BASE_IMAGE": CUDA_12_8,
        "SOURCE": "pypi",
        "PYTHON_VERSION": "3.12",
        "TORCH_VERSION": "2.9.1",
        "FLASH_ATTN_VERSION": "2.8.3",
        "FLASH_ATTN_SHA256": "1e71dd64a9e0280e0447b8a0c2541bad4bf6ac65bdeaa2f90e51a9e57de0370d",
        "CUDA_ARCHS": "120",
    }


def test_sgl_kernel_build_uses_the_patched_git_tree_of_the_sglang_release():
    wheels = {w.package: w for w in planned_builds(BOTH, BuildSettings())}
    sgl = wheels["sgl-kernel"]
    assert sgl.source == "git" and sgl.build_args["SGLANG_GIT_REF"] == "v0.5.9"
    assert [p.name for p in sgl.patches] == ["0001-compile-only-sm120a.patch"]


def test_cuda_13_stack_with_prebuilt_kernels_builds_nothing():
    assert planned_builds(STACK.stacks["sglang-0.5.23-cu130"], BuildSettings()) == []


def test_building_the_renamed_kernel_package_is_refused_clearly():
    renamed = dataclasses.replace(
        STACK.stacks["sglang-0.5.23-cu130"],
        kernel=dataclasses.replace(STACK.stacks["sglang-0.5.23-cu130"].kernel, source="build"),
    )
    with pytest.raises(WheelPlanError, match="sglang-kernel 0.4.10.*source: prebuilt"):
        planned_builds(renamed, BuildSettings())


def test_keys_are_stable():
    assert keys(BOTH) == keys(BOTH)


def test_job_cap_and_wheelhouse_are_not_inputs():
    tuned = BuildSettings(max_jobs=3, nvcc_threads=1, wheelhouse_dir="/srv/w", force=["flash-attn"])
    assert keys(BOTH, tuned) == keys(BOTH)


def test_engine_upgrade_without_kernel_input_changes_rebuilds_nothing():
    upgraded = dataclasses.replace(BOTH, id="next", flashinfer="0.6.4")
    assert keys(upgraded) == keys(BOTH)


def test_torch_upgrade_rebuilds_both():
    before, after = keys(BOTH), keys(dataclasses.replace(BOTH, torch="2.9.2"))
    assert before["flash-attn"] != after["flash-attn"]
    assert before["sgl-kernel"] != after["sgl-kernel"]


def test_flash_attn_bump_rebuilds_only_flash_attn():
    before, after = keys(BOTH), keys(dataclasses.replace(BOTH, flash_attn="2.8.2"))
    assert before["flash-attn"] != after["flash-attn"]
    assert before["sgl-kernel"] == after["sgl-kernel"]


def test_sglang_release_changes_only_the_sgl_kernel_source_ref():
    before, after = keys(BOTH), keys(dataclasses.replace(BOTH, sglang="0.5.8"))
    assert before["flash-attn"] == after["flash-attn"]
    assert before["sgl-kernel"] != after["sgl-kernel"]


def test_base_image_is_an_input():
    other = BuildSettings(base_image="nvidia/cuda:12.8.1-devel-ubuntu24.04@sha256:" + "0" * 64)
    assert keys(BOTH, other)["flash-attn"] != keys(BOTH)["flash-attn"]


def test_unknown_cuda_needs_a_base_image_setting():
    with pytest.raises(WheelPlanError, match="CUDA 11.8.*build_base_image setting pinned by digest"):
        planned_builds(dataclasses.replace(BOTH, cuda="11.8"), BuildSettings())


def test_every_default_devel_image_is_pinned_by_digest():
    for cuda, image in CUDA_DEVEL_IMAGES.items():
        name, _, digest = image.partition("@")
        assert name == f"nvidia/cuda:{cuda}.1-devel-ubuntu24.04" and re.fullmatch(r"sha256:[0-9a-f]{64}", digest)
    assert len({image.partition("@")[2] for image in CUDA_DEVEL_IMAGES.values()}) == len(CUDA_DEVEL_IMAGES)


def test_the_digest_reaches_the_build_args_and_the_dockerfiles_from():
    pinned = "registry.example:5000/cuda/devel:12.8@sha256:" + "a" * 64
    for wheel in planned_builds(BOTH, BuildSettings(base_image=pinned)):
        assert wheel.build_args["BASE_IMAGE"] == pinned and wheel.inputs["build_args"]["BASE_IMAGE"] == pinned
        text = wheel.dockerfile.read_text()
        # The first FROM is the one BuildKit resolves and pulls: it must take the argument.
        assert re.search(r"^FROM (\S+)", text, re.MULTILINE).group(1) == "${BASE_IMAGE}", wheel.dockerfile


def test_a_tag_alone_is_refused_in_one_line_naming_how_to_read_a_digest():
    with pytest.raises(ValidationError) as raised:
        BuildSettings(base_image="nvidia/cuda:12.8.1-devel-ubuntu24.04")
    (error,) = raised.value.errors()
    assert error["loc"] == ("base_image",)
    assert "never a tag alone" in error["msg"] and "docker buildx imagetools inspect" in error["msg"]
    assert "\n" not in error["msg"]


def test_dockerfile_and_patch_contents_are_inputs(tmp_path, monkeypatch):
    role = tmp_path / "wheels"
    shutil.copytree(ROLE_DIR / "docker", role / "docker")
    shutil.copytree(ROLE_DIR / "patches", role / "patches")
    docker = role / "docker"
    monkeypatch.setattr(plan, "DOCKER_DIR", docker)
    monkeypatch.setattr(plan, "HELPERS_DIR", docker / "wheels")
    monkeypatch.setattr(plan, "PATCHES_DIR", role / "patches")
    original = keys(BOTH)
    assert original == keys(BOTH)  # the copy hashes like the original
    patch = role / "patches" / "sgl-kernel" / "0001-compile-only-sm120a.patch"
    patch.write_text(patch.read_text() + "\n")
    changed = keys(BOTH)
    assert changed["sgl-kernel"] != original["sgl-kernel"]
    assert changed["flash-attn"] == original["flash-attn"]
    dockerfile = docker / "flash-attn.Dockerfile"
    dockerfile.write_text(dockerfile.read_text() + "# changed\n")
    assert keys(BOTH)["flash-attn"] != changed["flash-attn"]
    helper = docker / "wheels" / "compile.sh"
    helper.write_text(helper.read_text() + "\n")
    assert all(keys(BOTH)[p] != changed[p] for p in ("sgl-kernel",))


def test_source_override_content_is_an_input(tmp_path):
    tree = tmp_path / "ext"
    shutil.copytree(FIXTURE, tree, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    settings = BuildSettings(source_overrides={"flash-attn": str(tree)})
    first = keys(ACTIVE, settings)["flash-attn"]
    (tree / "build").mkdir(exist_ok=True)
    (tree / "build" / "junk.o").write_bytes(b"build output is not an input")
    assert keys(ACTIVE, settings)["flash-attn"] == first
    (tree / "csrc" / "scale.cu").write_text((tree / "csrc" / "scale.cu").read_text() + "\n")
    assert keys(ACTIVE, settings)["flash-attn"] != first


def test_context_tar_is_reproducible_and_holds_what_the_dockerfile_copies(tmp_path):
    settings = BuildSettings(source_overrides={"flash-attn": str(FIXTURE)})
    (wheel,) = planned_builds(ACTIVE, settings)
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    first = context_tar(wheel, [str(ca)])
    assert first == context_tar(wheel, [str(ca)])
    with tarfile.open(fileobj=io.BytesIO(first)) as tar:
        names = tar.getnames()
    assert "flash-attn.Dockerfile" in names and "wheels/compile.sh" in names
    assert "extra-ca/site-0.crt" in names and "src/setup.py" in names
    assert "src/csrc/scale.cu" in names
    assert wheel.source == "context" and wheel.patches == ()


def test_dockerfiles_keep_the_production_defaults():
    for name in ("flash-attn", "sgl-kernel"):
        text = (ROLE_DIR / "docker" / f"{name}.Dockerfile").read_text()
        assert f"ARG BASE_IMAGE={CUDA_12_8}\n" in text  # the same pin as the plan's default
        assert "FROM scratch AS artifact" in text and "--mount=type=cache" in text
        assert "# syntax=" not in text.replace("No `# syntax=` line", "")
    flash = (ROLE_DIR / "docker" / "flash-attn.Dockerfile").read_text()
    assert "FLASH_ATTENTION_FORCE_BUILD=TRUE" in flash and "FLASH_ATTN_CUDA_ARCHS=${CUDA_ARCHS}" in flash
    sgl = (ROLE_DIR / "docker" / "sgl-kernel.Dockerfile").read_text()
    assert "SGL_KERNEL_COMPILE_THREADS=1;ENABLE_BELOW_SM90=OFF" in sgl
    assert "--fuzz=0" in sgl
    assert Path(ROLE_DIR / "patches" / "sgl-kernel").is_dir()
