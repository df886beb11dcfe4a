"""nvidia_driver_dcgm in the lab: DCGM 4 comes from the (stand-in) CUDA repository through real
apt, its host engine runs under systemd, `dcgmi diag -r 1 -j` answers in DCGM's JSON,
and a second deploy with the setting changes nothing. The main lab has the setting on, as
inventory/prod.py does: these tests read its first and second deploy (no deploy of their own).

The packages and programs are stand-ins (lab/standins/nvidia_apt_repo/dcgm.py): names,
dependencies and the unit are DCGM 4.6.0's, the version 1:4.5.3-1 (what exporter 4.8.2 is built
against); the diagnostics need a GPU.
"""

from __future__ import annotations

import pytest

from checks import gpu_parsers as parse
from roles.nvidia_driver import dcgm_packages
from roles.site import load_site
from tests.lab.harness import LAB_INVENTORY

pytestmark = pytest.mark.lab

SITE = load_site(LAB_INVENTORY)
STACK = SITE.stack


@pytest.fixture(scope="module")
def dcgm_deploy(lab_first_deploy, lab_second_deploy):
    gpu_node = SITE.group("gpu_nodes")[0]
    assert gpu_node.nvidia_driver.dcgm, "inventory/lab.py must turn nvidia_driver_dcgm on, as inventory/prod.py"
    return lab_first_deploy, lab_second_deploy


def test_dcgm_installed_from_the_cuda_repository(dcgm_deploy, gpu_guest):
    for package in dcgm_packages(STACK.active.cuda_major):
        assert gpu_guest.package(package).is_installed, package
        assert gpu_guest.package(package).version == "1:4.5.3-1"  # the exporter's DCGM, epoch from the index


def test_dcgm_host_engine_runs(dcgm_deploy, gpu_guest):
    assert gpu_guest.service("nvidia-dcgm").is_running
    assert gpu_guest.service("nvidia-dcgm").is_enabled


def test_dcgmi_diag_answers_in_dcgms_format(dcgm_deploy, gpu_guest):
    out = gpu_guest.run("dcgmi diag -r 1 -j")
    tests = parse.parse_dcgmi_diag_json(out.stdout)
    assert [(t.section, t.name, t.result) for t in tests] == [("Deployment", "software", "Skip")], out.stdout
    assert parse.dcgm_version(out.stdout) == "4.5.3"
    table = gpu_guest.run("dcgmi diag -r 1")  # without -j: the text table, as the real one
    assert "| software                  | Skip" in table.stdout, table.stdout


def test_second_deploy_with_dcgm_changes_nothing(dcgm_deploy):
    _, second = dcgm_deploy
    ours = [n for n in second.changed if n.startswith("NVIDIA driver |")]
    assert ours == [], ours
