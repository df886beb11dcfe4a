"""checks.acceptance rehearsed on the main lab: every line collected and judged, every answer
that came from a stand-in named as such, the report's three files written, the exit status the
overall verdict's. The lab has no GPU, no torch in the guest and no DCGM: those lines must say so
(FAIL or UNREACHED), never PASS."""

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
    "single-stream benchmark",
    "DCGM diagnostics level 2",
    "engine restart after DCGM",
    "health verdict",
]


@pytest.fixture(scope="module")
def report(lab_second_deploy, tmp_path_factory):
    """One acceptance run after the deploy that changed nothing (its DCGM line stops the exporter
    for `dcgmi diag` and starts it again: the guest's monitoring installs DCGM with the exporter)."""
    out = tmp_path_factory.mktemp("acceptance") / "report"
    run = subprocess.run(
        [sys.executable, "-m", "checks.acceptance", "--inventory", str(LAB_INVENTORY), "--out", str(out)],
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
    assert {"ACCEPTED": 0, "NOT ACCEPTED": 1, "INCOMPLETE": 3}[payload["verdict"]] == run.returncode


def test_stand_in_answers_are_named(report):
    _, _, _, lines = report
    assert lines["node kernel arguments"]["source"].startswith("stand-in: pve-standin-kernel")
    assert lines["guest GPUs"]["source"] == "stand-in: lab nvidia-smi"
    for area in ("model load time", "first generation", "KV cache allocated", "single-stream benchmark"):
        assert lines[area]["source"] == "stand-in: lab SGLang server", area


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
    """No torch in the guest: said in one line, not counted as passed."""
    _, _, payload, lines = report
    line = lines["all-reduce bandwidth"]
    assert line["verdict"] in ("FAIL", "UNREACHED"), line
    assert "\n" not in line["observed"]
    assert payload["verdict"] != "ACCEPTED"


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
