"""roles/nvidia_driver, roles/cuda, roles/docker_engine in the lab, through real apt and dpkg.

The lab's GPU guest is an LXC guest of the stand-in Proxmox node (as in production), so its
driver is the userspace-only mode at the node's kernel module version; the full mode (kernel
module packages, nouveau, persistenced) is covered by the plan tests (tests/unit).

NVIDIA's servers are replaced by the local repository stand-in (lab/standins/nvidia_apt_repo)
that inventory/lab.py serves; it also holds newer driver versions than the pin (580.105.08,
590.48.01), so these tests prove that the pin, not "newest wins", decides. No GPU and no kernel
module exist here: what needs them is listed in docs/testing.md, "What is verified where".
"""

from __future__ import annotations

import json
import os

import pytest

import lab
from lab.standins.nvidia_apt_repo import repo as nvidia_apt_standin
from roles.nvidia_driver import driver_packages
from roles.shared.nvidia_repo import SUPPORTED
from roles.site import load_site
from tests.lab.harness import LAB_INVENTORY, run_deploy

pytestmark = pytest.mark.lab

SITE = load_site(LAB_INVENTORY)
HOST = next(iter(SITE.group("gpu_nodes")))
STACK = SITE.stack
PINNED = f"{STACK.driver_version}-1"  # Debian revision in NVIDIA's repository
DRIVER_PACKAGES = driver_packages(SUPPORTED[("Debian", 12, None)], STACK.driver_branch, HOST.driver_mode)
ROLES = ("NVIDIA driver |", "CUDA |", "Docker engine |")


def _ours(names):
    return [n for n in names if n.startswith(ROLES)]


def test_second_deploy_changes_nothing_in_the_gpu_stack(lab_second_deploy):
    assert lab_second_deploy.results is not None, lab_second_deploy.explain()
    assert _ours(lab_second_deploy.changed) == []


@pytest.mark.skipif(
    os.environ.get("INFERENCE_HOST_LAB_REUSE") == "1",
    reason="containers were reused: the first deploy had nothing to do",
)
def test_first_deploy_installed_the_stack(lab_first_deploy):
    changed = _ours(lab_first_deploy.changed)
    for expected in (
        "Install the CUDA repository's signing key",
        f"Install NVIDIA driver {STACK.driver_version}",
        "Install CUDA toolkit 12.8",
        "Install CUDA toolkit 13.0",
        "Add the nvidia runtime to daemon.json",
    ):
        assert any(expected in name for name in changed), f"{expected!r} did not run: {changed}"


def test_lxc_guest_gets_the_userspace_driver_only():
    assert HOST.driver_mode == "userspace"
    assert DRIVER_PACKAGES == ["nvidia-driver-cuda", "nvidia-persistenced"]


def test_guest_driver_equals_the_nodes_kernel_module(gpu_guest):
    # Read on the node as the role reads it: the module version the node reports.
    import testinfra

    import lab
    from roles.shared.driver_state import parse_proc_driver_version

    node = testinfra.get_host(f"docker://{lab.container_name('pve')}")
    module = parse_proc_driver_version(node.file(f"{lab.PVE_PROC_DIR}/version").content_string)
    assert module is not None and module.flavor == "open"
    assert gpu_guest.package("nvidia-driver-cuda").version == f"{module.version}-1"


# --- the repository: keyring package, the configured URL, real apt ---------------------------


CUDA_KEY = "/etc/apt/keyrings/nvidia-cuda.asc"
CUDA_SOURCES = "/etc/apt/sources.list.d/cuda-debian12-x86_64.list"


def _fingerprints(guest, path: str) -> list[str]:
    listed = guest.run(f"gpg --batch --with-colons --show-keys {path} | awk -F: '$1 == \"fpr\" {{ print $10 }}'")
    assert listed.rc == 0, listed.stderr
    return listed.stdout.split()


