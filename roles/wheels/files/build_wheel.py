#!/usr/bin/env python3
"""Build one kernel wheel on the builder and admit it to the wheelhouse (roles/wheels uploads
and runs this; it needs only Python 3.9+, a docker client with BuildKit and cuobjdump).

    build_wheel.py --package flash-attn --key KEY --context CONTEXT.tar --dockerfile F \
        --wheelhouse DIR --docker /usr/bin/docker --cuobjdump PATH --timeout-s 43200 \
        --build-arg NAME=VALUE ... [--secret id=ID,src=FILE ...] [--inputs-json FILE]

1. `docker build` of the Dockerfile's artifact stage from the context tar, output to a
   staging folder; the full log is kept, the job cap printed first. A build that fails, is
   killed or runs past --timeout-s exits non-zero with the tail of the log (never hangs).
2. Every wheel's shared objects are listed with `cuobjdump --list-elf`; a wheel without
   sm_120 code is refused (exit 3) and never enters the wheelhouse.
3. The entry WHEELHOUSE/PACKAGE/KEY/ (wheels, build.log, elf-check.txt, inputs.json last) is
   moved into place atomically.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

REQUIRED_ARCH = "sm_120"
REQUIRED_ARCH_RE = re.compile(r"sm_120[af]?")  # sm_120, sm_120a, sm_120f: compute capability 12.0
ELF_RE = re.compile(r"\.(sm_\d+[af]?)\.cubin\s*$")
TAIL_LINES = 100
EXIT_BUILD_FAILED, EXIT_REFUSED, EXIT_TIMEOUT = 2, 3, 4


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--package", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--context", required=True, help="build context as a tar file")
    parser.add_argument("--dockerfile", required=True, help="path of the Dockerfile in the context")
    parser.add_argument("--wheelhouse", required=True)
    parser.add_argument("--docker", default="docker")
    parser.add_argument("--cuobjdump", default="cuobjdump")
    parser.add_argument("--timeout-s", type=int, default=12 * 3600)
    parser.add_argument("--build-arg", action="append", default=[])
    # BuildKit secrets (a mirror's login): a file the build mounts, never a value in argv or the image.
    parser.add_argument("--secret", action="append", default=[], help="id=ID,src=FILE, passed to docker build")
    parser.add_argument("--inputs-json", help="the inputs the key was computed from")
    parser.add_argument("--job-cap", default="", help="human-readable job cap, printed first")
    return parser.parse_args(argv)


def say(message: str) -> None:
    print(f"[wheels] {message}", flush=True)


def fail(code: int, message: str, log: Path | None = None) -> None:
    if log is not None and log.exists():
        lines = log.read_text(errors="replace").splitlines()
        print(f"---- last {min(TAIL_LINES, len(lines))} of {len(lines)} lines of {log}:", file=sys.stderr)
        print("\n".join(lines[-TAIL_LINES:]), file=sys.stderr)
    print(f"[wheels] {message}", file=sys.stderr, flush=True)
    sys.exit(code)


def docker_build(args, staging: Path, log: Path) -> None:
    command = [
        args.docker,
        "build",
        "--progress=plain",
        "--target",
        "artifact",
        "-f",
        args.dockerfile,
        "--output",
        f"type=local,dest={staging / 'out'}",
    ]
    for build_arg in args.build_arg:
        command += ["--build-arg", build_arg]
    for secret in args.secret:
        command += ["--secret", secret]
    command.append("-")  # the context comes as a tar on stdin
    env = {**os.environ, "DOCKER_BUILDKIT": "1"}
    say(f"{args.package}: docker build (timeout {args.timeout_s}s), log {log}")
    started = time.monotonic()
    with open(args.context, "rb") as context, open(log, "ab") as out:
        # Own process group: on timeout the client and anything it started are killed, and
        # BuildKit cancels the build when its client goes away.
        process = subprocess.Popen(
            command, stdin=context, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:
            rc = process.wait(timeout=args.timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            fail(
                EXIT_TIMEOUT,
                f"{args.package}: build ran past {args.timeout_s}s and was stopped"
                " (build_timeout_minutes); nothing entered the wheelhouse",
                log,
            )
    elapsed = time.monotonic() - started
    if rc != 0:
        hint = " (exit 137: killed, out of memory? lower build_max_jobs)" if rc in (137, -9) else ""
        base = base_image_problem(args, log)
        fail(
            EXIT_BUILD_FAILED,
            base
            or f"{args.package}: docker build failed with exit {rc} after"
            f" {elapsed:.0f}s{hint}; nothing entered the wheelhouse",
            log,
        )
    say(f"{args.package}: built in {elapsed:.0f}s")


def base_image_problem(args, log: Path) -> str | None:
    """The one line for a base image that BuildKit could not resolve by its digest, or None.

    BuildKit (moby 20.10's and buildx's) fails the FROM of a reference that no manifest at the
    registry answers with `<reference>: not found` ("failed to create LLB definition"), and a
    fetched manifest whose bytes do not hash to the digest with a message naming the digest
    and "mismatch" or "unexpected" (containerd's remotes/docker fetcher). Both mean the pin and the
    registry disagree: the wrong digest, a repository that lost it, or content changed on the way."""
    base = next((a.partition("=")[2] for a in args.build_arg if a.startswith("BASE_IMAGE=")), "")
    if "@sha256:" not in base:
        return None
    text = log.read_text(errors="replace")
    if f"{base}: not found" in text:
        found = "no image with this digest at its registry (not found)"
    elif base.partition("@")[2] in text and re.search(r"digest mismatch|unexpected (commit )?digest", text):
        found = "its registry served content that does not match the digest"
    else:
        return None
    return (
        f"{args.package}: base image {base}: {found}; build_base_image (or the stack's default) must name a digest"
        " its registry serves (`docker buildx imagetools inspect IMAGE`); nothing entered the wheelhouse"
    )


def parse_list_elf(output: str) -> list[str]:
    """Architectures in `cuobjdump --list-elf` output ("ELF file 1: x.1.sm_120.cubin")."""
    return sorted({m.group(1) for line in output.splitlines() if (m := ELF_RE.search(line))})


def elf_archs(cuobjdump: str, shared_object: Path) -> list[str]:
    """SASS architectures embedded in one shared object, from `cuobjdump --list-elf`."""
    result = subprocess.run([cuobjdump, "--list-elf", str(shared_object)], check=False, capture_output=True, text=True)
    archs = parse_list_elf(result.stdout)
    if result.returncode != 0 and "does not contain device code" not in result.stdout + result.stderr:
        raise RuntimeError(
            f"cuobjdump --list-elf {shared_object.name} failed: {(result.stderr or result.stdout).strip()}"
        )
    return archs


def check_wheel(cuobjdump: str, wheel: Path) -> tuple[bool, list[str]]:
    """(has sm_120 code, report lines) for one wheel."""
    report = []
    ok = False
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if re.search(r"\.so(\.\d+)*$", n)]
        for name in names:
            target = Path(archive.extract(name, tmp))
            archs = elf_archs(cuobjdump, target)
            report.append(f"{wheel.name}: {name}: {' '.join(archs) or 'no device code'}")
            ok = ok or any(REQUIRED_ARCH_RE.fullmatch(arch) for arch in archs)
        if not names:
            report.append(f"{wheel.name}: no shared objects")
    return ok, report


def admit(args, staging: Path, log: Path) -> Path:
    wheels = sorted((staging / "out").glob("*.whl"))
    if not wheels:
        fail(EXIT_BUILD_FAILED, f"{args.package}: the build produced no wheel", log)
    report: list[str] = []
    refused = []
    for wheel in wheels:
        ok, lines = check_wheel(args.cuobjdump, wheel)
        report += lines
        if not ok:
            refused.append(wheel.name)
    (staging / "elf-check.txt").write_text("\n".join(report) + "\n")
    for line in report:
        say(f"cuobjdump --list-elf: {line}")
    if refused:
        fail(
            EXIT_REFUSED,
            f"REFUSED {', '.join(refused)}: no {REQUIRED_ARCH} code in its shared"
            f" objects (cuobjdump --list-elf: {'; '.join(report)}); the target GPUs are SM120,"
            f" so this wheel was NOT added to the wheelhouse {args.wheelhouse}",
        )
    entry = Path(args.wheelhouse) / args.package / args.key
    entry.parent.mkdir(parents=True, exist_ok=True)
    for wheel in wheels:
        shutil.move(str(wheel), staging / wheel.name)
    (staging / "out").rmdir()
    shutil.move(str(log), staging / "build.log")
    inputs = json.loads(Path(args.inputs_json).read_text()) if args.inputs_json else {}
    # Written last: the WheelhouseEntry fact treats a folder without it as absent.
    (staging / "inputs.json").write_text(
        json.dumps(
            {
                "package": args.package,
                "key": args.key,
                "inputs": inputs,
                "job_cap": args.job_cap,
                "wheels": [w.name for w in wheels],
                "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            },
            indent=2,
            sort_keys=True,
        )
        + "\n"
    )
    if entry.exists():  # a forced rebuild replaces the entry
        shutil.rmtree(entry)
    os.rename(staging, entry)
    return entry


def main(argv=None) -> None:
    args = parse_args(argv)
    root = Path(args.wheelhouse)
    staging = Path(tempfile.mkdtemp(prefix=f".staging-{args.package}-{args.key}-", dir=root))
    failed_log = root / ".failed" / f"{args.package}-{args.key}.log"
    failed_log.parent.mkdir(parents=True, exist_ok=True)
    log = staging / "build.log"
    log.write_text(f"[wheels] {args.package} key {args.key}\n[wheels] job cap: {args.job_cap}\n")
    say(f"job cap: {args.job_cap}")
    try:
        docker_build(args, staging, log)
        entry = admit(args, staging, log)
    except SystemExit:
        if log.exists():
            shutil.copyfile(log, failed_log)
            print(f"[wheels] full build log kept at {failed_log}", file=sys.stderr)
        shutil.rmtree(staging, ignore_errors=True)
        raise
    failed_log.unlink(missing_ok=True)
    say(f"{args.package}: admitted {entry}")


if __name__ == "__main__":
    main()
