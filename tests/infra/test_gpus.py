"""GPU suite: driver, devices, memory health and CUDA, one test per resource.

Needs no systemd: evidence comes from nvidia-smi, /proc/driver/nvidia and the kernel log
(dmesg, else journalctl). A missing source makes the dependent check SKIP with the reason.
"""

from __future__ import annotations

import pytest

from tests.infra import gpu_parsers as parse
from tests.infra.probes import explain, report

pytestmark = pytest.mark.gpu

DRIVER_DOCS = "re-run the deploy (roles/nvidia_driver installs the pinned driver from inventory/stack.yml)"


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
        "nvidia-smi on the PATH", "no nvidia-smi",
        "install the NVIDIA userspace driver (" + DRIVER_DOCS + ")")
    plain = gpu.smi_plain
    output = (plain.stdout + plain.stderr).strip()
    if parse.parse_nvml_mismatch(output) is not None:
        pytest.fail(explain("nvidia-smi to talk to the driver", output.splitlines()[0],
                            "reboot required: the userspace driver was upgraded but the old kernel "
                            "module is still loaded (see 'kernel module matches userspace')"))
    assert plain.rc == 0, explain("nvidia-smi to exit 0", f"rc {plain.rc}: {output[:300]}",
                                  "check the driver installation (" + DRIVER_DOCS + ")")
    report(request, gpu.smi_path)


def test_gpu_count(gpu, expect, request):
    found = gpu.gpus
    assert len(found) == expect.gpu_count, explain(
        f"{expect.gpu_count} GPUs ({expect.source})",
        f"{len(found)}: " + ", ".join(f"{g.index} {g.name} {g.bus}" for g in found),
        "check that every GPU is passed through to this guest (Proxmox devN / hostpci entries) and "
        "not excluded (/proc/driver/nvidia/gpus/*/information 'GPU Excluded'), or correct gpu_count")
    report(request, f"{len(found)} x {found[0].name}" if found else "0")


def test_driver_version_equals_pin(gpu, expect, request):
    versions = {g.driver_version for g in gpu.gpus}
    assert versions == {expect.driver_version}, explain(
        f"driver {expect.driver_version} (inventory/stack.yml nvidia_driver.version)",
        ", ".join(sorted(v or "unknown" for v in versions)),
        DRIVER_DOCS + "; an LXC guest's userspace must equal the Proxmox host's module")
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
            pytest.skip(f"no evidence for the kernel module version: {gpu.proc_version.missing}, "
                        "and the kernel log has no 'NVRM: loading NVIDIA UNIX ... Kernel Module' line")
    userspace = set()
    smi = parse.parse_smi_version(gpu.smi_version.text or "")
    if smi.get("DRIVER version"):
        userspace.add(smi["DRIVER version"])
    if gpu.userspace_libraries.text:
        userspace |= parse.parse_userspace_versions(gpu.userspace_libraries.text)
    plain = gpu.smi_plain
    if plain is not None and parse.parse_nvml_mismatch(plain.stdout + plain.stderr) is not None:
        pytest.fail(explain(f"userspace {module.version} like the loaded module", "NVML: Driver/library "
                            f"version mismatch (userspace {', '.join(sorted(userspace)) or 'unknown'})",
                            "reboot required to load the new kernel module"))
    if not userspace:
        pytest.skip("no evidence for the userspace driver version: nvidia-smi --version failed and "
                    f"{gpu.userspace_libraries.missing}")
    assert userspace == {module.version}, explain(
        f"userspace driver {module.version} (the loaded kernel module, from {source})",
        f"userspace {', '.join(sorted(userspace))}",
        "reboot required: the kernel still runs the old module; on an LXC guest install the host's "
        "exact version in the guest")
    report(request, f"module {module.version} ({source}) = userspace")


def test_open_kernel_module(gpu, request):
    """Blackwell GPUs work only with NVIDIA's open kernel modules."""
    module = parse.parse_proc_driver_version(gpu.proc_version.text or "")
    if module is not None:
        assert module.flavor == "open", explain(
            "the open kernel module ('NVIDIA UNIX Open Kernel Module')", "the proprietary module",
            "install the -open driver flavour; " + DRIVER_DOCS)
        report(request, "open (/proc/driver/nvidia/version)")
        return
    license_text = gpu.modinfo_license.require(
        f"the module flavour ({gpu.proc_version.missing}, and modinfo cannot tell either)")
    flavor = parse.parse_modinfo_license(license_text)
    assert flavor == "open", explain("license 'Dual MIT/GPL' (open module)", license_text,
                                     "install the -open driver flavour; " + DRIVER_DOCS)
    report(request, "open (modinfo)")


