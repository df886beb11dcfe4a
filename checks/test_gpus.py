"""GPU suite: driver, devices, memory health and CUDA, one test per resource.

Needs no systemd: evidence comes from nvidia-smi, /proc/driver/nvidia and the kernel log
(dmesg, else journalctl). A missing source makes the dependent check SKIP with the reason.
"""

from __future__ import annotations

import dataclasses

import pytest

from checks import bounded, gpu_processes, service_parsers
from checks import gpu_parsers as parse
from checks.bounded import DCGM_DIAG_BOUND_S
from checks.probes import SLOW_DRIVER_CALL_S, cuda_visibility_advice, evidence, explain, report, warn
from roles.shared import xid_catalog
from roles.shared.shell import sh

pytestmark = pytest.mark.gpu

DRIVER_DOCS = "re-run the deploy (roles/nvidia_driver installs the pinned driver from inventory/stack.yml)"
# A lost GPU (nvidia-smi exit 15, "GPU is lost. Reboot the system to recover this GPU"; Xid 79,
# whose catalog row says RESTART_BM) comes back only with the node: no deploy reaches it.
REBOOT_NODE = (
    "reboot the node that owns the GPU (for a guest: the Proxmox node, not only the guest), then run "
    "the checks again; if it falls off again, check its slot, riser and power, then the catalog's "
    "next step for Xid 79: contact support (`dmesg | grep -i -e xid -e 'fallen off'` on the node)"
)


def _gpu(gpu, gpu_index: int, expect) -> parse.GpuInfo:
    gpus = gpu.gpus
    if gpu_index >= expect.gpu_count:
        pytest.skip(f"GPU{gpu_index} is not expected on this host ({expect.gpu_count} GPUs)")
    if gpu_index >= len(gpus):
        # Not a pass: the check 'gpu count' fails for it, once, instead of every per-GPU check.
        pytest.skip(f"GPU{gpu_index} is missing (found {len(gpus)}): see the failed check 'gpu count'")
    return gpus[gpu_index]


def test_nvidia_smi_present(gpu, request):
    assert gpu.smi_path, explain(
        "nvidia-smi on the PATH", "no nvidia-smi", "install the NVIDIA userspace driver (" + DRIVER_DOCS + ")"
    )
    plain = gpu.smi_plain
    output = (plain.stdout + plain.stderr).strip()
    lost = parse.parse_gpu_lost(plain.rc, output)
    if lost:
        pytest.fail(explain("nvidia-smi to reach every GPU", f"rc {plain.rc}: {lost}", REBOOT_NODE))
    if parse.parse_nvml_mismatch(output) is not None:
        pytest.fail(
            explain(
                "nvidia-smi to talk to the driver",
                output.splitlines()[0],
                "reboot required: the userspace driver was upgraded but the old kernel "
                "module is still loaded (see 'kernel module matches userspace')",
            )
        )
    assert plain.rc == 0, explain(
        "nvidia-smi to exit 0", f"rc {plain.rc}: {output[:300]}", "check the driver installation (" + DRIVER_DOCS + ")"
    )
    report(request, gpu.smi_path)


def test_gpu_count(gpu, expect, request):
    lost = gpu.gpu_query.lost
    if lost:  # not a skip for want of evidence: nvidia-smi said a GPU is gone
        evidence(request, "gpus_visible", 0 if gpu.gpu_query.text is None else len(gpu.gpus))
        pytest.fail(explain(f"{expect.gpu_count} GPUs ({expect.source})", f"a GPU lost: {lost}", REBOOT_NODE))
    found = gpu.gpus
    evidence(request, "gpus_visible", len(found))
    assert len(found) == expect.gpu_count, explain(
        f"{expect.gpu_count} GPUs ({expect.source})",
        f"{len(found)}: " + ", ".join(f"{g.index} {g.name} {g.bus}" for g in found),
        "check that every GPU is passed through to this guest (Proxmox devN / hostpci entries) and "
        "not excluded (/proc/driver/nvidia/gpus/*/information 'GPU Excluded'), or correct gpu_count",
    )
    report(request, f"{len(found)} x {found[0].name}" if found else "0")


