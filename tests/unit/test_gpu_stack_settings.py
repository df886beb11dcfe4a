"""GPU stack settings: defaults, the driver mode from the groups, and refusals of bad values."""

from __future__ import annotations

import pytest

from roles.site import load_site
from tests.unit.conftest import PROJECT_ROOT, gpu_node
from tests.unit.test_site import assert_names, only_problem


def test_prod_driver_modes_follow_the_groups():
    site = load_site(PROJECT_ROOT / "inventory" / "prod.py")
    assert site.hosts["gpu-lxc.example.internal"].driver_mode == "userspace"
    assert site.hosts["gpu-vm.example.internal"].driver_mode == "full"


def test_defaults_point_at_the_public_repositories(inventory):
    host = next(iter(load_site(inventory.groups(gpu_nodes=[gpu_node()])).hosts.values()))
    assert host.cuda.repo_url == "https://developer.download.nvidia.com/compute/cuda/repos"
    assert host.docker.source == "docker"
    assert host.docker.repo_url == "https://download.docker.com/linux"
    # The vendors' signing keys: NVIDIA's CUDA key of 2022, Docker's release key, NVIDIA's
    # libnvidia-container key.
    assert host.cuda.repo_key_fingerprint == "EB693B3035CD5710E231E123A4B469963BF863CC"
    assert host.docker.repo_key_fingerprint == "9DC858229FC7DD38854AE2D88D81803C0EBFCD88"
    assert host.docker.nvidia_toolkit_key_fingerprint == "C95B321B61E88C1809C4F759DDCAE044F796ECB0"
    assert host.nvidia_driver.allow_reboot is False


@pytest.mark.parametrize(
    "data, parts",
    [
        ({"cuda_repo_url": "ftp://mirror/cuda"}, ["cuda_repo_url", "'ftp://mirror/cuda'", "http(s) URL"]),
        ({"docker_source": "snap"}, ["docker_source", "'snap'", "'docker', 'distro'"]),
        ({"docker_log_max_size": "lots"}, ["docker_log_max_size", "'lots'", "64m, 1g"]),
        ({"docker_daemon_extra": {"runtimes": {}}}, ["docker_daemon_extra", "daemon.json keys other than", "runtimes"]),
        ({"docker_users": ["Root"]}, ["docker_users", "lower-case Unix user names"]),
        ({"nvidia_driver_allow_reboot": "yes"}, ["nvidia_driver_allow_reboot", "'yes'", "True or False"]),
        (
            {"cuda_keyring_version": "1.1-1"},
            ["cuda_keyring_version", "no longer a setting", "cuda_repo_key_fingerprint"],
        ),
        ({"cuda_repo_key_fingerprint": "3bf863cc"}, ["cuda_repo_key_fingerprint", "'3bf863cc'", "40 upper-case hex"]),
        (
            {"cuda_repo_key_fingerprint": "EB69 3B30 35CD 5710 E231  E123 A4B4 6996 3BF8 63CC"},
            ["cuda_repo_key_fingerprint", "no spaces"],
        ),
        ({"docker_repo_key_fingerprint": "9dc858229fc7dd38854ae2d88d81803c0ebfcd88"}, ["docker_repo_key_fingerprint"]),
        ({"docker_nvidia_toolkit_key_fingerprint": ""}, ["docker_nvidia_toolkit_key_fingerprint", "40 upper-case"]),
    ],
)
def test_bad_gpu_stack_settings_are_refused(inventory, data, parts):
    message = only_problem(inventory.groups(gpu_nodes=[gpu_node(**data)]))
    assert_names(message, "site.py", *parts)
