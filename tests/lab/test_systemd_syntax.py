"""Every kind of value the deploy writes for systemd, read back by systemd itself (252, the lab's
Debian 12): 2,000 generated hostile values through each encoder of roles/shared/systemd_syntax.py,
in a few unit files and one EnvironmentFile, parsed by one systemd as PID 1 (daemon-reload,
`systemctl show`, `busctl`, and the units run). Each value either reads back byte for byte or
was refused by the encoder. Also the issue's cases: a path with a space and a planted `%h`.
One throwaway container, its name under INFERENCE_HOST_LAB_PREFIX; 23-36 s."""

from __future__ import annotations

import json
import random
import shlex
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

import lab
from roles.shared import systemd_syntax as sd
from tests.lab.harness import require_docker

COUNT = 2000
SEED = 38
PIECES = [
    " ",
    "  ",
    "%",
    "%h",
    "%n",
    "%%",
    "$",
    "$HOME",
    "${X}",
    "$$",
    "'",
    '"',
    "`",
    "\\",
    "\\\\",
    "\\n",
    ";",
    " ; ",
    "#",
    "=",
    ",",
    "-",
    "--api-key",
    "/",
    "é",
    "漢字",
    "🙂",
    "\u200b",
    "\u202e",
    "\t",
    "{",
    "}",
    "*",
    "a",
    "b",
    "z9",
    "_",
    ".",
    "..",
    "~",
]


def hostile_values(count: int = COUNT, seed: int = SEED) -> list[str]:
    """Seeded: the same values every run. Short words of hostile pieces, some empty-ish."""
    rng = random.Random(seed)
    values = ["", " ", "%h", "/var/lib/sg lang /", "a\\", "\\", ";", '"', "'"]
    while len(values) < count:
        values.append("".join(rng.choice(PIECES) for _ in range(rng.randint(1, 8))))
    return values


def _docker(*args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=check, input=input)


@pytest.fixture(scope="module")
def systemd_container():
    require_docker()
    name = lab.container_name("syntax")
    _docker("rm", "-f", name, check=False)
    _docker("run", "-d", "--name", name, "--label", "inference-host.lab=1", *lab.SYSTEMD_RUN_FLAGS, lab.systemd_image())
    lab._wait_for_systemd(name)
    yield name
    _docker("rm", "-f", name, check=False)


