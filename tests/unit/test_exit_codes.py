"""One exit-code contract for every subcommand of `inference-host` (docs/operations.md): 0 ok,
1 a check failed, 2 bad usage or input (nothing contacted), 3 a host could not be reached, 4
accepted on stand-ins. One table: each subcommand with a good, a bad, a missing, a folder and an
unreachable inventory. Unreachable hosts are loopback addresses only (127.0.0.2-4, Linux routes
all of 127/8 to the loopback interface): a port nothing listens on, and a listener that accepts
and never speaks; no packet leaves this machine."""

from __future__ import annotations

import contextlib
import io
import os
import re
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from inference_host import cli
from tests.unit.conftest import (
    ADMIN,
    CLIENT_KEY,
    CONTROL,
    GATEWAY_PLAINTEXT,
    PROJECT_ROOT,
    ROLE_KEYS,
    SERVING_PLAINTEXT,
)

ADDRESSES = {"rep-a.example.internal": "127.0.0.2", "rep-b.example.internal": "127.0.0.3", "gw": "127.0.0.4"}
REPLICA = "rep-a.example.internal"
GUEST = "gpu-lxc.example.internal"


def replicas_inventory(folder: Path, port: int, first: str = REPLICA, bad: bool = False) -> Path:
    """Two replicas behind a gateway, each at its own loopback address and the given port, with
    a throwaway vault (its password file in the folder)."""
    from roles.site import vault

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "password").write_text("table-password\n")
    if not (folder / "secrets.vault.yml").exists():  # a key per role, each as long as the rules ask
        for name, value in {"engine_api_key": CLIENT_KEY, **ROLE_KEYS}.items():
            vault.set_secret(folder / "secrets.vault.yml", name, value, b"table-password")
    stack = os.path.relpath(PROJECT_ROOT / "inventory" / "stack.yml", folder)
    first_host = (
        '("@local", _node)' if first == "@local" else f'({REPLICA!r}, {{**_node, "ssh_hostname": "127.0.0.2"}})'
    )
    text = f"""from validation import require_valid_inventory

_site = {{"stack_file": {stack!r}, "secrets_file": "secrets.vault.yml", "ssh_user": "root", "ssh_port": {port}}}
_node = {{**_site, "gpu_count": {'"eight"' if bad else 8}, "serving_host": "0.0.0.0",
    "serving_api_key_secret": "engine_api_key", **{ADMIN!r}, **{SERVING_PLAINTEXT!r}}}
gpu_nodes = [
    {first_host},
    ("rep-b.example.internal", {{**_node, "ssh_hostname": "127.0.0.3"}}),
]
gateways = [("gw.example.internal", {{**_site, "ssh_hostname": "127.0.0.4", **{CONTROL!r}, **{GATEWAY_PLAINTEXT!r}}})]
require_valid_inventory(__file__, globals())
"""
    path = folder / ("local.py" if first == "@local" else "bad.py" if bad else "replicas.py")
    path.write_text(text)
    return path


def node_inventory(folder: Path, port: int) -> Path:
    """inventory/prod.py with each host at a loopback address of its own and the given port: a
    node and its guests (teardown's)."""
    import shutil

    folder.mkdir(parents=True, exist_ok=True)
    for name in ("stack.yml", "secrets.vault.yml"):
        shutil.copy(PROJECT_ROOT / "inventory" / name, folder / name)
    for name in ("locks", "models"):
        shutil.copytree(PROJECT_ROOT / "inventory" / name, folder / name)
    address = {"pve.example.internal": "127.0.0.2", GUEST: "127.0.0.3", "gpu-vm.example.internal": "127.0.0.4"}
    lines, host = [], None
    for line in (PROJECT_ROOT / "inventory" / "prod.py").read_text().splitlines(keepends=True):
        named = re.match(r'\s*"([a-z.-]+\.example\.internal)",\s*$', line)
        host = named.group(1) if named else host
        if '"ssh_user": "root",' in line and host:
            line = line.replace(
                '"ssh_user": "root",', f'"ssh_user": "root", "ssh_hostname": "{address[host]}", "ssh_port": {port},'
            )
        lines.append(line)
    path = folder / "node.py"
    path.write_text("".join(lines))
    return path


