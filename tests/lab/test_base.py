"""roles/base in the lab: a fresh container converges, a second deploy changes nothing,
and what base laid down is there (checked with testinfra, as a user would)."""

from __future__ import annotations

import os

import pytest

from roles.site import load_site
from tests.lab.harness import LAB_INVENTORY

pytestmark = pytest.mark.lab

SITE = load_site(LAB_INVENTORY)
HOST = next(iter(SITE.group("gpu_nodes")))


def test_second_deploy_changes_nothing(lab_second_deploy):
    assert lab_second_deploy.results is not None, lab_second_deploy.explain()
    assert lab_second_deploy.changed == [], (
        "a second deploy must report no change; these operations changed again: " + ", ".join(lab_second_deploy.changed)
    )
    # pyinfra's own count agrees: every operation on every host reported "no change".
    totals = lab_second_deploy.results["totals"]
    assert totals["success"] == 0 and totals["error"] == 0 and totals["no_change"] > 0, totals
    # The health check reports no change, yet it ran and printed its verdict.
    assert lab_second_deploy.health_checks, "the post-deploy health check did not run"
    assert "inference-host health verdict" in lab_second_deploy.stderr


@pytest.mark.skipif(
    os.environ.get("INFERENCE_HOST_LAB_REUSE") == "1",
    reason="containers were reused: the first deploy had nothing to do",
)
def test_first_deploy_did_the_work(lab_first_deploy):
    # A fresh container needs the packages and uv: if nothing changed, the deploy did nothing.
    assert any("Install base packages" in name for name in lab_first_deploy.changed)
    assert any(f"Install uv {SITE.stack.uv}" in name for name in lab_first_deploy.changed)


@pytest.mark.parametrize(
    "package",
    ["build-essential", "git", "curl", "ca-certificates", "numactl", "pciutils", "jq", "python3-venv", "psmisc"],
)
def test_base_package_installed(gpu_guest, package):
    assert gpu_guest.package(package).is_installed, f"{package} is not installed"


def test_service_user_is_unprivileged_system_user(gpu_guest):
    user = gpu_guest.user(HOST.base.service_user)
    assert user.exists
    assert user.uid < 1000, f"expected a system user, got uid {user.uid}"
    assert user.shell == "/usr/sbin/nologin"
    assert user.group == HOST.base.service_group
    assert "sudo" not in user.groups


@pytest.mark.parametrize("attr", ["data_dir", "log_dir"])
def test_engine_directories_owned_by_service_user(gpu_guest, attr):
    directory = gpu_guest.file(getattr(HOST.base, attr))
    assert directory.is_directory
    assert directory.user == HOST.base.service_user
    assert directory.mode == 0o750


def test_model_dir_is_the_nodes_read_only_mount(gpu_guest):
    """The lab guest's model_dir is the node's model storage (guest_mount_points, roles/weights):
    base leaves it to the node, and the guest cannot write it."""
    assert HOST.base.model_dir in HOST.guest.mount_points.values()
    options = gpu_guest.check_output(f"findmnt -n -o OPTIONS --target {HOST.base.model_dir}")
    assert "ro" in options.split(","), options
    assert gpu_guest.run(f"touch {HOST.base.model_dir}/.write-probe").rc != 0


def test_numa_balancing_is_set_on_the_node_not_in_the_lxc_guest(gpu_guest):
    """An LXC guest shares its node's kernel: roles/proxmox_host writes the setting there."""
    import testinfra

    import lab

    node = testinfra.get_host(f"docker://{lab.container_name('pve')}")
    assert node.file("/etc/sysctl.d/90-inference-host-node.conf").contains(r"^kernel.numa_balancing = 0$")
    assert not gpu_guest.file("/etc/sysctl.d/90-inference-host-sysctl.conf").exists


def test_limits_raise_memlock_and_nofile_for_service_user(gpu_guest):
    limits = gpu_guest.file("/etc/security/limits.d/90-inference-host-limits.conf")
    user = HOST.base.service_user
    assert limits.contains(rf"^{user} hard memlock unlimited$")
    assert limits.contains(rf"^{user} hard nofile {HOST.base.limit_nofile}$")


def test_uv_is_the_pinned_version_on_path(gpu_guest):
    result = gpu_guest.run("uv --version")
    assert result.rc == 0, result.stderr
    assert result.stdout.split()[1] == SITE.stack.uv
    assert gpu_guest.file("/usr/local/bin/uv").linked_to == f"{HOST.base.uv_dir}/{SITE.stack.uv}/bin/uv"


