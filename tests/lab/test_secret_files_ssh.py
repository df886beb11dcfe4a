"""roles/shared/secret_files.py over a real SSH connection (OpenSSH's sshd and sftp-server in
the lab's gpu container, pyinfra's SSH connector): a watcher in the container records the mode
of every file in the destination and upload folders as it appears or changes. Nothing another
user could read may ever hold the secret. The same watcher run against pyinfra's own files.put
must see the world-readable moment (SFTP writes the destination at 0644, then chmods it), so
this test can fail.

Also the link race, in a throwaway container (no deploy, seconds): the installer puts a file
into a folder the service account owns while a process of that account swaps the new file's
name for a symbolic link to a root-only file, round after round. The root file must come out
untouched; the installer this one replaced (root's rm, cat, chown, chmod, mv beside the
destination) must lose it within the same rounds, so the race can be won."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import lab
from roles.shared.secret_files import install_steps, staged_path
from tests.lab.harness import PROJECT_ROOT, require_docker

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


ROUNDS = 300
RACE_DIR = "/srv/ih-race"  # the service account's folder, as its home holds the Hub token
VICTIM = "/etc/ih-race-victim"  # a root-only file the account must never get

# The installer before this one, as it ran: root writes the new file beside the destination and
# changes it by name, so a link swapped in between hands the chown and chmod to the link's target.
OLD_STEPS = (
    "rm -f -- {new} && (umask 077 && cat -- {staged} > {new}) && rm -f -- {staged}"
    " && chown -- svc:svc {new} && chmod 0600 -- {new} && mv -f -- {new} {dest}"
)

# Rounds of the installer against an attacker of the service account that keeps replacing the
# new file's name with a link to the victim. Prints "won <round>" the first time the victim's
# owner, mode or content changes, "held" after the last round.
RACE = """
set -u
ls -l {victim} >/dev/null
before=$(stat -c '%u:%g %a' {victim}; sha256sum < {victim})
setpriv --reuid=svc --regid=svc --init-groups -- sh -c \
  'while :; do ln -sfn {victim} {new}; done' &
attacker=$!
result=held
for round in $(seq 1 {rounds}); do
  printf secret-%s "$round" > {staged}
  ( {steps} ) >/dev/null 2>&1
  now=$(stat -c '%u:%g %a' {victim}; sha256sum < {victim})
  if [ "$now" != "$before" ]; then result="won $round"; break; fi
done
kill $attacker
echo "$result"
"""


@pytest.fixture(scope="module")
def race_container():
    """A throwaway container of the lab's image with a service account and its own folder."""
    require_docker()
    name = lab.container_name("secret-race")
    subprocess.run(["docker", "rm", "-f", name], capture_output=True)
    subprocess.run(
        ["docker", "run", "-d", "--name", name, "--label", "inference-host.lab=1", lab.systemd_image(), "sleep", "inf"],
        capture_output=True,
        check=True,
    )
    _exec(
        name,
        f"useradd --system --user-group svc && mkdir -p -m 0700 {UPLOAD} && mkdir -p {RACE_DIR}"
        f" && chown svc:svc {RACE_DIR} && echo root-only > {VICTIM} && chmod 0600 {VICTIM}",
    )
    yield name
    subprocess.run(["docker", "rm", "-f", name], capture_output=True)


def _race(container: str, steps: str) -> str:
    dest = f"{RACE_DIR}/token"
    new = f"{dest}.inference-host-new"
    script = RACE.format(
        victim=VICTIM,
        new=new,
        rounds=ROUNDS,
        staged=staged_path(dest, UPLOAD),
        steps=steps.format(new=new, staged=staged_path(dest, UPLOAD), dest=dest),
    )
    return _exec(container, script).strip()


def test_a_link_swapped_in_by_the_service_account_reaches_no_root_file(race_container):
    dest = f"{RACE_DIR}/token"
    steps = " && ".join(install_steps(staged_path(dest, UPLOAD), dest, "svc", "svc"))
    assert _race(race_container, steps.replace("{", "{{").replace("}", "}}")) == "held"
    # Not vacuous: without the attacker the same steps put the file in place, as the account.
    _exec(race_container, f"rm -f {dest}* && printf planted > {staged_path(dest, UPLOAD)} && {steps}")
    assert _exec(race_container, f"stat -c '%a %U %G' {dest} && cat {dest}").split() == ["600", "svc", "svc", "planted"]


def test_root_installs_into_a_folder_only_root_can_change(race_container):
    dest = "/srv/ih-root-only/token"
    steps = " && ".join(install_steps(staged_path(dest, UPLOAD), dest, "svc", "svc"))
    _exec(
        race_container, f"mkdir -p -m 0755 /srv/ih-root-only && printf planted > {staged_path(dest, UPLOAD)} && {steps}"
    )
    assert _exec(race_container, f"stat -c '%a %U %G' {dest} && cat {dest}").split() == ["600", "svc", "svc", "planted"]
    assert _exec(race_container, f"ls -A {UPLOAD}; ls -A /srv/ih-root-only").split() == ["token"]


def test_the_old_installer_loses_the_race(race_container):
    _exec(race_container, f"chown root:root {VICTIM} && chmod 0600 {VICTIM}")
    result = _race(race_container, OLD_STEPS)
    print(f"old installer: {result} of {ROUNDS} rounds")
    assert result.startswith("won "), "the race was never won: the test cannot fail"


def test_a_folder_of_another_account_is_refused(race_container):
    dest = f"{RACE_DIR}/token"
    staged = staged_path(dest, UPLOAD)
    steps = " && ".join(install_steps(staged, dest, "nobody", "nogroup"))
    result = subprocess.run(
        ["docker", "exec", race_container, "sh", "-c", f"printf x > {staged} && {steps}"],
        capture_output=True,
        text=True,
    )
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [
        f"refusing to install {dest}: its folder {RACE_DIR} is neither root's alone (every folder up to / owned by"
        " root, writable by no one else) nor owned by nobody, the file's owner"
    ]