def test_driver_version_equals_pin(gpu, expect, request):
    versions = {g.driver_version for g in gpu.gpus}
    assert versions == {expect.driver_version}, explain(
        f"driver {expect.driver_version} (inventory/stack.yml nvidia_driver.version)",
        ", ".join(sorted(v or "unknown" for v in versions)),
        DRIVER_DOCS + "; an LXC guest's userspace must equal the Proxmox host's module",
    )
    report(request, expect.driver_version)


def test_kernel_module_matches_userspace(gpu, request):
    """The most reported GPU failure: after a driver upgrade without reboot, NVML refuses."""
    module = parse.parse_proc_driver_version(gpu.proc_version.text or "")
    source = "/proc/driver/nvidia/version"
    if module is None:
        log = gpu.kernel_log.require("the kernel module version (no /proc/driver/nvidia/version either)")
        module = parse.parse_kernel_log_driver_version(log)
        source = "the kernel log's NVRM load line"
        if module is None:
            pytest.skip(
                f"no evidence for the kernel module version: {gpu.proc_version.missing}, "
                "and the kernel log has no 'NVRM: loading NVIDIA UNIX ... Kernel Module' line"
            )
    userspace = set()
    smi = parse.parse_smi_version(gpu.smi_version.text or "")
    if smi.get("DRIVER version"):
        userspace.add(smi["DRIVER version"])
    if gpu.userspace_libraries.text:
        userspace |= parse.parse_userspace_versions(gpu.userspace_libraries.text)
    plain = gpu.smi_plain
    if plain is not None and parse.parse_nvml_mismatch(plain.stdout + plain.stderr) is not None:
        pytest.fail(
            explain(
                f"userspace {module.version} like the loaded module",
                f"NVML: Driver/library version mismatch (userspace {', '.join(sorted(userspace)) or 'unknown'})",
                "reboot required to load the new kernel module",
            )
        )
    if not userspace:
        pytest.skip(
            "no evidence for the userspace driver version: nvidia-smi --version failed and "
            f"{gpu.userspace_libraries.missing}"
        )
    assert userspace == {module.version}, explain(
        f"userspace driver {module.version} (the loaded kernel module, from {source})",
        f"userspace {', '.join(sorted(userspace))}",
        "reboot required: the kernel still runs the old module; on an LXC guest install the host's "
        "exact version in the guest",
    )
    report(request, f"module {module.version} ({source}) = userspace")


def test_open_kernel_module(gpu, request):
    """Blackwell GPUs work only with NVIDIA's open kernel modules."""
    module = parse.parse_proc_driver_version(gpu.proc_version.text or "")
    if module is not None:
        assert module.flavor == "open", explain(
            "the open kernel module ('NVIDIA UNIX Open Kernel Module')",
            "the proprietary module",
            "install the -open driver flavour; " + DRIVER_DOCS,
        )
        report(request, "open (/proc/driver/nvidia/version)")
        return
    license_text = gpu.modinfo_license.require(
        f"the module flavour ({gpu.proc_version.missing}, and modinfo cannot tell either)"
    )
    flavor = parse.parse_modinfo_license(license_text)
    assert flavor == "open", explain(
        "license 'Dual MIT/GPL' (open module)", license_text, "install the -open driver flavour; " + DRIVER_DOCS
    )
    report(request, "open (modinfo)")


def test_no_xid_errors_since_boot(gpu, request):
    """Each Xid is judged by NVIDIA's catalog (roles/shared/xid_catalog.yml): the codes whose
    immediate action is IGNORE are reported, not failed; the others fail with their action."""
    log = gpu.kernel_log.require("Xid errors")
    events = parse.parse_xid_events(log)
    evidence(request, "xid_events_since_boot", len(events))
    acted = [e for e in events if xid_catalog.severity(e.code) != "none"]
    ignored = sorted({e.code for e in events} - {e.code for e in acted})
    steps = " | ".join(dict.fromkeys(xid_catalog.advice(e.code) for e in acted))
    assert not acted, explain(
        "no 'NVRM: Xid' line since boot whose catalog action is more than IGNORE",
        f"{len(acted)}: " + " | ".join(f"Xid {e.code} on {e.bus}: {e.message[:80]}" for e in acted[:5]),
        f"{steps} (NVIDIA's Xid catalog, {xid_catalog.catalog()['source']})",
    )
    report(
        request,
        "kernel log has no Xid lines"
        if not events
        else f"only Xids the catalog says to ignore: {', '.join(str(c) for c in ignored)}",
    )


