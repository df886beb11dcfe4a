"""roles/wheels: flash-attn and sgl-kernel wheels for SM120, built in Docker on the builder.

Runs on the `builders` group and drives the builder's own Docker engine (BuildKit). For each
wheel the active stack builds from source (stack.yml: flash_attn_source / kernel.source):

1. its inputs are hashed into a key (roles/shared/wheel_plan.py); a complete wheelhouse entry
   WHEELHOUSE/<package>/<key>/ means there is nothing to do: a fact lookup, seconds;
2. otherwise the job cap is computed from the builder's real memory and cores
   (roles/wheels/jobcap.py), printed, and passed to the build as MAX_JOBS / NVCC_THREADS;
3. build_wheel.py builds roles/wheels/docker/<package>.Dockerfile with a time limit, checks every wheel
   with `cuobjdump --list-elf` for sm_120 code, and only then moves it into the wheelhouse.

Where the wheels are: <build_wheelhouse_dir>/<package>/<key>/ (roles/shared/engine_env.py: what
roles/engine_envs installs on the gpu nodes, copied there when the builder is another host).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.operations import files, server

from roles.shared.host_facts import WheelhouseEntry
from roles.shared.mirror_auth import BUILD_SECRET_ID, pypi_netrc
from roles.shared.note import note
from roles.shared.pip import pip_environment
from roles.shared.refusal import Refused
from roles.shared.shell import argv, chain, sh
from roles.shared.tool_locks import BUILD_TOOLS, CUOBJDUMP, tool_lock_text
from roles.shared.wheel_plan import (
    WheelBuild,
    WheelPlanError,
    context_tar,
    patches_sha256,
    planned_builds,
    torch_lock_text,
)
from roles.site import HostSettings, current_host, current_site
from roles.wheels.facts import BuilderResources, CuobjdumpPath, DockerBuildClient
from roles.wheels.jobcap import JobCap, JobCapError, compute_job_cap

BUILD_SCRIPT = Path(__file__).parent / "files" / "build_wheel.py"
# cuobjdump from PyPI when the builder has no CUDA toolkit of its own (CUDA 13 reads the
# ELF of 12.x builds too); installed from files/cuobjdump.lock.txt, made from files/cuobjdump.in.
CUOBJDUMP_PYPI = "nvidia-cuda-cuobjdump==13.4.92"


@deploy("Wheels")
def wheels() -> None:
    settings = current_host()
    stack = current_site().stack.active
    try:
        builds = planned_builds(stack, settings.build)
    except WheelPlanError as error:
        raise Refused(f"{host.name}: {error}") from None
    if not builds:
        logger.info(f"{host.name}: stack {stack.id} builds no kernel wheel from source")
        return
    root = settings.build.wheelhouse_dir
    tools = f"{root}/.tools"
    pending = [b for b in builds if _needs_build(b, settings)]
    for directory in (root, tools, f"{root}/.contexts"):
        files.directory(name=f"Create {directory}", path=directory, mode="0755")
    files.put(
        name=f"Install {tools}/build_wheel.py", src=str(BUILD_SCRIPT), dest=f"{tools}/build_wheel.py", mode="0755"
    )
    if not pending:
        return
    tool_lock_text(BUILD_TOOLS)  # the Dockerfiles install docker/wheels/build-tools.lock.txt: stale is refused
    docker = _docker_client()
    cuobjdump = _cuobjdump(tools, settings)
    resources = host.get_fact(BuilderResources)
    for wheel in pending:
        cap = _job_cap(wheel, settings, resources)
        _build(wheel, cap, settings, docker, cuobjdump)


def _needs_build(wheel: WheelBuild, settings: HostSettings) -> bool:
    entry = host.get_fact(WheelhouseEntry, path=f"{settings.build.wheelhouse_dir}/{wheel.package}/{wheel.key}")
    if entry and wheel.package not in settings.build.force:
        logger.info(f"{host.name}: {wheel.label}: in the wheelhouse (key {wheel.key}): {', '.join(entry)}; no build")
        return False
    reason = "forced (build_force)" if entry else "not in the wheelhouse"
    logger.info(f"{host.name}: {wheel.label}: {reason} (key {wheel.key}); will build")
    return True


def _docker_client() -> dict:
    client = host.get_fact(DockerBuildClient)
    if client is None:
        raise Refused(
            f"{host.name}: no docker client here can run BuildKit builds against a running engine;"
            " expected Docker-CE with the docker-buildx-plugin (production) or Debian's docker.io"
            " 20.10 (DOCKER_BUILDKIT=1), with the engine started"
        )
    return client


def _cuobjdump(tools: str, settings: HostSettings) -> str:
    found = host.get_fact(CuobjdumpPath, tools_dir=tools)
    if found:
        return found
    venv = f"{tools}/cuobjdump"
    lock = f"{tools}/cuobjdump.lock.txt"
    env = pip_environment(settings)
    # From the committed hashed lock (roles/shared/tool_locks.py): wheels whose sha256 it lists only.
    files.put(
        name=f"Write {lock} ({CUOBJDUMP.path.name})",
        src=io.StringIO(tool_lock_text(CUOBJDUMP)),
        dest=lock,
        mode="0644",
    )
    server.shell(
        name=f"Install {CUOBJDUMP_PYPI} into {venv}",
        commands=[
            sh(
                "rm -rf -- {venv} && python3 -m venv -- {venv}"
                " && {venv}/bin/pip install --quiet --no-cache-dir --require-hashes --only-binary :all: -r {lock}"
                ' && ln -sf -- "$(ls -d -- {venv}/lib/python3*/site-packages/nvidia/cu*/bin/cuobjdump | head -n 1)"'
                " {venv}/bin/cuobjdump && {venv}/bin/cuobjdump --version >/dev/null"
                " || {{ rm -rf -- {venv}; exit 1; }}",
                venv=venv,
                lock=lock,
            )
        ],
        _env=env,
    )
    return f"{venv}/bin/cuobjdump"


def _job_cap(wheel: WheelBuild, settings: HostSettings, resources) -> JobCap:
    try:
        cap = compute_job_cap(wheel.package, resources, settings.build.max_jobs, settings.build.nvcc_threads)
    except JobCapError as error:
        raise Refused(f"{host.name}: {error}") from None
    logger.info(f"{host.name}: job cap {cap.describe()}")
    return cap


def _build(wheel: WheelBuild, cap: JobCap, settings: HostSettings, docker: dict, cuobjdump: str) -> None:
    root = settings.build.wheelhouse_dir
    context = f"{root}/.contexts/{wheel.package}-{wheel.key}.tar"
    site = current_site()
    try:
        # The stack's lock is read only for a build that takes torch: a builder's own stack (the
        # lab's, build_with_torch off) may have no lock at all.
        takes_torch = bool(wheel.build_args.get("TORCH_VERSION"))
        torch_lock = torch_lock_text(wheel, site.stack.lock_text(site.stack.active.id) if takes_torch else "")
    except WheelPlanError as error:
        raise Refused(f"{host.name}: {error}") from None
    inputs = f"{root}/.contexts/{wheel.package}-{wheel.key}.json"
    files.put(
        name=f"Upload the {wheel.label} build context",
        dest=context,
        mode="0600",
        src=io.BytesIO(context_tar(wheel, settings.base.extra_ca_certificates, torch_lock)),
    )
    files.put(
        name=f"Upload the {wheel.label} build inputs",
        dest=inputs,
        mode="0644",
        src=io.BytesIO(json.dumps(wheel.inputs, indent=2, sort_keys=True).encode()),
    )
    build_args = {
        **wheel.build_args,
        "MAX_JOBS": str(cap.max_jobs),
        "NVCC_THREADS": str(cap.nvcc_threads),
        "INPUTS_KEY": wheel.key,
        "PATCHES_SHA256": patches_sha256(wheel),
    }
    if settings.base.pypi_index_url:
        build_args["PIP_INDEX_URL"] = settings.base.pypi_index_url
    timeout_s = settings.build.timeout_minutes * 60
    command = [
        "python3",
        f"{root}/.tools/build_wheel.py",
        "--package",
        wheel.package,
        "--key",
        wheel.key,
        "--context",
        context,
        "--dockerfile",
        wheel.dockerfile.name,
        "--wheelhouse",
        root,
        "--docker",
        docker["path"],
        "--cuobjdump",
        cuobjdump,
        "--timeout-s",
        str(timeout_s),
        "--inputs-json",
        inputs,
        "--job-cap",
        cap.describe(),
    ]
    for name, value in build_args.items():
        command += ["--build-arg", f"{name}={value}"]
    netrc = pypi_netrc(settings)
    if netrc:  # the mirror's login as a BuildKit secret: a file's path here, in no layer or image history
        command += ["--secret", f"id={BUILD_SECRET_ID},src={netrc}"]
    note(name=f"Print the {wheel.package} job cap", message=f"building {wheel.label} with job cap {cap.describe()}")
    server.shell(
        name=f"Build the {wheel.label} wheel for sm_120 (MAX_JOBS={cap.max_jobs},"
        f" NVCC_THREADS={cap.nvcc_threads}, key {wheel.key})",
        commands=[chain(argv(*command), sh("rm -f -- {context} {inputs}", context=context, inputs=inputs))],
        # build_wheel.py stops the build at timeout_s; this is the backstop for the SSH side.
        _timeout=timeout_s + 600,
    )
