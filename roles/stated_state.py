"""The state the preview's hosts answer from (roles/recording.py): what each kind of host is
before the deploy, stated here once so that the preview says what it assumed.

- A node (`proxmox_hosts`): Proxmox VE 8 (Debian 12, kernel 6.8.12-pve), freshly installed, with
  its GPUs at proxmox_gpu_addresses (vendor 0x10de, IOMMU groups in that order), an AMD CPU,
  booted by GRUB, with the NVIDIA module of stack.yml's pin loaded (as after the deploy's first
  reboot), its /dev/nvidiaN minors in proxmox_gpu_addresses order. Each of its guests exists and
  runs, with an empty configuration (an LXC guest's `unprivileged` as the inventory says): the deploy shows
  every setting it would give the guest (`pct set`, `qm set`), and goes on inside the guests.
- Any other host: Ubuntu 24.04, freshly installed, nothing of ours on it; a builder (`builders`)
  with Docker CE 27.5.1 and its buildx plugin running (roles/docker_engine's or the user's), 64
  cores and 512 GiB of memory, no cgroup limit.
- The health checks after the deploy (roles/health's run_checks) pass, without running: they
  would judge the real host from this machine over SSH. Recorded as a call on this machine.
- The vault: every secret reads `***` (a login:password secret `***:***`); no vault is opened.

What a role reads that is not stated here answers as a fresh host does: empty output, success.
Each answer is in the format of the fact's real command, as pyinfra's @fake connector takes it
(pyinfra/connectors/fake.py, 3.10: first matching substring wins).
"""

from __future__ import annotations

from roles.site import HostSettings, Site

MASK = "***"

OS_RELEASE = {
    "Ubuntu 24.04": [
        "/etc/lsb-release",
        "DISTRIB_ID=Ubuntu",
        "DISTRIB_RELEASE=24.04",
        "DISTRIB_CODENAME=noble",
        "---",
        "/etc/os-release",
        'PRETTY_NAME="Ubuntu 24.04.3 LTS"',
        'NAME="Ubuntu"',
        'VERSION_ID="24.04"',
        'VERSION="24.04.3 LTS (Noble Numbat)"',
        "VERSION_CODENAME=noble",
        "ID=ubuntu",
        "ID_LIKE=debian",
        "UBUNTU_CODENAME=noble",
        "---",
    ],
    "Debian 12": [
        "/etc/os-release",
        'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"',
        'NAME="Debian GNU/Linux"',
        'VERSION_ID="12"',
        'VERSION="12 (bookworm)"',
        "VERSION_CODENAME=bookworm",
        "ID=debian",
        "---",
    ],
}
KERNEL = {"Ubuntu 24.04": "6.8.0-85-generic", "Debian 12": "6.8.12-15-pve"}
# Tools a fresh install has (pyinfra looks them up with `command -v`).
TOOLS = ("useradd", "usermod", "groupadd", "curl", "wget", "dpkg", "apt-get", "systemctl")


def answers(settings: HostSettings, site: Site) -> dict:
    """The @fake answers of one host of the site."""
    node = settings.in_group("proxmox_hosts")
    system = "Debian 12" if node else "Ubuntu 24.04"
    specific = _node(settings, site) if node else {}
    return {
        **specific,
        **(_builder() if settings.in_group("builders") else {}),
        # roles/weights' WeightsManifestState: its tool is not installed yet
        """echo '{"state": "no-tool"}'""": '{"state": "no-tool"}',
        "-release | grep -v /": OS_RELEASE[system],
        "systemctl list-unit-files": ["ssh.service enabled enabled", "list-rc 0"],  # none of ours
        "systemctl is-system-running": "running",
        "uname -s": "Linux",
        "uname -r": KERNEL[system],
        **{f"command -v {tool} ": f"/usr/bin/{tool}" for tool in TOOLS},
    }


def _builder() -> dict:
    return {
        # roles/wheels' DockerBuildClient and BuilderResources
        "buildx version": ["client /usr/bin/docker 27.5.1", "server 27.5.1", "buildx yes"],
        'echo "cores $(nproc)"': ["cores 64", f"MemTotal: {512 << 20} kB", f"MemAvailable: {500 << 20} kB"],
    }


def _node(settings: HostSettings, site: Site) -> dict:
    gpus = settings.proxmox.gpu_addresses
    pci = ", ".join(
        f'{{"id": "{address}", "vendor": "0x10de", "iommugroup": {20 + index}}}' for index, address in enumerate(gpus)
    )
    devices = [f"node character special file|c3:{minor:x}|/dev/nvidia{minor}" for minor in range(len(gpus))]
    devices += [
        "node character special file|c3:ff|/dev/nvidiactl",
        "node character special file|1ff:0|/dev/nvidia-uvm",
        "node character special file|1ff:1|/dev/nvidia-uvm-tools",
    ]
    for minor, address in enumerate(gpus):
        devices += [f"== /proc/driver/nvidia/gpus/{address}", f"Bus Location: \t {address}"]
        devices.append(f"Device Minor: \t {minor}")
    guests: dict = {}
    for guest in site.hosts.values():
        if guest.valid("guest") and guest.guest.node == settings.name:
            lxc = guest.in_group("lxc_guests")
            # What Proxmox cannot change on an existing container is as the inventory says.
            config = [f"unprivileged: {int(guest.guest.unprivileged)}"] if lxc else [""]
            guests[f"{'pct' if lxc else 'qm'} status {guest.guest.vmid}"] = ["status: running", "---", *config]
    return {
        **guests,
        "/hardware/pci": f"[{pci}]",
        "vendor_id": "vendor_id\t: AuthenticAMD",
        "for n in /dev/nvidia*": devices,
        f"{settings.proxmox.nvidia_proc_dir.rstrip('/')}/version": [
            f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {site.stack.driver_version}  Release Build"
            "  (dvs-builder@U22-I3-AF03-09-1)  Tue Sep 23 17:35:14 UTC 2025",
            "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)",
        ],
    }


def description(settings: HostSettings) -> str:
    """The state this host was previewed from, for DIR/<host>/inference-host-preview.txt."""
    kind = (
        "a Proxmox VE 8 node (Debian 12), freshly installed, with the NVIDIA module of stack.yml's pin"
        " loaded and its guests created and running, their configurations empty"
        if settings.in_group("proxmox_hosts")
        else "an Ubuntu 24.04 host, freshly installed, nothing of the deploy's on it"
    )
    builder = (
        "\n- Docker CE 27.5.1 with buildx running, 64 cores, 512 GiB of memory" if settings.in_group("builders") else ""
    )
    return (
        f"The deploy as it would run on {settings.name}, were it {kind}{builder}"
        "\n- its health checks pass (not run); every secret reads *** (roles/stated_state.py)\n"
    )


def secrets(site: Site) -> dict[str, str]:
    """Every secret of the vault, as the preview reads it."""
    logins = {
        ref
        for host in site.hosts.values()
        for ref in (host.cuda.repo_credentials_secret, host.base.pypi_index_credentials_secret)
        if ref
    }
    return {name: f"{MASK}:{MASK}" if name in logins else MASK for name in site.secret_names}


def checks_passed(inventory: str, host_name: str, suites: list[str]) -> None:
    """roles/health's run_checks, as the stated state answers it: passed (None)."""
    from roles.recording import record_call

    record_call(host_name, f"python -m checks --host {host_name} --suites {','.join(suites)} (stated: passed)")
    return None


# What runs on this machine and would reach a host: module, name -> its stated stand-in.
LOCAL: dict[tuple[str, str], object] = {("roles.health", "run_checks"): checks_passed}
