"""Evidence gathered from a host once per run and shared by the checks: each command runs
once per host, its text goes through checks.gpu_parsers, and where a source is missing the
probe records why, so a check can say "no evidence because ..." instead of passing.

Nothing here needs systemd: the GPU evidence comes from nvidia-smi, /proc and the kernel log.
"""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import pytest

from checks import bounded
from checks import gpu_parsers as parse
from roles.shared.shell import Shell, argv, sh

PROGRAMS = Path(__file__).resolve().parent / "programs"
# A program's outer bound past its own timeout_s: its own KILL comes first and its check says what
# it was doing; the outer one is for a process KILL cannot end (stuck in the driver).
PROGRAM_BOUND_MARGIN_S = 30
SMI = "nvidia-smi"
# systemd's default PATH for services (systemd.exec(5), "Environment variables in spawned processes").
CLEAN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin"
# Multi-GPU NVLink hosts that must keep NVLink multicast off (the 2 × H200 validation host: it can
# take the GPUs out of service) set these; kept wherever a program starts with its own
# environment, passed on only when set.
SAFETY_VARIABLES = ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")
# A driver slower than this per nvidia-smi call is a WARN line (checks/test_gpus.py): a sixth of
# the call's bound (30 s), it passes every check yet costs the run minutes (25 s a call made the
# GPU suite take 207 s, silently) and is a driver on its way to that bound.
SLOW_DRIVER_CALL_S = 5.0


@dataclass(frozen=True)
class Evidence:
    """A command's output, or why there is none."""

    text: str | None
    missing: str | None = None  # why there is no text: tool absent, permission, ...
    lost: str | None = None  # nvidia-smi's words that a GPU is lost (parse.parse_gpu_lost)

    def require(self, what: str) -> str:
        if self.text is None:
            pytest.skip(f"no evidence for {what}: {self.missing}")
        return self.text


def _tool_exists(host, tool: str) -> bool:
    return host.run(sh("command -v {tool}", tool=tool)).rc == 0


