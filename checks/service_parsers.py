"""Pure parsers of what the engine's service looks like on its host: `systemctl show`, the
launch script's parallelism flags, an environment file's assignment, `ss -ltnp`. No I/O here;
checks/test_service.py and checks/server_checks.py read through them, and tests/unit holds each to
real output. (Split from checks/gpu_parsers.py by concern: that module parses the GPU tools.)
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

# ----------------------------------------------------------------------------------------------
# Service: systemctl show, ss


def parse_systemctl_show(text: str) -> dict[str, str]:
    """Returns `systemctl show UNIT -p A -p B` as {"A": ..., "B": ...}."""
    values = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip()
    return values


# The engine's tensor-parallel size as roles/serving renders it (roles/serving/command.py
# SPELLINGS): SGLang's --tp-size (or its --tensor-parallel-size alias), vLLM's
# --tensor-parallel-size. SGLang's --tp-size counts the whole group's GPUs, --nnodes its nodes
# (sglang 0.5.9 server_args.py: each node runs tp_size // nnodes ranks).
TP_FLAGS = ("--tp-size", "--tensor-parallel-size")


@dataclass(frozen=True)
class Parallelism:
    flag: str
    tp_size: int
    nnodes: int

    @property
    def per_node(self) -> int:
        return self.tp_size // self.nnodes


def parse_launcher_parallelism(text: str) -> Parallelism | None:
    """Returns --tp-size/--tensor-parallel-size and --nnodes of the launcher's `exec` line (the
    script roles/serving writes: launch.j2), None when it names no tensor-parallel size."""
    line = next((line for line in reversed(text.splitlines()) if line.strip().startswith("exec ")), "")
    argv = shlex.split(line)
    values = {flag: argv[i + 1] for i, flag in enumerate(argv[:-1]) if flag in (*TP_FLAGS, "--nnodes")}
    flag = next((f for f in TP_FLAGS if f in values), None)
    if flag is None or not values[flag].isdigit() or not values.get("--nnodes", "1").isdigit():
        return None
    return Parallelism(flag, int(values[flag]), int(values.get("--nnodes", "1")))


def parse_env_assignment(text: str, name: str) -> str | None:
    """The value of NAME=value in an environment file (the last assignment wins), None if unset."""
    found = None
    for line in text.splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and key == name:
            found = value
    return found


@dataclass(frozen=True)
class ListeningSocket:
    address: str
    port: int
    process: str | None = None


def parse_ss_listening(text: str) -> list[ListeningSocket]:
    """Returns the TCP listening sockets of `ss -Hltnp` (or `ss -ltnp` with its header)."""
    sockets = []
    for line in text.splitlines():
        cells = line.split()
        if len(cells) < 4 or cells[0] == "State":
            continue
        # State Recv-Q Send-Q Local Peer [Process]; `-H` drops the header only.
        local = cells[3]
        address, _, port = local.rpartition(":")
        if not port.isdigit():
            continue
        address = address.strip("[]")
        address = address.split("%", 1)[0]  # 127.0.0.1%lo
        process = " ".join(cells[5:]) or None
        sockets.append(ListeningSocket(address=address, port=int(port), process=process))
    return sockets
