"""Interconnect suite: topology and NUMA affinity (reported), and an NCCL all-reduce across all
GPUs with a timeout (a P2P deadlock hangs it) and a bus-bandwidth floor (a slow path)."""

from __future__ import annotations

import re

import pytest

from checks import gpu_parsers as parse
from checks.probes import cuda_visibility_advice, evidence, explain, report
from roles.shared.shell import sh

pytestmark = pytest.mark.interconnect


def test_topology_reported(gpu, expect, request):
    topology = parse.parse_topology(gpu.topology.require("the GPU topology"))
    assert len(topology.gpus) == expect.gpu_count, explain(
        f"{expect.gpu_count} GPUs in `nvidia-smi topo -m`", f"{len(topology.gpus)}", "see the check 'gpu count'"
    )
    kinds = sorted(topology.link_kinds())
    report(request, f"links {', '.join(kinds) or 'none (one GPU)'}")


def test_numa_affinity_reported(gpu, expect, request):
    topology = parse.parse_topology(gpu.topology.require("NUMA affinity"))
    missing = [name for name in topology.gpus if topology.cpu_affinity.get(name) is None]
    assert not missing, explain(
        "a CPU affinity for every GPU",
        f"none for {', '.join(missing)}",
        "check that the guest sees the host's NUMA layout (LXC: cpuset; KVM: numa=1 and vCPU pinning)",
    )
    report(
        request,
        "; ".join(
            f"{name}: CPUs {topology.cpu_affinity[name]} NUMA {topology.numa_affinity.get(name) or 'N/A'}"
            for name in topology.gpus
        ),
    )


def test_links_as_expected(gpu, expect, request):
    """The slowest GPU-to-GPU link of `nvidia-smi topo -m` against the site model's expectation."""
    topology = parse.parse_topology(gpu.topology.require("the GPU topology"))
    found = parse.worst_link(topology)
    if found is None:
        pytest.skip(f"one GPU in `nvidia-smi topo -m`: no link to judge (expected {expect.gpu_link})")
    order = parse.LINK_CLASSES
    slower = {
        pair: code
        for pair, code in topology.links.items()
        if order.index(parse.link_class(code)) > order.index(expect.gpu_link)
    }
    assert not slower, explain(
        f"every GPU pair joined by {expect.gpu_link} or better ({expect.gpu_link_source})",
        ", ".join(f"{a}-{b} {code} ({parse.link_class(code)})" for (a, b), code in sorted(slower.items()) if a < b),
        "check that the GPUs sit where the site model says (NVLink bridges/"
        "baseboard, slots, BIOS NUMA settings), or correct health_gpu_link",
    )
    report(request, f"slowest link {found} (expected {expect.gpu_link}): " + ", ".join(sorted(topology.link_kinds())))


def test_nvlink_links_up_without_errors(gpu, expect, request):
    topology = parse.parse_topology(gpu.topology.require("the GPU topology"))
    if not any(code.startswith("NV") for code in topology.links.values()):
        pytest.skip("no NVLink in `nvidia-smi topo -m`: nothing to check")
    status_text, _, errors_text = gpu.nvlink.require("NVLink state").partition("\n@@ERRORS@@\n")
    states = parse.parse_nvlink(status_text, errors_text)
    assert states, explain(
        "`nvidia-smi nvlink -s` to list links",
        "no output",
        "check the fabric manager (NVSwitch systems) and `nvidia-smi nvlink -s`",
    )
    down = {g: s.inactive for g, s in states.items() if s.inactive}
    errors = {g: s.nonzero_errors() for g, s in states.items() if s.nonzero_errors()}
    assert not down and not errors, explain(
        "every NVLink link up, all error counters 0",
        "; ".join(
            [f"GPU{g} links {links} inactive" for g, links in down.items()]
            + [f"GPU{g} link {k}: {v}" for g, e in errors.items() for k, v in e.items()]
        ),
        "a link down or counting errors: reseat/RMA the board; `nvidia-smi nvlink -e` over time "
        "shows whether counters grow",
    )
    links = sum(len(s.links) for s in states.values())
    speeds = sorted({v for s in states.values() for v in s.links.values() if v})
    report(request, f"{links} links up ({', '.join(f'{v} GB/s' for v in speeds)}), error counters 0")


@pytest.fixture(scope="module")
def allreduce_run(gpu, expect) -> dict:
    """The all-reduce, run once, with the PCIe replay counters read before and after it."""
    if expect.gpu_count < 2:
        return {"skip": f"one GPU expected ({expect.source}): there is no interconnect to exercise"}
    missing = gpu.engine_python_missing(expect.engine_python)
    if missing:
        return {"fail": explain("the engine environment's python", missing, "deploy the engine first")}
    before = gpu.replays()
    result = gpu.run_program(
        expect.engine_python,
        "allreduce.py",
        [str(expect.allreduce_size_mib)],
        env_file=expect.env_file,
        fallback_env=expect.nccl_env,
        timeout_s=expect.allreduce_timeout_s,
    )
    return {"result": result, "replays_before": before, "replays_after": gpu.replays()}


