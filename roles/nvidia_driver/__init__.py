"""roles/nvidia_driver: the NVIDIA driver with the open kernel modules, pinned and held.

Two modes, chosen by the site model (HostSettings.driver_mode):
- full (bare metal, Proxmox node, KVM guest): headers for the kernel DKMS builds for, kernel
  modules (DKMS, open flavor: Blackwell requires it) and userspace at stack.yml's
  nvidia_driver.version, nouveau blacklisted (on a Proxmox node by roles/proxmox_host, its one
  owner there), nvidia-uvm loaded at boot with its device nodes, nvidia-persistenced on.
- userspace (LXC guest): no kernel module, the guest uses its Proxmox node's. The userspace
  version is read from the node's /proc/driver/nvidia/version, because it must equal the loaded
  module EXACTLY; it is never typed a second time.

The packages come from NVIDIA's CUDA repository, installed at an exact version, pinned with an
apt preferences file (so that no upgrade, unattended or not, moves them) and held with apt-mark.

A kernel module that differs from the installed driver is reported as "reboot required" in
plain words; with nvidia_driver_allow_reboot the host is rebooted and the deploy waits for it.
On a Proxmox node the node's own reboot step (roles/proxmox_host) decides, once for all reasons.
"""

from __future__ import annotations

from io import StringIO

from pyinfra import host, logger, state
from pyinfra.api import deploy
from pyinfra.facts.server import KernelVersion
from pyinfra.operations import apt, files, server, systemd

from roles.nvidia_driver.facts import HeldPackages, NvidiaKernelModule
from roles.shared import layout, templates
from roles.shared.apt_resolve import install_resolved
from roles.shared.driver_state import KernelModule, driver_mismatch
from roles.shared.host_facts import ContainerVirtualization
from roles.shared.nvidia_repo import DCGM_CORE_PACKAGE, Distro, current_distro, ensure_cuda_repository
from roles.shared.refusal import Refused
from roles.shared.shell import sh
from roles.site import HostSettings, current_host, current_site
from roles.site.stack import DCGM_FOR_EXPORTER

PIN_FILE = "/etc/apt/preferences.d/90-inference-host-nvidia-driver"
NOUVEAU_BLACKLIST = layout.NOUVEAU_BLACKLIST
UVM_MODULES_FILE = "/etc/modules-load.d/nvidia-uvm.conf"
UVM_UNIT = "nvidia-uvm-devices.service"
UVM_MODULES_TEXT = "# Managed by inference-host (roles/nvidia_driver)\nnvidia-uvm\n"
# Proxmox VE 8's meta-package for the headers of its default kernel series (pulls
# proxmox-headers-6.8 -> proxmox-headers-6.8.12-N-pve, with /lib/modules/<release>/build).
PROXMOX_HEADERS = "proxmox-default-headers"

# Debian revision NVIDIA's CUDA repository gives driver packages of each distro.
PACKAGE_REVISION = {"ubuntu": "0ubuntu1", "debian": "1"}


def driver_packages(distro: Distro, branch: str, mode: str) -> list[str]:
    """Package names of NVIDIA's compute-only (headless) driver in its CUDA repository.

    Ubuntu carries the branch in the package names (until 590); Debian does not. The open
    kernel modules come as DKMS source packages (nvidia-dkms-<branch>-open,
    nvidia-kernel-open-dkms); the userspace mode leaves them out, and nvidia-modprobe (which
    loads nvidia-uvm and makes its device nodes at boot) with them.
    """
    if distro.id == "ubuntu":
        userspace = [f"libnvidia-compute-{branch}", f"nvidia-utils-{branch}", f"nvidia-compute-utils-{branch}"]
        kernel = [f"nvidia-dkms-{branch}-open", "nvidia-modprobe"]
    else:
        userspace = ["nvidia-driver-cuda", "nvidia-persistenced"]
        kernel = ["nvidia-kernel-open-dkms", "nvidia-modprobe"]
    return userspace + (kernel if mode == "full" else [])


def package_version(distro: Distro, version: str) -> str:
    return f"{version}-{PACKAGE_REVISION[distro.id]}"


@deploy("NVIDIA driver")
def nvidia_driver() -> None:
    settings = current_host()
    stack = current_site().stack
    distro = current_distro("roles/nvidia_driver")
    version = _target_version(settings, stack.driver_version)
    packages = driver_packages(distro, stack.driver_branch, settings.driver_mode)
    ensure_cuda_repository(settings, distro)
    if settings.driver_mode == "full" and _has_own_kernel(settings):
        _kernel_headers(settings)
    _pin_and_install(distro, version, packages)
    if settings.driver_mode == "full":
        if not settings.in_group("proxmox_hosts"):  # a node's blacklist is roles/proxmox_host's
            _blacklist_nouveau()
        module = host.get_fact(NvidiaKernelModule, proc_dir=_proc_dir(settings))
        loaded = _module_problem(module, version) is None
        if _has_own_kernel(settings):
            if not loaded:
                _require_dkms_build(version)
            _uvm_at_boot(start=loaded)
        _persistence_daemon(start=loaded)
    if settings.nvidia_driver.dcgm:
        # DCGM's version follows the exporter's pin: a stack file without `monitoring:` has none.
        if stack.monitoring is None:
            raise Refused(
                f"{host.name}: nvidia_driver_dcgm needs the monitoring pins of {stack.file}"
                " (its `monitoring:` mapping names dcgm_exporter, whose DCGM is installed)"
            )
        _dcgm(stack.active.cuda_major, stack.monitoring.dcgm_exporter)
    if settings.driver_mode == "full":
        _kernel_module_matches(settings, module, version)


