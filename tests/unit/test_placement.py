"""Settings written on another host than the one whose section declares them (roles/site/placement):
an LXC guest's kernel-wide sysctls on its node, the Hugging Face token where the download runs."""

from __future__ import annotations

import dataclasses

from roles.site import engine_reads_hub_token, load_site, node_sysctl, own_sysctl
from tests.unit.test_site import NODE, assert_names, only_problem
from tests.unit.test_weights import WEIGHTS, guest_node


def _site(inventory, *guests, node=NODE, name="site.py"):
    return inventory.groups(name, proxmox_hosts=[node], lxc_guests=list(guests), gpu_nodes=list(guests))


def test_an_lxc_guests_kernel_settings_are_written_on_its_node(inventory):
    ct = guest_node(
        "ct",
        200,
        base_sysctl={
            "kernel.numa_balancing": "0",
            "vm.max_map_count": "1048576",
            "net.core.somaxconn": "4096",
            "kernel.shmmax": "68719476736",
        },
    )
    site = load_site(_site(inventory, ct))
    guest, node = site.hosts["ct"], site.hosts["pve"]
    # What the container's own namespaces hold (runc's list) stays in the guest...
    assert own_sysctl(guest) == {"net.core.somaxconn": "4096", "kernel.shmmax": "68719476736"}
    # ...the shared kernel's keys go to the node, beside the node's own base_sysctl.
    assert node_sysctl(node, site.hosts) == {"kernel.numa_balancing": "0", "vm.max_map_count": "1048576"}


def test_a_vm_keeps_its_whole_sysctl(inventory):
    path = inventory.groups(gpu_nodes=[("vm", {"gpu_count": 1})])
    assert own_sysctl(load_site(path).hosts["vm"]) == {"kernel.numa_balancing": "0"}


def test_two_values_of_one_kernel_key_on_one_node_are_refused(inventory):
    path = _site(inventory, guest_node("ct", 200, base_sysctl={"kernel.numa_balancing": "1"}))
    assert_names(
        only_problem(path),
        "host pve",
        "base_sysctl kernel.numa_balancing = '1' on LXC guest ct",
        "'0' on pve",
        "expected one value",
    )


def test_the_hub_token_stays_off_a_guest_that_serves_local_files(inventory):
    inventory.vault(hf_token="hf_x")
    common = dict(serving_hf_token_secret="hf_token", secrets_file="secrets.vault.yml")
    site = load_site(_site(inventory, guest_node("ct", 200, **WEIGHTS, **common)))
    assert engine_reads_hub_token(site.hosts["ct"], site.hosts) is False  # the node downloads
    plain = load_site(inventory.groups("plain.py", gpu_nodes=[("gpu", {"gpu_count": 1, **common})]))
    assert engine_reads_hub_token(plain.hosts["gpu"], plain.hosts) is False  # a local directory
    # A drafter named by a Hub id (the project's own checks refuse one, validation.py; the model
    # alone would let SGLang fetch it, with the token from $HF_HOME).
    gpu = plain.hosts["gpu"]
    hub = dataclasses.replace(
        gpu, serving=gpu.serving.model_copy(update={"speculative": {"draft_model_path": "lmsys/some-eagle3"}})
    )
    assert engine_reads_hub_token(hub, {"gpu": hub}) is True
