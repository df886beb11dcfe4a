"""Service suite: the engine's systemd unit is active, not restart-looping, its env file is
private, its rendered tensor-parallel size fits the GPUs it sees, and it listens on the
configured address only."""

from __future__ import annotations

import pytest

from checks import service_parsers, vllm_kv_log
from checks.probes import evidence, explain, report
from checks.server_checks import environment_file
from roles.shared import sglang_kv_log
from roles.shared.layout import CHECKS_USER
from roles.shared.shell import argv, sh

pytestmark = pytest.mark.service

UNIT_PROPERTIES = ("LoadState", "ActiveState", "SubState", "NRestarts", "MainPID", "Result", "ExecMainStartTimestamp")


@pytest.fixture(scope="module")
def unit(host, expect) -> dict[str, str]:
    if host.run("command -v systemctl").rc != 0:
        pytest.fail(
            explain(
                f"systemd to run {expect.unit_name}.service",
                "no systemctl on this host",
                "the engine runs as a systemd unit: use a guest with systemd as PID 1",
            )
        )
    properties = [word for p in UNIT_PROPERTIES for word in ("-p", p)]
    shown = host.run(argv("systemctl", "show", f"{expect.unit_name}.service", *properties))
    return service_parsers.parse_systemctl_show(shown.stdout)


def _require_loaded(unit, expect) -> None:
    if unit.get("LoadState") != "loaded":
        pytest.skip(
            f"{expect.unit_name}.service is not installed (LoadState={unit.get('LoadState')}): "
            "see the failed check 'unit active'"
        )


def test_unit_active(unit, expect, request):
    evidence(request, "unit_active", unit.get("ActiveState") == "active" and unit.get("SubState") == "running")
    assert unit.get("LoadState") == "loaded", explain(
        f"unit {expect.unit_name}.service installed",
        f"LoadState={unit.get('LoadState')}",
        "re-run the deploy (roles/serving writes the unit)",
    )
    assert unit.get("ActiveState") == "active" and unit.get("SubState") == "running", explain(
        f"{expect.unit_name}.service active (running)",
        f"{unit.get('ActiveState')} ({unit.get('SubState')}), result {unit.get('Result')}",
        f"`journalctl -u {expect.unit_name} -n 200`; `systemctl start {expect.unit_name}`",
    )
    report(request, f"active (running) since {unit.get('ExecMainStartTimestamp')}, pid {unit.get('MainPID')}")


def test_unit_not_restart_looping(unit, expect, request):
    _require_loaded(unit, expect)
    restarts = int(unit.get("NRestarts") or 0)
    evidence(request, "unit_restarts", restarts)
    assert restarts <= expect.max_unit_restarts, explain(
        f"at most {expect.max_unit_restarts} automatic restarts (health_max_unit_restarts)",
        f"{restarts} restarts",
        f"the server crashes and systemd restarts it: `journalctl -u "
        f"{expect.unit_name} -b` shows why (out of memory, a kernel missing for the GPU arch, a NCCL hang)",
    )
    report(request, f"{restarts} restarts")


def test_env_file_private(host, unit, expect, request):
    _require_loaded(unit, expect)
    path = environment_file(host, expect.unit_name)
    if path is None:
        pytest.skip(f"{expect.unit_name}.service has no EnvironmentFile: no secret to protect")
    env = host.file(path)
    assert env.exists, explain(f"{path} (the unit's EnvironmentFile)", "no such file", "re-run the deploy")
    # Read by root (systemd) and by the periodic checks' group, which run the engine's python with it.
    assert env.mode == 0o640 and (env.user, env.group) == ("root", CHECKS_USER), explain(
        f"{path} mode 0640 owned by root, group {CHECKS_USER} (serving_extra_env may hold keys)",
        f"mode {env.mode:04o} owner {env.user}:{env.group}",
        f"chmod 640 {path}; chown root:{CHECKS_USER} {path}; re-run the deploy",
    )
    report(request, f"{path} 0640 root:{CHECKS_USER}")


def visible_gpus(host, gpu, expect) -> tuple[int, str]:
    """The GPUs the engine sees: nvidia-smi's list (skips where there is none), narrowed by a
    CUDA_VISIBLE_DEVICES of the unit's env file. Only that one line is read off the host."""
    count, source = len(gpu.gpus), "nvidia-smi"
    shown = host.run(sh("grep -E '^CUDA_VISIBLE_DEVICES=' -- {file}", file=expect.env_file))
    visible = service_parsers.parse_env_assignment(shown.stdout, "CUDA_VISIBLE_DEVICES") if shown.rc == 0 else None
    if visible is not None:
        # CUDA counts the entries up to the first invalid one; an empty value hides every GPU.
        listed = [part for part in visible.split(",") if part.strip()]
        count, source = min(count, len(listed)), f"nvidia-smi and CUDA_VISIBLE_DEVICES={visible} in {expect.env_file}"
    return count, source