def _proc_dir(settings: HostSettings) -> str:
    """/proc/driver/nvidia, or where a Proxmox node's settings say the driver lists itself."""
    if settings.in_group("proxmox_hosts"):
        return settings.proxmox.nvidia_proc_dir
    return "/proc/driver/nvidia"


def _has_own_kernel(settings: HostSettings) -> bool:
    """False inside a container (its kernel is the host's). A Proxmox node is never one in
    production; the lab's node container stands in for one, its kernel included."""
    return settings.in_group("proxmox_hosts") or host.get_fact(ContainerVirtualization) is None


def _kernel_headers(settings: HostSettings) -> None:
    """DKMS builds the module only for kernels whose headers are installed, and skips the others
    with a notice (dkms autoinstall); the driver packages go in without recommends, so nothing
    else brings them."""
    if settings.in_group("proxmox_hosts"):
        apt.packages(
            name=f"Install kernel headers for DKMS ({PROXMOX_HEADERS})",
            packages=[PROXMOX_HEADERS],
            no_recommends=True,
            update=True,
            cache_time=24 * 3600,
        )
        return
    release = host.get_fact(KernelVersion)
    apt.packages(
        name=f"Install kernel headers for DKMS (linux-headers-{release})",
        packages=[f"linux-headers-{release}"],
        no_recommends=True,
    )


def _require_dkms_build(version: str) -> None:
    """Before the reboot that should load it: DKMS must have built and installed the module
    (`dkms status` prints "nvidia/<version>, <kernel>, x86_64: installed"), else the reboot
    comes back without one."""
    server.shell(
        name=f"Check that DKMS built NVIDIA kernel module {version} (dkms status)",
        commands=[
            sh(
                "dkms status -m nvidia -v {version} | grep -q ': installed' || {{ echo {not_built}"
                '"$(dkms status -m nvidia 2>&1)"{headers} >&2; exit 1; }}',
                version=version,
                not_built=f"DKMS has not built nvidia {version} for any kernel (dkms status -m nvidia: ",
                headers="); are the kernel headers of the kernel that boots next installed?",
            )
        ],
    )


def _uvm_at_boot(start: bool) -> None:
    """nvidia-uvm loaded at boot and /dev/nvidia-uvm(-tools) made, without waiting for a CUDA
    program to do it: an LXC guest's devN entries point at them, and Proxmox refuses to start
    a container whose devN path is missing. nvidia-persistenced does neither. Some packagings
    add a udev rule running `nvidia-modprobe -c0 -u` when the driver binds; this unit does not
    count on one (running both is harmless: existing nodes are left as they are)."""
    files.put(
        name=f"Load nvidia-uvm at boot ({UVM_MODULES_FILE})",
        src=StringIO(UVM_MODULES_TEXT),
        dest=UVM_MODULES_FILE,
        mode="0644",
    )
    unit = files.template(
        name=f"Create the nvidia-uvm device nodes at boot ({UVM_UNIT}: nvidia-modprobe -u -c0)",
        src=f"roles/nvidia_driver/templates/{UVM_UNIT}.j2",
        dest=f"/etc/systemd/system/{UVM_UNIT}",
        mode="0644",
        jinja_env_kwargs=templates.jinja_env_kwargs(f"roles/nvidia_driver/templates/{UVM_UNIT}.j2"),
    )
    systemd.service(
        name=f"Enable {UVM_UNIT}" + ("" if start else " (runs once the reboot loads the module)"),
        service=UVM_UNIT,
        enabled=True,
        running=True if start else None,
        daemon_reload=unit.will_change,
    )


def dcgm_packages(cuda_major: int) -> list[str]:
    """NVIDIA DCGM 4 from the same CUDA repository (NVIDIA/DCGM cmake/packaging.cmake 4.6.0):
    -core holds dcgmi, nv-hostengine and nvidia-dcgm.service; -cuda<major> the diagnostics
    (`dcgmi diag`) built for the stack's CUDA major."""
    return [DCGM_CORE_PACKAGE, f"datacenter-gpu-manager-4-cuda{cuda_major}"]


def _dcgm(cuda_major: int, exporter: str) -> None:
    """DCGM at the version the pinned exporter is built against (one pairing, DCGM_FOR_EXPORTER)."""
    packages = dcgm_packages(cuda_major)
    install_resolved("NVIDIA DCGM", {package: DCGM_FOR_EXPORTER[exporter] for package in packages})
    # The host engine dcgmi talks to; the health suite runs `dcgmi diag -r 1` through it.
    systemd.service(
        name="Enable and start nvidia-dcgm (DCGM host engine)",
        service="nvidia-dcgm.service",
        enabled=True,
        running=True,
    )


