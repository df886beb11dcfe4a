"""The day-two operations of `inference-host` (docs/operations.md): status, drain, undrain, and
the bounded remote runs they share with rollback (inference_host/rollback.py), rotate
(inference_host/rotate.py) and teardown (inference_host/teardown.py).

Every remote call is bounded twice: each command on the host runs under `timeout -s KILL`, and
the whole answer of a host is waited for at most --timeout seconds (a host that does not answer
in time is reported as such, exit 3, and the others are still shown). Commands are built by
roles/shared/shell.py (every value quoted, as the roles' are) and read only what the deploy
wrote; no secret is read here: the gateway's key stays on the gateway host (checks/gateway.py's
request, the key to curl on a file descriptor).
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
import threading
import time
from dataclasses import asdict, dataclass, field

from inference_host.site_load import load as _load
from roles.shared.shell import Shell, argv, chain, sh
from roles.site.command_line import FAILED, OK, UNREACHABLE

SECTION = "@@inference-host-status "
COMMAND_BOUND_S = 3  # each command on a host; the host's whole answer: --timeout (default 4 s)
NVIDIA_SMI_FIELDS = ("index", "memory.used", "memory.total", "temperature.gpu")


# -- the commands each host runs ----------------------------------------------------------------


def time_bounded(command: Shell, seconds: int = COMMAND_BOUND_S) -> Shell:
    """`timeout -s KILL`: a wedged nvidia-smi or amtool is killed, not waited for."""
    return sh("timeout -s KILL {seconds} {command}", seconds=int(seconds), command=command)


def sections_script(parts: dict[str, Shell]) -> Shell:
    """One POSIX shell script: each part's output after its marker line, then its exit status."""
    # The status line on a line of its own: curl's -w output ends without a newline.
    lines = [
        sh(
            "echo {begin}; {command}; rc=$?; echo; echo {end} $rc",
            begin=SECTION + name,
            command=command,
            end=SECTION + "rc " + name,
        )
        for name, command in parts.items()
    ]
    return chain(*lines, operator="\n")


def status_script(site, host) -> Shell:
    """What `status` runs on one host, by the groups it is in."""
    from checks.gateway import gateway_on_its_host, request_command
    from roles.shared.layout import CHECKS_TEXTFILE, current_link, drained_marker_file

    parts: dict[str, Shell] = {"clock": sh("date +%s"), "uptime": sh("cat /proc/uptime")}
    if host.in_group("gpu_nodes"):
        root = host.base.install_root
        unit = f"{host.serving.unit_name}.service"
        parts |= {
            "current": time_bounded(sh("readlink -- {link}", link=current_link(root))),
            "kept": time_bounded(sh("ls -1 -- {envs}", envs=root + "/envs")),
            "unit": time_bounded(
                sh("systemctl show -p ActiveState -p SubState -p ActiveEnterTimestampMonotonic -- {unit}", unit=unit)
            ),
            "health": time_bounded(sh("cat -- {file}", file=CHECKS_TEXTFILE)),
            "gpus": time_bounded(
                sh(
                    "nvidia-smi --query-gpu={fields} --format=csv,noheader,nounits 2>&1",
                    fields=",".join(NVIDIA_SMI_FIELDS),
                )
            ),
            "drained": sh("test -e {marker}", marker=drained_marker_file(host.serving.unit_name)),
        }
    if host.in_group("gateways"):
        parts["workers"] = request_command(*gateway_on_its_host(host), "/workers", seconds=COMMAND_BOUND_S)
    if host.in_group("monitors"):
        parts["alerts"] = time_bounded(sh("amtool alert query -o json"))
    return sections_script(parts)


def split_sections(stdout: str) -> dict[str, tuple[str, int | None]]:
    """name -> (output, exit status) from a status script's output."""
    found: dict[str, list] = {}
    current = None
    for line in stdout.splitlines():
        if line.startswith(SECTION + "rc "):
            name, _, code = line[len(SECTION) + 3 :].partition(" ")
            if name in found:
                found[name][1] = int(code) if code.strip().isdigit() else None
            current = None
        elif line.startswith(SECTION):
            current = line[len(SECTION) :]
            found[current] = [[], None]
        elif current:
            found[current][0].append(line)
    return {name: ("\n".join(lines).removesuffix("\n"), code) for name, (lines, code) in found.items()}


