"""checks.acceptance: each line's judgement on recorded answers, the overall verdict and exit
status, the report's files. The collection itself runs in the lab (tests/lab/test_acceptance.py)
and on the real H200 (tests/unit/data/acceptance/)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from checks import acceptance as acc
from checks import acceptance_line as acc_line
from checks import acceptance_node as acc_node
from checks import acceptance_report as acc_report


class FakeHost:
    """testinfra's host.run, answering by command prefix (a recorded session)."""

    def __init__(self, answers: dict[str, tuple[int, str]]):
        self.answers = answers

    def run(self, command: str):
        for prefix, (rc, stdout) in self.answers.items():
            if command.startswith(prefix):
                return SimpleNamespace(rc=rc, stdout=stdout, stderr="")
        return SimpleNamespace(rc=1, stdout="", stderr="not recorded")


def test_kernel_arguments_pass_only_with_both_iommu_args():
    line = acc_node.judge_kernel_args(
        "pve", "BOOT_IMAGE=/vmlinuz root=ZFS=rpool amd_iommu=on iommu=pt\n", "amd", "target"
    )
    assert line.verdict == acc.PASS
    line = acc_node.judge_kernel_args("pve", "BOOT_IMAGE=/vmlinuz intel_iommu=on\n", "intel", "target")
    assert line.verdict == acc.FAIL and "iommu=pt" in line.details[0]


def test_kernel_arguments_unreadable_are_unreached_not_passed():
    assert acc_node.judge_kernel_args("pve", None, "amd", "target").verdict == acc.UNREACHED
    assert acc_node.judge_kernel_args("pve", "iommu=pt", None, "target").verdict == acc.UNREACHED


def test_cpu_vendor_from_cpuinfo():
    assert acc_node.cpu_vendor("processor\t: 0\nvendor_id\t: AuthenticAMD\n") == "amd"
    assert acc_node.cpu_vendor("vendor_id\t: GenuineIntel\n") == "intel"
    assert acc_node.cpu_vendor("vendor_id\t: HygonGenuine\n") is None


def test_the_stand_in_kernel_is_named_as_the_source():
    host = FakeHost(
        {
            "head -c 8192 /usr/local/lib/pve-standin/pve-standin-kernel": (0, ""),
            "cat /run/pve-standin/cmdline": (0, "BOOT_IMAGE=/vmlinuz-6.1 root=ZFS=x amd_iommu=on iommu=pt\n"),
            "cat /proc/cpuinfo": (0, "vendor_id : AuthenticAMD\n"),
            "test -d /sys/module/nouveau": (1, ""),
            "grep -rqsE": (0, ""),
        }
    )
    lines = acc_node.node_lines(SimpleNamespace(name="pve"), host)
    kernel = lines[0]
    assert kernel.verdict == acc.PASS and kernel.source.startswith("stand-in: pve-standin-kernel")
    assert lines[1].area == "nouveau" and lines[1].source.startswith("stand-in")
    assert lines[2].verdict == acc.NOT_APPLICABLE  # no KVM guest


def test_a_real_node_is_read_from_proc_cmdline():
    host = FakeHost(
        {
            "cat /proc/cmdline": (0, "BOOT_IMAGE=/vmlinuz root=ZFS=x\n"),
            "cat /proc/cpuinfo": (0, "vendor_id : GenuineIntel\n"),
            "test -d /sys/module/nouveau": (0, ""),
            "grep -rqsE": (1, ""),
        }
    )
    kernel, nouveau, _ = acc_node.node_lines(SimpleNamespace(name="pve"), host)
    assert (kernel.verdict, kernel.source) == (acc.FAIL, acc.TARGET)
    assert nouveau.verdict == acc.FAIL and nouveau.observed == "loaded; not blacklisted"


