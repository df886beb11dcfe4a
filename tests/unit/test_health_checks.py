"""The health suites' new checks (issue 14) and the 8-GPU behaviour (issue 19), on real
captured output (tests/unit/data/gpu/h200-1gpu-checks: 1 x H200; h200-2gpu: 2 x H200 over
NVLink) and on a synthetic 8-GPU PCIe topology built in nvidia-smi's format."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import struct
import subprocess
import sys
import types
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from checks import answer_parsers, connection, probes, test_gpus, test_interconnect, test_service
from checks import gpu_parsers as parse
from checks.conftest import verdict_table
from checks.expectations import Expectations
from checks.probes import cuda_visibility_advice

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parent / "data" / "gpu"
CHECKS = DATA / "h200-1gpu-checks"
ONE = DATA / "h200-1gpu"
TWO = DATA / "h200-2gpu"
EIGHT = DATA / "synthetic-8gpu-pcie"
H200 = ["gpu_arch=sm90", "gpu_model=NVIDIA H200", "gpu_memory_gib=140", "driver_version=580.159.04"]


def expect(count: int = 1, *more: str) -> Expectations:
    return Expectations.from_overrides([f"gpu_count={count}", *H200, *more])


# -- nvidia-smi -q ------------------------------------------------------------------------------


def test_smi_q_of_one_h200_under_driver_580():
    health = parse.parse_gpu_health((CHECKS / "nvidia-smi-q.txt").read_text())
    assert list(health) == ["0000:00:06.0"]
    gpu = health["0000:00:06.0"]
    assert gpu.name == "NVIDIA H200"
    assert (gpu.ecc_current, gpu.ecc_pending) == (True, True)
    assert gpu.ecc_errors["Volatile"] == {
        "SRAM Correctable": 0,
        "SRAM Uncorrectable Parity": 0,
        "SRAM Uncorrectable SEC-DED": 0,
        "DRAM Correctable": 0,
        "DRAM Uncorrectable": 0,
    }
    assert gpu.uncorrectable("Aggregate") == {}
    assert gpu.recovery_action == "None"
    assert gpu.clock_events["Idle"] is True and gpu.clock_events["HW Thermal Slowdown"] is False
    assert gpu.clock_events["HW Power Brake Slowdown"] is False  # nested under HW Slowdown
    assert gpu.tlimit_margin_c == 52 and gpu.temperature_c == 36
    assert (gpu.power_limit_w, gpu.power_default_limit_w, gpu.power_max_limit_w) == (700, 700, 700)
    assert (gpu.bar1_total_mib, gpu.fb_total_mib) == (262144, 143771)
    assert gpu.replays == 0 and gpu.replay_rollovers == 0
    assert (gpu.mig_current, gpu.mig_pending) == ("Disabled", "Disabled")


def test_smi_q_replays_seen_on_an_earlier_boot():
    gpu = parse.parse_gpu_health((ONE / "nvidia-smi-q.txt").read_text())["0000:00:06.0"]
    assert gpu.replays == 2 and gpu.tlimit_margin_c == 42


def test_smi_q_missing_values_are_none():
    text = (
        (CHECKS / "nvidia-smi-q.txt")
        .read_text()
        .replace(
            "GPU Recovery Action                                : None",
            "GPU Recovery Action                                : N/A",
        )
    )
    assert parse.parse_gpu_health(text)["0000:00:06.0"].recovery_action is None


# -- the checks, judged on the capture and on it with one planted fault ---------------------------


@dataclass
class FakeProbe:
    gpus: list
    health: dict
    pcie_under_load: str = ""
    dcgmi_path: str | None = None


class FakeRequest:
    def __init__(self):
        self.node = types.SimpleNamespace(user_properties=[])

    @property
    def detail(self) -> str:
        return "; ".join(text for key, text in self.node.user_properties if key == "detail")

    @property
    def evidence(self) -> dict[tuple, float]:
        return {
            (name, tuple(sorted(labels.items()))): value
            for key, (name, value, labels) in ((k, v) for k, v in self.node.user_properties if k == "evidence")
        }


def probe(smi_q: str | None = None) -> FakeProbe:
    gpus = parse.parse_gpu_query((DATA / "h200-1gpu-health" / "query-gpu-health.csv").read_text())
    return FakeProbe(gpus, parse.parse_gpu_health(smi_q or (CHECKS / "nvidia-smi-q.txt").read_text()))


def plant(old: str, new: str) -> FakeProbe:
    text = (CHECKS / "nvidia-smi-q.txt").read_text()
    assert old in text
    return probe(text.replace(old, new, 1))


HEALTH_CHECKS = [
    test_gpus.test_ecc_enabled_no_uncorrectable_errors,
    test_gpus.test_recovery_action_none,
    test_gpus.test_no_active_clock_slowdown,
    test_gpus.test_temperature_margin,
    test_gpus.test_power_limit_as_expected,
    test_gpus.test_bar1_covers_memory,
    test_gpus.test_mig_mode_as_expected,
]


@pytest.mark.parametrize("check", HEALTH_CHECKS, ids=lambda c: c.__name__)
def test_every_new_check_passes_on_the_real_h200_with_its_evidence(check):
    request = FakeRequest()
    check(probe(), expect(), 0, request)
    assert request.detail


def test_the_checks_record_their_numbers_as_evidence_on_the_real_h200():
    """What the checks' timer exports (checks/textfile.py): real nvidia-smi -q of the
    1 × H200, driver 580.159.04, 2026-12-01 (GPU Current Temp 36 C, T.Limit Temp 52 C), zero ECC
    errors, no bad clock event."""
    request = FakeRequest()
    for check in (
        test_gpus.test_temperature_margin,
        test_gpus.test_ecc_enabled_no_uncorrectable_errors,
        test_gpus.test_no_active_clock_slowdown,
    ):
        check(probe(), expect(), 0, request)
    found = request.evidence
    margin = found[("gpu_temperature_margin_celsius", (("gpu", "0"),))]
    assert margin == 52.0 and found[("gpu_temperature_celsius", (("gpu", "0"),))] == 36.0
    assert found[("gpu_ecc_uncorrectable_errors", (("gpu", "0"), ("scope", "volatile")))] == 0
    assert found[("gpu_ecc_uncorrectable_errors", (("gpu", "0"), ("scope", "aggregate")))] == 0
    assert found[("gpu_clock_events_active", (("gpu", "0"),))] == 0


def test_a_failing_check_keeps_its_evidence():
    request = FakeRequest()
    with pytest.raises(AssertionError):
        test_gpus.test_ecc_enabled_no_uncorrectable_errors(plant(*PLANTED[0][1]), expect(), 0, request)
    assert request.evidence[("gpu_ecc_uncorrectable_errors", (("gpu", "0"), ("scope", "volatile")))] == 2


PLANTED = [
    (
        test_gpus.test_ecc_enabled_no_uncorrectable_errors,
        (
            "        Volatile\n            SRAM Correctable                           : 0\n"
            "            SRAM Uncorrectable Parity                  : 0\n"
            "            SRAM Uncorrectable SEC-DED                 : 0\n"
            "            DRAM Correctable                           : 0\n"
            "            DRAM Uncorrectable                         : 0",
            "        Volatile\n            SRAM Correctable                           : 0\n"
            "            SRAM Uncorrectable Parity                  : 0\n"
            "            SRAM Uncorrectable SEC-DED                 : 0\n"
            "            DRAM Correctable                           : 5\n"
            "            DRAM Uncorrectable                         : 2",
        ),
        "Volatile DRAM Uncorrectable 2",
    ),
    (
        test_gpus.test_ecc_enabled_no_uncorrectable_errors,
        (
            "    ECC Mode\n        Current                                        : Enabled",
            "    ECC Mode\n        Current                                        : Disabled",
        ),
        "ECC enabled",
    ),
    (
        test_gpus.test_recovery_action_none,
        (
            "GPU Recovery Action                                : None",
            "GPU Recovery Action                                : GPU Reset",
        ),
        "GPU Reset",
    ),
    (
        test_gpus.test_no_active_clock_slowdown,
        (
            "            HW Thermal Slowdown                        : Not Active",
            "            HW Thermal Slowdown                        : Active",
        ),
        "HW Thermal Slowdown",
    ),
    (
        test_gpus.test_no_active_clock_slowdown,
        (
            "        SW Thermal Slowdown                            : Not Active",
            "        SW Thermal Slowdown                            : Active",
        ),
        "SW Thermal Slowdown",
    ),
    (
        test_gpus.test_temperature_margin,
        (
            "GPU T.Limit Temp                               : 52 C",
            "GPU T.Limit Temp                               : 4 C",
        ),
        "4 C margin",
    ),
    (
        test_gpus.test_power_limit_as_expected,
        (
            "Current Power Limit                            : 700.00 W",
            "Current Power Limit                            : 450.00 W",
        ),
        "450.0 W",
    ),
    (
        test_gpus.test_mig_mode_as_expected,
        (
            "    MIG Mode\n        Current                                        : Disabled",
            "    MIG Mode\n        Current                                        : Enabled",
        ),
        "current Enabled",
    ),
]


@pytest.mark.parametrize(("check", "fault", "shown"), PLANTED, ids=lambda v: getattr(v, "__name__", None))
def test_every_new_check_fails_on_its_planted_fault_and_says_what_to_do(check, fault, shown):
    with pytest.raises(AssertionError) as failure:
        check(plant(*fault), expect(), 0, FakeRequest())
    message = str(failure.value)
    assert shown in message and "what to do:" in message


def test_bar1_smaller_than_memory_fails_only_where_the_model_needs_resizable_bar():
    small = (
        "    BAR1 Memory Usage\n        Total                                          : 262144 MiB",
        "    BAR1 Memory Usage\n        Total                                          : 256 MiB",
    )
    request = FakeRequest()
    test_gpus.test_bar1_covers_memory(plant(*small), expect(), 0, request)  # H200: informative
    assert "does not need" in request.detail
    rtx = replace(expect(), needs_resizable_bar=True, gpu_model="NVIDIA RTX PRO 6000 Blackwell Server Edition")
    with pytest.raises(AssertionError, match="Resizable BAR"):
        test_gpus.test_bar1_covers_memory(plant(*small), rtx, 0, FakeRequest())


def test_rtx_pro_6000_needs_resizable_bar_and_a_gddr7_floor():
    e = Expectations.from_overrides(
        [
            "gpu_count=8",
            "gpu_arch=sm120",
            "gpu_model=NVIDIA RTX PRO 6000 Blackwell Server Edition",
            "gpu_memory_gib=96",
            "driver_version=580.95.05",
        ]
    )
    assert e.needs_resizable_bar and e.min_memory_bandwidth_gbps == 1344.0
    assert e.gpu_link == "cross-socket" and e.allreduce_min_busbw_gbps == 15.0


def test_power_limit_setting_overrides_the_default():
    with pytest.raises(AssertionError, match="health_power_limit_w"):
        test_gpus.test_power_limit_as_expected(probe(), expect(1, "health_power_limit_w=600"), 0, FakeRequest())


# -- PCIe under load, memory bandwidth ----------------------------------------------------------


def test_pcie_link_read_under_load_replaces_the_idle_reading():
    gpu = probe()
    idle = replace(gpu.gpus[0], pstate="P8", pcie_gen_current=1)
    gpu.gpus = [idle]
    gpu.pcie_under_load = "0, 00000000:00:06.0, P0, 5, 5, 16, 16\n"
    request = FakeRequest()
    test_gpus.test_pcie_link_generation(gpu, expect(), 0, request, {})
    assert request.detail == "Gen5 of Gen5 (P0, under load)"
    gpu.pcie_under_load = "0, 00000000:00:06.0, P0, 3, 5, 16, 16\n"
    with pytest.raises(AssertionError, match="Gen5 under load; found Gen3"):
        test_gpus.test_pcie_link_generation(gpu, expect(), 0, FakeRequest(), {})


def test_memory_bandwidth_of_the_real_h200_against_its_spec_floor():
    found = parse.parse_json_line((CHECKS / "membw.txt").read_text(), "IH-MEMBW ")
    request = FakeRequest()
    test_gpus.test_memory_bandwidth(probe(), expect(), 0, request, found)
    assert request.detail == "4293 GB/s (floor 3600)"
    slow = {"devices": [{**found["devices"][0], "gbps": 2400.0}]}
    with pytest.raises(AssertionError, match="memory clock"):
        test_gpus.test_memory_bandwidth(probe(), expect(), 0, FakeRequest(), slow)


# -- the service's environment: hidden GPUs name their cause --------------------------------------


def test_a_gpu_hidden_by_the_env_file_names_cuda_visible_devices():
    advice = cuda_visibility_advice(
        {"CUDA_VISIBLE_DEVICES": "", "IH_ENV_SOURCE": "/etc/inference-host/engine/inference-engine.env"}
    )
    assert advice.startswith(
        "CUDA_VISIBLE_DEVICES='' (from /etc/inference-host/engine/inference-engine.env) hides GPUs"
    )
    assert "passthrough" in cuda_visibility_advice({})


def test_the_real_hidden_gpu_run_names_the_variable_not_gpu_count():
    text = (CHECKS / "hidden.txt").read_text()
    assert (
        " ".join(text.split()).count("CUDA_VISIBLE_DEVICES='' (from /etc/sglang/sglang.env) hides GPUs") == 2
    )  # as captured (that day's layout)
    assert "PASS  gpu count" in text


def test_the_callers_environment_does_not_leak_into_the_checks():
    """Run with NCCL_P2P_DISABLE=1 CUDA_VISIBLE_DEVICES= in the caller's shell and the
    project's rendered env file on the host: the checks ran with the file, not the shell."""
    text = (CHECKS / "envfile.txt").read_text()
    assert "VERDICT: HEALTHY" in text
    report = json.loads((CHECKS / "report-envfile.json").read_text())
    cuda = next(c for c in report["checks"] if c["check"] == "cuda works")
    assert cuda["detail"].endswith("environment from /etc/sglang/sglang.env)")  # as captured