def test_no_compute_process_outside_service(gpu, host, expect, request):
    """The GPUs' processes are the engine's (checks/gpu_processes.py: what NVML reports in a KVM
    guest, on bare metal and in an LXC guest)."""
    apps = parse.parse_compute_apps(gpu.compute_apps.require("GPU processes"))
    cgroup, active = None, None
    if host.run("command -v systemctl").rc == 0:
        shown = host.run(sh("systemctl show -p ControlGroup -p ActiveState -- {unit}", unit=expect.unit_name))
        values = service_parsers.parse_systemctl_show(shown.stdout)
        cgroup = values.get("ControlGroup") or None
        active = values.get("ActiveState") in ("active", "activating", "reloading")
    listed = []
    for app in apps:
        own = host.run(sh("cat /proc/{pid}/cgroup", pid=int(app.pid)))
        listed.append(gpu_processes.Listed(app, own.rc == 0, bool(cgroup) and own.rc == 0 and cgroup in own.stdout))
    driver = next((info.driver_version for info in parse.parse_gpu_query(gpu.gpu_query.text or "")), None)
    judgement = gpu_processes.judge(
        listed, gpu.memory_used_mib, gpu.container, expect.unit_name, active, cgroup is not None, driver
    )
    evidence(request, "gpu_processes_listed", len(apps))
    if gpu.memory_used_mib is not None:
        evidence(request, "gpu_memory_used_mib", gpu.memory_used_mib)
    if judgement.verdict == "SKIP":
        pytest.skip(judgement.text)
    assert judgement.verdict == "PASS", judgement.text
    report(request, judgement.text)


# -- one test per GPU ----------------------------------------------------------------------------


def test_gpu_name(gpu, expect, gpu_index, request):
    info = _gpu(gpu, gpu_index, expect)
    assert info.name == expect.gpu_model, explain(
        f"{expect.gpu_model!r}",
        f"{info.name!r} at {info.bus}",
        "check the inventory's gpu_model, or that the right GPUs are passed through",
    )
    report(request, f"{info.name} at {info.bus}")


def test_compute_capability(gpu, expect, gpu_index, request):
    info = _gpu(gpu, gpu_index, expect)
    assert info.compute_cap == expect.compute_capability, explain(
        f"compute capability {expect.compute_capability} (gpu_arch)",
        f"{info.compute_cap} ({info.name})",
        "set gpu_arch to the GPUs' architecture: kernels and wheels are built for it",
    )
    report(request, str(info.compute_cap))


def test_memory(gpu, expect, gpu_index, request):
    info = _gpu(gpu, gpu_index, expect)
    found_gib = (info.memory_mib or 0) / 1024
    # Marketing GB vs reported MiB, and memory the driver reserves: allow 5% either way.
    assert abs(found_gib - expect.gpu_memory_gib) <= 0.05 * expect.gpu_memory_gib, explain(
        f"about {expect.gpu_memory_gib} GiB (gpu_memory_gib)",
        f"{found_gib:.1f} GiB",
        "correct gpu_memory_gib, or check for a wrong GPU model / MIG partitioning",
    )
    report(request, f"{found_gib:.1f} GiB")


def test_persistence_mode(gpu, expect, gpu_index, request):
    info = _gpu(gpu, gpu_index, expect)
    assert info.persistence_mode, explain(
        "persistence mode enabled",
        f"{info.persistence_mode} on {info.bus}",
        "enable nvidia-persistenced (roles/nvidia_driver), or `nvidia-smi -pm 1` until the next deploy",
    )
    report(request, "enabled")


def _under_load(gpu, info: parse.GpuInfo, membw_result) -> parse.GpuInfo:
    """The GPU's PCIe link as read while the memory bandwidth probe kept every GPU busy."""
    text = getattr(gpu, "pcie_under_load", "")
    fields = (
        "index",
        "pci.bus_id",
        "pstate",
        "pcie.link.gen.current",
        "pcie.link.gen.max",
        "pcie.link.width.current",
        "pcie.link.width.max",
    )
    try:
        loaded = {g.bus: g for g in parse.parse_gpu_query(text, fields)} if text else {}
    except ValueError:
        loaded = {}
    found = loaded.get(info.bus)
    if found is None:
        return info
    return dataclasses.replace(
        info, pstate=found.pstate, pcie_gen_current=found.pcie_gen_current, pcie_width_current=found.pcie_width_current
    )