def judge_tensor_parallel(launcher: str, text: str, seen: int, source: str) -> str:
    """A problem of the rendered command line against the GPUs seen (explain's three parts), or ""."""
    parallel = service_parsers.parse_launcher_parallelism(text)
    if parallel is None:
        return explain(
            f"a tensor-parallel size ({' or '.join(service_parsers.TP_FLAGS)}) in {launcher}",
            "none",
            "re-run the deploy (roles/serving writes the launcher from gpu_count)",
        )
    if parallel.per_node == seen:
        return ""
    group = f" of {parallel.tp_size} over --nnodes {parallel.nnodes}" if parallel.nnodes > 1 else ""
    return explain(
        f"{parallel.flag}{group} to give this node as many ranks as the GPUs it sees ({seen}, {source})",
        f"{parallel.per_node} ranks per node in {launcher}",
        "if GPUs are missing see 'gpu count'; else correct gpu_count (the node's GPUs) in the "
        "inventory and re-run the deploy: roles/serving renders the size from it",
    )


def test_tensor_parallel_size_matches_the_gpus(host, unit, gpu, expect, request):
    _require_loaded(unit, expect)
    shown = host.run(sh("cat -- {file}", file=expect.launcher))
    assert shown.rc == 0, explain(
        f"{expect.launcher} (the unit's command line)",
        (shown.stderr.strip() or "no such file")[:300],
        "re-run the deploy",
    )
    if expect.engine_on_cpu:  # its ranks are not GPUs: one shard, whatever nvidia-smi lists
        seen, source = 1, "vllm_install_mode = cpu: vLLM's CPU build runs one shard on the CPUs"
    else:
        seen, source = visible_gpus(host, gpu, expect)
    problem = judge_tensor_parallel(expect.launcher, shown.stdout, seen, source)
    parallel = service_parsers.parse_launcher_parallelism(shown.stdout)
    evidence(request, "tensor_parallel_ranks", parallel.per_node if parallel else None)
    assert not problem, problem
    assert parallel is not None  # judge_tensor_parallel found the launcher's flags
    per_node = f" ({parallel.per_node} per node)" if parallel.nnodes > 1 else ""
    if expect.engine_on_cpu:
        report(request, f"{parallel.flag} {parallel.tp_size} = one shard ({source})")
    else:
        report(request, f"{parallel.flag} {parallel.tp_size}{per_node} = {seen} GPUs seen ({source})")


def test_listens_on_configured_address_only(host, unit, expect, request):
    _require_loaded(unit, expect)
    shown = host.run(sh("ss -Hltn {filter}", filter=f"sport = :{expect.serving_port}"))
    assert shown.rc == 0, explain("ss (iproute2) to list sockets", shown.stderr.strip(), "install iproute2")
    sockets = service_parsers.parse_ss_listening(shown.stdout)
    addresses = sorted({s.address for s in sockets})
    wildcard = {"0.0.0.0", "*", "::"}
    wanted = {expect.serving_host} | (wildcard if expect.serving_host in wildcard else set())
    assert addresses and set(addresses) <= wanted, explain(
        f"the server listening on {expect.serving_host}:{expect.serving_port} only (serving_host)",
        f"listening on {', '.join(addresses) or 'nothing'} port {expect.serving_port}",
        "nothing: the server is down (see 'unit active'); a wider address: the unit's --host is "
        "not the inventory's serving_host, re-run the deploy",
    )
    report(request, f"{', '.join(addresses)}:{expect.serving_port}")


def test_kv_cache_allocated(host, unit, expect, request):
    """The engine's own figure for its KV pool, from the unit's journal of its current run (SGLang:
    the line roles/shared/sglang_kv_log.py parses; vLLM: checks/vllm_kv_log.py's): reported
    beside the deploy's estimate, which the deploy's note "KV cache estimate" prints
    (docs/serving-memory.md)."""
    _require_loaded(unit, expect)
    if host.run("command -v journalctl").rc != 0:
        pytest.skip("no journalctl on this host: the engine's KV-cache line cannot be read")
    service = f"{expect.unit_name}.service"
    invocation = host.run(sh("systemctl show -p InvocationID --value -- {unit}", unit=service)).stdout.strip()
    if not invocation:
        pytest.skip(f"{expect.unit_name}.service has no current run (no InvocationID)")
    journal = host.run(
        sh("journalctl _SYSTEMD_INVOCATION_ID={run} -o cat --no-pager | grep -i 'kv cache'", run=invocation)
    )
    if expect.engine == "vllm":
        size = vllm_kv_log.kv_size(journal.stdout)
        if size is None:
            pytest.skip(
                'no "GPU KV cache size: N tokens" line in this run\'s journal (still loading, or'
                f" VLLM_LOGGING_LEVEL above INFO): `journalctl -u {expect.unit_name} -b | grep -i 'kv cache'`"
            )
        evidence(request, "kv_cache_tokens", size.tokens)
        memory = f", {size.memory_gib:.2f} GiB per worker" if size.memory_gib is not None else ""
        report(request, f"{size.tokens} tokens{memory} (vLLM's own line; compare with the deploy's KV cache estimate)")
        return
    found = sglang_kv_log.target_allocation(journal.stdout)
    if found is None:
        # A report, not a verdict: --log-level warning hides the line on a healthy server.
        pytest.skip(
            'no "KV Cache is allocated. #tokens: ..." line in this run\'s journal (still loading, or'
            f" --log-level above info): `journalctl -u {expect.unit_name} -b | grep -i 'kv cache'`"
        )
    evidence(request, "kv_cache_tokens", found.tokens)
    report(
        request,
        f"{found.tokens} tokens, {found.size_gib:.2f} GiB per GPU (SGLang's own line;"
        " compare with the deploy's KV cache estimate)",
    )