def _install(container: str, files: dict[str, str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for path, text in files.items():
            target = Path(tmp) / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        subprocess.run(
            f"tar -C {shlex.quote(tmp)} -c . | docker exec -i {container} tar -C / -x", shell=True, check=True
        )
    _docker("exec", container, "systemctl", "daemon-reload")


def _exec(container: str, *argv: str) -> str:
    return _docker("exec", container, *argv).stdout


def _busctl(container: str, unit: str, prop: str, interface: str = "Service"):
    path = "/org/freedesktop/systemd1/unit/" + "".join(c if c.isalnum() else f"_{ord(c):02x}" for c in unit)
    out = _exec(
        container,
        "busctl",
        "--json=short",
        "get-property",
        "org.freedesktop.systemd1",
        path,
        f"org.freedesktop.systemd1.{interface}",
        prop,
    )
    return json.loads(out)["data"]


def _encode(encoder, value):
    try:
        return encoder(value)
    except sd.EncodingError:
        return None


def _simplified(path: str) -> str:
    """What systemd's path_simplify makes of a path (doubled and trailing `/`, `.` parts dropped):
    the same directory, the form `systemctl show` prints."""
    parts = [p for p in path.split("/") if p not in ("", ".")]
    return "/" + "/".join(parts)


def _run_unit(container: str, unit: str, output: str) -> bytes:
    _docker("exec", container, "systemctl", "start", unit)
    return subprocess.run(["docker", "exec", container, "cat", output], capture_output=True, check=True).stdout


def test_every_encoded_value_reads_back_unchanged(systemd_container):
    started = time.monotonic()
    values = hostile_values()
    files, units = {}, []
    # Free text and single paths (one per unit: Description=, WorkingDirectory= hold one value).
    text_ok = {i: _encode(sd.text, v) for i, v in enumerate(values)}
    dirs_ok = {i: _encode(sd.path, "/srv/" + v) for i, v in enumerate(values)}
    for i in range(len(values)):
        lines = ["[Unit]"] + ([f"Description={text_ok[i]}"] if text_ok[i] is not None else [])
        lines += ["[Service]", "ExecStart=/bin/true"] + ([f"WorkingDirectory={dirs_ok[i]}"] if dirs_ok[i] else [])
        files[f"/etc/systemd/system/sx-{i}.service"] = "\n".join(lines) + "\n"
        units.append(f"sx-{i}.service")
    # Lists, Environment= and argv: all values in one unit, run once.
    paths = [p for p in (f"/srv/{i}/{v}" for i, v in enumerate(values)) if _encode(sd.path_list, [p])]
    env_unit = [sd.environment(f"E{i}", v) for i, v in enumerate(values) if _encode(sd.env_value, v) and "\n" not in v]
    argv = ["/usr/bin/printf", "%s\\0", *values]
    env_file_values = {f"F{i}": v for i, v in enumerate(values)}
    files["/etc/sysd/values.env"] = "# hostile values\n" + "".join(
        sd.env_assignment(k, v) + "\n" for k, v in env_file_values.items()
    )
    files["/etc/sysd/args.env"] = f"ARGS={sd.env_words(values)}\n"
    files["/etc/systemd/system/sx-all.service"] = "\n".join(
        [
            "[Service]",
            "Type=oneshot",
            "ProtectSystem=strict",
            *(f"ReadWritePaths=-{sd.path_list([p])}" for p in paths),
            *(f"Environment={e}" for e in env_unit),
            f"ExecStart={sd.argv(argv)}",
            "StandardOutput=file:/run/sx-argv.out",
            "",
        ]
    )
    files["/etc/systemd/system/sx-env.service"] = "\n".join(
        [
            "[Service]",
            "Type=oneshot",
            "EnvironmentFile=/etc/sysd/values.env",
            *(f"Environment={e}" for e in env_unit),
            "ExecStart=/usr/bin/env -0",
            "StandardOutput=file:/run/sx-env.out",
            "",
        ]
    )
    # Debian's packaged units: ExecStart=/usr/bin/prometheus $ARGS (split with EXTRACT_UNQUOTE).
    files["/etc/systemd/system/sx-args.service"] = "\n".join(
        [
            "[Service]",
            "Type=oneshot",
            "EnvironmentFile=/etc/sysd/args.env",
            "ExecStart=/usr/bin/printf %%s\\0 $ARGS",
            "StandardOutput=file:/run/sx-args.out",
            "",
        ]
    )
    _install(systemd_container, files)

    shown = _exec(systemd_container, "systemctl", "show", "-p", "Id,Description,WorkingDirectory", *units)
    blocks = {}
    for block in shown.strip("\n").split("\n\n"):
        props = dict(line.split("=", 1) for line in block.split("\n"))
        blocks[props["Id"]] = props
    for i, value in enumerate(values):
        props = blocks[f"sx-{i}.service"]
        if text_ok[i] is not None:
            assert props["Description"] == value, (i, value)
        if dirs_ok[i] is not None:
            assert props["WorkingDirectory"] == _simplified("/srv/" + value), (i, value)
    assert sum(v is not None for v in text_ok.values()) > COUNT * 0.7  # refusals are the exception

    read_write = _busctl(systemd_container, "sx-all.service", "ReadWritePaths")
    assert sorted(read_write) == sorted({"-" + _simplified(p) for p in paths})
    argv_out = _run_unit(systemd_container, "sx-all.service", "/run/sx-argv.out").decode()
    assert argv_out.split("\0")[:-1] == values

    env_out = _run_unit(systemd_container, "sx-env.service", "/run/sx-env.out").decode()
    env = dict(item.split("=", 1) for item in env_out.split("\0") if item)
    assert {k: env[k] for k in env_file_values} == env_file_values
    expected_unit_env = {
        e.split("=", 1)[0].strip('"'): values[int(e.split("=", 1)[0].strip('"')[1:])] for e in env_unit
    }
    assert {k: env[k] for k in expected_unit_env} == expected_unit_env

    args_out = _run_unit(systemd_container, "sx-args.service", "/run/sx-args.out").decode()
    assert args_out.split("\0")[:-1] == values
    # A transient service's command (the engine preflight's systemd-run), expanded like ExecStart=.
    transient = _exec(
        systemd_container,
        "systemd-run",
        "--quiet",
        "--wait",
        "--pipe",
        "--collect",
        *sd.transient_argv(["/usr/bin/printf", "%s\\0", *values]),
    )
    assert transient.split("\0")[:-1] == values
    print(f"\n{len(values)} values x 7 encoders read back by systemd in {time.monotonic() - started:.1f} s")


PLANTED_DATA_DIR = "/var/lib/sg lang /"
PLANTED_MODEL = "kimi-%h"


def _planted_site(tmp_path: Path):
    """inventory/stack.yml with one gpu node: the issue's space in a path and a `%h` in a name."""
    import shutil

    from roles.site import PROJECT_ROOT, load_site

    folder = tmp_path / "inventory"
    folder.mkdir()
    shutil.copy(PROJECT_ROOT / "inventory" / "stack.yml", folder)
    shutil.copytree(PROJECT_ROOT / "inventory" / "locks", folder / "locks")
    (folder / "site.py").write_text(
        f"gpu_nodes = [('gpu1', {{'gpu_count': 8, 'base_data_dir': {PLANTED_DATA_DIR!r},"
        f" 'serving_served_model_name': {PLANTED_MODEL!r}}})]\n"
    )
    return load_site(folder / "site.py")


def _engine_files(site, unit: str) -> dict[str, str]:
    return _engine_files_of(site, site.hosts["gpu1"], unit)


def _read_back(container: str, unit: str) -> dict:
    env_out = _run_unit(container, f"{unit}-env.service", f"/run/{unit}-env.out").decode()
    env = dict(item.split("=", 1) for item in env_out.split("\0") if item)
    return dict(
        paths=_busctl(container, f"{unit}.service", "ReadWritePaths"),
        description=_busctl(container, f"{unit}.service", "Description", "Unit"),
        workdir=_busctl(container, f"{unit}.service", "WorkingDirectory"),
        hf_home=env["HF_HOME"],
    )


def test_the_issues_planted_values_arrive_unchanged_and_the_old_rendering_did_not(
    systemd_container, tmp_path, monkeypatch
):
    site = _planted_site(tmp_path)
    _install(systemd_container, _engine_files(site, "sx-engine"))
    now = _read_back(systemd_container, "sx-engine")
    # One writable path, the planted one: the folder `sg lang ` (its trailing blank too); systemd
    # drops the trailing `/` (the same directory).
    assert now["paths"] == ["/var/lib/sg lang ", "/var/log/inference-engine"]
    assert now["workdir"] == "/var/lib/sg lang "
    assert f"({PLANTED_MODEL}, stack" in now["description"]
    assert now["hf_home"] == f"{PLANTED_DATA_DIR}/.cache/huggingface"

    # The old rendering: the same templates with the values written raw (no quoting, no `%%`).
    monkeypatch.setattr(sd, "_quoted", lambda value: value)
    monkeypatch.setattr(sd, "_specifiers", lambda value: value)
    _install(systemd_container, _engine_files(site, "sx-raw"))
    raw = _read_back(systemd_container, "sx-raw")
    assert "/" in raw["paths"] and "/var/lib/sg" in raw["paths"]  # the whole file system writable
    assert f"({PLANTED_MODEL}, stack" not in raw["description"]  # %h expanded to root's home


# --- the inventories' own settings, through the site model and the templates, read back by systemd ---

# (inventory, setting, how a generated value becomes the setting, what systemd must read back):
# every inventory setting that reaches the engine's unit or its EnvironmentFile.
INVENTORY_SLOTS = [
    ("prod", "base_data_dir", lambda v: "/srv/" + v, "data_dir"),
    ("prod", "base_log_dir", lambda v: "/var/log/" + v, "log_dir"),
    ("prod", "serving_served_model_name", lambda v: "m" + v, "model"),
    ("prod", "serving_extra_env", lambda v: {"IH_READ_BACK": v}, "extra_env"),
    ("lab", "base_data_dir", lambda v: "/srv/" + v, "data_dir"),
    ("lab", "serving_served_model_name", lambda v: "m" + v, "model"),
    ("lab_replicas", "base_log_dir", lambda v: "/var/log/" + v, "log_dir"),
    ("lab_replicas", "serving_extra_env", lambda v: {"IH_READ_BACK": v}, "extra_env"),
    ("two-node", "base_data_dir", lambda v: "/srv/" + v, "data_dir"),
    ("two-node", "serving_served_model_name", lambda v: "m" + v, "model"),
]
INVENTORY_COUNT = 400


class _Inventory:
    """One inventory as pyinfra reads it, each host's data retyped with one value changed through
    the site model's per-value rules (build_host) and the engine's systemd check (ROLE_CHECKS)."""

    def __init__(self, path: Path):
        from roles.site import load_site
        from roles.site.errors import display
        from roles.site.loading import _pyinfra_inventory

        self.site, self.where = load_site(path), display(path)
        self.data = {host.name: host.data.dict() for host in _pyinfra_inventory(path)}

    def retyped(self, key: str, value):
        """(site with the first gpu node retyped, that node, its problems)."""
        import dataclasses

        from roles import serving
        from roles.site.schema import build_host

        host = self.site.group("gpu_nodes")[0]
        problems: list[str] = []
        node = build_host(host.name, host.groups, {**self.data[host.name], key: value}, self.where, problems)
        site = dataclasses.replace(self.site, hosts={**self.site.hosts, host.name: node})
        if not problems:
            problems = serving.systemd_problems(node, site.hosts, site.stack.active)
        return site, node, problems


def _two_node_inventory(folder: Path) -> Path:
    import shutil

    from roles.site import PROJECT_ROOT

    folder.mkdir()
    shutil.copy(PROJECT_ROOT / "inventory" / "stack.yml", folder)
    shutil.copytree(PROJECT_ROOT / "inventory" / "locks", folder / "locks")
    tp = {
        "gpu_count": 8,
        "serving_topology": "tensor_parallel",
        "nccl_ib_disable": True,
        "nccl_socket_ifname": "ens1f0",
    }
    (folder / "two_node.py").write_text(
        f"gpu_nodes = [('node-a', {{**{tp!r}, 'ssh_hostname': '10.0.0.11'}}),"
        f" ('node-b', {{**{tp!r}, 'ssh_hostname': '10.0.0.12'}})]\n"
    )
    return folder / "two_node.py"


def _read_back_all(container: str, units: list[str]) -> tuple[dict, dict]:
    """Each engine unit's properties (busctl, JSON) and each env unit's `env -0`, in two docker execs."""
    script = "".join(
        f"for p in ReadWritePaths WorkingDirectory; do busctl --json=short get-property org.freedesktop.systemd1"
        f" /org/freedesktop/systemd1/unit/{''.join(c if c.isalnum() else f'_{ord(c):02x}' for c in u + '.service')}"
        f" org.freedesktop.systemd1.Service $p; done; systemctl show -p Description --value {u}.service;\n"
        for u in units
    )
    lines = _docker("exec", "-i", container, "sh", input=script).stdout.split("\n")
    props = {
        u: dict(
            paths=json.loads(lines[3 * i])["data"],
            workdir=json.loads(lines[3 * i + 1])["data"],
            description=lines[3 * i + 2],
        )
        for i, u in enumerate(units)
    }
    _docker("exec", container, "systemctl", "start", *(f"{u}-env.service" for u in units))
    outputs = subprocess.run(
        [
            "docker",
            "exec",
            container,
            "sh",
            "-c",
            'for u in "$@"; do cat /run/$u-env.out | base64 -w0; echo; done',
            "sh",
            *units,
        ],
        capture_output=True,
        check=True,
        text=True,
    ).stdout.split("\n")
    import base64

    envs = {
        u: dict(item.split("=", 1) for item in base64.b64decode(outputs[i]).decode().split("\0") if item)
        for i, u in enumerate(units)
    }
    return props, envs


def test_hostile_values_in_every_inventorys_settings_reach_systemd_unchanged_or_are_refused(
    systemd_container, tmp_path
):
    """The issue's property test at the inventory: a generated value in a setting of prod, lab,
    lab_replicas or a two-node site either is refused by validation in one line naming our file,
    the host and the setting, or systemd reads it back from the rendered unit and EnvironmentFile
    exactly as the inventory wrote it."""
    from roles.site import PROJECT_ROOT

    started = time.monotonic()
    inventories = {
        label: _Inventory(PROJECT_ROOT / "inventory" / f"{label}.py") for label in ("prod", "lab", "lab_replicas")
    }
    inventories["two-node"] = _Inventory(_two_node_inventory(tmp_path / "two-node"))
    values = hostile_values(INVENTORY_COUNT, seed=3800)
    files, wanted = {}, {}
    outcome = {index: {"refused": 0, "read back": 0} for index in range(len(INVENTORY_SLOTS))}
    for number, value in enumerate(values):
        index = number % len(INVENTORY_SLOTS)
        label, key, setting, what = INVENTORY_SLOTS[index]
        inventory = inventories[label]
        site, node, problems = inventory.retyped(key, setting(value))
        if problems:
            assert len(problems) == 1 and "\n" not in problems[0], problems
            assert key in problems[0] or key.removeprefix("base_") in problems[0], problems[0]
            outcome[index]["refused"] += 1
            continue
        unit = f"sxi-{number}"
        files.update(_engine_files_of(site, node, unit))
        wanted[unit] = (label, key, setting(value), what, node)
        outcome[index]["read back"] += 1
    _install(systemd_container, files)
    props, envs = _read_back_all(systemd_container, list(wanted))
    for unit, (label, key, value, what, node) in wanted.items():
        got, env, where = props[unit], envs[unit], f"{label} {key} = {value!r}"
        data_dir, log_dir = node.base.data_dir, node.base.log_dir
        assert got["paths"] == [_simplified(data_dir), _simplified(log_dir)], where
        assert got["workdir"] == _simplified(data_dir), where
        assert env["HF_HOME"] == f"{data_dir}/.cache/huggingface", where
        assert f"({node.serving.served_model_name}, stack" in got["description"], where
        if what == "data_dir":
            assert data_dir == value, where
        elif what == "log_dir":
            assert log_dir == value, where
        elif what == "model":
            assert node.serving.served_model_name == value, where
        else:
            assert env["IH_READ_BACK"] == value["IH_READ_BACK"], where
    # Every setting saw both: values it refused and values that reached systemd unchanged.
    assert all(seen["refused"] and seen["read back"] for seen in outcome.values()), outcome
    print(
        f"\n{len(values)} inventory values: {sum(s['read back'] for s in outcome.values())} read back by systemd,"
        f" {sum(s['refused'] for s in outcome.values())} refused, in {time.monotonic() - started:.1f} s"
    )


def _engine_files_of(site, node, unit: str) -> dict[str, str]:
    from roles import serving
    from roles.shared import templates

    rendered = {
        Path(t).name: templates.render(t, **kw)
        for _, t, _, kw in serving.release_templates(node, site.stack.active, site)
        if t.endswith((".service.j2", ".env.j2"))
    }
    return {
        f"/etc/systemd/system/{unit}.service": rendered["inference-engine.service.j2"],
        f"/etc/sysd/{unit}.env": rendered["inference-engine.env.j2"],
        f"/etc/systemd/system/{unit}-env.service": (
            f"[Service]\nType=oneshot\nEnvironmentFile=/etc/sysd/{unit}.env\nExecStart=/usr/bin/env -0\n"
            f"StandardOutput=file:/run/{unit}-env.out\n"
        ),
    }
