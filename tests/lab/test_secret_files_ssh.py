"""roles/shared/secret_files.py over a real SSH connection (OpenSSH's sshd and sftp-server in
the lab's gpu container, pyinfra's SSH connector): a watcher in the container records the mode
of every file in the destination and upload folders as it appears or changes. Nothing another
user could read may ever hold the secret. The same watcher run against pyinfra's own files.put
must see the world-readable moment (SFTP writes the destination at 0644, then chmods it), so
this test can fail."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import lab
from tests.lab.harness import PROJECT_ROOT

pytestmark = pytest.mark.lab

PORT = 22
DEST_DIR = "/srv/ih-ssh"
UPLOAD = "/var/lib/inference-host/upload"
WATCH_LOG = "/run/ih-ssh-watch.log"
VALUE = "planted-ssh-secret-3e8a91"

# Records "<mode> <path>" whenever a file in the watched folders appears or changes mode: a
# tight scandir/stat loop (inotify instances are a host-wide limit that the lab's many systemd
# containers can exhaust; the loop needs none). One pass takes microseconds, the SFTP-write
# to chmod gap is a whole SSH round trip.
WATCHER = r"""
import os, sys
out = open(sys.argv[1], "w", buffering=1)
out.write("ready\n")
last = {}
while True:
    for folder in sys.argv[2:]:
        for entry in os.scandir(folder):
            try:
                mode = entry.stat(follow_symlinks=False).st_mode & 0o777
            except FileNotFoundError:
                continue
            if last.get(entry.path) != mode:
                last[entry.path] = mode
                out.write(f"{mode:o} {entry.path}\n")
"""


def _exec(container: str, command: str, check: bool = True) -> str:
    result = subprocess.run(["docker", "exec", container, "sh", "-c", command], capture_output=True, text=True)
    if check and result.returncode != 0:
        raise AssertionError(f"{command}: {result.stdout}{result.stderr}")
    return result.stdout


@pytest.fixture(scope="module")
def ssh_target(gpu_guest, tmp_path_factory):
    """sshd on the gpu container, a key for root, and an inventory that reaches it over SSH."""
    container = lab.container_name("gpu")
    folder = tmp_path_factory.mktemp("ssh")
    key = folder / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    _exec(
        container,
        "command -v sshd >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q openssh-server >/dev/null",
    )
    # Appended, outside the PVE block the deploy keeps (roles/shared/guest_keys.py), as an admin
    # adds a key: replacing the file would make the next deploy put the block back.
    _exec(
        container,
        f"mkdir -p -m 0700 /root/.ssh && echo '{(folder / 'id_ed25519.pub').read_text().strip()}'"
        " >> /root/.ssh/authorized_keys && chmod 600 /root/.ssh/authorized_keys"
        " && systemctl enable --now --quiet ssh.service",
    )
    address = subprocess.run(
        ["docker", "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", container],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    inventory = folder / "ssh_inventory.py"
    inventory.write_text(
        f"hosts = [({address!r}, {{'ssh_user': 'root', 'ssh_port': {PORT}, 'ssh_key': {str(key)!r},"
        " 'ssh_strict_host_key_checking': 'off', 'ssh_known_hosts_file': '/dev/null'})]\n"
    )
    return container, inventory


def _deploy_watched(container: str, inventory: Path, name: str, plant: str | None = None) -> list[tuple[int, str]]:
    dest = f"{DEST_DIR}/{name}"
    _exec(container, f"rm -rf {DEST_DIR} && mkdir -p -m 0755 {DEST_DIR} {UPLOAD}")
    _exec(
        container,
        f"rm -f {WATCH_LOG} && cat > /run/ih-ssh-watch.py <<'EOF'\n{WATCHER}EOF\n"
        f"systemd-run --quiet --collect --unit=ih-ssh-watch"
        f" python3 /run/ih-ssh-watch.py {WATCH_LOG} {DEST_DIR} {UPLOAD}",
    )
    try:
        deadline = time.monotonic() + 30
        while _exec(container, f"head -1 {WATCH_LOG} 2>/dev/null", check=False).strip() != "ready":
            assert time.monotonic() < deadline, "the watcher did not start"
            time.sleep(0.2)
        env = {**os.environ, "IH_SSH_DEST": dest, "IH_SSH_VALUE": VALUE}
        if plant:
            env["IH_SSH_PLANT"] = plant
        pyinfra = str(Path(sys.executable).parent / "pyinfra")
        run = subprocess.run(
            [pyinfra, "-y", str(inventory), "tests/lab/ssh/secret_deploy.py"],
            cwd=PROJECT_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert run.returncode == 0, run.stdout + run.stderr
        assert VALUE not in run.stdout + run.stderr
        time.sleep(1)
    finally:
        _exec(container, "systemctl stop ih-ssh-watch", check=False)
    assert _exec(container, f"cat {dest}") == VALUE
    seen = [line.split(" ", 1) for line in _exec(container, f"cat {WATCH_LOG}").splitlines()[1:]]
    return [(int(mode, 8), path) for mode, path in seen]


def _exposed(container: str, seen: list[tuple[int, str]]) -> list[str]:
    """Events where another user could have read the file: o+r, and every parent folder o+x."""
    found = []
    for mode, path in seen:
        parents = _exec(container, f"p={path}; while p=$(dirname $p); [ $p != / ]; do stat -c %a $p; done").split()
        if mode & 0o004 and all(int(m, 8) & 0o001 for m in parents):
            found.append(f"{mode:o} {path}")
    return found


def test_secret_file_is_never_readable_by_others_over_ssh(ssh_target):
    container, inventory = ssh_target
    seen = _deploy_watched(container, inventory, "ours")
    assert any(path == f"{DEST_DIR}/ours" for _, path in seen), seen  # the watcher saw it land
    assert _exposed(container, seen) == [], seen
    assert _exec(container, f"stat -c '%a %U' {DEST_DIR}/ours").strip() == "600 nobody"
    assert _exec(container, f"ls -A {UPLOAD}").strip() == ""


def test_the_watcher_sees_files_puts_readable_moment(ssh_target):
    container, inventory = ssh_target
    seen = _deploy_watched(container, inventory, "files-put", plant="files.put")
    assert f"644 {DEST_DIR}/files-put" in _exposed(container, seen), seen