def test_vfio_binding_judged_per_address():
    acc_node._KVM_GPUS["pve"] = [["0000:01:00.0", "0000:02:00.0"]]
    try:
        host = FakeHost(
            {
                "readlink /sys/bus/pci/devices/0000:01:00.0/driver": (0, "../../bus/pci/drivers/vfio-pci\n"),
                "readlink /sys/bus/pci/devices/0000:02:00.0/driver": (0, "../../bus/pci/drivers/nvidia\n"),
            }
        )
        (line,) = acc_node.vfio_lines(SimpleNamespace(name="pve"), host, in_lab=False)
    finally:
        acc_node._KVM_GPUS.pop("pve")
    assert line.verdict == acc.FAIL and "0000:02:00.0: nvidia" in line.observed


REPORT = {
    "verdict": "healthy",
    "checks": [
        {"suite": "gpu", "check": "gpu count", "verdict": "PASS", "detail": "8 GPUs", "evidence": []},
        {
            "suite": "interconnect",
            "check": "allreduce across all gpus",
            "verdict": "FAIL",
            "detail": "expected: bus bandwidth >= 40 GB/s\nfound: 3.1 GB/s",
            "evidence": [{"name": "allreduce_busbw_gbps", "value": 3.1, "labels": {"gpus": "8"}}],
        },
        {
            "suite": "server",
            "check": "accept length from metrics",
            "verdict": "SKIP",
            "detail": "no drafter",
            "evidence": [],
        },
    ],
}


def test_health_rows_become_lines():
    assert acc.from_health(REPORT, "guest GPUs", "gpu", "8 GPUs", ("gpu count",)).verdict == acc.PASS
    expect = SimpleNamespace(allreduce_min_busbw_gbps=40.0, allreduce_floor_source="the target's figure")
    line = acc.allreduce_line(REPORT, "gpu", expect, "target")
    assert (line.verdict, line.figure, line.expected_figure) == (acc.FAIL, 3.1, 40.0)
    assert "3.1 GB/s" in line.observed


def test_a_check_that_only_skipped_or_never_ran_is_unreached():
    assert acc.from_health(REPORT, "x", "gpu", "y", ("accept length from metrics",)).verdict == acc.UNREACHED
    assert acc.from_health(REPORT, "x", "gpu", "y", ("weights manifest matches the pin",)).verdict == acc.UNREACHED
    assert acc.from_health(None, "x", "gpu", "y", ("gpu count",)).verdict == acc.UNREACHED


def test_load_time_from_systemd_timestamps():
    expect = SimpleNamespace(unit_name="inference-engine", host_name="gpu")
    host = FakeHost(
        {
            "systemctl show": (
                0,
                "InactiveExitTimestampMonotonic=10000000\n"
                "ActiveEnterTimestampMonotonic=622500000\nTimeoutStartUSec=30min\n",
            )
        }
    )
    line = acc.load_time_line(host, expect, acc.TARGET)
    assert (line.verdict, line.figure, line.expected_figure) == (acc.PASS, 612.5, 1800.0)
    host = FakeHost(
        {
            "systemctl show": (
                0,
                "InactiveExitTimestampMonotonic=10000000\nActiveEnterTimestampMonotonic=0\nTimeoutStartUSec=30min\n",
            )
        }
    )
    assert acc.load_time_line(host, expect, acc.TARGET).verdict == acc.FAIL


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30min", 1800), ("1h 30s", 3630), ("600000000", 600), ("infinity", None), ("", None), ("1min 500ms", 60.5)],
)
def test_systemd_timespans(text, seconds):
    assert acc.parse_timespan(text) == seconds


def test_kv_allocation_judged_against_the_estimate(monkeypatch):
    from roles.shared import kv_cache

    site = SimpleNamespace(
        hosts={"gpu": object()},
        inventory_file="inventory/prod.py",
        stack=SimpleNamespace(active=SimpleNamespace(sglang="0.5.10")),
    )
    monkeypatch.setattr(kv_cache, "site_estimate", lambda host, folder, version: SimpleNamespace(kv_tokens=218348))
    report = {
        "checks": [
            {
                "suite": "service",
                "check": "kv cache allocated",
                "verdict": "PASS",
                "detail": "231040 tokens",
                "evidence": [{"name": "kv_cache_tokens", "value": 231040}],
            }
        ]
    }
    line = acc.kv_cache_line(report, site, "gpu", acc.TARGET)
    assert (line.verdict, line.figure, line.expected_figure) == (acc.PASS, 231040, 218348)
    report["checks"][0]["evidence"][0]["value"] = 200000
    assert acc.kv_cache_line(report, site, "gpu", acc.TARGET).verdict == acc.FAIL
    report["checks"][0].update(verdict="SKIP", evidence=[])
    assert acc.kv_cache_line(report, site, "gpu", acc.TARGET).verdict == acc.UNREACHED


