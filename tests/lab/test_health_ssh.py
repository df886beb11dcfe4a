"""The health step over real SSH, connecting as pyinfra does (checks/connection.py).

A lab container runs a real OpenSSH server that accepts one key and no password; its host key
is known only through a known-hosts file named in the inventory, with strict host-key
checking. The checks must connect with exactly those settings: the service suite runs and
reaches its verdicts (the unit is absent in this container, so they fail; the point is that
they run). With the known-hosts file left out of the inventory the same run must fail to
connect: proof that the settings are what lets it in.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import lab
from tests.lab.harness import PROJECT_ROOT, require_docker

pytestmark = pytest.mark.lab


def _docker(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=check, timeout=600)


@pytest.fixture(scope="module")
def ssh_host(tmp_path_factory):
    require_docker()
    name = f"{lab.PREFIX}-ssh"
    _docker("rm", "-f", name, check=False)
    _docker(
        "run",
        "-d",
        "--name",
        name,
        "--hostname",
        name,
        "--label",
        "inference-host.lab=1",
        *lab.SYSTEMD_RUN_FLAGS,
        lab.systemd_image(),
    )
    try:
        lab._wait_for_systemd(name, timeout=300)  # a loaded shared machine boots slowly
        _docker(
            "exec",
            name,
            "sh",
            "-c",
            "apt-get update -q && DEBIAN_FRONTEND=noninteractive "
            "apt-get install -y -q --no-install-recommends openssh-server",
        )
        folder = tmp_path_factory.mktemp("ssh")
        key = folder / "id_ed25519"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
        public = key.with_suffix(".pub").read_text()
        _docker(
            "exec",
            name,
            "sh",
            "-c",
            "mkdir -p /root/.ssh && chmod 700 /root/.ssh && printf 'PasswordAuthentication no\\n"
            "KbdInteractiveAuthentication no\\nPermitRootLogin prohibit-password\\n'"
            " > /etc/ssh/sshd_config.d/lab.conf && systemctl restart ssh",
        )
        subprocess.run(
            ["docker", "exec", "-i", name, "sh", "-c", "cat > /root/.ssh/authorized_keys"],
            input=public,
            text=True,
            check=True,
        )
        address = _docker(
            "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", name
        ).stdout.strip()
        host_key = _docker("exec", name, "cat", "/etc/ssh/ssh_host_ed25519_key.pub").stdout.split()
        known = folder / "known_hosts"
        known.write_text(f"{address} {host_key[0]} {host_key[1]}\n")
        yield {"name": name, "address": address, "key": key, "known": known, "folder": folder}
    finally:
        _docker("rm", "-f", name, check=False)


def _inventory(ssh_host, known_hosts: bool) -> Path:
    settings = {
        "gpu_count": 1,
        "ssh_hostname": ssh_host["address"],
        "ssh_user": "root",
        "ssh_key": str(ssh_host["key"]),
        "ssh_strict_host_key_checking": "yes",
        "ssh_config_file": str(ssh_host["folder"] / "ssh_config"),
    }  # empty: no user settings
    (ssh_host["folder"] / "ssh_config").write_text("")
    if known_hosts:
        settings["ssh_known_hosts_file"] = str(ssh_host["known"])
    else:  # pyinfra's default known-hosts file would be the user's: point at an empty one
        empty = ssh_host["folder"] / "empty_known_hosts"
        empty.write_text("")
        settings["ssh_known_hosts_file"] = str(empty)
    path = ssh_host["folder"] / f"inventory_{'known' if known_hosts else 'unknown'}.py"
    path.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(PROJECT_ROOT)!r})\n"
        "from validation import require_valid_inventory\n"
        f"_site = {{'stack_file': {str(PROJECT_ROOT / 'inventory' / 'stack.yml')!r}}}\n"
        f"gpu_nodes = [('gpu-over-ssh', {{**_site, **{settings!r}}})]\n"
        "require_valid_inventory(__file__, globals())\n"
    )
    return path


def _checks(inventory: Path, report: Path) -> subprocess.CompletedProcess:
    # The command roles/health runs at the end of a deploy (roles.health.check_command).
    from roles.health import check_command

    return subprocess.run(
        check_command(str(inventory), "gpu-over-ssh", ["service"], str(report)),
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_health_step_connects_with_the_inventorys_key_and_known_hosts(ssh_host):
    run = _checks(_inventory(ssh_host, known_hosts=True), ssh_host["folder"] / "known.json")
    output = run.stdout + run.stderr
    assert "Host key verification failed" not in output and "Permission denied" not in output, output[-3000:]
    assert "SERVICE" in output and "unit active" in output, output[-3000:]
    # the container has no engine unit: the checks ran on it and said so
    assert "inference-engine.service" in output and run.returncode == 1, output[-3000:]


def test_without_the_known_hosts_file_the_same_run_cannot_connect(ssh_host):
    run = _checks(_inventory(ssh_host, known_hosts=False), ssh_host["folder"] / "unknown.json")
    output = run.stdout + run.stderr
    assert run.returncode != 0
    assert "Host key verification failed" in output or "No ED25519 host key is known" in output, output[-3000:]


def _fingerprint(public_key: str) -> str:
    """As ssh-keygen -l prints it (OpenSSH's own tool, not the project's code)."""
    listed = subprocess.run(["ssh-keygen", "-lf", "-"], input=public_key, capture_output=True, text=True, check=True)
    return listed.stdout.split()[1]


def test_a_changed_host_key_stops_the_deploy_in_one_line_before_anything_runs(ssh_host):
    """The guest's host key is swapped (regenerated, ssh restarted) as a new machine answering at
    its address would present another: the next deploy names the host and both fingerprints in
    one line, and no command runs on it (its marker is never written)."""
    name, inventory = ssh_host["name"], _inventory(ssh_host, known_hosts=True)
    pinned = _fingerprint(ssh_host["known"].read_text().split(None, 1)[1])
    swap = (
        "mkdir -p /root/keep && cp -p /etc/ssh/ssh_host_ed25519_key /etc/ssh/ssh_host_ed25519_key.pub /root/keep/"
        " && rm -f /etc/ssh/ssh_host_ed25519_key /etc/ssh/ssh_host_ed25519_key.pub"
        " && ssh-keygen -q -t ed25519 -N '' -f /etc/ssh/ssh_host_ed25519_key && systemctl restart ssh"
        " && rm -f /root/ih-deploy-ran"
    )
    _docker("exec", name, "sh", "-c", swap)
    try:
        presented = _fingerprint(_docker("exec", name, "cat", "/etc/ssh/ssh_host_ed25519_key.pub").stdout)
        assert presented != pinned
        run = subprocess.run(
            [str(Path(sys.executable).parent / "pyinfra"), "-y", str(inventory), "tests/lab/ssh/marker_deploy.py"],
            cwd=PROJECT_ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        output = run.stdout + run.stderr
        ran = _docker("exec", name, "test", "-e", "/root/ih-deploy-ran", check=False).returncode == 0
        assert run.returncode != 0 and not ran, output[-3000:]
        lines = [line for line in output.splitlines() if pinned in line and presented in line]
        assert len(lines) == 1 and ssh_host["address"] in lines[0], output[-3000:]
        assert "Traceback" not in output, output[-3000:]
    finally:
        restore = (
            "cp -p /root/keep/ssh_host_ed25519_key /root/keep/ssh_host_ed25519_key.pub /etc/ssh/"
            " && systemctl restart ssh"
        )
        _docker("exec", name, "sh", "-c", restore)