def test_pcie_link_generation(gpu, expect, gpu_index, request, membw_result):
    info = _under_load(gpu, _gpu(gpu, gpu_index, expect), membw_result)
    if info.pcie_gen_max is None or info.pcie_gen_current is None:
        pytest.skip(f"no evidence: nvidia-smi reports no PCIe link generation for {info.bus}")
    gpu_max = info.pcie_gen_gpu_max or info.pcie_gen_max
    assert info.pcie_gen_max >= gpu_max, explain(
        f"the slot to allow the GPU's Gen{gpu_max}",
        f"Gen{info.pcie_gen_max} at most ({info.bus})",
        "check the BIOS PCIe setting, risers and the slot: the link is capped below the GPU's maximum",
    )
    if info.pcie_gen_current < info.pcie_gen_max and info.pstate not in (None, "P0", "P1", "P2"):
        pytest.skip(
            f"link at Gen{info.pcie_gen_current} of Gen{info.pcie_gen_max} while the GPU idles "
            f"({info.pstate}): GPUs lower the link speed at idle; re-run under load to judge it"
        )
    assert info.pcie_gen_current == info.pcie_gen_max, explain(
        f"Gen{info.pcie_gen_max} under load",
        f"Gen{info.pcie_gen_current} in {info.pstate} ({info.bus})",
        "reseat the GPU / check risers and BIOS PCIe speed; a degraded link halves all-reduce speed",
    )
    report(
        request,
        f"Gen{info.pcie_gen_current} of Gen{info.pcie_gen_max} ({info.pstate}"
        f"{', under load' if getattr(gpu, 'pcie_under_load', '') else ''})",
    )


def test_pcie_link_width(gpu, expect, gpu_index, request, membw_result):
    info = _under_load(gpu, _gpu(gpu, gpu_index, expect), membw_result)
    if info.pcie_width_max is None or info.pcie_width_current is None:
        pytest.skip(f"no evidence: nvidia-smi reports no PCIe link width for {info.bus}")
    assert info.pcie_width_current == info.pcie_width_max, explain(
        f"x{info.pcie_width_max}",
        f"x{info.pcie_width_current} ({info.bus})",
        "reseat the GPU or move it to a full-width slot; check risers",
    )
    report(
        request,
        f"x{info.pcie_width_current} of x{info.pcie_width_max}"
        f"{' under load' if getattr(gpu, 'pcie_under_load', '') else ''}",
    )


def test_no_row_remap_failure(gpu, expect, gpu_index, request):
    info = _gpu(gpu, gpu_index, expect)
    rows = {normalize(r.bus_id): r for r in parse.parse_remapped_rows(gpu.remapped.require("row remapping"))}
    state = rows.get(info.bus)
    if state is None or (state.failure is None and state.uncorrectable is None):
        pytest.skip(
            f"no evidence: {info.name} reports no row-remapping state (pre-Ampere GPUs retire "
            "pages instead; see 'no retired pages')"
        )
    assert not state.failure and not state.pending, explain(
        "no row-remap failure and none pending",
        f"failure={state.failure} pending={state.pending} uncorrectable={state.uncorrectable} on {info.bus}",
        "pending: reset the GPU or reboot to apply the remap; failure: the GPU needs an RMA",
    )
    report(request, f"correctable {state.correctable}, uncorrectable {state.uncorrectable}, none pending")


def test_no_retired_pages(gpu, expect, gpu_index, request):
    info = _gpu(gpu, gpu_index, expect)
    pages = {p.index: p for p in parse.parse_retired_pages(gpu.retired.require("page retirement"))}
    state = pages.get(info.index)
    if state is None or not state.supported:
        pytest.skip(
            f"no evidence: {info.name} does not retire pages ([N/A]); it remaps rows instead, "
            "see 'no row remap failure'"
        )
    assert not state.pending and not state.double_bit, explain(
        "no double-bit retired pages and none pending",
        f"double-bit {state.double_bit}, pending {state.pending} on {info.bus}",
        "reboot to retire pending pages; repeated double-bit errors: RMA",
    )
    report(request, f"single-bit {state.single_bit}, double-bit {state.double_bit}")