def test_overall_verdict_and_exit_status():
    line = lambda verdict: acc.Line("a", "h", "e", "o", verdict)  # noqa: E731
    assert acc_report.overall([line(acc.PASS), line(acc.NOT_APPLICABLE)]) == ("ACCEPTED", 0)
    assert acc_report.overall([line(acc.PASS), line(acc.UNREACHED)]) == ("INCOMPLETE", 3)
    assert acc_report.overall([line(acc.UNREACHED), line(acc.FAIL)]) == ("NOT ACCEPTED", 1)


def test_a_run_a_stand_in_answered_is_never_accepted():
    """Every line passed, but one on a lab stand-in's answer: a rehearsal, exit 4, never 0; a
    failure or an unreached line still decides first."""
    line = lambda verdict, source=acc.TARGET: acc.Line("a", "h", "e", "o", verdict, source)  # noqa: E731
    lab = "stand-in: lab nvidia-smi"
    assert acc_report.overall([line(acc.PASS), line(acc.PASS, lab)]) == ("ACCEPTED ON STAND-INS", 4)
    assert acc_report.overall([line(acc.PASS), line(acc.NOT_APPLICABLE, lab)]) == ("ACCEPTED ON STAND-INS", 4)
    assert acc_report.overall([line(acc.PASS, lab), line(acc.UNREACHED)]) == ("INCOMPLETE", 3)
    assert acc_report.overall([line(acc.PASS, lab), line(acc.FAIL, lab)]) == ("NOT ACCEPTED", 1)
    text = acc_report.markdown(
        [line(acc.PASS), line(acc.PASS, lab)], {"inventory": "i", "started": "now", "seconds": 1}
    )
    assert text.startswith("# Acceptance report: ACCEPTED ON STAND-INS\n")
    assert "1 of 2 lines were answered by a lab stand-in (column 'answered by'): this rehearses" in text
    target_only = acc_report.markdown([line(acc.PASS)], {"inventory": "i", "started": "now", "seconds": 1})
    assert target_only.startswith("# Acceptance report: ACCEPTED\n") and "lab stand-in (column" not in target_only


def test_the_verdict_line_names_who_answered_the_suites_it_judges():
    lab = {
        "gpu_from": "stand-in: lab nvidia-smi",
        "engine_from": "stand-in: lab SGLang server",
        "weights_from": acc.HUB_STANDIN,
        "python_from": "stand-in: lab engine python",
    }
    assert acc.suites_source(["service", "server"], **lab) == f"stand-in: lab SGLang server; {acc.HUB_STANDIN}"
    assert acc.suites_source(["gpu"], **lab) == "stand-in: lab nvidia-smi; stand-in: lab engine python"
    target = dict.fromkeys(lab, acc.TARGET)
    assert acc.suites_source(["gpu", "interconnect", "service", "server"], **target) == acc.TARGET
    report = {"checks": [{"suite": "service", "check": "unit active", "verdict": "PASS", "detail": "ok"}]}
    verdict = acc.health_verdict_line(report, "gpu", ["service"], lab["engine_from"])
    assert verdict.verdict == acc.PASS and verdict.source == "stand-in: lab SGLang server"
    assert acc.health_verdict_line(None, "gpu", ["service"], lab["engine_from"]).source == lab["engine_from"]


