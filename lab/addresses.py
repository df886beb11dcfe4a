"""How the lab's hosts are reached: each container's address on Docker's bridge as last
recorded (inventories read it without asking Docker), and, with INFERENCE_HOST_LAB_CONNECT=ssh,
OpenSSH in the containers with the lab's own key and known-hosts file."""

from __future__ import annotations

import json
import os
from pathlib import Path

from lab.containers import HOSTS, MAIN_LAB, container_address, container_name
from lab.docker_engine import PREFIX, STATE_DIR, _docker
from lab.vault import throwaway_ssh_public_key


def known_hosts_file() -> Path:
    return STATE_DIR / f"{PREFIX}-known_hosts"


def ssh_connection_data(role: str) -> dict:
    """How pyinfra (and the health checks) reach a lab host over SSH: the lab's throwaway key,
    its own known-hosts file (strict), the container's address as last recorded (the connector
    puts the running container's in as it connects)."""
    return {
        "ssh_hostname": recorded_address(role),
        "ssh_user": "root",
        "ssh_key": str(STATE_DIR / "guest-ssh-key"),
        "ssh_known_hosts_file": str(known_hosts_file()),
        "ssh_strict_host_key_checking": "yes",
    }


def enable_ssh(roles: tuple[str, ...] | None = None) -> None:
    """Runs Debian's OpenSSH server in each container, letting in the lab's throwaway key only,
    and records each host key in a known-hosts file of the lab's own (strict checking); the
    lines of other roles already there are kept (the connector enables one host at a time)."""
    public = throwaway_ssh_public_key()
    known = {}
    if known_hosts_file().is_file():
        known = {line.split()[0]: line for line in known_hosts_file().read_text().splitlines() if line.strip()}
    for role in roles or MAIN_LAB:
        name = container_name(role)
        script = (
            "set -e; command -v sshd >/dev/null || { apt-get update -q >/dev/null &&"
            " DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends"
            " openssh-server >/dev/null; }; mkdir -p /root/.ssh && chmod 700 /root/.ssh;"
            ' touch /root/.ssh/authorized_keys; grep -qxF "$1" /root/.ssh/authorized_keys'
            " || printf '%s\\n' \"$1\" >> /root/.ssh/authorized_keys;"
            " systemctl is-active -q ssh || systemctl enable -q --now ssh;"
            " cat /etc/ssh/ssh_host_ed25519_key.pub"
        )
        host_key = _docker("exec", name, "sh", "-c", script, "sh", public).stdout.split()
        address = container_address(role)
        known[address] = f"{address} {host_key[0]} {host_key[1]}"
    known_hosts_file().write_text("\n".join(known.values()) + "\n")


# Where each container's address on Docker's bridge was last seen (written whenever the lab
# brings a container up): inventories that name a host by its address read it from here, as
# loading an inventory asks Docker nothing; the connector puts the running container's own into
# the host's data as it connects (a container made anew may get another address).
def addresses_file() -> Path:
    return STATE_DIR / PREFIX / "addresses.json"


def recorded_addresses() -> dict[str, str]:
    try:
        return json.loads(addresses_file().read_text())
    except (OSError, ValueError):
        return {}


def recorded_address(role: str, placeholder: str | None = None) -> str:
    """The container's address as the lab last recorded it; before any, a placeholder (a valid
    address, one per role: `inference-host validate` validates with it; the connector replaces it)."""
    return recorded_addresses().get(role) or placeholder or f"172.17.255.{10 + list(HOSTS).index(role)}"


def record_address(role: str) -> str:
    address = container_address(role)
    known = recorded_addresses()
    if known.get(role) != address:
        known[role] = address
        addresses_file().parent.mkdir(parents=True, exist_ok=True)
        partial = addresses_file().with_name(f".addresses.{os.getpid()}")
        partial.write_text(json.dumps(known, indent=1, sort_keys=True) + "\n")
        os.replace(partial, addresses_file())  # a checks process may read it meanwhile
    return address
