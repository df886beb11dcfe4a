"""Service suite: the engine's systemd unit is active, not restart-looping, its env file is
private, and it listens on the configured address only."""

from __future__ import annotations

import pytest

from checks import gpu_parsers as parse
from checks.probes import evidence, explain, report
from checks.server_checks import environment_file

pytestmark = pytest.mark.service

UNIT_PROPERTIES = ("LoadState", "ActiveState", "SubState", "NRestarts", "MainPID", "Result",
                   "ExecMainStartTimestamp")


@pytest.fixture(scope="module")
def unit(host, expect) -> dict[str, str]:
    if host.run("command -v systemctl").rc != 0:
        pytest.fail(explain(f"systemd to run {expect.unit_name}.service", "no systemctl on this host",
                            "the engine runs as a systemd unit: use a guest with systemd as PID 1"))
    shown = host.run(f"systemctl show {expect.unit_name}.service "
                     + " ".join(f"-p {p}" for p in UNIT_PROPERTIES))
    return parse.parse_systemctl_show(shown.stdout)


def _require_loaded(unit, expect) -> None:
    if unit.get("LoadState") != "loaded":
        pytest.skip(f"{expect.unit_name}.service is not installed (LoadState={unit.get('LoadState')}): "
                    "see the failed check 'unit active'")


def test_unit_active(unit, expect, request):
    evidence(request, "unit_active", unit.get("ActiveState") == "active" and unit.get("SubState") == "running")
    assert unit.get("LoadState") == "loaded", explain(
        f"unit {expect.unit_name}.service installed", f"LoadState={unit.get('LoadState')}",
        "re-run the deploy (roles/serving writes the unit)")
    assert unit.get("ActiveState") == "active" and unit.get("SubState") == "running", explain(
        f"{expect.unit_name}.service active (running)",
        f"{unit.get('ActiveState')} ({unit.get('SubState')}), result {unit.get('Result')}",
        f"`journalctl -u {expect.unit_name} -n 200`; `systemctl start {expect.unit_name}`")
    report(request, f"active (running) since {unit.get('ExecMainStartTimestamp')}, pid {unit.get('MainPID')}")


def test_unit_not_restart_looping(unit, expect, request):
    _require_loaded(unit, expect)
    restarts = int(unit.get("NRestarts") or 0)
    evidence(request, "unit_restarts", restarts)
    assert restarts <= expect.max_unit_restarts, explain(
        f"at most {expect.max_unit_restarts} automatic restarts (health_max_unit_restarts)",
        f"{restarts} restarts", f"the server crashes and systemd restarts it: `journalctl -u "
        f"{expect.unit_name} -b` shows why (out of memory, a kernel missing for the GPU arch, a NCCL hang)")
    report(request, f"{restarts} restarts")


def test_env_file_private(host, unit, expect, request):
    _require_loaded(unit, expect)
    path = environment_file(host, expect.unit_name)
    if path is None:
        pytest.skip(f"{expect.unit_name}.service has no EnvironmentFile: no secret to protect")
    env = host.file(path)
    assert env.exists, explain(f"{path} (the unit's EnvironmentFile)", "no such file", "re-run the deploy")
    assert env.mode == 0o600 and env.user == "root", explain(
        f"{path} mode 0600 owned by root (it holds the API key / HF token)",
        f"mode {env.mode:04o} owner {env.user}", f"chmod 600 {path}; chown root {path}; re-run the deploy")
    report(request, f"{path} 0600 root")


def test_listens_on_configured_address_only(host, unit, expect, request):
    _require_loaded(unit, expect)
    shown = host.run(f"ss -Hltn 'sport = :{expect.serving_port}'")
    assert shown.rc == 0, explain("ss (iproute2) to list sockets", shown.stderr.strip(), "install iproute2")
    sockets = parse.parse_ss_listening(shown.stdout)
    addresses = sorted({s.address for s in sockets})
    wildcard = {"0.0.0.0", "*", "::"}
    wanted = {expect.serving_host} | (wildcard if expect.serving_host in wildcard else set())
    assert addresses and set(addresses) <= wanted, explain(
        f"the server listening on {expect.serving_host}:{expect.serving_port} only (serving_host)",
        f"listening on {', '.join(addresses) or 'nothing'} port {expect.serving_port}",
        "nothing: the server is down (see 'unit active'); a wider address: the unit's --host is "
        "not the inventory's serving_host, re-run the deploy")
    report(request, f"{', '.join(addresses)}:{expect.serving_port}")