# -- reading the answers (pure: unit-tested on captured output) --------------------------------


@dataclass
class HostStatus:
    name: str
    groups: list[str]
    answered: bool = True
    seconds: float = 0.0
    problem: str = ""
    stack: dict = field(default_factory=dict)
    engine: dict = field(default_factory=dict)
    health: dict = field(default_factory=dict)
    gpus: dict = field(default_factory=dict)
    replica: dict = field(default_factory=dict)
    workers: list = field(default_factory=list)
    alerts: dict = field(default_factory=dict)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    return f"{minutes}m {secs}s" if minutes else f"{secs}s"


def _killed(code: int | None) -> bool:
    return code in (124, 137)


def read_stack(sections: dict, install_root: str) -> dict:
    target, code = sections.get("current", ("", None))
    if code != 0 or not target.strip():
        return {"active": None, "problem": f"no {install_root}/current link (never deployed here?)"}
    env = target.strip().rstrip("/").rsplit("/", 1)[-1]
    kept_text, _ = sections.get("kept", ("", None))
    kept = sorted(line.strip() for line in kept_text.splitlines() if line.strip() and line.strip() != env)
    stack_id, _, stamp = env.rpartition("-")
    return {
        "active": stack_id or env,
        "environment": env,
        "lock": f"{install_root}/locks/{env}.txt",
        "stamp": stamp,
        "kept": kept,
    }


def read_engine(sections: dict, unit: str) -> dict:
    text, code = sections.get("unit", ("", None))
    values = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    uptime_text, _ = sections.get("uptime", ("", None))
    since = None
    try:
        entered_us = int(values.get("ActiveEnterTimestampMonotonic", "0"))
        now_s = float(uptime_text.split()[0])
        if entered_us and values.get("ActiveState") == "active":
            since = max(0.0, now_s - entered_us / 1e6)
    except (ValueError, IndexError):
        pass
    state = values.get("ActiveState", "unknown" if code else "?")
    return {"unit": unit, "state": state, "sub_state": values.get("SubState", "?"), "up_seconds": since}


_METRIC = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def read_health(sections: dict, path: str) -> dict:
    """The periodic checks' last verdict (checks/textfile.py's file) and its age."""
    text, code = sections.get("health", ("", None))
    if code != 0:
        return {"verdict": None, "problem": f"no periodic verdict yet ({path} unreadable)"}
    values: dict[str, str] = {}
    failed_checks: list[str] = []
    for line in text.splitlines():
        match = _METRIC.match(line)
        if not match:
            continue
        name, labels, value = match.groups()
        values.setdefault(name, value)
        if name == "inference_host_check_ok" and value in ("0", "0.0"):
            check = re.search(r'check="((?:[^"\\]|\\.)*)"', labels or "")
            failed_checks.append(check.group(1) if check else "?")
    try:
        ran_at = float(values["inference_host_checks_last_run_timestamp_seconds"])
        failed = int(float(values.get("inference_host_checks_failed", "0")))
    except (KeyError, ValueError):
        return {"verdict": None, "problem": f"{path} has no last-run timestamp"}
    clock_text, _ = sections.get("clock", ("", None))
    age = float(clock_text.strip()) - ran_at if clock_text.strip().isdigit() else None
    return {
        "verdict": "healthy" if failed == 0 else "failed",
        "failed": failed,
        "failed_checks": sorted(set(failed_checks)),
        "age_seconds": age,
    }