# -- link classes, floors, and P2P off on NVLink (2 x H200 captures) -------------------------------


def test_link_classes_of_every_topology_code():
    assert [parse.link_class(c) for c in ("NV18", "PIX", "PXB", "PHB", "NODE", "SYS")] == [
        "nvlink",
        "pcie-switch",
        "pcie-switch",
        "host-bridge",
        "host-bridge",
        "cross-socket",
    ]
    with pytest.raises(ValueError, match="unknown link"):
        parse.link_class("XYZ")


def test_two_h200_are_nvlink_and_their_floor_comes_from_the_class():
    topology = parse.parse_topology((TWO / "topo.txt").read_text())
    assert parse.worst_link(topology) == "nvlink"
    e = expect(2)
    assert (e.gpu_link, e.allreduce_min_busbw_gbps) == ("nvlink", 100.0)
    assert "nvlink floor" in e.allreduce_floor_source
    assert expect(2, "health_allreduce_min_busbw_gbps=20").allreduce_min_busbw_gbps == 20.0


def run_of(path: Path, rc: int = 0) -> dict:
    return {"result": types.SimpleNamespace(rc=rc, stdout=path.read_text(), stderr="")}


def test_p2p_off_on_nvlink_fails_with_the_default_floor():
    """The committed 2 x H200 run with NCCL_P2P_DISABLE=1 (27.1 GB/s) passed the old 10 GB/s
    default; the floor derived from the NVLink class fails it and names the variable."""
    with pytest.raises(AssertionError) as failure:
        test_interconnect.judge_allreduce(run_of(TWO / "allreduce-p2p-off.txt"), expect(2))
    message = " ".join(str(failure.value).split())
    assert "bus bandwidth >= 100.0 GB/s (the nvlink floor" in message
    assert "found 27.1 GB/s" in message and "NCCL_P2P_DISABLE=1 is set" in message