def test_cuda_works(gpu, expect, gpu_index, request, cuda_result):
    info = _gpu(gpu, gpu_index, expect)
    if "failure" in cuda_result:  # the engine environment itself: said once, on the first GPU
        if gpu_index == 0:
            pytest.fail(cuda_result["failure"])
        pytest.skip("the CUDA check could not run: see 'cuda works [GPU0]'")
    devices = {d["index"]: d for d in cuda_result.get("devices", [])}
    device = devices.get(gpu_index)
    assert device is not None, explain(
        f"torch to see GPU{gpu_index} ({info.bus}, listed by nvidia-smi)",
        f"{len(devices)} devices (torch {cuda_result.get('torch')})",
        cuda_visibility_advice(cuda_result.get("env", {})),
    )
    assert device.get("ok"), explain(
        "a 512x512 matrix product on the GPU equal to the CPU's",
        device.get("error") or f"max error {device.get('max_error')}",
        "check the driver/CUDA pairing of the engine's torch; "
        "a wrong result on one GPU points at that GPU (see Xid errors)",
    )
    source = cuda_result.get("env", {}).get("IH_ENV_SOURCE", "?")
    report(
        request,
        f"torch {cuda_result['torch']} CUDA {cuda_result['cuda']}: {device['name']} ok "
        f"({info.bus}; environment from {source})",
    )


@pytest.fixture(scope="module")
def cuda_result(gpu, expect) -> dict:
    missing = gpu.engine_python_missing(expect.engine_python)
    if missing:
        return {"failure": explain("the engine environment's python", missing, "deploy the engine first")}
    result = gpu.run_program(
        expect.engine_python, "cuda_check.py", env_file=expect.env_file, fallback_env=expect.nccl_env, timeout_s=300
    )
    try:
        found = parse.parse_json_line(result.stdout, "IH-CUDA ")
    except ValueError:
        return {
            "failure": explain(
                "the CUDA check to print its result",
                f"rc {result.rc}: {(result.stdout + result.stderr).strip()[-400:]}",
                "run it by hand: checks/programs/cuda_check.py with the engine python",
            )
        }
    if "error" in found:
        hidden = found.get("env", {})
        if "CUDA_VISIBLE_DEVICES" in hidden:
            return {
                "failure": explain(
                    "torch to see the GPUs nvidia-smi lists", found["error"], cuda_visibility_advice(hidden)
                )
            }
        return {
            "failure": explain(
                "torch with CUDA in the engine environment",
                found["error"],
                "reinstall the engine environment (roles/engine_envs); check the driver supports the torch "
                "build's CUDA version",
            )
        }
    return found


def normalize(bus_id: str) -> str:
    return parse.normalize_bus_id(bus_id)


# -- health counters of nvidia-smi -q, one test per GPU ------------------------------------------


def _health(gpu, gpu_index: int, expect) -> tuple[parse.GpuInfo, parse.GpuHealth]:
    info = _gpu(gpu, gpu_index, expect)
    health = gpu.health.get(info.bus)
    if health is None:
        pytest.skip(f"no evidence: `nvidia-smi -q` has no section for {info.bus}")
    return info, health