def read_gpus(sections: dict) -> dict:
    text, code = sections.get("gpus", ("", None))
    if _killed(code):
        return {"count": None, "problem": f"nvidia-smi gave no answer within {COMMAND_BOUND_S} s (killed)"}
    if code != 0:
        first = (text.strip().splitlines() or ["no output"])[0][:160]
        return {"count": None, "problem": f"nvidia-smi exit {code}: {first}"}
    from checks.gpu_parsers import parse_csv

    rows = parse_csv(text, NVIDIA_SMI_FIELDS)

    def number(row, key):
        try:
            return float(re.sub(r"[^0-9.]", "", row.get(key) or "") or "nan")
        except ValueError:
            return float("nan")

    used = [number(r, "memory.used") for r in rows]
    total = [number(r, "memory.total") for r in rows]
    temps = [number(r, "temperature.gpu") for r in rows]
    return {
        "count": len(rows),
        "memory_used_mib": round(sum(u for u in used if u == u)),
        "memory_total_mib": round(sum(t for t in total if t == t)),
        "temperature_c": [None if t != t else round(t) for t in temps],
    }


def read_workers(sections: dict) -> tuple[list, str]:
    from checks.server_checks import parse_curl_output

    text, _ = sections.get("workers", ("", None))
    answer = parse_curl_output(text, "")
    if answer.status != 200:
        return [], f"GET /workers: {f'HTTP {answer.status}' if answer.status else 'no answer'} {answer.error}".strip()
    try:
        workers = answer.json().get("workers", [])
    except ValueError:
        return [], "GET /workers: not JSON"
    keep = ("url", "status", "is_healthy", "load")
    return [{k: w.get(k) for k in keep} for w in workers], ""


def read_alerts(sections: dict) -> dict:
    text, code = sections.get("alerts", ("", None))
    if _killed(code):
        return {"firing": None, "problem": f"amtool gave no answer within {COMMAND_BOUND_S} s (killed)"}
    if code != 0:
        return {"firing": None, "problem": f"amtool exit {code}: {(text.strip().splitlines() or [''])[-1][:160]}"}
    try:
        alerts = json.loads(text or "[]")
    except ValueError:
        return {"firing": None, "problem": "amtool's answer is not JSON"}
    firing = [
        {"alertname": a.get("labels", {}).get("alertname", "?"), "severity": a.get("labels", {}).get("severity", "")}
        for a in alerts
        if (a.get("status") or {}).get("state", "active") == "active"
    ]
    return {"firing": firing}


def host_status(site, host, stdout: str) -> HostStatus:
    from roles.shared.layout import CHECKS_TEXTFILE

    sections = split_sections(stdout)
    status = HostStatus(host.name, list(host.groups))
    if host.in_group("gpu_nodes"):
        status.stack = read_stack(sections, host.base.install_root)
        status.engine = read_engine(sections, f"{host.serving.unit_name}.service")
        status.health = read_health(sections, CHECKS_TEXTFILE)
        status.gpus = read_gpus(sections)
        status.replica = {"drained_on_purpose": sections.get("drained", ("", 1))[1] == 0}
    if host.in_group("gateways"):
        status.workers, problem = read_workers(sections)
        if problem:
            status.problem = problem
    if host.in_group("monitors"):
        status.alerts = read_alerts(sections)
    return status


def worker_states(site, statuses: list[HostStatus]) -> dict[str, str]:
    """Each replica's state at the gateways: ready, draining, unhealthy or out (not listed)."""
    from roles.shared.replicas import replicas, worker_url

    listed: dict[str, list[str]] = {}
    for status in statuses:
        for worker in status.workers:
            state = str(worker.get("status") or "?").lower()
            if state == "ready" and not worker.get("is_healthy"):
                state = "unhealthy"
            listed.setdefault(worker.get("url"), []).append(f"{state} at {status.name} (load {worker.get('load')})")
    return {node.name: "; ".join(listed.get(worker_url(node), ["out (not listed)"])) for node in replicas(site.hosts)}