def test_no_xid_errors_since_boot(gpu, request):
    log = gpu.kernel_log.require("Xid errors")
    events = parse.parse_xid_events(log)
    assert not events, explain(
        "no 'NVRM: Xid' lines in the kernel log since boot", f"{len(events)}: "
        + " | ".join(f"Xid {e.code} on {e.bus}: {e.message[:80]}" for e in events[:5]),
        "look the codes up in NVIDIA's Xid catalog (79: fallen off the bus, 48/63/64/94/95: memory "
        "errors, 13/31/43: application faults); persistent hardware Xids need a reboot or an RMA")
    report(request, "kernel log has no Xid lines")


def test_no_compute_process_outside_service(gpu, host, expect, request):
    apps = parse.parse_compute_apps(gpu.compute_apps.require("GPU processes"))
    if not apps:
        report(request, "no process holds a GPU")
        return
    cgroup = None
    if host.run("command -v systemctl").rc == 0:
        shown = host.run(f"systemctl show -p ControlGroup {expect.unit_name}")
        cgroup = parse.parse_systemctl_show(shown.stdout).get("ControlGroup") or None
    outside = []
    for app in apps:
        own = host.run(f"cat /proc/{app.pid}/cgroup")
        if cgroup is None or own.rc != 0 or cgroup not in own.stdout:
            outside.append(app)
    assert not outside, explain(
        f"only {expect.unit_name}.service's processes on the GPUs",
        "; ".join(f"pid {a.pid} {a.process_name} {a.used_memory_mib} MiB" for a in outside)
        + ("" if cgroup else f" (no cgroup for {expect.unit_name}: systemd missing or unit not running)"),
        "stop the stray processes (orphans of an old server pin GPU memory): "
        "`nvidia-smi --query-compute-apps=pid,process_name --format=csv`, then kill them")
    report(request, f"{len(apps)} process(es), all in {expect.unit_name}.service")


# -- one test per GPU ----------------------------------------------------------------------------


def test_gpu_name(gpu, expect, gpu_index, request):
    info = _gpu(gpu, gpu_index, expect)
    assert info.name == expect.gpu_model, explain(
        f"{expect.gpu_model!r}", f"{info.name!r} at {info.bus}",
        "check the inventory's gpu_model, or that the right GPUs are passed through")
    report(request, f"{info.name} at {info.bus}")


def test_compute_capability(gpu, expect, gpu_index, request):
    info = _gpu(gpu, gpu_index, expect)
    assert info.compute_cap == expect.compute_capability, explain(
        f"compute capability {expect.compute_capability} (gpu_arch)", f"{info.compute_cap} ({info.name})",
        "set gpu_arch to the GPUs' architecture: kernels and wheels are built for it")
    report(request, info.compute_cap)


def test_memory(gpu, expect, gpu_index, request):
    info = _gpu(gpu, gpu_index, expect)
    found_gib = (info.memory_mib or 0) / 1024
    # Marketing GB vs reported MiB, and memory the driver reserves: allow 5% either way.
    assert abs(found_gib - expect.gpu_memory_gib) <= 0.05 * expect.gpu_memory_gib, explain(
        f"about {expect.gpu_memory_gib} GiB (gpu_memory_gib)", f"{found_gib:.1f} GiB",
        "correct gpu_memory_gib, or check for a wrong GPU model / MIG partitioning")
    report(request, f"{found_gib:.1f} GiB")


def test_persistence_mode(gpu, expect, gpu_index, request):
    info = _gpu(gpu, gpu_index, expect)
    assert info.persistence_mode, explain(
        "persistence mode enabled", f"{info.persistence_mode} on {info.bus}",
        "enable nvidia-persistenced (roles/nvidia_driver), or `nvidia-smi -pm 1` until the next deploy")
    report(request, "enabled")


def test_pcie_link_generation(gpu, expect, gpu_index, request):
    info = _gpu(gpu, gpu_index, expect)
    if info.pcie_gen_max is None or info.pcie_gen_current is None:
        pytest.skip(f"no evidence: nvidia-smi reports no PCIe link generation for {info.bus}")
    gpu_max = info.pcie_gen_gpu_max or info.pcie_gen_max
    assert info.pcie_gen_max >= gpu_max, explain(
        f"the slot to allow the GPU's Gen{gpu_max}", f"Gen{info.pcie_gen_max} at most ({info.bus})",
        "check the BIOS PCIe setting, risers and the slot: the link is capped below the GPU's maximum")
    if info.pcie_gen_current < info.pcie_gen_max and info.pstate not in (None, "P0", "P1", "P2"):
        pytest.skip(f"link at Gen{info.pcie_gen_current} of Gen{info.pcie_gen_max} while the GPU idles "
                    f"({info.pstate}): GPUs lower the link speed at idle; re-run under load to judge it")
    assert info.pcie_gen_current == info.pcie_gen_max, explain(
        f"Gen{info.pcie_gen_max} under load", f"Gen{info.pcie_gen_current} in {info.pstate} ({info.bus})",
        "reseat the GPU / check risers and BIOS PCIe speed; a degraded link halves all-reduce speed")
    report(request, f"Gen{info.pcie_gen_current} of Gen{info.pcie_gen_max}")


