"""Plan tests: the exact commands and files roles/nvidia_driver, roles/cuda and
roles/docker_engine issue against NVIDIA's and Docker's real repositories, for Ubuntu 24.04
(production) and Debian 12, without any host.

The real pyinfra CLI runs deploy.py against @fake hosts (tests/unit/plans/record.py): facts
answer as a fresh host would, and every operation command and uploaded file is recorded.
"""

from __future__ import annotations

import json
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from roles.shared.apt_resolve import install_command
from roles.site import load_stack
from roles.site.stack import DCGM_FOR_EXPORTER

PROJECT_ROOT = Path(__file__).resolve().parents[2]
PLANS = Path(__file__).parent / "plans"
STACK = load_stack(PROJECT_ROOT / "inventory" / "stack.yml")
APT_INSTALL = (
    'DEBIAN_FRONTEND=noninteractive apt-get -y -o Dpkg::Options::="--force-confdef"'
    ' -o Dpkg::Options::="--force-confold" install --no-install-recommends'
)


class Plan:
    def __init__(self, records: list[dict], stderr: str):
        self.commands = [r["command"] for r in records if "command" in r]
        self.uploads = {r["upload"]: r["content"] for r in records if "upload" in r}
        # (command, the variables pyinfra exports in front of it) of each command run with _env
        self.environments = [(r["command"], r["env"]) for r in records if "env" in r]
        self.stderr = stderr

    def index(self, command: str) -> int:
        assert command in self.commands, f"not in the plan: {command}\nplan:\n" + "\n".join(self.commands)
        return self.commands.index(command)