def render(statuses: list[HostStatus], replica_states: dict[str, str]) -> str:
    lines = []
    for s in statuses:
        lines.append(f"== {s.name} ({', '.join(s.groups)})  " + (f"{s.seconds:.1f} s" if s.answered else ""))
        if not s.answered:
            lines.append(f"   {s.problem}" if s.problem.startswith("unreachable") else f"   unreachable: {s.problem}")
            continue
        if s.stack:
            st = s.stack
            lines.append(
                f"   stack    {st['active']} (lock {st['lock']}); kept for rollback: {', '.join(st['kept']) or 'none'}"
                if st.get("active")
                else f"   stack    {st['problem']}"
            )
        if s.engine:
            e = s.engine
            up = f", up {_duration(e['up_seconds'])}" if e["up_seconds"] is not None else ""
            lines.append(f"   engine   {e['unit']} {e['state']} ({e['sub_state']}){up}")
        if s.health:
            h = s.health
            if h.get("verdict"):
                failed = f": {', '.join(h['failed_checks'])}" if h["failed_checks"] else ""
                lines.append(
                    f"   health   {h['verdict']} ({h['failed']} failed{failed}), {_duration(h['age_seconds'])} ago"
                )
            else:
                lines.append(f"   health   {h['problem']}")
        if s.gpus:
            g = s.gpus
            if g.get("count") is None:
                lines.append(f"   gpus     {g['problem']}")
            else:
                temps = [t for t in g["temperature_c"] if t is not None]
                heat = f", {min(temps)}-{max(temps)} C" if temps else ""
                lines.append(
                    f"   gpus     {g['count']}, memory used {g['memory_used_mib']} of {g['memory_total_mib']} MiB{heat}"
                )
        if s.name in replica_states:
            drained = " (drained with inference-host drain)" if s.replica.get("drained_on_purpose") else ""
            lines.append(f"   replica  {replica_states[s.name]}{drained}")
        if s.workers or "gateways" in s.groups:
            lines.append(f"   gateway  {len(s.workers)} worker(s) listed" + (f"; {s.problem}" if s.problem else ""))
        if s.alerts:
            a = s.alerts
            if a.get("firing") is None:
                lines.append(f"   alerts   {a['problem']}")
            else:
                names = ", ".join(f"{x['alertname']} ({x['severity']})" for x in a["firing"])
                lines.append(f"   alerts   {len(a['firing'])} firing" + (f": {names}" if names else ""))
    return "\n".join(lines)


# -- running on the hosts, bounded -----------------------------------------------------------------


def _on_host(inventory: str, name: str, script: Shell, answer: dict, timeout_s: float = 60.0) -> None:
    """Runs the script on the host, bounded (checks/bounded.py): the connection and the script
    within timeout_s; answer["runner"] lets run_everywhere kill what is left when it gives up."""
    from checks import bounded
    from checks.connection import testinfra_url
    from checks.reach import reason

    try:
        url = testinfra_url(inventory, name)
        # asked first, within the wait: the address, the port and ssh's own cause, in one line
        why = reason(url, timeout_s=max(1.0, timeout_s - 1), started=lambda probe: _probing(answer, probe))
        if why:
            answer["error"] = why
            return
        host = bounded.own_host(url, deadline_s=timeout_s)
        answer["runner"] = host.backend._ih_runner
        if answer.get("given_up"):  # run_everywhere stopped waiting before the runner was here
            answer["runner"].stop()
        result = bounded.run(host, sh("sh -c {script}", script=str(script)), bound_s=timeout_s)
        if SECTION not in result.stdout:  # the connection itself failed (ssh, docker exec)
            why = (result.stderr.strip().splitlines() or [f"exit {result.rc}, no output"])[-1]
            answer["error"] = f"no answer: {why[:200]}"
            return
        answer["stdout"], answer["rc"] = result.stdout, result.rc
    except bounded.CommandOverrun as error:  # its own line: the connection or the script, the next step
        answer["error"] = str(error)
    except Exception as error:  # an unreachable host is one line, not a traceback
        answer["error"] = f"{type(error).__name__}: {str(error).strip()[:200]}"
    except KeyboardInterrupt:  # under pyinfra's gevent a thread is a greenlet, and Ctrl-C may land
        answer["interrupted"] = True  # in it: run_everywhere raises it again where it waits


def _probing(answer: dict, probe) -> None:
    """The reachability ssh, kept where run_everywhere can kill it when it stops waiting."""
    answer["probe"] = probe
    if answer.get("given_up"):
        probe.kill()


