"""checks.acceptance rehearsed on the main lab, which has the shipped example's shape (DCGM on,
weights pinned, the monitor on the guest): every line collected and judged, every answer that came
from a stand-in named as such, the report's three files written, the exit status the overall
verdict's. The lab rehearses a full acceptance: every line passes or does not apply, and every
line it passes names the stand-in that answered it, so its verdict is ACCEPTED ON STAND-INS
(exit 4), never ACCEPTED: the lab is never presented as the machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.lab.harness import LAB_INVENTORY, PROJECT_ROOT, load_lab_site

pytestmark = pytest.mark.lab

AREAS = [
    "node kernel arguments",
    "nouveau",
    "vfio binding",
    "guest GPUs",
    "all-reduce bandwidth",
    "weights at the pinned revision",
    "model load time",
    "first generation",
    "KV cache allocated",
    "EAGLE-3 accept length",
    "DCGM profiling rows",
    "single-stream benchmark",
    "DCGM diagnostics level 2",
    "engine restart after DCGM",
    "health verdict",
]


@pytest.fixture(scope="module")
def report(lab_second_deploy, tmp_path_factory):
    """One acceptance run after the deploy that changed nothing (its DCGM line stops the engine
    for `dcgmi diag` and starts it again). The benchmark runs 2 prompts of 128 tokens out, not 4
    of 256: the stand-in server decodes 100 tokens/s, and the module's time counts."""
    out = tmp_path_factory.mktemp("acceptance") / "report"
    run = subprocess.run(
        [sys.executable, "-m", "checks.acceptance", "--inventory", str(LAB_INVENTORY), "--out", str(out)]
        + ["--bench-prompts", "2", "--bench-output-len", "128"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    print(run.stdout[-4000:])
    payload = json.loads((out / "report.json").read_text())
    return run, out, payload, {line["area"]: line for line in payload["lines"]}


def test_every_line_is_collected_and_judged(report):
    run, out, payload, lines = report
    assert list(lines) == AREAS, run.stderr[-2000:]
    assert {line["verdict"] for line in payload["lines"]} <= {"PASS", "FAIL", "UNREACHED", "N/A"}
    assert (out / "report.md").read_text().startswith(f"# Acceptance report: {payload['verdict']}")
    statuses = {"ACCEPTED": 0, "NOT ACCEPTED": 1, "INCOMPLETE": 3, "ACCEPTED ON STAND-INS": 4}
    assert statuses[payload["verdict"]] == run.returncode


def test_stand_in_answers_are_named(report):
    _, _, _, lines = report
    assert lines["node kernel arguments"]["source"].startswith("stand-in: pve-standin-kernel")
    assert lines["guest GPUs"]["source"] == "stand-in: lab nvidia-smi"
    # the exporter stand-in serves DCGM_FI_PROF_* with the profiling module the deploy installed
    profiling = lines["DCGM profiling rows"]
    assert (profiling["verdict"], profiling["source"]) == ("PASS", "stand-in: lab DCGM exporter"), profiling
    assert profiling["observed"].startswith("present: ")
    for area in ("model load time", "first generation", "KV cache allocated"):
        assert lines[area]["source"] == "stand-in: lab SGLang server", area
    # The all-reduce and SGLang's benchmark client ran with the stand-in engine python.
    assert lines["all-reduce bandwidth"]["source"] == "stand-in: lab nvidia-smi; stand-in: lab engine python"
    assert lines["single-stream benchmark"]["source"] == "stand-in: lab SGLang server; stand-in: lab engine python"
    # The weights really downloaded and verified, from the Hub stand-in (its config.json says so).
    assert lines["weights at the pinned revision"]["source"].startswith("stand-in: lab Hugging Face Hub")
    # The verdict judged the suites the lab runs after a deploy (service, server): their answers
    # came from the stand-in engine and the stand-in Hub's weights.
    verdict_from = lines["health verdict"]["source"].split("; ")
    assert verdict_from[0] == "stand-in: lab SGLang server", verdict_from
    assert verdict_from[1].startswith("stand-in: lab Hugging Face Hub"), verdict_from


def test_what_the_lab_really_has_passes(report):
    """The node's kernel arguments reach the stand-in kernel only through proxmox-boot-tool
    refresh and the reboot the walk made; the weights are really verified; the stand-in
    engine really started, answered and was judged by the deploy's own suites."""
    _, _, _, lines = report
    for area in (
        "node kernel arguments",
        "weights at the pinned revision",
        "model load time",
        "first generation",
        "engine restart after DCGM",
        "health verdict",
    ):
        assert lines[area]["verdict"] == "PASS", lines[area]
    assert "iommu=pt" in lines["node kernel arguments"]["observed"].split()
    assert 0 < lines["model load time"]["figure"] <= lines["model load time"]["expected_figure"]


def test_what_the_lab_cannot_show_is_never_passed(report):
    """The lab is never presented as the machine: every line it passes names the stand-in that
    answered it, and its verdict is never ACCEPTED (exit 0 needs every answer from the target)."""
    run, out, payload, lines = report
    passed = {area: line["source"] for area, line in lines.items() if line["verdict"] == "PASS"}
    assert passed and all(source.startswith("stand-in") for source in passed.values()), passed
    assert payload["verdict"] != "ACCEPTED" and run.returncode != 0
    named = [line for line in lines.values() if line["source"].startswith("stand-in")]  # N/A lines too
    assert f"{len(named)} of {len(lines)} lines were answered by a lab stand-in" in (out / "report.md").read_text()


def test_the_shipped_shape_is_accepted_on_stand_ins(report):
    """The full rehearsal: every line passes or does not apply (no KVM guest with GPUs, no drafter
    served, as in inventory/prod.py), and the verdict is ACCEPTED ON STAND-INS, exit status 4."""
    run, out, payload, lines = report
    assert {
        area: line["observed"][:300] for area, line in lines.items() if line["verdict"] not in ("PASS", "N/A")
    } == {}
    assert {area for area, line in lines.items() if line["verdict"] == "N/A"} == {
        "vfio binding",
        "EAGLE-3 accept length",
    }
    assert payload["verdict"] == "ACCEPTED ON STAND-INS" and run.returncode == 4, run.stdout[-2000:]
    text = (out / "report.md").read_text()
    assert text.startswith("# Acceptance report: ACCEPTED ON STAND-INS") and "it accepts no machine" in text


def test_what_the_lab_cannot_show_is_judged_on_a_named_stand_in(report):
    """The lab's all-reduce is the CPU's, judged against the lab's floor (the setting named in the
    line), over the eight GPUs the nvidia-smi stand-in lists, its sum exact; the benchmark is the
    stand-in server's speed measured by the stand-in client. Both lines say so."""
    _, _, _, lines = report
    allreduce, bench = lines["all-reduce bandwidth"], lines["single-stream benchmark"]
    assert "health_allreduce_min_busbw_gbps" in allreduce["expectation"], allreduce
    assert "over 8 GPUs, 1 MiB" in allreduce["observed"] and "lab stand-in" in allreduce["observed"], allreduce
    assert bench["figure"] >= bench["expected_figure"] * 0.9, bench
    assert "2 prompts, 1024 in / 128 out" in bench["observed"], bench
    print(f"\nlab all-reduce: {allreduce['observed'][:120]}; benchmark: {bench['observed']}")


def test_the_gpu_lines_are_judged_from_the_stand_ins_answers(report):
    """The lab's guest sees its node's eight GPUs as an LXC guest does (lab/pve_node.py plants the
    real H200 captures, re-addressed, where the nvidia-smi stand-in reads them), and its monitoring
    installs DCGM with the exporter (the dcgmi stand-in answers): those lines are judged on the
    stand-ins' answers and name them, so they show the judging, not the hardware."""
    _, _, _, lines = report
    gpus, dcgm = lines["guest GPUs"], lines["DCGM diagnostics level 2"]
    assert gpus["source"] == "stand-in: lab nvidia-smi" and gpus["verdict"] == "PASS", gpus
    assert gpus["observed"].startswith("8 x NVIDIA RTX PRO 6000 Blackwell Server Edition"), gpus
    assert dcgm["source"] == "stand-in: lab dcgmi" and dcgm["verdict"] == "PASS", dcgm


# -- the machine's worst day, rehearsed on the same lab (after the report above) --------------------

ENGINE = "inference-engine"
DROP_IN_DIR = f"/run/systemd/system/{ENGINE}.service.d"
NO_START = f"{DROP_IN_DIR}/ih-lab-no-start.conf"
HANG = "/run/nvidia-smi-standin/hang"


def _checks_see_the_lab_healed(gpu_guest) -> None:
    """The periodic checks (inference-host-checks.timer, every 5 minutes) may have run while the
    fault was planted: run them once more now, so the monitor's alerts (and the later modules that
    count them) see the healed lab, not the planted fault until the next tick."""
    healed = gpu_guest.run("systemctl start inference-host-checks.service")
    assert healed.rc in (0, 1), healed.stderr  # 1: a check the lab always fails (cuda works)


def _guest_name() -> str:
    return load_lab_site(LAB_INVENTORY).group("gpu_nodes")[0].name


def test_an_engine_that_does_not_come_back_after_dcgm_is_not_accepted(report, gpu_guest, tmp_path):
    """A drop-in under /run makes the engine's next start fail (its running process is left
    alone); DCGM stops the engine and starts it again: that start fails, a FAIL line of its own,
    and the health verdict, taken after it, sees the dead engine. Only the service suite (the one
    that judges the unit), no benchmark: well under a minute."""
    gpu_guest.run(f"mkdir -p {DROP_IN_DIR} && printf '[Service]\\nExecStartPre=/bin/false\\n' > {NO_START}")
    gpu_guest.run("systemctl daemon-reload")
    out = tmp_path / "report"
    try:
        run = subprocess.run(
            [sys.executable, "-m", "checks.acceptance", "--inventory", str(LAB_INVENTORY), "--out", str(out)]
            + ["--no-bench", "--suites", "service"],
            cwd=PROJECT_ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        # Stopped first: the failed start left systemd restarting it (Restart=on-failure), and a
        # start merged into that keeps NRestarts, which the service suite's restart-loop check
        # reads; a stop, reset-failed and a start of our own bring the counter back to 0.
        gpu_guest.run(f"rm -f {NO_START} && systemctl daemon-reload && systemctl stop {ENGINE}")
        gpu_guest.run(f"systemctl reset-failed {ENGINE}")
        started = gpu_guest.run(f"systemctl start {ENGINE}")
        _checks_see_the_lab_healed(gpu_guest)
    payload = json.loads((out / "report.json").read_text())
    lines = {line["area"]: line for line in payload["lines"]}
    restart = lines["engine restart after DCGM"]
    assert restart["verdict"] == "FAIL", restart
    assert "`systemctl start` rc 1" in restart["observed"], restart
    assert f"journalctl -u {ENGINE} -b" in restart["observed"]
    verdict = lines["health verdict"]
    assert verdict["verdict"] == "FAIL" and any("unit active" in d for d in verdict["details"]), verdict
    assert payload["verdict"] == "NOT ACCEPTED" and run.returncode == 1
    assert started.rc == 0, started.stderr
    assert gpu_guest.run(f"systemctl show -p NRestarts --value {ENGINE}").stdout.strip() == "0"
    print(f"\nacceptance with an engine that did not come back: {payload['seconds']} s, {restart['observed'][:200]}")


def test_a_wedged_nvidia_smi_is_a_fail_line_within_its_bound(report, gpu_guest, tmp_path):
    """The stand-in's hang switch: every nvidia-smi call blocks for ever, as on a wedged driver.
    The gpu suite still ends, with a FAIL line naming nvidia-smi and its 30 s bound, and the
    bound's next step."""
    gpu_guest.run(f"touch {HANG}")
    report_file = tmp_path / "health.json"
    try:
        started = time.monotonic()
        run = subprocess.run(
            [sys.executable, "-m", "checks", "--inventory", str(LAB_INVENTORY), "--host", _guest_name()]
            + ["--suites", "gpu", "--no-bandwidth-probes", "--report", str(report_file)],
            cwd=PROJECT_ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        seconds = time.monotonic() - started
    finally:
        gpu_guest.run(f"rm -f {HANG}")
        _checks_see_the_lab_healed(gpu_guest)
    checks = json.loads(report_file.read_text())["checks"]
    failed = [c["detail"] for c in checks if c["verdict"] == "FAIL"]
    wedged = [d for d in failed if "found no answer after" in d]
    assert len(wedged) == 1 and "`nvidia-smi" in wedged[0] and "within 30 s (nvidia-smi)" in wedged[0], failed
    assert "Xid" in wedged[0] and "reboot" in wedged[0]
    assert run.returncode == 1 and "VERDICT: UNHEALTHY" in run.stdout
    assert seconds < 30 + 15 + 30, seconds  # the bound, the kill grace, Python's start over docker
    print(f"\ngpu suite with a wedged nvidia-smi: {seconds:.1f} s, {len(failed)} FAIL lines; first: {wedged[0][:160]}")