@pytest.fixture(scope="module")
def closed_port():
    """A loopback port nothing listens on (bound, then let go)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _hold_every_connection(listener: socket.socket, held: list) -> None:
    with contextlib.suppress(OSError):  # the listener closed at the module's end
        while True:
            held.append(listener.accept()[0])


def _listeners(backlog_full: bool):
    """Listeners at 127.0.0.2-4 on one port. Silent: each accepts (the kernel completes the
    handshake) and never sends a byte, so ssh waits for a banner that never comes. Backlog full:
    each has an accept queue of one, taken by a connection never accepted, so Linux drops every
    further SYN (net/ipv4/tcp_input.c, tcp_conn_request: the queue is full) and a client's
    connect times out, as toward an address that does not route; no packet leaves this machine."""
    sockets, held = [], []
    port = 0
    for address in ("127.0.0.2", "127.0.0.3", "127.0.0.4"):
        listener = socket.socket()
        listener.bind((address, port))
        port = listener.getsockname()[1]
        listener.listen(0 if backlog_full else 8)
        sockets.append(listener)
        if not backlog_full:
            # Taken off the accept queue and held, never answered: a queue left full (every
            # subcommand's connections in one test process) would drop further SYNs, and the
            # silent host would turn into one that does not route.
            threading.Thread(target=_hold_every_connection, args=(listener, held), daemon=True).start()
        if backlog_full:
            filler = socket.socket()
            filler.connect((address, port))
            held.append(filler)
    if backlog_full:  # a further SYN is dropped: the proof that the addresses do not answer
        probe = socket.socket()
        probe.settimeout(1)
        with pytest.raises(TimeoutError):
            probe.connect(("127.0.0.2", port))
        probe.close()
    return port, sockets + held


@pytest.fixture(scope="module")
def silent_port():
    port, sockets = _listeners(backlog_full=False)
    yield port
    for item in sockets:
        with contextlib.suppress(OSError):
            item.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept()
        item.close()


@pytest.fixture(scope="module")
def no_route_port():
    port, sockets = _listeners(backlog_full=True)
    yield port
    for item in sockets:
        item.close()


@pytest.fixture(scope="module")
def sites(tmp_path_factory, closed_port, silent_port, no_route_port):
    folder = tmp_path_factory.mktemp("exit-codes")
    empty = folder / "a-folder"
    empty.mkdir()
    return {
        "unreachable": replicas_inventory(folder / "replicas", closed_port),
        "bad": replicas_inventory(folder / "replicas", closed_port, bad=True),
        "good": replicas_inventory(folder / "replicas", closed_port, first="@local"),
        "missing": folder / "nothing-here.py",
        "folder": empty,
        "node": node_inventory(folder / "node", closed_port),
        "silent": replicas_inventory(folder / "silent", silent_port),
        "silent-node": node_inventory(folder / "silent-node", silent_port),
        "no-route": replicas_inventory(folder / "no-route", no_route_port),
        "no-route-node": node_inventory(folder / "no-route-node", no_route_port),
        "ports": {"unreachable": closed_port, "silent": silent_port, "no-route": no_route_port},
        "out": folder,
    }


def run(argv: list[str], stdin: str = "") -> tuple[int, str]:
    """cli.main in this process (as the console script runs it): the status and what it printed."""
    out = io.StringIO()
    old_stdin = sys.stdin
    sys.stdin = io.StringIO(stdin)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            try:
                code = cli.main(argv)
            except SystemExit as done:
                code = done.code if isinstance(done.code, int) else 2
    finally:
        sys.stdin = old_stdin
    return int(code or 0), out.getvalue()


# subcommand -> its arguments ({inv}: the inventory, {out}: a fresh folder), and the status with
# the good inventory (None: needs a machine, GOOD_ELSEWHERE names the test that runs it) and the
# unreachable one.
# An inventory of "node" kind is prod.py's node and guests (teardown needs a guest).
TABLE = {
    "validate": (["validate", "{inv}"], 0, 0),
    "preview": (["preview", "{inv}", "--out", "{out}"], 0, 0),
    "deploy": (["deploy", "{inv}", "--check"], None, 3),
    "status": (["status", "{inv}", "--timeout", "3"], 0, 3),
    "check": (["check", "{inv}", "--report", "{out}/"], None, 3),
    "accept": (["accept", "{inv}", "--out", "{out}"], None, 3),
    "bench": (["bench", "{inv}", "--history", "{out}/history.jsonl"], None, 3),
    "drain": (["drain", "{inv}", REPLICA], None, 3),
    "undrain": (["undrain", "{inv}", REPLICA], None, 3),
    "rollback": (["rollback", "{inv}", "--timeout", "3"], None, 3),
    "rotate": (["rotate", "{inv}", "engine_api_key"], 0, 3),
    "teardown": (["teardown", "{inv}", GUEST, "--yes-i-typed", GUEST], None, 3),
    "trust": (["trust", "{inv}", REPLICA, "--yes"], 0, 3),
}
NODE_KIND = {"teardown"}
# How a host can fail to answer, and the cause the line must give in the connector's words
# (OpenSSH: "Connection refused", "Connection timed out", "timed out during banner exchange";
# paramiko, for the commands that run pyinfra: "Unable to connect to port", "timed out",
# "Error reading SSH protocol banner").
# The next step follows the cause: nothing listening, something listening that does not speak
# SSH, nothing answering at all.
UNREACHABLE_KINDS = {
    "unreachable": (r"refused|Unable to connect", "sshd is not listening on"),
    "silent": (r"timed out|banner|no SSH banner", "does not speak SSH"),
    "no-route": (r"timed out", "nothing answered on"),
}
GOOD_EXTRA = {"status": ["--host", "@local"]}  # the good inventory's other hosts are not there
# The good case of these needs no host: the vault alone (the deploy comes later), and a key the
# operator copied from the host's console (pinned in the inventory's known_hosts).
GOOD_ARGV = {
    "rotate": ["rotate", "{inv}", "engine_api_key", "--no-deploy"],
    "trust": ["trust", "{inv}", "rep-b.example.internal", "--yes", "--key-file", "{out}/host.pub"],
}
# The good case of a subcommand that needs a deployed machine: the lab test that runs it, the
# words that run it there, and the status it asserts. `check` and `accept` run there as the
# modules the subcommand wraps (cli._run_module passes their status on unchanged).
GOOD_ELSEWHERE = {
    "deploy": (
        "tests/lab/test_base.py",
        "test_deploy_check_prints_each_changed_files_diff_and_changes_nothing",
        '"deploy"',
        "check.returncode == 0",
    ),
    "check": (
        "tests/lab/test_health.py",
        "test_service_and_server_suites_pass_against_the_stand_in",
        '"-m", "checks"',
        "completed.returncode == 0",
    ),
    "accept": (
        "tests/lab/test_acceptance.py",
        "test_the_shipped_shape_is_accepted_on_stand_ins",
        '"-m", "checks.acceptance"',
        "run.returncode == 4",
    ),
    "drain": (
        "tests/lab/test_replicas.py",
        "test_drain_takes_a_replica_out_and_undrain_brings_it_back",
        '"drain"',
        "result.returncode == 0",
    ),
    "undrain": (
        "tests/lab/test_replicas.py",
        "test_drain_takes_a_replica_out_and_undrain_brings_it_back",
        '"undrain"',
        "result.returncode == 0",
    ),
    "rollback": (
        "tests/lab/test_replicas.py",
        "test_rolling_upgrade_never_drops_the_endpoint",
        '"rollback"',
        "returncode == 0",
    ),
    "bench": (
        "tests/lab/test_vllm_engine.py",
        "test_benchmark_runs_vllms_own_client_and_labels_the_engine",
        '"checks.bench"',
        "completed.returncode == 0",
    ),
    "teardown": (
        "tests/lab/test_proxmox.py",
        "test_teardown_keeps_the_weights_and_the_next_deploy_makes_the_guest_again",
        '"teardown"',
        "done.returncode == 0",
    ),
}
# None: the benchmark's good run is vLLM's own client against the real vLLM CPU engine below
# (SGLang's bench_serving against a real SGLang needs the GPU machine; docs/operations.md).
GOOD_NOWHERE_YET: set[str] = set()
CASES = [
    (command, kind)
    for command, (_, good, _) in TABLE.items()
    for kind in ("good", "bad", "missing", "folder", *UNREACHABLE_KINDS)
    if not (kind == "good" and good is None)
]


def test_every_subcommand_is_in_the_table():
    parser = cli.build_parser()
    assert parser._subparsers is not None
    commands = set(parser._subparsers._group_actions[0].choices)  # argparse keeps them here (3.11-3.13)
    assert commands - {"vault", "lock", "lab"} == set(TABLE), "a subcommand without its row (or a row too many)"


@pytest.mark.parametrize(("command", "kind"), CASES, ids=[f"{c}-{k}" for c, k in CASES])
def test_the_status_of_each_subcommand_with_each_inventory(command, kind, sites, monkeypatch, tmp_path):
    words, good, unreachable = TABLE[command]
    monkeypatch.setenv("INFERENCE_HOST_VAULT_PASSWORD_FILE", str(sites["unreachable"].parent / "password"))
    if command in NODE_KIND and kind in UNREACHABLE_KINDS:
        inventory = sites["node" if kind == "unreachable" else f"{kind}-node"]
    else:
        inventory = sites["node"] if command in NODE_KIND and kind == "good" else sites[kind]
    if kind == "good" and command == "trust":
        import subprocess

        key = tmp_path / "host"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True, timeout=30)
    words = GOOD_ARGV.get(command, words) if kind == "good" else words
    argv = [word.format(inv=inventory, out=tmp_path) for word in words]
    argv += GOOD_EXTRA.get(command, []) if kind == "good" else []
    expected = good if kind == "good" else unreachable if kind in UNREACHABLE_KINDS else 2
    started = time.monotonic()
    code, said = run(argv, stdin="a-new-client-key-for-the-exit-code-table-0123\n")
    took = time.monotonic() - started
    assert code == expected, f"{' '.join(argv)}: exit {code}, expected {expected}\n{said[-3000:]}"
    assert "Traceback" not in said, said
    if kind in UNREACHABLE_KINDS and expected == 3:
        # one line per host, with its address, port and cause; no check ran (no verdict table)
        port = sites["ports"][kind]
        lines = [line for line in said.splitlines() if f"port {port}: " in line and "unreachable at" in line]
        assert lines, said
        assert all(len(line) < 450 for line in lines), lines
        cause, step = UNREACHABLE_KINDS[kind]
        assert re.search(cause, lines[0].partition("what to do:")[0]), lines[0]
        assert step in lines[0].partition("what to do:")[2], lines[0]
        assert not re.search(r"\| FAIL \||UNHEALTHY|[1-9]\d* failed", said), said
        assert took < 60, f"{' '.join(argv)}: {took:.0f} s"
    if kind in ("missing", "folder", "bad"):
        assert len([line for line in said.splitlines() if line.strip()]) <= 4, said


def test_every_good_case_is_run_somewhere():
    """A subcommand whose good case needs a machine names the lab test that runs it; that test
    exists, runs the subcommand (or the module it wraps) and asserts the table's status."""
    import ast

    for command, (_, good, _) in TABLE.items():
        if good is not None:
            assert command not in GOOD_ELSEWHERE, command
            continue
        if command in GOOD_NOWHERE_YET:
            continue
        assert command in GOOD_ELSEWHERE, f"{command}: no good case in this table, none named elsewhere"
        path, name, runs, asserts = GOOD_ELSEWHERE[command]
        tree = ast.parse((PROJECT_ROOT / path).read_text())
        functions = {node.name: node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
        assert name in functions, f"{command}: {path}::{name} is gone"
        source = ast.get_source_segment((PROJECT_ROOT / path).read_text(), functions[name]) or ""
        # run and judged in the test, in a helper it calls (_under_load) or a fixture of its file (report)
        called = {
            n.func.id for n in ast.walk(functions[name]) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
        } | {argument.arg for argument in functions[name].args.args}
        helpers = "".join(
            ast.get_source_segment((PROJECT_ROOT / path).read_text(), functions[c]) or ""
            for c in called & set(functions)
        )
        assert runs in source + helpers, f"{command}: {name} does not run {runs}"
        assert asserts in source + helpers, f"{command}: {name} does not assert {asserts}"
    assert GOOD_NOWHERE_YET == {c for c, (_, good, _) in TABLE.items() if good is None} - set(GOOD_ELSEWHERE)


def test_a_limit_that_matches_nothing_is_refused_before_pyinfra(sites):
    started = time.monotonic()
    code, said = run(["deploy", str(sites["unreachable"]), "-y", "--limit", "nosuchhost"])
    assert code == 2, said
    assert "--limit 'nosuchhost' matches no host or group" in said
    assert "Loading inventory" not in said  # pyinfra did not start
    assert time.monotonic() - started < 60


def test_every_subcommand_has_help_and_a_usage_error(sites):
    for command in [*TABLE, "vault", "lab"]:
        code, said = run([command, "--help"])
        assert code == 0, (command, said)
        code, said = run([command, str(sites["good"]), "--no-such-option"] if command in TABLE else [command, "nosuch"])
        assert code == 2, (command, said)
    assert run(["lock", "eagle3", "--help"])[0] == 0
    assert run(["lock", "nosuch"])[0] == 2


@pytest.fixture
def silent_listeners():
    """Listeners at 127.0.0.2-4 on one port that accept (the kernel completes the handshake) and
    never send a byte: ssh waits for a banner that never comes."""
    sockets = []
    port = 0
    for address in ("127.0.0.2", "127.0.0.3", "127.0.0.4"):
        listener = socket.socket()
        listener.bind((address, port))
        port = listener.getsockname()[1]
        listener.listen(8)
        sockets.append(listener)
    yield port
    for listener in sockets:
        listener.close()


def test_a_host_that_never_speaks_is_unreachable_within_the_connect_timeout(silent_listeners, tmp_path, monkeypatch):
    inventory = replicas_inventory(tmp_path / "silent", silent_listeners)
    monkeypatch.setenv("INFERENCE_HOST_VAULT_PASSWORD_FILE", str(inventory.parent / "password"))
    started = time.monotonic()
    code, said = run(["check", str(inventory), "--host", REPLICA, "--report", f"{tmp_path}/"])
    took = time.monotonic() - started
    assert code == 3, said
    line = [line for line in said.splitlines() if "unreachable at 127.0.0.2" in line]
    assert line and "timed out" in line[0], said  # OpenSSH: "Connection to ... timed out"
    assert took < 60, took
    code, said = run(["status", str(inventory), "--timeout", "3"])
    assert code == 3, said
    assert said.count("unreachable at 127.0.0.") + said.count("no answer within") == 3, said


@pytest.mark.parametrize(
    ("cause", "step"),
    [
        ("ssh: connect to host 10.0.0.5 port 22: Connection refused", "sshd is not listening on"),
        ("Could not connect ([Errno 111] Connection refused)", "sshd is not listening on"),
        ("ssh: connect to host 10.0.0.5 port 22: Connection timed out", "nothing answered on"),
        ("Connection to 10.0.0.5 port 22 timed out", "does not speak SSH"),  # OpenSSH: accepted, then silent
        ("Connection timed out during banner exchange", "does not speak SSH"),
        ("SSH error (No existing session)", "does not speak SSH"),  # paramiko 4.0: the same silence
        ("ssh: Could not resolve hostname gpu1: Name or service not known", "this machine's DNS"),
    ],
)
def test_the_next_step_follows_the_connectors_words(cause, step):
    from checks.reach import next_step, plain_cause

    assert step in next_step(cause, "10.0.0.5", "22")
    if "No existing session" in cause:
        assert plain_cause(cause).startswith("no SSH banner or key exchange within 10 s over an accepted connection")
    else:
        assert plain_cause(cause) == cause