def _target_version(settings: HostSettings, pinned: str) -> str:
    """Full mode: stack.yml's version. Userspace mode: the node's loaded kernel module."""
    if settings.driver_mode == "full":
        return pinned
    node_name = settings.guest.node
    assert node_name, "userspace mode is an LXC guest's, whose guest_node the site rules require"
    node = state.inventory.get_host(node_name)
    proc_dir = current_site().hosts[node_name].proxmox.nvidia_proc_dir
    module: KernelModule | None = node.get_fact(NvidiaKernelModule, proc_dir=proc_dir)
    if module is None:
        raise Refused(
            f"{host.name}: an LXC guest's NVIDIA userspace must equal its node's kernel module,"
            f" but node {node_name} has no NVIDIA module loaded (/proc/driver/nvidia/version is"
            " absent); converge the node's driver and reboot it first"
        )
    if module.version != pinned:
        logger.warning(
            f"{host.name}: node {node_name} runs NVIDIA kernel module {module.version}, stack.yml"
            f" pins {pinned}; installing {module.version} here to match the node. Re-deploy this"
            " guest after the node is moved to the pinned version."
        )
    return module.version


def _pin_and_install(distro: Distro, version: str, packages: list[str]) -> None:
    files.template(
        name=f"Pin NVIDIA driver packages to {version}",
        src="roles/nvidia_driver/templates/90-inference-host-nvidia-driver.j2",
        dest=PIN_FILE,
        version=version,
        mode="0644",
    )
    exact = package_version(distro, version)
    apt.packages(
        name=f"Install NVIDIA driver {version} ({', '.join(packages)})",
        packages=[f"{name}={exact}" for name in packages],
        no_recommends=True,
        allow_downgrades=True,  # an LXC guest follows its node, also downwards
        # The deploy is the one authority allowed to move held packages (stack.yml changed).
        extra_install_args="--allow-change-held-packages",
    )
    server.shell(
        name=f"Hold NVIDIA driver packages at {version}",
        commands=[sh("apt-mark hold {packages}", packages=packages)],
        _if=lambda: not set(packages) <= host.get_fact(HeldPackages),
    )


def _blacklist_nouveau() -> None:
    blacklist = files.template(
        name=f"Blacklist nouveau in {NOUVEAU_BLACKLIST}",
        src="roles/nvidia_driver/templates/blacklist-nouveau.conf.j2",
        dest=NOUVEAU_BLACKLIST,
        mode="0644",
    )
    # The initramfs must not load nouveau before the blacklist is seen. A container has no
    # initramfs of its own (and update-initramfs may be absent there).
    in_container = host.get_fact(ContainerVirtualization) is not None
    server.shell(
        name="Rebuild the initramfs without nouveau",
        commands=["update-initramfs -u"],
        _if=lambda: blacklist.did_change() and not in_container,
    )


def _persistence_daemon(start: bool) -> None:
    # Started only where the right module is loaded: without one (a fresh install before its
    # reboot, the lab's containers) or with an older one, nvidia-persistenced fails.
    systemd.service(
        name="Enable nvidia-persistenced" + ("" if start else " (starts once the reboot loads the module)"),
        service="nvidia-persistenced.service",
        enabled=True,
        running=True if start else None,
    )


def _kernel_module_matches(settings: HostSettings, module: KernelModule | None, version: str) -> None:
    if not _has_own_kernel(settings):
        container = host.get_fact(ContainerVirtualization)
        logger.warning(
            f"{host.name}: runs in a {container} container: kernel modules cannot be built or"
            " loaded here, so the NVIDIA kernel module is not checked (packages and configuration"
            " are installed; load the module on a real host or VM)"
        )
        return
    problem = _module_problem(module, version)
    if problem is None:
        return
    if settings.in_group("proxmox_hosts"):
        # The node's reboot step (roles/proxmox_host) reboots once, for every reason, when
        # /run/reboot-required is there (the Debian convention; /run is empty after a boot).
        server.shell(
            name=f"Mark the node: reboot required ({problem.removeprefix('reboot required: ')})",
            commands=["touch /run/reboot-required && echo nvidia-driver >> /run/reboot-required.pkgs"],
        )
        return
    if not settings.nvidia_driver.allow_reboot:
        logger.warning(f"{host.name}: {problem} (set nvidia_driver_allow_reboot = True to let the deploy reboot it)")
        return
    server.reboot(
        name=f"Reboot to load NVIDIA kernel module {version}",
        delay=10,
        reboot_timeout=settings.nvidia_driver.reboot_timeout,
    )


def _module_problem(module: KernelModule | None, version: str) -> str | None:
    if module is None:
        return f"reboot required: NVIDIA driver {version} is installed but no NVIDIA kernel module is loaded"
    if module.flavor != "open":
        return (
            f"reboot required: the loaded NVIDIA kernel module is the proprietary one; this GPU"
            f" generation needs the open kernel modules of {version}"
        )
    return driver_mismatch(module, version)