def test_p2p_on_over_nvlink_passes_the_default_floor():
    detail = test_interconnect.judge_allreduce(run_of(TWO / "allreduce-p2p-on.txt"), expect(2))
    assert detail.startswith("busbw 297.0 GB/s") and "floor 100" in detail


def test_links_slower_than_expected_fail():
    gpu = types.SimpleNamespace(topology=types.SimpleNamespace(require=lambda _: (EIGHT / "topo.txt").read_text()))
    with pytest.raises(AssertionError, match="GPU0-GPU4 SYS"):
        test_interconnect.test_links_as_expected(gpu, expect(8, "health_gpu_link=host-bridge"), FakeRequest())
    request = FakeRequest()
    test_interconnect.test_links_as_expected(gpu, expect(8, "health_gpu_link=cross-socket"), request)
    assert request.detail.startswith("slowest link cross-socket")


# -- hang: start-up or a stuck collective ---------------------------------------------------------


def killed(stdout: str) -> dict:
    return {"result": types.SimpleNamespace(rc=137, stdout=stdout, stderr="")}


def test_a_kill_during_start_up_is_not_called_a_deadlock():
    with pytest.raises(pytest.fail.Exception) as failure:
        test_interconnect.judge_allreduce(killed("IH-ALLREDUCE-STAGE start 1.0\n"), expect(2))
    assert "killed while starting" in str(failure.value) and "deadlock" not in str(failure.value)


def test_a_kill_inside_the_collective_is_a_p2p_deadlock():
    with pytest.raises(pytest.fail.Exception, match="P2P deadlock"):
        test_interconnect.judge_allreduce(
            killed("IH-ALLREDUCE-STAGE start 1.0\nIH-ALLREDUCE-STAGE collective 9.0\n"), expect(2)
        )


def test_the_real_one_second_timeout_is_reported_as_start_up():
    text = " ".join((CHECKS / "timeout.txt").read_text().split())
    assert "expected the all-reduce to start within 1 s; found killed while starting" in text


# -- float32 exactness of the all-reduce's check (issue 19) ---------------------------------------


def load_program(name: str):
    """A program of checks/programs without torch (its functions under test need none)."""
    stub = types.ModuleType("torch")
    stub.distributed, stub.multiprocessing = types.ModuleType("d"), types.ModuleType("m")
    saved = {k: sys.modules.get(k) for k in ("torch", "torch.distributed", "torch.multiprocessing")}
    sys.modules.update(
        {"torch": stub, "torch.distributed": stub.distributed, "torch.multiprocessing": stub.multiprocessing}
    )
    argv, sys.argv = sys.argv, [name]
    try:
        namespace: dict = {"__name__": "program"}
        exec(compile((ROOT / "checks/programs" / name).read_text(), name, "exec"), namespace)
        return types.SimpleNamespace(**namespace)
    finally:
        sys.argv = argv
        for key, value in saved.items():
            if value is None:
                sys.modules.pop(key, None)
            else:
                sys.modules[key] = value