def test_ecc_enabled_no_uncorrectable_errors(gpu, expect, gpu_index, request):
    info, health = _health(gpu, gpu_index, expect)
    if health.ecc_current is None:
        pytest.skip(f"no evidence: {info.name} reports no ECC mode (N/A: no ECC on this GPU)")
    assert health.ecc_current and health.ecc_pending is not False, explain(
        "ECC enabled (current and pending)",
        f"current {health.ecc_current}, pending {health.ecc_pending} on {info.bus}",
        f"`nvidia-smi -i {gpu_index} -e 1` and reboot; without ECC a memory error corrupts results silently",
    )
    for scope in ("Volatile", "Aggregate"):
        count = sum(v or 0 for v in (health.uncorrectable(scope) or {}).values())
        evidence(request, "gpu_ecc_uncorrectable_errors", count, gpu=str(gpu_index), scope=scope.lower())
    evidence(request, "gpu_pcie_replays", health.replays, gpu=str(gpu_index))
    bad = {scope: health.uncorrectable(scope) for scope in ("Volatile", "Aggregate")}
    bad = {scope: counters for scope, counters in bad.items() if counters}
    assert not bad, explain(
        "no uncorrectable ECC errors (volatile: since the driver loaded; aggregate: lifetime)",
        "; ".join(f"{scope} " + ", ".join(f"{k} {v}" for k, v in c.items()) for scope, c in bad.items())
        + f" on {info.bus}",
        "volatile: drain the GPU and reset it (`nvidia-smi -r`) or reboot, then "
        "check row remapping; aggregate growing: the GPU needs an RMA (NVIDIA's GPU memory error guide)",
    )
    corrected = {
        scope: sum(v or 0 for k, v in c.items() if "Correctable" in k) for scope, c in health.ecc_errors.items()
    }
    report(
        request,
        "ECC on; uncorrectable 0 (volatile, aggregate); correctable "
        + ", ".join(f"{k.lower()} {v}" for k, v in corrected.items()),
    )


def test_recovery_action_none(gpu, expect, gpu_index, request):
    info, health = _health(gpu, gpu_index, expect)
    if health.recovery_action is None:
        pytest.skip(f"no evidence: the driver reports no 'GPU Recovery Action' for {info.bus} (before 550)")
    assert health.recovery_action == "None", explain(
        "GPU Recovery Action None",
        f"{health.recovery_action} on {info.bus}",
        "do what the driver asks: GPU Reset -> drain and `nvidia-smi -r`; Node Reboot -> reboot; "
        "Drain P2P -> stop peer traffic, then reset (nvidia-smi(1), 'GPU Recovery Action')",
    )
    report(request, "None")


def test_no_active_clock_slowdown(gpu, expect, gpu_index, request):
    info, health = _health(gpu, gpu_index, expect)
    if not health.clock_events:
        pytest.skip(f"no evidence: no 'Clocks Event Reasons' for {info.bus}")
    active = {name: why for name, why in parse.CLOCK_EVENTS_BAD.items() if health.clock_events.get(name)}
    evidence(request, "gpu_clock_events_active", len(active), gpu=str(gpu_index))
    assert not active, explain(
        "no HW slowdown, HW thermal, HW power brake or SW thermal clock event active",
        ", ".join(active) + f" on {info.bus}",
        "; ".join(active.values()),
    )
    shown = [name for name, on in health.clock_events.items() if on]
    report(
        request,
        "none of "
        + ", ".join(parse.CLOCK_EVENTS_BAD)
        + " active"
        + (f" (active: {', '.join(shown)})" if shown else ""),
    )


def test_temperature_margin(gpu, expect, gpu_index, request):
    info, health = _health(gpu, gpu_index, expect)
    if health.tlimit_margin_c is None:
        pytest.skip(f"no evidence: {info.name} reports no 'GPU T.Limit Temp' (the margin to slowdown)")
    evidence(request, "gpu_temperature_margin_celsius", health.tlimit_margin_c, gpu=str(gpu_index))
    evidence(request, "gpu_temperature_celsius", health.temperature_c, gpu=str(gpu_index))
    assert health.tlimit_margin_c >= expect.min_temp_margin_c, explain(
        f"at least {expect.min_temp_margin_c} C below the slowdown temperature (health_min_temp_margin_c)",
        f"{health.tlimit_margin_c:.0f} C margin at {health.temperature_c} C on {info.bus}",
        "check airflow, fans and inlet temperature; a GPU near its limit slows down under load",
    )
    report(request, f"{health.tlimit_margin_c:.0f} C below slowdown (GPU at {health.temperature_c:.0f} C)")


def test_power_limit_as_expected(gpu, expect, gpu_index, request):
    info, health = _health(gpu, gpu_index, expect)
    if health.power_limit_w is None:
        pytest.skip(f"no evidence: no power limit reported for {info.bus}")
    wanted = expect.power_limit_w or health.power_default_limit_w
    source = "health_power_limit_w" if expect.power_limit_w else "the GPU's default limit"
    assert wanted is not None and abs(health.power_limit_w - wanted) < 1.0, explain(
        f"power limit {wanted} W ({source})",
        f"{health.power_limit_w} W (requested "
        f"{health.power_requested_limit_w} W, max {health.power_max_limit_w} W) on {info.bus}",
        f"`nvidia-smi -i {gpu_index} -pl {wanted}` (a lowered cap slows every request), or set "
        "health_power_limit_w if the cap is intended",
    )
    report(request, f"{health.power_limit_w:.0f} W = {source}")