def run_everywhere(inventory: str, scripts: dict[str, Shell], timeout_s: float) -> dict[str, dict]:
    """host name -> {"stdout", "rc"} or {"error"}; every host at once, none waited for longer
    than timeout_s. A host given up on has its ssh (or docker exec) killed, not left running
    after this command exits (a thread left behind is a daemon)."""
    answers: dict[str, dict] = {name: {} for name in scripts}
    threads = {}
    started = time.monotonic()
    for name, script in scripts.items():
        thread = threading.Thread(
            target=_on_host, args=(inventory, name, script, answers[name]), kwargs={"timeout_s": timeout_s}, daemon=True
        )
        thread.start()
        threads[name] = thread
    for name, thread in threads.items():
        thread.join(max(0.0, timeout_s - (time.monotonic() - started)))
        slot = answers[name]
        if thread.is_alive():  # given up: _on_host stops its runner itself if it has none yet
            slot["given_up"] = True
            if slot.get("probe") is not None:
                slot["probe"].kill()
            if slot.get("runner") is not None:
                slot["runner"].stop()
        if slot.get("interrupted"):
            raise KeyboardInterrupt
        answers[name] = {key: value for key, value in slot.items() if key not in ("runner", "given_up", "probe")}
        answers[name]["seconds"] = round(time.monotonic() - started, 2)
        if thread.is_alive():
            answers[name] = {
                "error": f"no answer within {timeout_s:g} s; what to do: `ssh -v {name} true` from here, "
                "and a longer --timeout if the host is only slow",
                "seconds": timeout_s,
            }
    return answers


def status(args, parser) -> int:
    site = _load(parser, args.inventory)
    hosts = [h for h in site.hosts.values() if {"gpu_nodes", "gateways", "monitors"} & set(h.groups)]
    if args.host:
        unknown = [n for n in args.host if n not in site.hosts]
        if unknown:
            parser.error(f"no host {unknown[0]!r} in {args.inventory}; expected one of: {', '.join(site.hosts)}")
        hosts = [h for h in hosts if h.name in args.host]
    answers = run_everywhere(args.inventory, {h.name: status_script(site, h) for h in hosts}, args.timeout)
    statuses = []
    for host in hosts:
        answer = answers[host.name]
        if "error" in answer:
            statuses.append(HostStatus(host.name, list(host.groups), answered=False, problem=answer["error"]))
            continue
        status = host_status(site, host, answer["stdout"])
        status.seconds = answer["seconds"]
        statuses.append(status)
    replica_states = worker_states(site, statuses)
    code = OK if all(s.answered for s in statuses) else UNREACHABLE
    if args.json:
        print(json.dumps({"hosts": [asdict(s) for s in statuses], "replicas": replica_states, "status": code}))
    else:
        print(render(statuses, replica_states))
    return code


# -- drain / undrain: the rolling upgrade's own script -------------------------------------------


PROGRESS_EVERY_S = 10.0


@contextlib.contextmanager
def progress(what: str, bound_s: float, stream=None, every_s: float = PROGRESS_EVERY_S):
    """At a terminal, a line every every_s seconds while the block runs (a drain waits minutes
    for in-flight requests, and said nothing until it ended); nothing into a file or a pipe."""
    stream = stream or sys.stderr
    if not stream.isatty():
        yield
        return
    done = threading.Event()
    started = time.monotonic()

    def tick() -> None:
        while not done.wait(every_s):
            print(f"{what}: {time.monotonic() - started:.0f} s, still waiting (at most {bound_s:.0f} s)", file=stream)
            stream.flush()

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        yield
    finally:
        done.set()
        ticker.join(1)


def _replica(parser, site, name: str):
    from roles.shared.replicas import gateways, replicas

    nodes = replicas(site.hosts)
    node = site.hosts.get(name)
    if node is None or node not in nodes:
        parser.error(f"{name!r} is not a replica of this site; expected one of: {', '.join(n.name for n in nodes)}")
    if not gateways(site.hosts) or node.serving.topology != "replicas":
        parser.error(f"{name!r} is behind no gateway (no gateways group, or serving_topology is not replicas)")
    return node