def test_weights_from_the_hub_stand_in_are_named(tmp_path):
    """The lab's Hub marks each repository's config.json; the line reads that mark on the host."""
    from lab.standins.hf_hub import server as hub_server
    from roles.site import load_site

    site = load_site(Path(__file__).parents[2] / "inventory" / "lab.py")
    name = site.group("gpu_nodes")[0].name
    config = hub_server.LAB_REPOS["inference-host-lab/tiny-moe"]["config.json"]
    assert acc_line.STANDIN_MARK in str(config) and json.loads(str(config))["model_type"] == "kimi_k2"
    marked = FakeHost({"head -c 8192 /models/tiny-moe/config.json": (0, "")})
    assert acc.weights_source(marked, site, name) == acc.HUB_STANDIN
    assert acc.weights_source(FakeHost({}), site, name) == acc.TARGET  # a real model's config says nothing
    assert acc.weights_source(marked, None, name) == acc.TARGET  # no inventory: no weight sets


def test_report_files(tmp_path):
    lines = [
        acc.Line(
            "all-reduce bandwidth",
            "gpu",
            ">= 40 GB/s",
            "41 GB/s",
            acc.PASS,
            figure=41.0,
            expected_figure=40.0,
            unit="GB/s",
        ),
        acc.Line("guest GPUs", "gpu", "8", "a | b", acc.FAIL, "stand-in: lab nvidia-smi", details=["why"]),
    ]
    text = acc_report.markdown(lines, {"inventory": "inventory/lab.py", "started": "now", "seconds": 1})
    assert text.startswith("# Acceptance report: NOT ACCEPTED")
    assert "| FAIL | guest GPUs | gpu | 8 | a \\| b | stand-in: lab nvidia-smi |" in text
    assert "**guest GPUs** (gpu)" in text
    pytest.importorskip("matplotlib")
    chart = acc_report.draw_chart(lines, tmp_path / "chart.png")
    assert chart and chart.read_bytes().startswith(b"\x89PNG")