class GpuProbe:
    """Everything the GPU and interconnect suites read from one host."""

    def __init__(self, host):
        self.host = host
        self.smi_calls: list[tuple[str, float]] = []  # (the call's arguments, its seconds)

    def _timed_smi(self, args: Shell | None = None):
        """One bounded nvidia-smi call (its arguments already built by sh()), timed for the
        slow-driver check."""
        started = time.monotonic()
        command = sh("{smi} {args}", smi=SMI, args=args) if args is not None else SMI
        try:
            return bounded.run(self.host, command, what="nvidia-smi")
        finally:
            self.smi_calls.append((str(args) if args is not None else "(no arguments)", time.monotonic() - started))

    # -- raw sources ---------------------------------------------------------------------------

    @cached_property
    def smi_path(self) -> str | None:
        result = self.host.run(f"command -v {SMI}")
        return result.stdout.strip() if result.rc == 0 else None

    def _smi(self, args: Shell) -> Evidence:
        if not self.smi_path:
            return Evidence(None, "nvidia-smi is not on the PATH (see the check nvidia-smi present)")
        result = self._timed_smi(args)
        said = (result.stdout + result.stderr).strip()
        lost = parse.parse_gpu_lost(result.rc, said)
        if result.rc != 0:
            return Evidence(None, f"`nvidia-smi {args}` failed (rc {result.rc}): {said[:300]}", lost)
        return Evidence(result.stdout, lost=lost)

    @cached_property
    def smi_plain(self):
        """`nvidia-smi` itself: its failure text is how a version mismatch shows."""
        return self._timed_smi() if self.smi_path else None

    @cached_property
    def gpu_query(self) -> Evidence:
        fields = ",".join(parse.GPU_QUERY_FIELDS)
        return self._smi(sh("--query-gpu={fields} --format=csv,noheader,nounits", fields=fields))

    @cached_property
    def gpus(self) -> list[parse.GpuInfo]:
        return parse.parse_gpu_query(self.gpu_query.require("the GPU list"))

    @cached_property
    def remapped(self) -> Evidence:
        fields = ",".join(parse.REMAPPED_FIELDS)
        return self._smi(sh("--query-remapped-rows={fields} --format=csv,noheader", fields=fields))

    @cached_property
    def retired(self) -> Evidence:
        return self._smi(sh("--query-gpu={fields} --format=csv,noheader", fields=",".join(parse.RETIRED_FIELDS)))

    @cached_property
    def compute_apps(self) -> Evidence:
        return self._smi(
            sh(
                "--query-compute-apps={fields} --format=csv,noheader,nounits",
                fields=",".join(parse.COMPUTE_APP_FIELDS),
            )
        )

    @cached_property
    def memory_used_mib(self) -> int | None:
        """Memory used over all GPUs (MiB), whoever holds it; None when nvidia-smi cannot say."""
        used = self._smi(sh("--query-gpu=memory.used --format=csv,noheader,nounits"))
        if used.text is None:
            return None
        values = [line.strip() for line in used.text.splitlines() if line.strip()]
        return sum(int(v) for v in values) if values and all(v.isdigit() for v in values) else None

    @cached_property
    def container(self) -> str:
        """systemd-detect-virt --container (its file when the tool is missing): "none" outside
        a container, "lxc" in an LXC guest, "unknown" when neither answers."""
        found = self.host.run(
            "systemd-detect-virt --container 2>/dev/null || cat /run/systemd/container 2>/dev/null || echo unknown"
        )
        return (found.stdout.strip().splitlines() or ["unknown"])[0].strip()

    @cached_property
    def topology(self) -> Evidence:
        return self._smi(sh("topo -m"))

    @cached_property
    def smi_q(self) -> Evidence:
        return self._smi(sh("-q"))

    @cached_property
    def health(self) -> dict[str, parse.GpuHealth]:
        return parse.parse_gpu_health(self.smi_q.require("the GPU health report (nvidia-smi -q)"))

    def replays(self) -> dict[str, int | None]:
        """PCIe replays per GPU now (read twice by the interconnect suite: before and after)."""
        now = self._smi(sh("-q"))
        if now.text is None:
            return {}
        return {bus: h.replays for bus, h in parse.parse_gpu_health(now.text).items()}

    @cached_property
    def nvlink(self) -> Evidence:
        status = self._smi(sh("nvlink -s"))
        if status.text is None:
            return status
        errors = self._smi(sh("nvlink -e"))
        return Evidence(status.text + "\n@@ERRORS@@\n" + (errors.text or ""))

    @cached_property
    def dcgmi_path(self) -> str | None:
        result = self.host.run("command -v dcgmi")
        return result.stdout.strip() if result.rc == 0 else None

    @cached_property
    def smi_version(self) -> Evidence:
        return self._smi(sh("--version"))

    @cached_property
    def proc_version(self) -> Evidence:
        result = self.host.run("cat /proc/driver/nvidia/version")
        if result.rc != 0:
            return Evidence(None, "/proc/driver/nvidia/version is not readable (no NVIDIA kernel module loaded?)")
        return Evidence(result.stdout)

    @cached_property
    def kernel_log(self) -> Evidence:
        """The kernel log since boot: dmesg, else journalctl -k -b (where systemd keeps it). The
        periodic checks' user reads it there (group systemd-journal): dmesg needs CAP_SYSLOG where
        kernel.dmesg_restrict=1 (Ubuntu's default). An empty journal is no kernel log (a container's
        journald may have none), never a clean one."""
        tried = []
        if _tool_exists(self.host, "dmesg"):
            result = bounded.run(self.host, "dmesg", what="kernel log")
            if result.rc == 0 and result.stdout.strip():
                return Evidence(result.stdout)
            tried.append(f"dmesg failed: {result.stderr.strip()[:200] or 'empty output'}")
        else:
            tried.append("dmesg is missing")
        if _tool_exists(self.host, "journalctl"):
            result = self.host.run("journalctl -k -b --no-pager -q")
            if result.rc == 0 and result.stdout.strip():
                return Evidence(result.stdout)
            tried.append(f"journalctl -k -b failed: {result.stderr.strip()[:200] or 'no kernel lines in the journal'}")
        else:
            tried.append("journalctl is missing")
        return Evidence(
            None,
            "; ".join(tried)
            + " (run the checks as root, or as a member of systemd-journal where it keeps the kernel's)",
        )

    @cached_property
    def userspace_libraries(self) -> Evidence:
        """libnvidia-ml.so.<version> files: the userspace driver as installed on disk."""
        result = self.host.run(
            "{ ldconfig -p 2>/dev/null; ls /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/local/nvidia/lib64 "
            "/usr/local/nvidia/lib 2>/dev/null; } | grep -o 'libnvidia-ml\\.so\\.[0-9.]*[0-9]' | sort -u"
        )
        if not result.stdout.strip():
            return Evidence(None, "no libnvidia-ml.so.<version> found by ldconfig or in the usual library folders")
        return Evidence(result.stdout)

    @cached_property
    def modinfo_license(self) -> Evidence:
        if not _tool_exists(self.host, "modinfo"):
            return Evidence(None, "modinfo is missing")
        result = self.host.run("modinfo -F license nvidia")
        if result.rc != 0:
            return Evidence(None, f"modinfo nvidia failed: {result.stderr.strip()[:200]}")
        return Evidence("license: " + result.stdout.strip())

    # -- programs run with the engine's python --------------------------------------------------

    def run_program(
        self,
        python: str,
        program: str,
        args: tuple[str, ...] | list[str] = (),
        env_file: str | None = None,
        fallback_env: dict | None = None,
        timeout_s: int = 300,
    ):
        """Copy a program from checks/programs to a temporary folder on the host and run it
        there (a file, not `python -c`: torch.multiprocessing's spawn needs one), killed after
        timeout_s.

        It runs in a clean environment (`env -i`), as systemd starts the service: a minimal
        PATH and LANG, then exactly the unit's EnvironmentFile, read on the host (`set -a; .`
        reads the KEY=VALUE lines roles/serving writes as systemd does). HOME is the program's own
        temporary folder: the checks' unit runs as a user whose home is none of root's, and a cache
        a library writes there goes with the folder. Only when the host has
        no such file (the service was never deployed) are `fallback_env` (the site model's NCCL
        settings) used instead. Nothing of the checker's own shell leaks in, except the
        NVLink-multicast guards of a multi-GPU host when set there (SAFETY_VARIABLES), which the
        program reports like every other variable it sees."""
        source = (PROGRAMS / program).read_text()
        env_path = env_file or ""
        has_file = bool(env_path) and self.host.run(sh("test -r {path}", path=env_path)).rc == 0
        assignments = [] if has_file else [f"{k}={v}" for k, v in (fallback_env or {}).items()]
        # The program's source travels as base64 (no quoting or heredoc delimiter to get wrong);
        # each SAFETY_VARIABLES guard is passed on only when set, as ${NAME+NAME="$NAME"}.
        command = sh(
            'd=$(mktemp -d) && printf %s {encoded} | base64 -d > "$d"/{program}'
            ' && env -i PATH={path} LANG=C.UTF-8 HOME="$d" IH_ENV_SOURCE={source_name}'
            ' ${{NCCL_NVLS_ENABLE+NCCL_NVLS_ENABLE="$NCCL_NVLS_ENABLE"}}'
            " ${{TORCH_SYMM_MEM_DISABLE_MULTICAST+TORCH_SYMM_MEM_DISABLE_MULTICAST="
            '"$TORCH_SYMM_MEM_DISABLE_MULTICAST"}}'
            ' ${{NVSHMEM_DISABLE_NVLS+NVSHMEM_DISABLE_NVLS="$NVSHMEM_DISABLE_NVLS"}}'
            ' {assignments} sh -c \'if [ -n "$1" ]; then set -a; . "$1"; set +a; fi; shift; exec "$@"\''
            ' sh {file_argument} timeout -s KILL {timeout} {python} "$d"/{program} {args};'
            ' rc=$?; rm -rf "$d"; exit $rc',
            encoded=base64.b64encode(source.encode()).decode(),
            program=program,
            path=CLEAN_PATH,
            source_name=env_path if has_file else "site model",
            assignments=assignments,
            file_argument=env_path if has_file else "",
            timeout=int(timeout_s),
            python=python,
            # the program's own options (--disable-custom-all-reduce), from this code, never a setting
            args=argv(*args) if args else sh(""),
        )
        assert all(f"${{{name}+{name}=" in command for name in SAFETY_VARIABLES), "a guard is not passed on"
        return bounded.run(self.host, command, what="gpu program", bound_s=int(timeout_s) + PROGRAM_BOUND_MARGIN_S)

    def engine_python_missing(self, python: str) -> str | None:
        if self.host.run(sh("test -x {python}", python=python)).rc != 0:
            return (
                f"the engine python {python} does not exist; expected the engine environment "
                "(roles/engine_envs) there; set health_engine_python or --expect health_engine_python=PATH"
            )
        return None