def drain(args, parser, undrain: bool = False) -> int:
    """inference-engine-rolling --drain-only / --undrain-only on the replica: the rolling
    upgrade's take-out and wait (smg's in-flight count and the engine's gauges, read twice) or its
    add-back (a generation first, then POST /workers, then healthy at every gateway)."""
    from checks import bounded
    from checks.connection import testinfra_url
    from checks.reach import unreachable
    from roles.serving import rolling_argv

    site = _load(parser, args.inventory)
    node = _replica(parser, site, args.replica)
    words = rolling_argv(node, site.hosts, "--undrain-only" if undrain else "--drain-only") + ["true"]
    # The script's own waits are bounded (the drain: serving_drain_timeout_s; the add-back: the
    # settle time + 30 s, then 120 s per gateway); this bound is theirs plus a margin.
    bound = node.serving.drain_timeout_s + 30 + 120 * max(1, len(site.group("gateways"))) + 60
    command = time_bounded(argv(*words), bound)
    started = time.monotonic()
    url = testinfra_url(args.inventory, node.name)
    gone = unreachable(url, node.name)
    if gone:
        print(f"inference-host {'undrain' if undrain else 'drain'}: {gone}; nothing changed", file=sys.stderr)
        return UNREACHABLE
    try:
        # bounded here too (checks/bounded.py): an ssh that never connects (DNS, a wedged sshd)
        # or loses the host mid-drain is killed, not waited on for ever
        host = bounded.own_host(url)
        with progress(f"{node.name}: {'undrain' if undrain else 'drain'}", bound + 10):
            result = bounded.run(host, command, bound_s=bound + 10)
    except bounded.CommandOverrun as error:
        print(f"{node.name}: {error}", file=sys.stderr)
        return UNREACHABLE if "connection" in host.backend._ih_runner.overran else FAILED
    except Exception as error:
        print(f"{node.name}: could not be reached: {type(error).__name__}: {str(error)[:200]}", file=sys.stderr)
        return UNREACHABLE
    took = time.monotonic() - started
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    what = "undrain" if undrain else "drain"
    if result.rc == 0:
        print(f"{node.name}: {what} done in {took:.1f} s")
        return OK
    if result.rc in (124, 137):
        print(f"{node.name}: {what} did not finish within {bound} s; see `inference-host status`", file=sys.stderr)
    elif result.rc == 3:
        return UNREACHABLE
    return FAILED


def add_parsers(commands) -> None:

    def inventory(sub):
        sub.add_argument("inventory", help="inventory file, e.g. inventory/prod.py")

    sub = commands.add_parser(
        "status",
        help="what each host is doing now (within seconds)",
        description="One screen per host: active stack and its lock, engine unit state and uptime, the "
        "last periodic health verdict and its age, GPUs, replicas at the gateways, firing alerts.",
    )
    inventory(sub)
    sub.add_argument("--host", action="append", default=[], help="only this host (repeat)")
    sub.add_argument("--json", action="store_true", help="one JSON object on stdout")
    sub.add_argument(
        "--timeout", type=seconds_option, default=4.0, metavar="SECONDS", help="wait at most this long for a host (4)"
    )
    sub.set_defaults(run=status)

    for name, undrain, text in (
        ("drain", False, "take a replica out of every gateway and wait until nothing is in flight to it"),
        ("undrain", True, "put a drained replica back into every gateway, once it answers a generation"),
    ):
        sub = commands.add_parser(name, help=text, description=text + ".")
        inventory(sub)
        sub.add_argument("replica", help="the replica's inventory host name (a gpu node behind the gateways)")
        sub.set_defaults(run=lambda args, parser, undrain=undrain: drain(args, parser, undrain))


def seconds_option(text: str) -> float:
    import argparse

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a number of seconds") from None
    if not 0.5 <= value <= 300:
        raise argparse.ArgumentTypeError(f"{value:g} is out of range; expected 0.5 to 300 seconds")
    return value