def f32(value: float) -> float:
    """value rounded to IEEE float32, as the GPU stores it."""
    return struct.unpack("f", struct.pack("f", value))[0]


@pytest.mark.parametrize("ranks", range(1, 9))
def test_the_sum_check_is_exact_in_float32_for_every_rank_count(ranks):
    program = load_program("allreduce.py")
    contributions = [[f32(i % program.PATTERN + r) for i in range(program.PATTERN)] for r in range(ranks)]
    for order in (list(range(ranks)), list(reversed(range(ranks)))):  # any order NCCL adds in
        total = [0.0] * program.PATTERN
        for r in order:
            total = [f32(t + c) for t, c in zip(total, contributions[r], strict=True)]
        assert total == [float(v) for v in program.expected_sum(ranks)]
    assert max(program.expected_sum(ranks)) < 2**24


def test_the_old_check_was_not_exact_for_three_ranks():
    """ones all-reduced 20 times: 3^20 has no exact float32, so the old check compared a rounded sum."""
    assert f32(3**20) != 3**20 and f32(2**20) == 2**20


# -- the engine all-reduce (issue 11): a wrong sum fails ------------------------------------------


def test_the_engine_check_passes_the_real_nccl_run():
    text = (CHECKS / "engine-torch-nccl.txt").read_text()
    detail = test_interconnect.judge_engine_allreduce(0, text, expect(2))
    assert detail.startswith("exact sums over 1 GPUs via torch.distributed nccl")


def test_the_engine_check_fails_the_real_deliberately_broken_reduction():
    text = (CHECKS / "engine-broken.txt").read_text()
    with pytest.raises(AssertionError) as failure:
        test_interconnect.judge_engine_allreduce(0, text, expect(2))
    message = str(failure.value)
    assert "7168 of 7168 wrong" in message and "do not serve" in message


def test_the_engine_check_fails_where_sglang_is_missing():
    text = (CHECKS / "engine-sglang.txt").read_text()
    with pytest.raises(pytest.fail.Exception, match="import sglang failed"):
        test_interconnect.judge_engine_allreduce(0, text, expect(2))


def test_the_engine_program_starts_the_tp_group_like_sglang_059():
    source = (ROOT / "checks/programs/engine_allreduce.py").read_text()
    for call in (
        "set_custom_all_reduce(not args.disable_custom_all_reduce)",
        "init_distributed_environment(",
        "initialize_model_parallel(tensor_model_parallel_size=world_size)",
        "tensor_model_parallel_all_reduce",
    ):
        assert call in source


# -- NVLink and DCGM output formats ---------------------------------------------------------------

NVLINK_S = """GPU 0: NVIDIA H200 (UUID: GPU-626a6486-103b-da2a-8f20-192347a59c5f)
\t Link 0: 26.562 GB/s
\t Link 1: 26.562 GB/s
GPU 1: NVIDIA H200 (UUID: GPU-0b2e4c1a-0000-0000-0000-000000000000)
\t Link 0: 26.562 GB/s
\t Link 1: <inactive>
"""
NVLINK_E = """GPU 0: NVIDIA H200 (UUID: GPU-626a6486-103b-da2a-8f20-192347a59c5f)
\t Link 0: Replay Errors: 0
\t Link 0: Recovery Errors: 0
\t Link 0: CRC Errors: 0
\t Link 1: Replay Errors: 3
"""


def test_nvlink_state_and_error_counters():
    states = parse.parse_nvlink(NVLINK_S, NVLINK_E)
    assert states[0].links == {0: 26.562, 1: 26.562} and states[0].inactive == []
    assert states[1].inactive == [1]
    assert states[0].nonzero_errors() == {1: {"Replay Errors": 3}}


def test_nvlink_of_a_gpu_without_links_is_empty():
    assert parse.parse_nvlink((CHECKS / "nvlink-s.txt").read_text(), (CHECKS / "nvlink-e.txt").read_text()) == {}


PERSISTENCE = (
    'Persistence mode for GPU 1 is disabled. Enable persistence mode by running "nvidia-smi -i <gpuId> -pm 1 " as root.'
)


def test_dcgmi_diag_json_level_1_failure_keeps_dcgms_whole_message_and_error_id():
    tests = parse.parse_dcgmi_diag_json((DATA / "dcgm" / "diag-r1-fail.json").read_text())
    assert [(t.section, t.name, t.result) for t in tests] == [("Deployment", "software", "Fail")]
    software = tests[0]
    assert software.entities == {"GPU0": "Pass", "GPU1": "Fail"}
    # DCGM_FR_PERSISTENCE_MODE (29), DCGM_FR_EC_SOFTWARE_OTHER (8), DCGM_ERROR_CONFIG (5); once,
    # although test_summary repeats it.
    assert software.errors == [parse.DcgmError("GPU1", 29, 8, 5, PERSISTENCE)]
    assert software.details == [f"Warning: GPU1: {PERSISTENCE} (DCGM error id 29)"]


def test_dcgmi_diag_json_pass():
    text = (DATA / "dcgm" / "diag-r1-pass.json").read_text()
    tests = parse.parse_dcgmi_diag_json(text)
    assert [(t.name, t.result, t.entities) for t in tests] == [("software", "Pass", {"GPU0": "Pass", "GPU1": "Pass"})]
    assert parse.dcgm_version(text) == "4.6.0"


def test_dcgmi_diag_json_info_and_tests_dcgm_did_not_run():
    tests = parse.parse_dcgmi_diag_json((DATA / "dcgm" / "diag-r2-not-run.json").read_text())
    by_name = {t.name: t for t in tests}
    assert [t.section for t in tests] == ["Deployment", "Integration", "Hardware"]
    assert by_name["pcie"].result == "Skip" and by_name["pcie"].entities == {"GPU0": "Skip"}
    assert by_name["pcie"].details == ["Info: GPU0: pcie test skipped: no peer GPU reachable by P2P"]
    assert by_name["memory"].result == "Not Run" and by_name["memory"].entities == {}