def judge_allreduce(run: dict, expect) -> str:
    """The all-reduce's verdict: raises pytest's fail/skip, else returns the finding."""
    if "skip" in run:
        pytest.skip(run["skip"])
    if "fail" in run:
        pytest.fail(run["fail"])
    result = run["result"]
    stages = re.findall(r"^IH-ALLREDUCE-STAGE (\w+)", result.stdout, re.MULTILINE)
    if result.rc in (124, 137):
        if "collective" not in stages:
            pytest.fail(
                explain(
                    f"the all-reduce to start within {expect.allreduce_timeout_s} s",
                    f"killed while starting (stages reached: {', '.join(stages) or 'none'})",
                    "start-up (imports, one process per GPU, NCCL set-up) alone takes ~8 s on 2 GPUs and "
                    "more on 8: raise health_allreduce_timeout_s; if it still hangs there, run it with "
                    "NCCL_DEBUG=INFO",
                )
            )
        pytest.fail(
            explain(
                f"the all-reduce to finish within {expect.allreduce_timeout_s} s",
                "it hung inside the collective and was killed (NCCL had started)",
                "a P2P deadlock: lower nccl_p2p_level (e.g. PHB) or set it to 'off', and check PCIe "
                "ACS/IOMMU settings (NVIDIA/nccl #631)",
            )
        )
    try:
        found = parse.parse_json_line(result.stdout, "IH-ALLREDUCE ")
    except ValueError:
        pytest.fail(
            explain(
                "the all-reduce to print its result",
                f"rc {result.rc}: {(result.stdout + result.stderr).strip()[-600:]}",
                "run it with NCCL_DEBUG=INFO to see the failing transport",
            )
        )
    env = found.get("nccl_env", {})
    env_text = " ".join(f"{k}={v}" for k, v in env.items()) or "none"
    where = f"environment from {found.get('env_source', '?')}: {env_text}"
    if found["world_size"] != expect.gpu_count:
        pytest.fail(
            explain(
                f"{expect.gpu_count} ranks",
                f"{found['world_size']} GPUs visible to torch ({where})",
                cuda_visibility_advice({**env, "IH_ENV_SOURCE": found.get("env_source", "?")}),
            )
        )
    assert found["correct"], explain(
        "the all-reduce sum to be exact",
        f"a wrong sum ({where})",
        "a corrupting transport: try nccl_p2p_level = 'off' and report it",
    )
    busbw = found["busbw_gbps"]
    assert busbw >= expect.allreduce_min_busbw_gbps, explain(
        f"bus bandwidth >= {expect.allreduce_min_busbw_gbps} GB/s ({expect.allreduce_floor_source}; "
        f"links expected: {expect.gpu_link})",
        f"{busbw:.1f} GB/s over {found['world_size']} GPUs, {found['size_mib']} MiB ({where})",
        (
            "NCCL_P2P_DISABLE=1 is set: P2P is off, traffic goes through host memory; remove it"
            if env.get("NCCL_P2P_DISABLE") == "1"
            else "P2P is probably off or falling back to host memory: check `nvidia-smi topo -m`, "
            "nccl_p2p_level, and NCCL_DEBUG=INFO for the chosen transport"
        ),
    )
    return (
        f"busbw {_gbps(busbw)} GB/s (algbw {_gbps(found['algbw_gbps'])}, floor "
        f"{_gbps(expect.allreduce_min_busbw_gbps, 0)}) over {found['world_size']} GPUs, {found['size_mib']} MiB, "
        f"NCCL {found['nccl_version']}; {where}"
    )


def _gbps(value: float, decimals: int = 1) -> str:
    """A bandwidth as read: one decimal (or none) for GB/s figures, three digits below 1 GB/s (a
    site's low floor, the lab's CPU all-reduce), never 0.0 for what was measured."""
    return f"{value:.{decimals}f}" if value >= 1 else f"{value:.3g}"


def test_allreduce_across_all_gpus(gpu, expect, request, allreduce_run):
    record_busbw(request, allreduce_run)
    report(request, judge_allreduce(allreduce_run, expect))


def record_busbw(request, run: dict) -> None:
    """The bus bandwidth as evidence, passed or failed (the acceptance report charts it)."""
    try:
        found = parse.parse_json_line(run["result"].stdout, "IH-ALLREDUCE ") if "result" in run else {}
    except ValueError:
        return
    if "busbw_gbps" in found:
        evidence(request, "allreduce_busbw_gbps", round(found["busbw_gbps"], 2), gpus=str(found["world_size"]))