def explain(expected, found, todo: str) -> str:
    """Every failure says the same three things, in this order."""
    return f"expected {expected}; found {found}; what to do: {todo}"


def report(request, text: str) -> None:
    """A passing check's finding, shown in the verdict table and the JSON report."""
    request.node.user_properties.append(("detail", text))


def warn(request, text: str) -> None:
    """A passing check's finding that a person should read: the check is a WARN line (the
    verdict stays healthy; the JSON report's verdict is "WARN")."""
    request.node.user_properties.append(("detail", text))
    request.node.user_properties.append(("warn", text))


def evidence(request, name: str, value: float | int | bool | None, **labels: str) -> None:
    """A number the check judged, kept in the JSON report's "evidence" (the checks' timer turns
    it into the gauge inference_host_<name>, checks/textfile.py). Recorded before the
    verdict, so a failing check keeps its numbers too."""
    if value is not None:
        request.node.user_properties.append(("evidence", (name, float(value), labels)))


def cuda_visibility_advice(env: dict) -> str:
    """What hides GPUs from CUDA, named: the variable and where it came from, or the passthrough."""
    source = env.get("IH_ENV_SOURCE", "the checker's environment")
    # Only CUDA_VISIBLE_DEVICES acts inside a process (NVIDIA_VISIBLE_DEVICES is read when a
    # container is created, by the NVIDIA container toolkit, and is "all" in CUDA images).
    if "CUDA_VISIBLE_DEVICES" in env:
        return (
            f"CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']!r} (from {source}) hides GPUs from "
            "CUDA: remove it from the service's environment (serving_extra_env) unless that is "
            "intended, and correct gpu_count"
        )
    return (
        "nvidia-smi sees the GPU but CUDA does not and no CUDA_VISIBLE_DEVICES is set: check the "
        "device nodes (/dev/nvidia*) and, in a guest, the passthrough (Proxmox devN entries)"
    )