def test_dcgmi_diag_json_runtime_error_and_text_that_is_no_json():
    with pytest.raises(parse.DcgmRuntimeError, match="^Error: Diagnostic could not be run while DCGM is paused.$"):
        parse.parse_dcgmi_diag_json((DATA / "dcgm" / "diag-runtime-error.json").read_text())
    with pytest.raises(ValueError, match="printed no JSON"):
        parse.parse_dcgmi_diag_json("Error: Unable to connect to host engine. {bad")
    with pytest.raises(ValueError, match='no "DCGM Diagnostic"'):
        parse.parse_dcgmi_diag_json('{"metadata": {"version": "4.6.0"}}')


def test_dcgmi_diag_json_iterations_read_the_last_run():
    one = json.loads((DATA / "dcgm" / "diag-r1-pass.json").read_text())
    two = json.loads((DATA / "dcgm" / "diag-r1-fail.json").read_text())
    text = json.dumps({"iterations": [one, two], "Overall Result": "Fail"})  # Diag::RunStartDiag
    assert [t.result for t in parse.parse_dcgmi_diag_json(text)] == ["Fail"]


def test_dcgm_json_keys_are_dcgms_own():
    """Every key of the samples is one nvvs/include/NvvsJsonStrings.h defines (DCGM 4.6.0) or
    one of Diag.cpp's metadata names."""
    header = {
        "test_categories",
        "category",
        "tests",
        "name",
        "results",
        "status",
        "warnings",
        "warning",
        "info",
        "version",
        "runtime_error",
        "error_id",
        "error_category",
        "error_severity",
        "iterations",
        "Overall Result",
        "Driver Version Detected",
        "entities",
        "entity_groups",
        "entity_group",
        "entity_group_id",
        "entity_id",
        "serial_num",
        "device_id",
        "test_summary",
        "metadata",
        "DCGM Diagnostic",
    }

    def keys(value):
        if isinstance(value, dict):
            for key, item in value.items():
                yield key
                yield from keys(item)
        elif isinstance(value, list):
            for item in value:
                yield from keys(item)

    for sample in (DATA / "dcgm").glob("*.json"):
        assert set(keys(json.loads(sample.read_text()))) <= header, sample.name


# -- 8 GPUs: per-GPU checks and collapsed skips (issue 19) ----------------------------------------


def test_synthetic_eight_gpu_pcie_topology():
    topology = parse.parse_topology((EIGHT / "topo.txt").read_text())
    assert topology.gpus == [f"GPU{i}" for i in range(8)]
    assert len(topology.links) == 56
    assert topology.links[("GPU0", "GPU1")] == "PIX" and topology.links[("GPU0", "GPU2")] == "NODE"
    assert topology.links[("GPU3", "GPU4")] == "SYS"
    assert topology.cpu_affinity["GPU0"] == "0-47,96-143" and topology.numa_affinity["GPU7"] == "1"
    assert parse.worst_link(topology) == "cross-socket"
    assert topology.link_kinds() == {"PIX", "NODE", "SYS"}


def test_eight_gpus_expected_give_eight_of_every_per_gpu_check():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            str(ROOT / "checks"),
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            "--hosts=local://",
            "-m",
            "gpu",
            "--expect=gpu_count=8",
            *(f"--expect={x}" for x in H200),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    items = [line for line in out.stdout.splitlines() if "::" in line]
    per_gpu = [line for line in items if "[GPU" in line]
    checks = {line.split("::")[1].split("[")[0] for line in per_gpu}
    assert len(per_gpu) == 8 * len(checks), out.stdout[-2000:]
    assert "test_memory_bandwidth" in checks and "test_ecc_enabled_no_uncorrectable_errors" in checks
    assert any("GPU7" in line for line in per_gpu)


def test_eight_expected_one_found_collapses_into_one_line_per_reason():
    rows = [
        {
            "suite": "gpu",
            "check": "gpu count",
            "gpu": None,
            "verdict": "FAIL",
            "detail": "expected 8 GPUs; found 1; what to do: ...",
        }
    ]
    for check in ("memory", "ecc enabled no uncorrectable errors", "temperature margin"):
        rows.append({"suite": "gpu", "check": check, "gpu": 0, "verdict": "PASS", "detail": "ok"})
        rows += [
            {
                "suite": "gpu",
                "check": check,
                "gpu": i,
                "verdict": "SKIP",
                "detail": f"GPU{i} is missing (found 1): see the failed check 'gpu count'",
            }
            for i in range(1, 8)
        ]
    table = verdict_table(rows)
    assert "SKIP  21 checks" in table and "GPU# is missing (found 1)" in table
    assert table.count("SKIP") == 1


def test_report_json_of_the_real_pass_lists_every_new_check():
    report = json.loads((CHECKS / "report-pass.json").read_text())
    passed = {c["check"] for c in report["checks"] if c["verdict"] == "PASS"}
    assert {
        "ecc enabled no uncorrectable errors",
        "recovery action none",
        "no active clock slowdown",
        "temperature margin",
        "power limit as expected",
        "bar1 covers memory",
        "mig mode as expected",
        "memory bandwidth",
    } <= passed
    assert report["verdict"] == "healthy"


def _dcgm_probe(sample: str | None) -> FakeProbe:
    gpu = probe()
    gpu.dcgmi_path = "/usr/bin/dcgmi" if sample else None
    text = (DATA / "dcgm" / sample).read_text() if sample else ""

    def run(command):
        assert command == "dcgmi diag -r 1 -j", command
        return types.SimpleNamespace(rc=0, stdout=text, stderr="")

    gpu.host = types.SimpleNamespace(run=run)
    return gpu


def test_dcgm_check_passes_on_a_passing_level_1():
    request = FakeRequest()
    test_gpus.test_dcgm_diagnostics(_dcgm_probe("diag-r1-pass.json"), expect(), request)
    assert request.detail == "dcgmi diag -r 1 (DCGM 4.6.0): 1 tests, software Pass"