def test_the_repositorys_key_is_the_pinned_one_and_no_package_brought_it(gpu_guest):
    # The stand-in's key served as <repo>/<key id>.pub, installed because it is the pinned one
    # (its signing subkey's fingerprint follows the primary's), by the deploy: no package owns it
    # (a guest deployed by older code keeps its cuda-keyring package, unused).
    assert _fingerprints(gpu_guest, CUDA_KEY)[0] == nvidia_apt_standin.SIGNING_KEY_FINGERPRINT
    assert gpu_guest.file(CUDA_KEY).mode == 0o644
    assert gpu_guest.run(f"dpkg -S {CUDA_KEY}").rc != 0


def test_a_key_other_than_the_pinned_one_stops_the_deploy_in_one_line(gpu_guest, lab_second_deploy):
    """The guest deployed with another fingerprint pinned, one with the stand-in key's id (its last
    8 digits), so that the file fetched is the one the stand-in serves, as a server that swapped
    the key behind NVIDIA's file name would: refused before the sources entry, apt's lists or a
    package changed, and the key in place stays."""
    other = "0123456789ABCDEF0123456789ABCDEF" + nvidia_apt_standin.SIGNING_KEY_FINGERPRINT[-8:]
    key_before = gpu_guest.file(CUDA_KEY).sha256sum
    sources_before = gpu_guest.file(CUDA_SOURCES).content_string
    packages_before = gpu_guest.run("dpkg-query -W -f '${Package} ${Version}\\n'").stdout
    run = run_deploy(
        LAB_INVENTORY,
        "--limit",
        lab.pyinfra_name("gpu"),
        env={"INFERENCE_HOST_LAB_REPO_KEY_FINGERPRINT": other},
        timeout=600,
    )
    assert run.returncode != 0, run.explain()
    url = f"{HOST.cuda.repo_url}/debian12/x86_64/{other[-8:].lower()}.pub"
    said = (run.stdout + run.stderr).splitlines()
    refusal = [line for line in said if "not the one cuda_repo_key_fingerprint" in line]
    assert refusal, run.explain()
    assert f"{url}: the key served there is " in refusal[0], refusal[0]
    assert f"not the one cuda_repo_key_fingerprint pins ({other}); nothing was installed" in refusal[0]
    assert gpu_guest.file(CUDA_KEY).sha256sum == key_before
    assert gpu_guest.file(CUDA_SOURCES).content_string == sources_before
    assert gpu_guest.run("dpkg-query -W -f '${Package} ${Version}\\n'").stdout == packages_before


def test_only_the_configured_url_is_an_apt_source(gpu_guest):
    sources = gpu_guest.file("/etc/apt/sources.list.d/cuda-debian12-x86_64.list")
    assert sources.content_string.strip() == (
        f"deb [signed-by=/etc/apt/keyrings/nvidia-cuda.asc] {HOST.cuda.repo_url}/debian12/x86_64/ /"
    )
    public = gpu_guest.run("grep -rl developer.download.nvidia.com /etc/apt/sources.list /etc/apt/sources.list.d/")
    assert public.stdout.strip() == "", "the keyring's public entry must be replaced by the setting"


# --- the driver: exact version, pinned, held ---------------------------------------------------


@pytest.mark.parametrize("package", DRIVER_PACKAGES)
def test_driver_package_at_the_pinned_version_though_newer_exist(gpu_guest, package):
    assert gpu_guest.package(package).version == PINNED
    policy = gpu_guest.run(f"apt-cache policy {package}").stdout
    assert "590.48.01-1" in policy and "580.105.08-1" in policy, "the stand-in offers newer versions"
    assert f"Candidate: {PINNED}" in policy, policy


def test_driver_packages_are_held(gpu_guest):
    held = set(gpu_guest.run("apt-mark showhold").stdout.split())
    assert set(DRIVER_PACKAGES) <= held


def test_an_upgrade_does_not_move_the_driver(gpu_guest):
    # What unattended-upgrades would do, simulated: nothing NVIDIA may be touched.
    upgrade = gpu_guest.run("apt-get -s -o Debug::NoLocking=1 dist-upgrade")
    assert upgrade.rc == 0, upgrade.stderr
    moved = [line for line in upgrade.stdout.splitlines() if line.startswith("Inst") and "nvidia" in line]
    assert moved == []