def test_bad_inventory_is_one_line_and_exit_2(capsys, tmp_path):
    assert acc.main(["--inventory", str(tmp_path / "missing.py")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("inference-host acceptance: bad input") and len(err) == 2


def test_report_json_shape(tmp_path, monkeypatch):
    monkeypatch.setattr(
        acc,
        "collect",
        lambda args, site, folder, *_: [acc.Line("health verdict", "gpu", "HEALTHY", "HEALTHY", acc.PASS)],
    )
    assert acc.main(["--inventory", "inventory/lab.py", "--out", str(tmp_path / "r")]) == 0
    payload = json.loads((tmp_path / "r" / "report.json").read_text())
    assert payload["verdict"] == "ACCEPTED" and payload["lines"][0]["area"] == "health verdict"
    assert (tmp_path / "r" / "report.md").is_file()


H200 = Path(__file__).parent / "data" / "acceptance" / "h200-1gpu"


def test_the_h200_capture_is_judged_as_it_was_on_the_machine():
    """The real health report of 1 x H200 gives the lines the real run printed."""
    health = json.loads((H200 / "health.json").read_text())
    printed = {line["area"]: line for line in json.loads((H200 / "report.json").read_text())["lines"]}
    expect = SimpleNamespace(
        gpu_count=1,
        gpu_model="NVIDIA H200",
        compute_capability="9.0",
        allreduce_min_busbw_gbps=100.0,
        allreduce_floor_source="the nvlink floor",
    )
    gpus = acc.from_health(
        health, "guest GPUs", "local", "1 x NVIDIA H200", ("gpu count", "gpu name", "compute capability", "memory")
    )
    assert gpus.verdict == acc.PASS == printed["guest GPUs"]["verdict"]
    assert "NVIDIA H200" in gpus.observed and "140.4 GiB" in gpus.observed
    allreduce = acc.allreduce_line(health, "local", expect, acc.TARGET)
    assert allreduce.verdict == acc.UNREACHED == printed["all-reduce bandwidth"]["verdict"]
    verdict = acc.health_verdict_line(health, "local", ["gpu", "interconnect"])
    assert verdict.verdict == acc.PASS and verdict.observed == printed["health verdict"]["observed"]
    assert json.loads((H200 / "report.json").read_text())["verdict"] == "INCOMPLETE"


# -- DCGM first, then the health checks; the engine's restart is a line of its own -----------------


def _dcgm_run(**changes):
    from checks.__main__ import DcgmRun
    from checks.gpu_parsers import parse_dcgmi_diag_json

    tests = parse_dcgmi_diag_json((DCGM_DATA / "diag-r1-pass.json").read_text())
    return DcgmRun(**{"tests": tests, "was_active": True, **changes})


DCGM_DATA = Path(__file__).parent / "data" / "gpu" / "dcgm"
EXPECT = SimpleNamespace(host_name="gpu", unit_name="inference-engine")


def test_an_engine_that_does_not_come_back_after_dcgm_is_not_accepted(monkeypatch):
    import checks.__main__ as checks_main

    problem = "expected inference-engine.service active again after DCGM; found `systemctl start` rc 1, state failed"
    monkeypatch.setattr(
        checks_main, "dcgm_diag", lambda host, level, unit, *_, **__: _dcgm_run(restart_problem=problem)
    )
    dcgm, restart = acc.dcgm_lines(SimpleNamespace(dcgm=True), None, EXPECT, acc.TARGET)
    assert dcgm.verdict == acc.PASS
    assert (restart.area, restart.verdict, restart.observed) == ("engine restart after DCGM", acc.FAIL, problem)
    assert acc_report.overall([dcgm, restart]) == ("NOT ACCEPTED", 1)


def test_an_engine_that_came_back_passes_and_one_never_running_is_not_applicable(monkeypatch):
    import checks.__main__ as checks_main

    monkeypatch.setattr(checks_main, "dcgm_diag", lambda host, level, unit, *_, **__: _dcgm_run())
    assert acc.dcgm_lines(SimpleNamespace(dcgm=True), None, EXPECT, acc.TARGET)[1].verdict == acc.PASS
    monkeypatch.setattr(checks_main, "dcgm_diag", lambda host, level, unit, *_, **__: _dcgm_run(was_active=False))
    assert acc.dcgm_lines(SimpleNamespace(dcgm=True), None, EXPECT, acc.TARGET)[1].verdict == acc.NOT_APPLICABLE
    no_dcgm = acc.dcgm_lines(SimpleNamespace(dcgm=False), None, EXPECT, acc.TARGET)
    assert [line.verdict for line in no_dcgm] == [acc.UNREACHED, acc.NOT_APPLICABLE]


def test_a_dcgm_overrun_is_a_failure_not_unreached(monkeypatch):
    import checks.__main__ as checks_main

    overran = "expected `dcgmi diag -r 2 -j` to finish within 1200 s (dcgmi); found no answer after 1200 s, killed"
    monkeypatch.setattr(
        checks_main, "dcgm_diag", lambda host, level, unit, *_, **__: _dcgm_run(tests=[], problem=overran)
    )
    dcgm, _ = acc.dcgm_lines(SimpleNamespace(dcgm=True), None, EXPECT, acc.TARGET)
    assert dcgm.verdict == acc.FAIL and dcgm.observed == overran


def test_the_health_verdict_is_taken_after_dcgm(monkeypatch, tmp_path):
    """The order on a GPU node: DCGM (which stops and starts the engine), then the health checks
    whose report every later line and the verdict read."""
    from checks import bounded

    order = []
    monkeypatch.setattr(bounded, "own_host", lambda url, *a, **k: FakeHost({}))
    monkeypatch.setattr(acc, "dcgm_lines", lambda *a: order.append("dcgm") or [])
    monkeypatch.setattr(acc, "health_report", lambda *a: order.append("health") or None)
    monkeypatch.setattr(acc, "load_time_line", lambda *a: acc.Line("model load time", "gpu", "", "", acc.PASS))
    monkeypatch.setattr(acc, "bench_line", lambda *a: acc.Line("single-stream benchmark", "gpu", "", "", acc.PASS))
    expect = SimpleNamespace(
        host_name="gpu",
        unit_name="inference-engine",
        gpu_count=1,
        gpu_model="NVIDIA H200",
        compute_capability="9.0",
        allreduce_min_busbw_gbps=100.0,
        allreduce_floor_source="x",
        launcher="/nonexistent",
        engine_python="/nonexistent",
        engine="vllm",
        speculative=False,
    )
    args = SimpleNamespace(suites="gpu", dcgm=True)
    lines = acc.guest_lines(args, None, "gpu", "local://", expect, tmp_path)
    assert order == ["dcgm", "health"]
    assert lines[-1].area == "health verdict"


def test_a_collection_that_overran_is_a_failure_line():
    from checks.bounded import CommandOverrun

    def overran():
        raise CommandOverrun("expected `systemctl show ...` to finish within 60 s (systemctl); found no answer")

    line = acc.overran_as_line("model load time", "gpu", overran)
    assert line.verdict == acc.FAIL and "(systemctl)" in line.observed


def test_the_profiling_line_reads_the_exporter_and_names_the_admin_restriction_in_a_guest():
    """A machine in no inventory (the exporter on 127.0.0.1:9400): the row absent in an
    unprivileged LXC guest whose node restricts profiling is a FAIL naming the node's option;
    the row present passes; no exporter unit is N/A."""
    expect = SimpleNamespace(compute_capability="12.0")
    row = 'DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="0",UUID="GPU-1"} 0.25\n'
    answers = {
        "systemctl cat nvidia-dcgm-exporter.service": (0, ""),
        "curl -sf --max-time 10 http://127.0.0.1:9400/metrics": (0, 'DCGM_FI_DEV_GPU_TEMP{gpu="0"} 31\n'),
        "cat /proc/driver/nvidia/params": (0, "EnableMSI: 1\nRmProfilingAdminOnly: 1\n"),
        "cat /proc/self/uid_map": (0, "         0     100000      65536\n"),
        "journalctl -u nvidia-dcgm-exporter": (0, "Not collecting DCP metrics: Error getting supported metrics\n"),
        "systemd-detect-virt --container": (0, "lxc\n"),
        "test -e /usr/lib/x86_64-linux-gnu/libdcgmmoduleprofiling.so.4": (0, ""),
    }
    line = acc.profiling_line(None, "gpu", FakeHost(answers), expect)
    assert (line.area, line.verdict, line.source) == ("DCGM profiling rows", acc.FAIL, acc.TARGET)
    assert "admin restriction" in line.observed and "NVreg_RestrictProfilingToAdminUsers=0" in line.observed
    answers["curl -sf --max-time 10 http://127.0.0.1:9400/metrics"] = (0, row)
    assert acc.profiling_line(None, "gpu", FakeHost(answers), expect).verdict == acc.PASS
    answers["systemctl cat nvidia-dcgm-exporter.service"] = (1, "")
    assert acc.profiling_line(None, "gpu", FakeHost(answers), expect).verdict == acc.NOT_APPLICABLE


def test_the_profiling_line_follows_the_sites_exporter_setting():
    """With an inventory: the exporter's port and bind address from the site; no exporter
    deployed (monitoring_dcgm_exporter off) is N/A, and the host is not asked."""
    from roles.site import load_site

    site = load_site(Path(__file__).parents[2] / "inventory" / "lab.py")
    name = site.group("gpu_nodes")[0].name
    port = site.hosts[name].monitoring.dcgm_exporter_port
    row = 'DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="0"} 0.5\n'
    host = FakeHost({f"curl -sf --max-time 10 http://127.0.0.1:{port}/metrics": (0, row)})
    assert acc.profiling_line(site, name, host, SimpleNamespace(compute_capability="12.0")).verdict == acc.PASS
    site.hosts[name] = dataclasses.replace(
        site.hosts[name], monitoring=site.hosts[name].monitoring.model_copy(update={"dcgm_exporter": False})
    )
    line = acc.profiling_line(site, name, FakeHost({}), SimpleNamespace(compute_capability="12.0"))
    assert line.verdict == acc.NOT_APPLICABLE and "monitoring_dcgm_exporter is off" in line.observed
