"""Evidence gathered from a host once per run and shared by the checks: each command runs
once per host, its text goes through tests.infra.gpu_parsers, and where a source is missing the
probe records why, so a check can say "no evidence because ..." instead of passing.

Nothing here needs systemd: the GPU evidence comes from nvidia-smi, /proc and the kernel log.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import pytest

from tests.infra import gpu_parsers as parse

PROGRAMS = Path(__file__).resolve().parent / "programs"
SMI = "nvidia-smi"


@dataclass(frozen=True)
class Evidence:
    """A command's output, or why there is none."""

    text: str | None
    missing: str | None = None  # why there is no text: tool absent, permission, ...

    def require(self, what: str) -> str:
        if self.text is None:
            pytest.skip(f"no evidence for {what}: {self.missing}")
        return self.text


def _tool_exists(host, tool: str) -> bool:
    return host.run(f"command -v {shlex.quote(tool)}").rc == 0


class GpuProbe:
    """Everything the GPU and interconnect suites read from one host."""

    def __init__(self, host):
        self.host = host

    # -- raw sources ---------------------------------------------------------------------------

    @cached_property
    def smi_path(self) -> str | None:
        result = self.host.run(f"command -v {SMI}")
        return result.stdout.strip() if result.rc == 0 else None

    def _smi(self, args: str) -> Evidence:
        if not self.smi_path:
            return Evidence(None, "nvidia-smi is not on the PATH (see the check nvidia-smi present)")
        result = self.host.run(f"{SMI} {args}")
        if result.rc != 0:
            return Evidence(None, f"`nvidia-smi {args}` failed (rc {result.rc}): "
                                  f"{(result.stdout + result.stderr).strip()[:300]}")
        return Evidence(result.stdout)

    @cached_property
    def smi_plain(self):
        """`nvidia-smi` itself: its failure text is how a version mismatch shows."""
        return self.host.run(SMI) if self.smi_path else None

    @cached_property
    def gpu_query(self) -> Evidence:
        return self._smi(f"--query-gpu={','.join(parse.GPU_QUERY_FIELDS)} --format=csv,noheader,nounits")

    @cached_property
    def gpus(self) -> list[parse.GpuInfo]:
        return parse.parse_gpu_query(self.gpu_query.require("the GPU list"))

    @cached_property
    def remapped(self) -> Evidence:
        return self._smi("--query-remapped-rows=" + ",".join(parse.REMAPPED_FIELDS) + " --format=csv,noheader")

    @cached_property
    def retired(self) -> Evidence:
        return self._smi("--query-gpu=" + ",".join(parse.RETIRED_FIELDS) + " --format=csv,noheader")

    @cached_property
    def compute_apps(self) -> Evidence:
        return self._smi("--query-compute-apps=" + ",".join(parse.COMPUTE_APP_FIELDS) + " --format=csv,noheader,nounits")

    @cached_property
    def topology(self) -> Evidence:
        return self._smi("topo -m")

    @cached_property
    def smi_version(self) -> Evidence:
        return self._smi("--version")

    @cached_property
    def proc_version(self) -> Evidence:
        result = self.host.run("cat /proc/driver/nvidia/version")
        if result.rc != 0:
            return Evidence(None, "/proc/driver/nvidia/version is not readable (no NVIDIA kernel module loaded?)")
        return Evidence(result.stdout)

    @cached_property
    def kernel_log(self) -> Evidence:
        """The kernel log since boot: dmesg, else journalctl -k -b (where systemd keeps it)."""
        tried = []
        if _tool_exists(self.host, "dmesg"):
            result = self.host.run("dmesg")
            if result.rc == 0 and result.stdout.strip():
                return Evidence(result.stdout)
            tried.append(f"dmesg failed: {result.stderr.strip()[:200] or 'empty output'}")
        else:
            tried.append("dmesg is missing")
        if _tool_exists(self.host, "journalctl"):
            result = self.host.run("journalctl -k -b --no-pager -q")
            if result.rc == 0:
                return Evidence(result.stdout)
            tried.append(f"journalctl -k -b failed: {result.stderr.strip()[:200]}")
        else:
            tried.append("journalctl is missing")
        return Evidence(None, "; ".join(tried) + " (run the checks as root to read the kernel log)")

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

    def run_program(self, python: str, program: str, args: str = "", env: dict | None = None,
                    timeout_s: int = 300):
        """Copy a program from tests/infra/programs to a temporary folder on the host and run it
        there (a file, not `python -c`: torch.multiprocessing's spawn needs one), killed with its
        whole process group after timeout_s."""
        source = (PROGRAMS / program).read_text()
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in (env or {}).items())
        command = (
            f"d=$(mktemp -d) && cat > \"$d/{program}\" <<'IH_PROGRAM_EOF'\n{source}\nIH_PROGRAM_EOF\n"
            f"{exports} timeout -s KILL {int(timeout_s)} {shlex.quote(python)} \"$d/{program}\" {args}; "
            "rc=$?; rm -rf \"$d\"; exit $rc"
        )
        return self.host.run(command)

    def engine_python_missing(self, python: str) -> str | None:
        if self.host.run(f"test -x {shlex.quote(python)}").rc != 0:
            return (f"the engine python {python} does not exist; expected the engine environment "
                    "(roles/sglang) there; set health_engine_python or --expect health_engine_python=PATH")
        return None


def explain(expected, found, todo: str) -> str:
    """Every failure says the same three things, in this order."""
    return f"expected {expected}; found {found}; what to do: {todo}"


def report(request, text: str) -> None:
    """A passing check's finding, shown in the verdict table and the JSON report."""
    request.node.user_properties.append(("detail", text))