def test_pcie_link_width(gpu, expect, gpu_index, request):
    info = _gpu(gpu, gpu_index, expect)
    if info.pcie_width_max is None or info.pcie_width_current is None:
        pytest.skip(f"no evidence: nvidia-smi reports no PCIe link width for {info.bus}")
    assert info.pcie_width_current == info.pcie_width_max, explain(
        f"x{info.pcie_width_max}", f"x{info.pcie_width_current} ({info.bus})",
        "reseat the GPU or move it to a full-width slot; check risers")
    report(request, f"x{info.pcie_width_current} of x{info.pcie_width_max}")


def test_no_row_remap_failure(gpu, expect, gpu_index, request):
    info = _gpu(gpu, gpu_index, expect)
    rows = {normalize(r.bus_id): r for r in parse.parse_remapped_rows(gpu.remapped.require("row remapping"))}
    state = rows.get(info.bus)
    if state is None or (state.failure is None and state.uncorrectable is None):
        pytest.skip(f"no evidence: {info.name} reports no row-remapping state (pre-Ampere GPUs retire "
                    "pages instead; see 'no retired pages')")
    assert not state.failure and not state.pending, explain(
        "no row-remap failure and none pending", f"failure={state.failure} pending={state.pending} "
        f"uncorrectable={state.uncorrectable} on {info.bus}",
        "pending: reset the GPU or reboot to apply the remap; failure: the GPU needs an RMA")
    report(request, f"correctable {state.correctable}, uncorrectable {state.uncorrectable}, none pending")


def test_no_retired_pages(gpu, expect, gpu_index, request):
    info = _gpu(gpu, gpu_index, expect)
    pages = {p.index: p for p in parse.parse_retired_pages(gpu.retired.require("page retirement"))}
    state = pages.get(info.index)
    if state is None or not state.supported:
        pytest.skip(f"no evidence: {info.name} does not retire pages ([N/A]); it remaps rows instead, "
                    "see 'no row remap failure'")
    assert not state.pending and not state.double_bit, explain(
        "no double-bit retired pages and none pending", f"double-bit {state.double_bit}, pending "
        f"{state.pending} on {info.bus}", "reboot to retire pending pages; repeated double-bit errors: RMA")
    report(request, f"single-bit {state.single_bit}, double-bit {state.double_bit}")


def test_cuda_works(gpu, expect, gpu_index, request, cuda_result):
    info = _gpu(gpu, gpu_index, expect)
    if "failure" in cuda_result:  # the engine environment itself: said once, on the first GPU
        if gpu_index == 0:
            pytest.fail(cuda_result["failure"])
        pytest.skip("the CUDA check could not run: see 'cuda works [GPU0]'")
    devices = {d["index"]: d for d in cuda_result.get("devices", [])}
    device = devices.get(gpu_index)
    assert device is not None, explain(f"torch to see GPU{gpu_index}",
                                       f"{len(devices)} devices (torch {cuda_result.get('torch')})",
                                       "check CUDA_VISIBLE_DEVICES and the engine's torch build")
    assert device.get("ok"), explain(
        "a 512x512 matrix product on the GPU equal to the CPU's", device.get("error")
        or f"max error {device.get('max_error')}", "check the driver/CUDA pairing of the engine's torch; "
        "a wrong result on one GPU points at that GPU (see Xid errors)")
    report(request, f"torch {cuda_result['torch']} CUDA {cuda_result['cuda']}: {device['name']} ok "
                    f"({info.bus})")


@pytest.fixture(scope="module")
def cuda_result(gpu, expect) -> dict:
    missing = gpu.engine_python_missing(expect.engine_python)
    if missing:
        return {"failure": explain("the engine environment's python", missing, "deploy the engine first")}
    result = gpu.run_program(expect.engine_python, "cuda_check.py", timeout_s=300)
    try:
        found = parse.parse_json_line(result.stdout, "IH-CUDA ")
    except ValueError:
        return {"failure": explain(
            "the CUDA check to print its result", f"rc {result.rc}: "
            f"{(result.stdout + result.stderr).strip()[-400:]}",
            "run it by hand: tests/infra/programs/cuda_check.py with the engine python")}
    if "error" in found:
        return {"failure": explain(
            "torch with CUDA in the engine environment", found["error"],
            "reinstall the engine environment (roles/sglang); check the driver supports the torch "
            "build's CUDA version")}
    return found


def normalize(bus_id: str) -> str:
    return parse.normalize_bus_id(bus_id)
