"""Which kernel wheels a stack needs built, everything that goes into each, and its key.

Shared by roles/wheels (which builds them on the builders) and roles/engine_envs (which installs
them on the gpu nodes, keyed the same way); the Dockerfiles and patches are roles/wheels' own.

The key is a hash of every input of a wheel: its Dockerfile, the helper scripts copied into
the image, its patches, the source (a pinned version, or the content of a local source tree)
and the build arguments that change the compiled code (base image, Python, torch, CUDA
architectures, versions). The job cap is not an input: it changes how fast a wheel is built,
not what is built. So an engine upgrade that keeps torch, CUDA and the kernel pins rebuilds
nothing, and one that moves any of them rebuilds exactly the wheels that depend on it.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from roles.shared.patches import patch_queue
from roles.site import PROJECT_ROOT, BuildSettings, EngineStack
from roles.site import lock as site_lock

ROLE_DIR = PROJECT_ROOT / "roles" / "wheels"  # the role that builds them, and its assets
DOCKER_DIR = ROLE_DIR / "docker"  # <package>.Dockerfile and the helpers they COPY (wheels/)
HELPERS_DIR = DOCKER_DIR / "wheels"
PATCHES_DIR = ROLE_DIR / "patches"  # roles/shared/patches.py: <package>/[<version>/]NNNN-*.patch

# NVIDIA's devel images by stack CUDA version (Ubuntu 24.04, like the gpu nodes), pinned by the
# digest of the tag's multi-platform index: BuildKit pulls by the digest, checks the content
# against it, and picks the builder's platform from the index. A tag alone is never used (the
# registry can move it). Where each digest was read, and that none was pulled from this project's
# machines (no registry answers there), is in roles/wheels/README.md ("Base image digests").
# A CUDA version without a sourced digest is not listed: its stack needs build_base_image.
CUDA_DEVEL_IMAGES = {
    "12.8": "nvidia/cuda:12.8.1-devel-ubuntu24.04"
    "@sha256:520292dbb4f755fd360766059e62956e9379485d9e073bbd2f6e3c20c270ed66",
    "12.9": "nvidia/cuda:12.9.1-devel-ubuntu24.04"
    "@sha256:020bc241a628776338f4d4053fed4c38f6f7f3d7eb5919fecb8de313bb8ba47c",
    "13.0": "nvidia/cuda:13.0.1-devel-ubuntu24.04"
    "@sha256:7d2f6a8c2071d911524f95061a0db363e24d27aa51ec831fcccf9e76eb72bc92",
}
# Files of a source tree that are build output, not input.
_SKIP_PARTS = {"build", "dist", "__pycache__", ".git", ".eggs"}


class WheelPlanError(Exception):
    pass


@dataclass(frozen=True)
class WheelBuild:
    package: str
    version: str
    dockerfile: Path
    source: str  # "pypi" / "git": the pinned upstream release; "context": source_dir as given
    source_dir: Path | None
    patches: tuple[Path, ...]
    build_args: dict[str, str]  # the ones that change the wheel (part of the key)
    inputs: dict = field(hash=False)
    key: str = ""

    @property
    def label(self) -> str:
        return f"{self.package} {self.version}"


def planned_builds(stack: EngineStack, build: BuildSettings) -> list[WheelBuild]:
    """The wheels the active stack builds from source, each with its inputs and key."""
    builds = []
    if stack.flash_attn_source == "build":
        if not stack.flash_attn:
            raise WheelPlanError(
                f"stack {stack.id}: flash_attn_source is 'build' but no flash_attn"
                ' version is pinned; expected flash_attn: "2.8.3" or similar'
            )
        builds.append(
            _wheel_build(
                "flash-attn",
                stack.flash_attn,
                stack,
                build,
                "pypi",
                {
                    "FLASH_ATTN_VERSION": stack.flash_attn,
                    # The source archive's sha256 from the stack file: fetch_source.py checks the
                    # download against it, never against what the index says.
                    "FLASH_ATTN_SHA256": stack.flash_attn_sha256 or "",
                    "CUDA_ARCHS": "120",
                },
            )
        )
    if stack.kernel is not None and stack.kernel.source == "build":
        if stack.kernel.package != "sgl-kernel":
            raise WheelPlanError(
                f"stack {stack.id}: kernel.source 'build' is supported for sgl-kernel only, not"
                f" {stack.kernel.package} {stack.kernel.version}; expected source: prebuilt"
            )
        builds.append(
            _wheel_build(
                "sgl-kernel",
                stack.kernel.version,
                stack,
                build,
                "git",
                {
                    "SGL_KERNEL_VERSION": stack.kernel.version,
                    # sgl-kernel has no sdist: its tree at the sglang release that pins it.
                    "SGLANG_GIT_REF": f"v{stack.sglang}",
                },
            )
        )
    return builds


def base_image(stack: EngineStack, build: BuildSettings) -> str:
    if build.base_image:
        return build.base_image
    if stack.cuda not in CUDA_DEVEL_IMAGES:
        raise WheelPlanError(
            f"stack {stack.id}: no CUDA devel image with a known digest for CUDA {stack.cuda}; expected CUDA"
            f" {', '.join(CUDA_DEVEL_IMAGES)} or a build_base_image setting pinned by digest"
            " (name:tag@sha256:...; `docker buildx imagetools inspect IMAGE` prints it)"
        )
    return CUDA_DEVEL_IMAGES[stack.cuda]


def _wheel_build(
    package: str,
    version: str,
    stack: EngineStack,
    build: BuildSettings,
    upstream_source: str,
    package_args: dict[str, str],
) -> WheelBuild:
    dockerfile = DOCKER_DIR / f"{package}.Dockerfile"
    override = build.source_overrides.get(package)
    source_dir = _source_dir(package, override) if override else None
    source = "context" if source_dir else upstream_source
    patches = tuple(patch_queue(PATCHES_DIR, package, version)) if source != "context" else ()
    build_args = {
        "BASE_IMAGE": base_image(stack, build),
        "SOURCE": source,
        "PYTHON_VERSION": stack.python,
        "TORCH_VERSION": stack.torch if build.with_torch else "",
        **package_args,
    }
    inputs = {
        "package": package,
        "version": version,
        "dockerfile": _sha256(dockerfile.read_bytes()),
        "helpers": {p.name: _sha256(p.read_bytes()) for p in _helper_files()},
        "patches": {p.name: _sha256(p.read_bytes()) for p in patches},
        "source": source,
        "source_tree": _tree_sha256(source_dir) if source_dir else None,
        "build_args": build_args,
    }
    key = _sha256(json.dumps(inputs, sort_keys=True).encode())[:20]
    return WheelBuild(package, version, dockerfile, source, source_dir, patches, build_args, inputs, key)


def _source_dir(package: str, override: str) -> Path:
    path = Path(override)
    path = path if path.is_absolute() else PROJECT_ROOT / path
    if not path.is_dir():
        raise WheelPlanError(
            f"build_source_overrides: {package} = {override!r} is not a folder"
            " on the deploy machine; expected a source tree"
        )
    return path


def _helper_files() -> list[Path]:
    return sorted(p for p in HELPERS_DIR.iterdir() if p.is_file())


def _source_files(root: Path) -> list[Path]:
    return sorted(
        p
        for p in root.rglob("*")
        if p.is_file()
        and not (_SKIP_PARTS & set(p.relative_to(root).parts))
        and not any(part.endswith(".egg-info") for part in p.relative_to(root).parts)
    )


def _tree_sha256(root: Path) -> str:
    digest = hashlib.sha256()
    for path in _source_files(root):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        digest.update(b"x" if path.stat().st_mode & 0o111 else b"-")
        digest.update(_sha256(path.read_bytes()).encode())
    return digest.hexdigest()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


TORCH_LOCK_NAME = "torch.lock.txt"
NO_TORCH_LOCK = "# no torch in this build image (build_with_torch = false)\n"


def torch_lock_text(wheel: WheelBuild, stack_lock: str) -> str:
    """What the build image installs of torch: the stack lock's entries of torch and everything it
    requires (hashes included), or a comment when the build takes no torch."""
    version = wheel.build_args.get("TORCH_VERSION", "")
    if not version:
        return NO_TORCH_LOCK
    if site_lock.entries(stack_lock).get("torch") != version:
        raise WheelPlanError(
            f"the stack's lock has no torch=={version}; re-lock the stack (inference-host lock engines)"
        )
    return site_lock.select(stack_lock, site_lock.required_by(stack_lock, {"torch"}))


def patches_sha256(wheel: WheelBuild) -> str:
    return _sha256("".join(wheel.inputs["patches"][p.name] for p in wheel.patches).encode())


def context_tar(wheel: WheelBuild, extra_ca_files: list[str], torch_lock: str = NO_TORCH_LOCK) -> bytes:
    """The build context as a reproducible tar (sorted, no times or owners), sent to
    `docker build -` on the builder. CA certificates are in it but not in the key: they let
    the build reach the index, they do not change the wheel. torch_lock: torch's part of the
    stack's hashed lock (torch_lock_text), which the Dockerfiles install with --require-hashes."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _add_file(tar, TORCH_LOCK_NAME, torch_lock.encode())
        _add_dir(tar, "extra-ca")
        _add_dir(tar, "wheels")
        _add_file(tar, wheel.dockerfile.name, wheel.dockerfile.read_bytes())
        for helper in _helper_files():
            _add_file(tar, f"wheels/{helper.name}", helper.read_bytes(), executable=bool(helper.stat().st_mode & 0o111))
        _add_dir(tar, "patches")
        for patch in wheel.patches:
            _add_file(tar, f"patches/{patch.name}", patch.read_bytes())
        for index, pem in enumerate(extra_ca_files):
            _add_file(tar, f"extra-ca/site-{index}.crt", Path(pem).read_bytes())
        if wheel.source_dir:
            _add_dir(tar, "src")
            for path in _source_files(wheel.source_dir):
                _add_file(
                    tar,
                    f"src/{path.relative_to(wheel.source_dir)}",
                    path.read_bytes(),
                    executable=bool(path.stat().st_mode & 0o111),
                )
    return buffer.getvalue()


def _add_dir(tar: tarfile.TarFile, name: str) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.mode = tarfile.DIRTYPE, 0o755
    tar.addfile(info)


def _add_file(tar: tarfile.TarFile, name: str, data: bytes, executable: bool = False) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), 0o755 if executable else 0o644
    tar.addfile(info, io.BytesIO(data))