def test_bar1_covers_memory(gpu, expect, gpu_index, request):
    info, health = _health(gpu, gpu_index, expect)
    if health.bar1_total_mib is None or health.fb_total_mib is None:
        pytest.skip(f"no evidence: no BAR1/FB sizes for {info.bus}")
    covers = health.bar1_total_mib >= health.fb_total_mib
    if not expect.needs_resizable_bar and not covers:
        report(
            request,
            f"BAR1 {health.bar1_total_mib} MiB < {health.fb_total_mib} MiB memory "
            f"({info.name} does not need a full BAR1)",
        )
        return
    assert covers, explain(
        f"BAR1 >= the GPU's memory ({health.fb_total_mib} MiB): {expect.gpu_model} needs resizable BAR",
        f"BAR1 {health.bar1_total_mib} MiB on {info.bus}",
        "enable 'Above 4G decoding' and 'Resizable BAR' in the BIOS (and on Proxmox pass the GPU "
        "with the host's resized BAR); reboot",
    )
    report(request, f"BAR1 {health.bar1_total_mib} MiB >= {health.fb_total_mib} MiB memory")


def test_mig_mode_as_expected(gpu, expect, gpu_index, request):
    info, health = _health(gpu, gpu_index, expect)
    if health.mig_current is None:
        pytest.skip(f"no evidence: {info.name} has no MIG mode (N/A: not a MIG-capable GPU)")
    wanted = "Enabled" if expect.mig_enabled else "Disabled"
    assert health.mig_current == wanted and health.mig_pending in (None, wanted), explain(
        f"MIG {wanted} (health_mig_enabled)",
        f"current {health.mig_current}, pending {health.mig_pending} on {info.bus}",
        f"`nvidia-smi -i {gpu_index} -mig {1 if expect.mig_enabled else 0}` and reset the GPU; "
        "the engine needs whole GPUs",
    )
    report(request, f"MIG {health.mig_current}")


def test_memory_bandwidth(gpu, expect, gpu_index, request, membw_result):
    info = _gpu(gpu, gpu_index, expect)
    if "off" in membw_result:
        pytest.skip(membw_result["off"])
    if "failure" in membw_result:
        if gpu_index == 0:
            pytest.fail(membw_result["failure"])
        pytest.skip("the memory bandwidth probe could not run: see 'memory bandwidth [GPU0]'")
    found = {d["index"]: d for d in membw_result["devices"]}.get(gpu_index)
    assert found is not None, explain(
        f"torch to see GPU{gpu_index}",
        f"{len(membw_result['devices'])} devices",
        cuda_visibility_advice(membw_result.get("env", {})),
    )
    if expect.min_memory_bandwidth_gbps is None:
        pytest.skip(f"measured {found['gbps']:.0f} GB/s; no floor: {expect.memory_bandwidth_source}")
    assert found["gbps"] >= expect.min_memory_bandwidth_gbps, explain(
        f">= {expect.min_memory_bandwidth_gbps:.0f} GB/s device copy ({expect.memory_bandwidth_source})",
        f"{found['gbps']:.0f} GB/s on {info.bus}",
        "check the memory clock (`nvidia-smi -q -d CLOCK`: Memory vs Max Clocks), clock event "
        "reasons and ECC/row-remap state; a degraded memory needs an RMA",
    )
    report(request, f"{found['gbps']:.0f} GB/s (floor {expect.min_memory_bandwidth_gbps:.0f})")