def test_no_kernel_module_package_in_an_lxc_guest(gpu_guest):
    # The node's kernel module serves the container; a DKMS package here could not even build.
    for package in ("nvidia-kernel-open-dkms", "nvidia-kernel-dkms", "cuda-drivers"):
        assert not gpu_guest.package(package).is_installed, package


# --- CUDA: side by side, one selected ---------------------------------------------------------


@pytest.mark.parametrize("cuda", sorted({s.cuda for s in STACK.stacks.values()}))
def test_every_stacks_toolkit_installed(gpu_guest, cuda):
    assert gpu_guest.package(f"cuda-toolkit-{cuda.replace('.', '-')}").is_installed
    assert gpu_guest.file(f"/usr/local/cuda-{cuda}/bin/nvcc").is_file


def test_no_cuda_meta_package(gpu_guest):
    for meta in ("cuda", "cuda-12-8", "cuda-13-0"):
        assert not gpu_guest.package(meta).is_installed, f"{meta} drags in a driver"


def test_active_cuda_selected_over_the_higher_priority_one(gpu_guest):
    active = STACK.active.cuda
    assert gpu_guest.run("readlink -e /usr/local/cuda").stdout.strip() == f"/usr/local/cuda-{active}"
    query = gpu_guest.run("update-alternatives --query cuda").stdout
    assert "Status: manual" in query  # 13.0 registers with a higher priority


def test_login_shell_gets_cuda_home_path_and_library_path(gpu_guest):
    active = STACK.active.cuda
    shell = gpu_guest.run("bash -lc 'echo $CUDA_HOME; echo $LD_LIBRARY_PATH; nvcc --version'")
    assert shell.rc == 0, shell.stderr
    lines = shell.stdout.splitlines()
    assert lines[0] == f"/usr/local/cuda-{active}"
    assert f"/usr/local/cuda-{active}/lib64" in lines[1].split(":")
    assert f"release {active}," in shell.stdout


# --- Docker engine and the NVIDIA container toolkit -------------------------------------------


def test_docker_engine_runs_with_the_nvidia_runtime(gpu_guest):
    assert gpu_guest.service("docker").is_running
    info = gpu_guest.run("docker info --format '{{json .Runtimes}}|{{.DockerRootDir}}|{{.LoggingDriver}}'")
    assert info.rc == 0, info.stderr
    runtimes, root, logging = info.stdout.strip().split("|")
    assert json.loads(runtimes)["nvidia"]["path"] == "nvidia-container-runtime"
    assert root == HOST.docker.data_root
    assert logging == "json-file"


def test_daemon_json_holds_the_settings_and_the_runtime(gpu_guest):
    config = json.loads(gpu_guest.file("/etc/docker/daemon.json").content_string)
    docker = HOST.docker
    assert config["data-root"] == docker.data_root
    assert config["default-shm-size"] == docker.default_shm_size
    assert config["log-opts"] == {"max-size": docker.log_max_size, "max-file": str(docker.log_max_file)}
    assert config["runtimes"]["nvidia"] == {"args": [], "path": "nvidia-container-runtime"}
    for key, value in docker.daemon_extra.items():
        assert config[key] == value


@pytest.mark.parametrize("user", HOST.docker.users)
def test_engine_user_can_build_with_buildkit(gpu_guest, user):
    assert "docker" in gpu_guest.user(user).groups
    build = gpu_guest.run(
        f"d=$(mktemp -d) && printf 'FROM scratch\\nCOPY hello /hello\\n' > $d/Dockerfile"
        f" && echo hi > $d/hello && chmod -R a+rX $d"
        f" && runuser -u {user} -- env DOCKER_BUILDKIT=1 docker build -q -t ih-lab-probe $d"
        f" && docker image rm -f ih-lab-probe >/dev/null; rc=$?; rm -rf $d; exit $rc"
    )
    assert build.rc == 0, build.stderr