@cache
def plan(inventory: str, host: str) -> Plan:
    completed = subprocess.run(
        # Only the host under test runs its roles; another host (a node) still answers facts.
        [sys.executable, str(PLANS / "record.py"), "--limit", host, str(PLANS / inventory), "deploy.py"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    records = [json.loads(line) for line in completed.stdout.splitlines() if line.strip()]
    return Plan([r for r in records if r["host"] == host], completed.stderr)


UBUNTU = ("inventory_ubuntu2404.py", "@fake/gpu-ubuntu2404")
DEBIAN = ("inventory_debian12.py", "@fake/gpu-debian12")
LXC = ("inventory_lxc_ubuntu2404.py", "@fake/lxc-ubuntu2404")
REBOOT = ("inventory_reboot_ubuntu2404.py", "@fake/gpu-reboot")
NVIDIA = "https://developer.download.nvidia.com/compute/cuda/repos"


def _key_install(p, url: str) -> int:
    """Index of the command that fetches url's key and installs it only if it is the pinned one."""
    (index,) = [i for i, c in enumerate(p.commands) if f"apt-helper download-file {url} " in c]
    assert 'if [ "$got" != ' in p.commands[index]
    return index


@pytest.mark.parametrize("where", [UBUNTU, DEBIAN])
def test_gpg_is_installed_once_before_the_first_key_is_read(where):
    p = plan(*where)
    gpg = [i for i, c in enumerate(p.commands) if c.startswith(APT_INSTALL) and c.endswith(" gpg")]
    keys = [i for i, c in enumerate(p.commands) if "apt-helper download-file" in c and 'if [ "$got" != ' in c]
    assert len(gpg) == 1 and len(keys) == 3 and gpg[0] < keys[0], (gpg, keys)  # CUDA, Docker, the toolkit


@pytest.mark.parametrize("where, path", [(UBUNTU, "ubuntu2404"), (DEBIAN, "debian12")])
def test_cuda_repository_key_then_sources_then_update(where, path):
    p = plan(*where)
    key = _key_install(p, f"{NVIDIA}/{path}/x86_64/3bf863cc.pub")
    assert "EB693B3035CD5710E231E123A4B469963BF863CC" in p.commands[key]
    assert not any("dpkg" in c and "cuda-keyring" in c for c in p.commands), "no downloaded .deb is installed"
    sources = f"/etc/apt/sources.list.d/cuda-{path}-x86_64.list"
    assert p.uploads[sources] == f"deb [signed-by=/etc/apt/keyrings/nvidia-cuda.asc] {NVIDIA}/{path}/x86_64/ /\n"
    update = p.commands.index("apt-get update", key)
    driver = next(i for i, c in enumerate(p.commands) if "nvidia-dkms" in c or "nvidia-kernel-open-dkms" in c)
    assert update < driver, "apt must read the new repository before installing from it"


@pytest.mark.parametrize(
    "where, headers", [(UBUNTU, "linux-headers-6.8.0-85-generic"), (DEBIAN, "linux-headers-6.1.0-37-amd64")]
)
def test_full_mode_installs_the_running_kernels_headers_before_the_dkms_package(where, headers):
    # Without them DKMS skips the build with only a notice; the driver goes in without recommends.
    p = plan(*where)
    install = p.index(f"{APT_INSTALL} {headers}")
    driver = next(i for i, c in enumerate(p.commands) if "nvidia-dkms" in c or "nvidia-kernel-open-dkms" in c)
    assert install < driver
    dkms = next(i for i, c in enumerate(p.commands) if c.startswith("dkms status -m nvidia -v "))
    assert driver < dkms


def test_ubuntu_full_driver_packages_pinned_exactly_and_held():
    p = plan(*UBUNTU)
    v = STACK.driver_version
    branch = STACK.driver_branch
    names = [
        f"libnvidia-compute-{branch}",
        f"nvidia-utils-{branch}",
        f"nvidia-compute-utils-{branch}",
        f"nvidia-dkms-{branch}-open",
        "nvidia-modprobe",
    ]
    install = p.index(
        f"{APT_INSTALL} --allow-downgrades --allow-change-held-packages " + " ".join(f"{n}={v}-0ubuntu1" for n in names)
    )
    assert p.index("apt-mark hold " + " ".join(names)) > install
    pin = p.uploads["/etc/apt/preferences.d/90-inference-host-nvidia-driver"]
    assert f"Pin: version {v}-*\nPin-Priority: 1001" in pin
    assert "Package: /nvidia/ libcuda1" in pin


def test_debian_full_driver_packages_pinned_exactly_and_held():
    p = plan(*DEBIAN)
    v = STACK.driver_version
    names = ["nvidia-driver-cuda", "nvidia-persistenced", "nvidia-kernel-open-dkms", "nvidia-modprobe"]
    p.index(f"{APT_INSTALL} --allow-downgrades --allow-change-held-packages " + " ".join(f"{n}={v}-1" for n in names))
    p.index("apt-mark hold " + " ".join(names))


@pytest.mark.parametrize("where", [UBUNTU, DEBIAN])
def test_full_mode_blacklists_nouveau_and_enables_persistenced(where):
    p = plan(*where)
    blacklist = p.uploads["/etc/modprobe.d/blacklist-nouveau.conf"]
    assert "blacklist nouveau\noptions nouveau modeset=0" in blacklist
    assert p.index("update-initramfs -u") > p.commands.index("chmod 644 /etc/modprobe.d/blacklist-nouveau.conf")
    p.index("systemctl enable nvidia-persistenced.service")
    # A fresh host has no module loaded: reported, not rebooted (the default).
    assert "reboot required" in p.stderr
    assert not any(c.startswith("reboot") or "shutdown -r" in c for c in p.commands)


def test_lxc_guest_gets_userspace_only_at_the_nodes_module_version():
    p = plan(*LXC)
    node_version = "580.105.08"  # what the fake node's /proc/driver/nvidia/version says
    assert node_version != STACK.driver_version
    names = ["libnvidia-compute-580", "nvidia-utils-580", "nvidia-compute-utils-580"]
    p.index(
        f"{APT_INSTALL} --allow-downgrades --allow-change-held-packages "
        + " ".join(f"{n}={node_version}-0ubuntu1" for n in names)
    )
    assert not any("dkms" in c for c in p.commands), "an LXC guest must not get kernel modules"
    assert "update-initramfs -u" not in p.commands
    assert "/etc/modprobe.d/blacklist-nouveau.conf" not in p.uploads
    assert f"Pin: version {node_version}-*" in p.uploads["/etc/apt/preferences.d/90-inference-host-nvidia-driver"]
    assert f"node @fake/pve runs NVIDIA kernel module {node_version}" in p.stderr


@pytest.mark.parametrize("where", [UBUNTU, DEBIAN])
def test_every_stacks_toolkit_side_by_side_never_a_meta_package(where):
    p = plan(*where)
    for cuda in sorted({s.cuda for s in STACK.stacks.values()}):
        p.index(f"{APT_INSTALL} cuda-toolkit-{cuda.replace('.', '-')}")
    installs = [c for c in p.commands if " install " in c]
    for meta in (" cuda ", " cuda-12-8", " cuda-13-0", "cuda-drivers"):
        assert not any(meta + " " in c + " " for c in installs), f"meta-package{meta} installed"


@pytest.mark.parametrize("where", [UBUNTU, DEBIAN])
def test_active_stacks_cuda_is_selected_and_exported(where):
    p = plan(*where)
    active = STACK.active.cuda
    p.index(f"update-alternatives --set cuda /usr/local/cuda-{active}")
    profile = p.uploads["/etc/profile.d/90-inference-host-cuda.sh"]
    assert f"export CUDA_HOME=/usr/local/cuda-{active}\n" in profile
    assert f'export PATH=/usr/local/cuda-{active}/bin:"$PATH"' in profile
    assert f"/usr/local/cuda-{active}/lib64" in profile


@pytest.mark.parametrize("where, distro, suite", [(UBUNTU, "ubuntu", "noble"), (DEBIAN, "debian", "bookworm")])
def test_docker_from_dockers_repository(where, distro, suite):
    p = plan(*where)
    key = _key_install(p, f"https://download.docker.com/linux/{distro}/gpg")
    assert "9DC858229FC7DD38854AE2D88D81803C0EBFCD88" in p.commands[key]
    assert p.uploads["/etc/apt/sources.list.d/docker.list"] == (
        "deb [arch=amd64 signed-by=/etc/apt/keyrings/docker.asc]"
        f" https://download.docker.com/linux/{distro} {suite} stable\n"
    )
    install = p.index(f"{APT_INSTALL} docker-ce docker-ce-cli containerd.io docker-buildx-plugin")
    assert key < install


@pytest.mark.parametrize("where", [UBUNTU, DEBIAN])
def test_nvidia_container_toolkit_and_runtime(where):
    p = plan(*where)
    key = _key_install(p, "https://nvidia.github.io/libnvidia-container/gpgkey")
    assert "C95B321B61E88C1809C4F759DDCAE044F796ECB0" in p.commands[key]
    assert p.uploads["/etc/apt/sources.list.d/nvidia-container-toolkit.list"] == (
        "deb [signed-by=/usr/share/keyrings/nvidia-container-toolkit-keyring.asc]"
        " https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH) /\n"
    )
    toolkit = p.index(f"{APT_INSTALL} nvidia-container-toolkit")
    assert p.index("nvidia-ctk runtime configure --runtime=docker") > toolkit


@pytest.mark.parametrize("where", [UBUNTU, DEBIAN])
def test_daemon_json_from_settings_before_the_engine_starts(where):
    p = plan(*where)
    config = json.loads(p.uploads["/etc/docker/daemon.json"])
    assert config == {
        "data-root": "/var/lib/docker",
        "default-shm-size": "1g",
        "log-driver": "json-file",
        "log-opts": {"max-file": "3", "max-size": "100m"},
    }
    assert p.index("chmod 644 /etc/docker/daemon.json") < p.index(
        f"{APT_INSTALL} docker-ce docker-ce-cli containerd.io docker-buildx-plugin"
    )
    p.index("systemctl enable docker.service")


def test_no_docker_engine_on_a_gpu_node_that_is_no_builder():
    p = plan(*LXC)
    assert not any("docker" in c for c in p.commands)


def test_old_module_with_reboots_allowed_reboots_after_the_install_and_continues():
    p = plan(*REBOOT)
    reboot = p.index("( sleep 1 && reboot ) </dev/null >/dev/null 2>&1 &")
    install = next(i for i, c in enumerate(p.commands) if "nvidia-dkms-580-open=" in c)
    assert install < reboot < p.index(f"{APT_INSTALL} cuda-toolkit-12-8"), "the deploy goes on after the reboot"
    # The old module is loaded until then: persistenced is enabled, not started against it.
    p.index("systemctl enable nvidia-persistenced.service")
    assert "systemctl start nvidia-persistenced.service" not in p.commands
    assert "reboot required" not in p.stderr  # it reboots instead of reporting


def test_old_module_is_reported_in_plain_words_by_default():
    p = plan(*UBUNTU)
    assert (
        "reboot required: NVIDIA driver 580.95.05 is installed but no NVIDIA kernel module is loaded"
        in p.stderr.replace("\n", " ")
    )


def test_dcgm_from_the_cuda_repository_when_asked_for():
    """nvidia_driver_dcgm: DCGM 4's core and the stack's CUDA-major diagnostics, host engine on."""
    p = plan(*REBOOT)
    major = STACK.active.cuda_major
    # at the DCGM the pinned exporter is built against, epoch read from the host's index when it runs
    packages = ["datacenter-gpu-manager-4-core", f"datacenter-gpu-manager-4-cuda{major}"]
    install = p.index(
        install_command({package: DCGM_FOR_EXPORTER[STACK.monitoring.dcgm_exporter] for package in packages})
    )
    assert DCGM_FOR_EXPORTER[STACK.monitoring.dcgm_exporter] == "4.5.3"
    assert install < p.index("systemctl enable nvidia-dcgm.service")
    assert not [c for c in plan(*UBUNTU).commands if "datacenter-gpu-manager" in c]