@pytest.fixture(scope="module")
def membw_result(gpu, expect, request) -> dict:
    if request.config.getoption("--no-bandwidth-probes"):
        return {"off": "--no-bandwidth-probes: the probes that load every GPU are off (periodic checks)"}
    missing = gpu.engine_python_missing(expect.engine_python)
    if missing:
        return {"failure": explain("the engine environment's python", missing, "deploy the engine first")}
    # 1 GiB copies (2 GiB per GPU): small beside the engine's memory, which it holds while the
    # checks run after a deploy; large beside any cache (H200 L2: 50 MB).
    result = gpu.run_program(
        expect.engine_python,
        "membw.py",
        ["1024", "2", gpu.smi_path or "nvidia-smi"],
        env_file=expect.env_file,
        fallback_env=expect.nccl_env,
        timeout_s=300,
    )
    try:
        found = parse.parse_json_line(result.stdout, "IH-MEMBW ")
    except ValueError:
        return {
            "failure": explain(
                "the memory bandwidth probe to print its result",
                f"rc {result.rc}: {(result.stdout + result.stderr).strip()[-400:]}",
                "run checks/programs/membw.py by hand with the engine python",
            )
        }
    gpu.pcie_under_load = found.get("pcie_under_load") or ""
    return found


def test_dcgm_diagnostics(gpu, expect, request):
    if not gpu.dcgmi_path:
        if expect.dcgm:
            pytest.fail(
                explain(
                    "dcgmi (nvidia_driver_dcgm = true)",
                    "no dcgmi on the PATH",
                    "re-run the deploy: roles/nvidia_driver installs datacenter-gpu-manager",
                )
            )
        pytest.skip("DCGM is not installed (nvidia_driver_dcgm = false): no dcgmi diag")
    # -j: DCGM's JSON (whole names and messages, DCGM's error ids), not the text table that
    # cuts names at 25 characters and messages at 45.
    result = bounded.run(gpu.host, "dcgmi diag -r 1 -j", what="dcgmi", bound_s=DCGM_DIAG_BOUND_S[1])
    try:
        tests = parse.parse_dcgmi_diag_json(result.stdout)
    except parse.DcgmRuntimeError as error:
        pytest.fail(
            explain(
                "`dcgmi diag -r 1 -j` to run",
                f"DCGM: {error}",
                "follow DCGM's message; are the GPUs idle and the host engine up?",
            )
        )
    except ValueError:
        tests = []
    assert tests, explain(
        "`dcgmi diag -r 1 -j` to print its results",
        f"rc {result.rc}: {(result.stdout + result.stderr).strip()[-400:]}",
        "start the host engine (`systemctl start nvidia-dcgm`) and run it by hand",
    )
    failed = [t for t in tests if t.result in ("Fail", "Warn")]
    assert not failed, explain(
        "every DCGM level-1 test Pass or Skip",
        "; ".join(f"{t.name} {t.result}" + (f" ({' | '.join(t.details)[:300]})" if t.details else "") for t in failed),
        "follow DCGM's message; `python -m checks --dcgm-level 2` runs the memory and PCIe tests",
    )
    version = parse.dcgm_version(result.stdout)
    report(
        request,
        f"dcgmi diag -r 1{f' (DCGM {version})' if version else ''}: {len(tests)} tests, "
        + ", ".join(f"{t.name} {t.result}" for t in tests),
    )


def test_driver_answers_promptly(gpu, request):
    """Last of the suite: every nvidia-smi call it made, timed. A driver that answers each call
    slowly passes every other check (25 s a call: the suite took 207 s and said nothing)."""
    if not gpu.smi_calls:
        pytest.skip("no nvidia-smi call ran (see the check 'nvidia-smi present')")
    slow = [(args, seconds) for args, seconds in gpu.smi_calls if seconds > SLOW_DRIVER_CALL_S]
    slowest = max(seconds for _, seconds in gpu.smi_calls)
    evidence(request, "nvidia_smi_slowest_call_seconds", round(slowest, 2))
    if not slow:
        report(request, f"slowest of {len(gpu.smi_calls)} nvidia-smi calls: {slowest:.1f} s")
        return
    args, seconds = max(slow, key=lambda call: call[1])
    warn(
        request,
        f"expected each nvidia-smi call within {SLOW_DRIVER_CALL_S:g} s; found {len(slow)} of "
        f"{len(gpu.smi_calls)} slower, the slowest `nvidia-smi {args}` {seconds:.1f} s; what to do: the "
        "driver is slow to answer: enable persistence mode (`nvidia-smi -pm 1`, nvidia-persistenced), "
        "read the kernel log for Xid 119/120 (GSP timeouts), and watch it: past 30 s a call is a hang",
    )