def test_uv_reaches_pypi_through_the_trusted_ca(gpu_guest):
    # The lab's extra CA setting is what makes HTTPS to PyPI work inside the container.
    result = gpu_guest.run(
        "printf 'six==1.16.0\\n' | SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"
        " uv pip compile --no-header --quiet -"
    )
    assert result.rc == 0, result.stderr
    assert "six==1.16.0" in result.stdout


def test_hub_token_is_on_the_node_that_downloads_not_in_the_guest(gpu_guest):
    """The node keeps the guest's weights (roles/weights): the token is its file, 0600, of the
    download's own user (not root: the unit runs as that user)."""
    import testinfra

    import lab
    from roles import weights

    node = testinfra.get_host(f"docker://{lab.container_name('pve')}")
    token = node.file(weights.token_file(HOST.serving.hf_token_secret))
    assert token.exists and token.mode == 0o600 and token.user == weights.USER
    assert not gpu_guest.file(f"{HOST.base.data_dir}/.cache/huggingface/token").exists


def test_secret_never_in_deploy_output(lab_first_deploy, lab_second_deploy):
    from roles.site import vault

    values = vault.decrypt_all(SITE.secrets_file)
    for run in (lab_first_deploy, lab_second_deploy):
        for value in values.values():
            assert value not in run.stdout and value not in run.stderr


def test_no_secret_left_in_upload_folder(gpu_guest):
    upload = gpu_guest.file("/var/lib/inference-host/upload")
    assert upload.mode == 0o700
    assert gpu_guest.run("ls -A /var/lib/inference-host/upload").stdout.strip() == ""


# --- deploy --check (last in this module: it plants changes and puts the files back) -------------


def test_deploy_check_prints_each_changed_files_diff_and_changes_nothing(lab_second_deploy, gpu_guest):
    """`inference-host deploy --check` on the converged lab with a file changed by hand on each
    host and the node's Hub token file overwritten: pyinfra's dry run reads the real hosts and
    prints both files' diffs (the line it would remove) and no secret, and executes nothing: the
    planted files are still as planted, no pct/qm call that changes a guest was made."""
    import re
    import subprocess
    import sys
    import time
    from pathlib import Path

    import testinfra

    import lab
    from roles import weights
    from roles.base import LIMITS_FILE
    from roles.proxmox_host import BLACKLIST_FILE
    from roles.site import vault
    from tests.lab.harness import PROJECT_ROOT

    node = testinfra.get_host(f"docker://{lab.container_name('pve')}")
    token_file = weights.token_file(HOST.serving.hf_token_secret)
    planted = {(gpu_guest, LIMITS_FILE): "# planted by hand\n", (node, BLACKLIST_FILE): "# planted by hand\n"}
    originals = {(host, path): host.file(path).content_string for host, path in planted}
    calls = node.file(lab.PVE_STANDIN_LOG).content_string.count("\n")
    kept = [*planted, (node, token_file)]
    for host, path in kept:  # copies beside them (mode and owner kept), put back at the end
        host.check_output(f"cp -p {path} {path}.before-check")
    try:
        for (host, path), line in planted.items():
            host.check_output(f"printf '%s' '{line}' >> {path}")
        node.check_output(f"printf 'planted-token' > {token_file}")
        started = time.monotonic()
        check = subprocess.run(
            [str(Path(sys.executable).with_name("inference-host")), "deploy", str(LAB_INVENTORY), "--check"],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=PROJECT_ROOT,
        )
        took = time.monotonic() - started
        output = re.sub(r"\x1b\[[0-9;]*m", "", check.stdout + check.stderr)
        assert check.returncode == 0, output[-3000:]
        for (host, path), line in planted.items():
            assert f"Will modify {path}" in output, output[-3000:]
            assert f"- {line.strip()}" in output  # the diff: the planted line would go
            assert host.file(path).content_string == originals[(host, path)] + line, "--check changed a file"
        assert node.file(token_file).content_string == "planted-token", "--check wrote the token"
        for value in vault.decrypt_all(SITE.secrets_file).values():
            assert value not in output
        made = node.file(lab.PVE_STANDIN_LOG).content_string.splitlines()[calls:]
        changing = ("create", "set", "start", "stop", "shutdown", "reboot", "destroy", "push")
        assert not [c for c in made if c.split()[1:2] and c.split()[1] in changing], made  # reads only
        print(f"\ninference-host deploy --check of the main lab (2 hosts): {took:.1f} s")
    finally:  # the lab as the deploy left it, for the modules after this one
        for host, path in kept:
            host.check_output(f"mv -f {path}.before-check {path}")