def test_dcgm_check_fails_with_dcgms_own_message():
    with pytest.raises(AssertionError) as failure:
        test_gpus.test_dcgm_diagnostics(_dcgm_probe("diag-r1-fail.json"), expect(), FakeRequest())
    assert f"software Fail (Warning: GPU1: {PERSISTENCE} (DCGM error id 29))" in str(failure.value)


def test_dcgm_check_that_cannot_run_fails_with_dcgms_message():
    with pytest.raises(pytest.fail.Exception, match="Diagnostic could not be run while DCGM is paused"):
        test_gpus.test_dcgm_diagnostics(_dcgm_probe("diag-runtime-error.json"), expect(), FakeRequest())


def test_dcgm_missing_skips_unless_the_site_model_installs_it():
    with pytest.raises(pytest.skip.Exception, match="DCGM is not installed"):
        test_gpus.test_dcgm_diagnostics(_dcgm_probe(None), expect(), FakeRequest())
    with pytest.raises(pytest.fail.Exception, match="nvidia_driver_dcgm = true"):
        test_gpus.test_dcgm_diagnostics(_dcgm_probe(None), expect(1, "nvidia_driver_dcgm=true"), FakeRequest())


def test_the_engine_check_reads_custom_all_reduce_from_the_services_launcher():
    e = expect(2)
    launcher = (
        "#!/bin/sh\nexec /opt/inference-host/envs/x/bin/python -m sglang.launch_server"
        " --tp-size 8 --disable-custom-all-reduce\n"
    )
    host = types.SimpleNamespace(run=lambda command: types.SimpleNamespace(rc=0, stdout=launcher, stderr=""))
    assert test_interconnect.engine_custom_all_reduce_off(types.SimpleNamespace(host=host), e) == (
        True,
        f"as in {e.launcher}",
    )
    missing = types.SimpleNamespace(run=lambda command: types.SimpleNamespace(rc=1, stdout="", stderr=""))
    off, source = test_interconnect.engine_custom_all_reduce_off(types.SimpleNamespace(host=missing), e)
    assert off is False and source.startswith("SGLang's default")


def _service_host(launcher: str | None, env_file: str = "NCCL_P2P_LEVEL=SYS\n"):
    """The answers of a deployed node's files: the launcher roles/serving wrote, its env file."""

    def run(command):
        if command.startswith("cat "):
            return types.SimpleNamespace(
                rc=0 if launcher else 1, stdout=launcher or "", stderr="" if launcher else "No such file or directory"
            )
        assert command.startswith("grep -E '^CUDA_VISIBLE_DEVICES=' "), command
        lines = [line for line in env_file.splitlines() if line.startswith("CUDA_VISIBLE_DEVICES=")]
        return types.SimpleNamespace(rc=0 if lines else 1, stdout="\n".join(lines), stderr="")

    return types.SimpleNamespace(run=run)


def _tp_check(launcher: str | None, e: Expectations, env_file: str = "NCCL_P2P_LEVEL=SYS\n") -> FakeRequest:
    request = FakeRequest()
    test_service.test_tensor_parallel_size_matches_the_gpus(
        _service_host(launcher, env_file), {"LoadState": "loaded"}, probe(), e, request
    )
    return request


def _launcher(*args: str) -> str:
    # As roles/serving/templates/launch.j2 writes it.
    return (
        "#!/bin/sh\n# Launch the sglang 0.5.9 server of stack x, written by inference-host\n"
        "exec /opt/inference-host/envs/x/bin/python -m sglang.launch_server --model-path /models/k "
        + " ".join(args)
        + " --host 0.0.0.0 --port 30000\n"
    )


