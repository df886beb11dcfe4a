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
PIECES = [" ", "  ", "%", "%h", "%n", "%%", "$", "$HOME", "${X}", "$$", "'", '"', "`", "\\", "\\\\", "\\n", ";",
          " ; ", "#", "=", ",", "-", "--api-key", "/", "é", "漢字", "🙂", "\u200b", "\u202e", "\t", "{", "}", "*",
          "a", "b", "z9", "_", ".", "..", "~"]


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
        subprocess.run(f"tar -C {shlex.quote(tmp)} -c . | docker exec -i {container} tar -C / -x", shell=True,
                       check=True)
    _docker("exec", container, "systemctl", "daemon-reload")


def _exec(container: str, *argv: str) -> str:
    return _docker("exec", container, *argv).stdout


def _busctl(container: str, unit: str, prop: str, interface: str = "Service"):
    path = "/org/freedesktop/systemd1/unit/" + "".join(
        c if c.isalnum() else f"_{ord(c):02x}" for c in unit)
    out = _exec(container, "busctl", "--json=short", "get-property", "org.freedesktop.systemd1", path,
                f"org.freedesktop.systemd1.{interface}", prop)
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
        sd.env_assignment(k, v) + "\n" for k, v in env_file_values.items())
    files["/etc/sysd/args.env"] = f"ARGS={sd.env_words(values)}\n"
    files["/etc/systemd/system/sx-all.service"] = "\n".join([
        "[Service]", "Type=oneshot", "ProtectSystem=strict",
        *(f"ReadWritePaths=-{sd.path_list([p])}" for p in paths),
        *(f"Environment={e}" for e in env_unit),
        f"ExecStart={sd.argv(argv)}", "StandardOutput=file:/run/sx-argv.out", ""])
    files["/etc/systemd/system/sx-env.service"] = "\n".join([
        "[Service]", "Type=oneshot", "EnvironmentFile=/etc/sysd/values.env",
        *(f"Environment={e}" for e in env_unit),
        "ExecStart=/usr/bin/env -0", "StandardOutput=file:/run/sx-env.out", ""])
    # Debian's packaged units: ExecStart=/usr/bin/prometheus $ARGS (split with EXTRACT_UNQUOTE).
    files["/etc/systemd/system/sx-args.service"] = "\n".join([
        "[Service]", "Type=oneshot", "EnvironmentFile=/etc/sysd/args.env",
        'ExecStart=/usr/bin/printf %%s\\0 $ARGS', "StandardOutput=file:/run/sx-args.out", ""])
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
    expected_unit_env = {e.split("=", 1)[0].strip('"'): values[int(e.split("=", 1)[0].strip('"')[1:])] for e in env_unit}
    assert {k: env[k] for k in expected_unit_env} == expected_unit_env

    args_out = _run_unit(systemd_container, "sx-args.service", "/run/sx-args.out").decode()
    assert args_out.split("\0")[:-1] == values
    # A transient service's command (the engine preflight's systemd-run), expanded like ExecStart=.
    transient = _exec(systemd_container, "systemd-run", "--quiet", "--wait", "--pipe", "--collect",
                      *sd.transient_argv(["/usr/bin/printf", "%s\\0", *values]))
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
    (folder / "site.py").write_text(f"gpu_nodes = [('gpu1', {{'gpu_count': 8, 'base_data_dir': {PLANTED_DATA_DIR!r},"
                                    f" 'serving_served_model_name': {PLANTED_MODEL!r}}})]\n")
    return load_site(folder / "site.py")


def _engine_files(site, unit: str) -> dict[str, str]:
    from roles import serving
    from roles.shared import templates

    host = site.hosts["gpu1"]
    rendered = {Path(t).name: templates.render(t, **kw) for _, t, _, kw in serving.release_templates(host, site.stack.active, site)
                if t.endswith((".service.j2", ".env.j2"))}
    return {f"/etc/systemd/system/{unit}.service": rendered["inference-engine.service.j2"],
            f"/etc/sysd/{unit}.env": rendered["inference-engine.env.j2"],
            f"/etc/systemd/system/{unit}-env.service": (
                f"[Service]\nType=oneshot\nEnvironmentFile=/etc/sysd/{unit}.env\nExecStart=/usr/bin/env -0\n"
                f"StandardOutput=file:/run/{unit}-env.out\n")}


def _read_back(container: str, unit: str) -> dict:
    env_out = _run_unit(container, f"{unit}-env.service", f"/run/{unit}-env.out").decode()
    env = dict(item.split("=", 1) for item in env_out.split("\0") if item)
    return dict(paths=_busctl(container, f"{unit}.service", "ReadWritePaths"),
                description=_busctl(container, f"{unit}.service", "Description", "Unit"),
                workdir=_busctl(container, f"{unit}.service", "WorkingDirectory"),
                hf_home=env["HF_HOME"])


def test_the_issues_planted_values_arrive_unchanged_and_the_old_rendering_did_not(systemd_container, tmp_path,
                                                                               monkeypatch):
    site = _planted_site(tmp_path)
    _install(systemd_container, _engine_files(site, "sx-engine"))
    now = _read_back(systemd_container, "sx-engine")
    # One writable path, the planted one: the folder `sg lang ` (its trailing blank too); systemd
    # drops the trailing `/` (the same directory).
    assert now["paths"] == ["/var/lib/sg lang ", "/var/log/sglang"]
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