def test_pcie_replays_not_increasing(gpu, expect, request, allreduce_run):
    if "result" not in allreduce_run:
        pytest.skip(allreduce_run.get("skip") or "the all-reduce did not run: see its check")
    before, after = allreduce_run["replays_before"], allreduce_run["replays_after"]
    if not before or not after:
        pytest.skip("no evidence: `nvidia-smi -q` gave no 'Replays Since Reset'")
    grown = {
        bus: (before[bus], after.get(bus))
        for bus in before
        if before[bus] is not None and after.get(bus) is not None and after[bus] > before[bus]
    }
    assert not grown, explain(
        "no PCIe replays during the all-reduce",
        ", ".join(f"{bus}: {a} -> {b}" for bus, (a, b) in grown.items()),
        "replays mean link errors that PCIe retried: reseat the GPU or riser, check the slot's "
        "signal integrity (lower the slot's PCIe generation in the BIOS to confirm)",
    )
    report(
        request,
        "replays unchanged across the all-reduce: " + ", ".join(f"{bus} {value}" for bus, value in after.items()),
    )


def test_engine_allreduce_correct(gpu, expect, request):
    """The engine's own communicator (SGLang's custom all-reduce where it takes over, else
    NCCL) gives the exact sum in the service's environment: a wrong sum fails the deploy."""
    if expect.gpu_count < 2:
        pytest.skip(f"one GPU expected ({expect.source}): SGLang returns the input unreduced")
    missing = gpu.engine_python_missing(expect.engine_python)
    assert not missing, explain("the engine environment's python", missing, "deploy the engine first")
    disable, source = engine_custom_all_reduce_off(gpu, expect)
    result = gpu.run_program(
        expect.engine_python,
        "engine_allreduce.py",
        ["--disable-custom-all-reduce"] if disable else [],
        env_file=expect.env_file,
        fallback_env=expect.nccl_env,
        timeout_s=expect.allreduce_timeout_s,
    )
    report(
        request,
        judge_engine_allreduce(result.rc, result.stdout + result.stderr, expect)
        + f"; custom all-reduce {'off' if disable else 'on'} ({source})",
    )


def engine_custom_all_reduce_off(gpu, expect) -> tuple[bool, str]:
    """Whether the service runs SGLang with --disable-custom-all-reduce: read from the unit's
    launcher on the host (its exact command line); without one, SGLang's default (on)."""
    launcher = gpu.host.run(sh("cat -- {file}", file=expect.launcher))
    if launcher.rc != 0:
        return False, f"SGLang's default: no {expect.launcher} on the host"
    return "--disable-custom-all-reduce" in launcher.stdout.split(), f"as in {expect.launcher}"


def judge_engine_allreduce(rc: int, output: str, expect) -> str:
    if rc in (124, 137):
        if "IH-ENGINE-ALLREDUCE-STAGE collective" not in output:
            pytest.fail(
                explain(
                    f"the engine all-reduce to start within {expect.allreduce_timeout_s} s",
                    "killed while starting (importing SGLang, spawning one process per "
                    "GPU, setting up its communicators)",
                    "raise health_allreduce_timeout_s: start-up alone takes several seconds",
                )
            )
        pytest.fail(
            explain(
                f"the engine all-reduce to finish within {expect.allreduce_timeout_s} s",
                "it hung inside the all-reduce and was killed",
                "see 'allreduce across all gpus'; with serving_custom_all_reduce_pcie on, turn it off",
            )
        )
    try:
        found = parse.parse_json_line(output, "IH-ENGINE-ALLREDUCE ")
    except ValueError:
        pytest.fail(
            explain(
                "the engine all-reduce to print its result",
                f"rc {rc}: {output.strip()[-600:]}",
                "run checks/programs/engine_allreduce.py by hand with the engine python",
            )
        )
    if "error" in found:
        pytest.fail(
            explain(
                "SGLang's distributed module in the engine environment",
                found["error"],
                "reinstall the engine environment (roles/engine_envs)",
            )
        )
    methods = sorted({s["method"] for s in found["sizes"]})
    bad = [s for s in found["sizes"] if s["wrong_elements"]]
    assert found["correct"] and not bad, explain(
        "the engine's all-reduce to give the exact sum for every size",
        "; ".join(
            f"{s['rows']}x7168 bf16 via {s['method']}: {s['wrong_elements']} of {s['elements']} wrong" for s in bad
        )
        + f" (custom all-reduce {'on' if found['custom_all_reduce'] else 'off'})",
        "do not serve: the communicator corrupts sums. If it is SGLang's custom all-reduce on PCIe, "
        "set serving_custom_all_reduce_pcie = false; otherwise set nccl_p2p_level = 'off' and report it",
    )
    return (
        f"exact sums over {found['world_size']} GPUs via {', '.join(methods)} "
        f"(SGLang {found.get('sglang', '-')}, environment from {found['env_source']})"
    )