def test_the_tensor_parallel_check_passes_where_the_rendered_size_is_the_gpus_seen():
    # Hardware answer: the real 1 x H200 nvidia-smi list (tests/unit/data/gpu/h200-1gpu-health).
    request = _tp_check(_launcher("--tp-size", "1"), expect(1))
    assert request.detail == "--tp-size 1 = 1 GPUs seen (nvidia-smi)"
    assert request.evidence[("tensor_parallel_ranks", ())] == 1
    vllm = "#!/bin/sh\nexec /e/bin/python -m vllm.entrypoints.openai.api_server --model /m --tensor-parallel-size 1\n"
    assert _tp_check(vllm, expect(1)).detail.startswith("--tensor-parallel-size 1 = 1 GPUs")
    # Two nodes of one group: --tp-size counts both nodes' GPUs, each runs tp_size // nnodes.
    two_nodes = _launcher("--tp-size", "2", "--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "a:5000")
    assert _tp_check(two_nodes, expect(1)).detail == "--tp-size 2 (1 per node) = 1 GPUs seen (nvidia-smi)"


def test_vllms_cpu_build_is_judged_as_one_shard_whatever_gpus_are_listed():
    """The lab's vLLM is PyPI's CPU build (vllm_install_mode = "cpu"): one shard on the CPUs,
    whatever GPUs nvidia-smi lists (the lab's guest lists its node's eight). Judged against the
    GPUs, a correct launcher failed; a wrong size still fails."""
    vllm = "#!/bin/sh\nexec /e/bin/python -m vllm.entrypoints.openai.api_server --model /m --tensor-parallel-size {}\n"
    on_cpu = dataclasses.replace(expect(1), engine="vllm", engine_on_cpu=True)
    no_gpu = "CUDA_VISIBLE_DEVICES=\n"  # planted: the GPUs seen (0) are not what it runs on
    request = _tp_check(vllm.format(1), on_cpu, no_gpu)
    assert (
        request.detail == "--tensor-parallel-size 1 = one shard (vllm_install_mode = cpu: vLLM's CPU build runs"
        " one shard on the CPUs)"
    )
    with pytest.raises(AssertionError):
        _tp_check(vllm.format(1), dataclasses.replace(on_cpu, engine_on_cpu=False), no_gpu)
    with pytest.raises(AssertionError, match="--tensor-parallel-size to give this node as many ranks"):
        _tp_check(vllm.format(8), on_cpu)


def test_the_tensor_parallel_check_fails_a_planted_size_with_what_to_do():
    with pytest.raises(AssertionError) as failed:
        _tp_check(_launcher("--tp-size", "8"), expect(1))
    text = str(failed.value)
    assert text.startswith(
        "expected --tp-size to give this node as many ranks as the GPUs it sees (1, nvidia-smi);"
        f" found 8 ranks per node in {expect(1).launcher}; what to do: "
    )
    assert "correct gpu_count" in text
    # The env file hides the GPU: CUDA_VISIBLE_DEVICES= leaves the engine none.
    with pytest.raises(AssertionError, match=r"GPUs it sees \(0, nvidia-smi and CUDA_VISIBLE_DEVICES= in "):
        _tp_check(_launcher("--tp-size", "1"), expect(1), env_file="CUDA_VISIBLE_DEVICES=\n")
    with pytest.raises(AssertionError, match="found none; what to do: re-run the deploy"):
        _tp_check(_launcher(), expect(1))
    with pytest.raises(AssertionError, match="found No such file or directory; what to do: re-run the deploy"):
        _tp_check(None, expect(1))


# -- connecting as pyinfra does ---------------------------------------------------------------------


def test_ssh_config_carries_every_pyinfra_setting(tmp_path):
    user_config = tmp_path / "config"
    user_config.write_text("Host gpu-node\n    ProxyJump bastion\n")
    text = connection.ssh_config_text(
        "gpu-node",
        {
            "ssh_hostname": "10.0.0.5",
            "ssh_user": "root",
            "ssh_port": 2222,
            "ssh_key": "/keys/id",
            "ssh_known_hosts_file": "/keys/known_hosts",
            "ssh_strict_host_key_checking": "yes",
            "ssh_config_file": str(user_config),
        },
    )
    assert text.splitlines()[1:] == [
        "Host 10.0.0.5",
        "    User root",
        "    Port 2222",
        "    IdentityFile /keys/id",
        "    IdentitiesOnly yes",
        "    UserKnownHostsFile /keys/known_hosts",
        "    StrictHostKeyChecking yes",
        "    BatchMode yes",
        "    ServerAliveInterval 10",
        "    ServerAliveCountMax 3",
        "Host *",
        f"    Include {user_config}",
    ]


@pytest.mark.skipif(shutil.which("ssh") is None, reason="OpenSSH's client reads the config back")
def test_the_checks_share_one_connection_read_back_by_openssh(tmp_path):
    # A hostile folder name: spaces and a %-token of OpenSSH's own must stay the folder's.
    folder = connection.private_folder(tmp_path / "a b %h")
    config = tmp_path / "config"
    config.write_text(connection.ssh_config_text("gpu-node", {"ssh_user": "root"}, control_dir=folder))
    read = subprocess.run(
        ["ssh", "-G", "-F", str(config), "gpu-node"], capture_output=True, text=True, timeout=30, check=True
    ).stdout.splitlines()
    options = dict(line.split(" ", 1) for line in read)
    assert options["controlmaster"] == "auto" and options["controlpersist"] == "60"
    # a host lost mid-command is ssh's own exit 255 after 30 s, not an overrun of the command
    assert options["serveraliveinterval"] == "10" and options["serveralivecountmax"] == "3"
    socket = Path(options["controlpath"])
    # The trust settings' hash, then %C: OpenSSH's hash per host.
    assert socket.parent == folder and re.fullmatch(r"[0-9a-f]{12}-[0-9a-f]{40}", socket.name)


@pytest.mark.skipif(shutil.which("ssh") is None, reason="OpenSSH's client reads the config back")
def test_other_trust_settings_never_ride_on_an_open_master(tmp_path):
    """A session on a master is not checked again: a run whose host key settings differ (another
    known-hosts file, strict checking) must not reuse the master a trusting run left open."""
    folder = connection.private_folder(tmp_path / "control")

    def control_path(data: dict) -> str:
        config = tmp_path / "config"
        config.write_text(connection.ssh_config_text("gpu-node", {"ssh_user": "root", **data}, control_dir=folder))
        read = subprocess.run(
            ["ssh", "-G", "-F", str(config), "gpu-node"], capture_output=True, text=True, timeout=30, check=True
        ).stdout.splitlines()
        return dict(line.split(" ", 1) for line in read)["controlpath"]

    trusting = control_path({"ssh_known_hosts_file": "/keys/known_hosts"})
    assert trusting == control_path({"ssh_known_hosts_file": "/keys/known_hosts"})
    assert trusting != control_path({})
    assert trusting != control_path({"ssh_known_hosts_file": "/keys/known_hosts", "ssh_key": "/keys/id"})
    assert trusting != control_path({"ssh_known_hosts_file": "/keys/known_hosts", "ssh_strict_host_key_checking": "no"})


def test_the_control_folder_must_be_private(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    with pytest.raises(connection.SshSettingsError, match="only it may enter"):
        connection.private_folder(shared)
    with pytest.raises(connection.SshSettingsError, match="double quote"):
        connection.ssh_config_text("gpu-node", {}, control_dir=tmp_path / 'a"b')


def test_ssh_defaults_check_host_keys_strictly():
    # Not pyinfra's accept-new: the first answer to an address is never trusted (docs/security.md#host-keys).
    text = connection.ssh_config_text("gpu-node", {})
    assert "Host gpu-node" in text and "StrictHostKeyChecking yes" in text
    assert "accept-new" not in text


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"ssh_password": "x"}, "ssh_password is set"),
        ({"ssh_strict_host_key_checking": "maybe"}, "ssh_strict_host_key_checking = 'maybe' is invalid"),
    ],
)
def test_ssh_settings_the_checks_cannot_honour_are_refused(data, message):
    with pytest.raises(connection.SshSettingsError) as failure:
        connection.ssh_config_text("gpu-node", data)
    assert message in failure.value.problems[0]


@pytest.mark.parametrize("ranks", [2, 3, 5, 7, 8])
def test_the_engine_check_passes_real_multi_rank_gloo_runs(ranks):
    """Run on the CPUs of the 1 × H200 machine (2026-12-01): N processes, every rank exact."""
    detail = test_interconnect.judge_engine_allreduce(
        0, (CHECKS / f"engine-gloo-{ranks}.txt").read_text(), expect(ranks)
    )
    assert detail.startswith(f"exact sums over {ranks} GPUs via torch.distributed gloo")


def test_the_engine_check_fails_a_real_broken_three_rank_reduction():
    with pytest.raises(AssertionError, match="7168 of 7168 wrong"):
        test_interconnect.judge_engine_allreduce(0, (CHECKS / "engine-gloo-3-broken.txt").read_text(), expect(3))


def test_a_completion_without_choices_names_the_engines_own_error():
    """vllm 0.16.0 answers HTTP 200 with its ErrorResponse when the engine core dies in a
    request (seen on an AMX Xeon: the lab's vLLM with bfloat16); the check prints that message."""
    body = {
        "error": {
            "message": "RuntimeError: Unsupported CPU attention configuration: head_dim=64 isa=0",
            "type": "InternalServerError",
            "param": None,
            "code": 500,
        }
    }
    with pytest.raises(ValueError) as raised:
        answer_parsers.completion_text(body)
    assert str(raised.value) == (
        "the completion has no choices; the engine answered: RuntimeError:"
        " Unsupported CPU attention configuration: head_dim=64 isa=0"
        " (InternalServerError, 500)"
    )
    sglang = {
        "object": "error",
        "message": "The model kimi does not exist.",
        "type": "NotFoundError",
        "param": None,
        "code": 404,
    }
    assert answer_parsers.engine_error(sglang) == "The model kimi does not exist. (NotFoundError, 404)"
    assert answer_parsers.engine_error({"unexpected": "x" * 700}).endswith("... (717 characters)")
    assert answer_parsers.completion_text({"choices": [{"message": {"content": "hi"}}]}) == "hi"


def test_lab_dcgmi_standin_prints_json_with_j_and_the_table_without(tmp_path):
    """The lab's dcgmi (lab/standins/nvidia_apt_repo/dcgm.py) answers `diag -j` in the shape
    the parser reads, and plain `diag` with the text table, as the real dcgmi does."""
    from lab.standins.nvidia_apt_repo import dcgm

    pid = tmp_path / "nv-hostengine.pid"
    pid.write_text(f"{__import__('os').getpid()}\n")
    script = tmp_path / "dcgmi"
    script.write_text(dcgm._dcgmi().replace("/run/nv-hostengine.pid", str(pid)))
    run = lambda *args: subprocess.run(["sh", str(script), *args], capture_output=True, text=True)  # noqa: E731
    out = run("diag", "-r", "1", "-j")
    assert out.returncode == 0 and [(t.section, t.name, t.result) for t in parse.parse_dcgmi_diag_json(out.stdout)] == [
        ("Deployment", "software", "Skip")
    ]
    assert "| software                  | Skip" in run("diag", "-r", "1").stdout
    pid.write_text("999999999\n")
    assert run("diag", "-r", "1", "-j").returncode == 255  # no host engine: dcgmi/Command.cpp's error


def _journal_host(journal: str):
    """A node whose engine unit has a current run and whose journal of that run is `journal`."""

    def run(command):
        if command == "command -v journalctl":
            return types.SimpleNamespace(rc=0, stdout="/usr/bin/journalctl\n", stderr="")
        if command.startswith("systemctl show -p InvocationID"):
            return types.SimpleNamespace(rc=0, stdout="5e1f0c2d9a8b4c3e\n", stderr="")
        assert command.startswith("journalctl _SYSTEMD_INVOCATION_ID=5e1f0c2d9a8b4c3e -o cat"), command
        return types.SimpleNamespace(rc=0, stdout=journal, stderr="")

    return types.SimpleNamespace(run=run)


def test_the_kv_cache_check_reports_sglangs_own_allocation_line():
    """sglang 0.5.10's line for Kimi-K2.5's MLA pool (srt/mem_cache/memory_pool.py), then the
    drafter's K/V pool: the target's figure is reported and kept as evidence."""
    journal = (
        "[2026-12-04 03:10:02 TP0] KV Cache is allocated. #tokens: 218348, KV size: 14.29 GB\n"
        "[2026-12-04 03:10:09 TP0] KV Cache is allocated. #tokens: 218348, K size: 0.42 GB, V size: 0.42 GB\n"
    )
    request = FakeRequest()
    test_service.test_kv_cache_allocated(_journal_host(journal), {"LoadState": "loaded"}, expect(), request)
    assert request.detail.startswith("218348 tokens, 14.29 GiB per GPU (SGLang's own line")
    assert request.evidence[("kv_cache_tokens", ())] == 218348
    with pytest.raises(pytest.skip.Exception, match="KV Cache is allocated"):
        test_service.test_kv_cache_allocated(
            _journal_host("Load weight end.\n"), {"LoadState": "loaded"}, expect(), FakeRequest()
        )


# -- Xid lines judged by NVIDIA's catalog (roles/shared/xid_catalog.yml) ---------------------------


def _xid_probe(*codes: int):
    lines = [
        f"[ {100 + i}.000000] NVRM: Xid (PCI:0000:61:00): {code}, pid=1234, name=python, planted"
        for i, code in enumerate(codes)
    ]
    return types.SimpleNamespace(kernel_log=probes.Evidence("\n".join(lines) + "\n"))


@pytest.mark.parametrize(
    ("codes", "shown"),
    [
        ((79,), "catalog: RESTART_BM): drain and reboot the node"),
        ((62,), "catalog: RESET_GPU): drain the GPU"),
        ((140,), "catalog: RESET_GPU)"),
        ((94,), "catalog: RESTART_APP): restart the program"),
        ((43, 48), "catalog: WORKFLOW_XID_48)"),
        ((999,), "Xid 999: not in this project's copy of the catalog"),
    ],
)
def test_an_xid_fails_with_its_catalog_action(codes, shown):
    with pytest.raises(AssertionError) as failed:
        test_gpus.test_no_xid_errors_since_boot(_xid_probe(*codes), FakeRequest())
    assert shown in str(failed.value) and "docs.nvidia.com/deploy/xid-errors" in str(failed.value)
    assert "Xid 43" not in str(failed.value).split("what to do")[0]  # an IGNORE code is not among the found


def test_xids_the_catalog_says_to_ignore_pass_and_are_named():
    request = FakeRequest()
    test_gpus.test_no_xid_errors_since_boot(_xid_probe(43, 63, 92), request)
    assert request.detail == "only Xids the catalog says to ignore: 43, 63, 92"
