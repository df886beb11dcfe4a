"""roles/shared/systemd_syntax.py: every file systemd reads takes only encoded values, and every
unit the preview renders, for every inventory in the repository, passes `systemd-analyze verify`.
The read-back of 2,000 generated values by systemd itself is the lab's
(tests/lab/test_systemd_syntax.py); here, what needs no systemd as PID 1."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from roles import render
from roles.shared import systemd_syntax as sd
from roles.shared import templates
from roles.site import PROJECT_ROOT, load_site
from tests.unit import systemd_verify
from tests.unit.conftest import gpu_node

INVENTORIES = [
    "inventory/prod.py",
    "inventory/lab.py",
    "inventory/lab_replicas.py",
    "tests/lab/inventories/eagle3.py",
    "tests/lab/inventories/replicas_vllm.py",
]
needs_verify = pytest.mark.skipif(not systemd_verify.AVAILABLE, reason="systemd-analyze is not installed")


def _units_of(preview: Path) -> dict[str, str]:
    """Host path -> text of every unit file and drop-in the preview wrote for one host; the serving
    unit at the name systemd knows it by (the deploy links it from its release folder)."""
    units = {}
    for file in sorted(preview.rglob("*")):
        if not file.is_file():
            continue
        path = "/" + str(file.relative_to(preview))
        if path.startswith("/etc/systemd/system/") and file.suffix in (".service", ".timer", ".conf"):
            units[path] = file.read_text()
        elif path.endswith("/serving/inference-engine.service"):
            units["/etc/systemd/system/inference-engine.service"] = file.read_text()
    return units


def _preview(site, tmp_path: Path) -> dict[str, dict[str, str]]:
    out = tmp_path / "preview"
    return {host: _units_of(out / host) for host in render.render(site, out)}


@needs_verify
@pytest.mark.parametrize("inventory_file", INVENTORIES)
def test_every_rendered_unit_passes_systemd_analyze_verify(inventory_file, tmp_path):
    per_host = _preview(load_site(PROJECT_ROOT / inventory_file), tmp_path)
    assert any(per_host.values()), f"{inventory_file}: the preview wrote no unit"
    for host, units in per_host.items():
        if units:
            assert systemd_verify.verify(units, tmp_path / "root" / host.replace("/", "_")) == [], (host, list(units))


@needs_verify
def test_a_two_node_tensor_parallel_sites_units_pass_verify(inventory, tmp_path):
    tp = {
        "gpu_count": 8,
        "serving_topology": "tensor_parallel",
        "nccl_ib_disable": True,
        "nccl_socket_ifname": "ens1f0",
    }
    site = load_site(
        inventory.groups(
            gpu_nodes=[("node-a", {**tp, "ssh_hostname": "10.0.0.11"}), ("node-b", {**tp, "ssh_hostname": "10.0.0.12"})]
        )
    )
    per_host = _preview(site, tmp_path)
    assert set(per_host) == {"node-a", "node-b"}
    for host, units in per_host.items():
        assert "/etc/systemd/system/inference-engine.service" in units
        assert systemd_verify.verify(units, tmp_path / "root" / host) == [], host


@needs_verify
def test_a_gpu_kvm_guests_units_pass_verify(tmp_path):
    """inventory/prod.py with the GPUs moved to its KVM guest (as its comment says to): the VM has
    its own kernel, so it gets the driver's nvidia-uvm-devices unit as well as the engine's."""
    folder = tmp_path / "inventory"
    shutil.copytree(PROJECT_ROOT / "inventory", folder)
    text = (folder / "prod.py").read_text()
    kvm, gpu_nodes = text.index("\nkvm_guests = ["), text.index("\ngpu_nodes = [")
    lxc = (
        text[:kvm]
        .replace('"guest_gpu_addresses": _gpus', '"guest_gpu_addresses": []', 1)
        .replace('"gpu_count": 8,', '"gpu_count": 0,', 1)
    )
    vm = text[kvm:gpu_nodes].replace('"guest_gpu_addresses": [],', '"guest_gpu_addresses": _gpus, "gpu_count": 8,', 1)
    text = lxc + vm + text[gpu_nodes:].replace("gpu-lxc.example.internal", "gpu-vm.example.internal")
    (folder / "kvm.py").write_text(text)
    units = _preview(load_site(folder / "kvm.py"), tmp_path)["gpu-vm.example.internal"]
    assert {"/etc/systemd/system/inference-engine.service", "/etc/systemd/system/nvidia-uvm-devices.service"} <= set(
        units
    )
    assert systemd_verify.verify(units, tmp_path / "root") == []


def _planted(inventory):
    """The issue's values: a space in a path, a specifier in a served model name."""
    return load_site(
        inventory.groups(gpu_nodes=[gpu_node(base_data_dir="/var/lib/sg lang /", serving_served_model_name="kimi-%h")])
    )


@needs_verify
def test_a_space_in_a_path_and_a_specifier_verify_clean_and_did_not_before(inventory, tmp_path, monkeypatch):
    site = _planted(inventory)
    units = _preview(site, tmp_path / "now")["gpu1"]
    engine = units["/etc/systemd/system/inference-engine.service"]
    assert 'ReadWritePaths="/var/lib/sg lang /" /var/log/inference-engine' in engine.splitlines()
    assert "(kimi-%%h, stack" in engine
    assert systemd_verify.verify(units, tmp_path / "now-root") == []
    # The old rendering, values written raw: systemd splits the path and keeps `/` writable.
    monkeypatch.setattr(sd, "_quoted", lambda value: value)
    monkeypatch.setattr(sd, "_specifiers", lambda value: value)
    raw = _preview(site, tmp_path / "raw")["gpu1"]
    problems = systemd_verify.verify(raw, tmp_path / "raw-root")
    assert any("lang" in row and "absolute" in row for row in problems), problems


def test_a_template_systemd_reads_refuses_a_raw_value():
    template = "roles/gateway/templates/smg.service.j2"
    kwargs = dict(
        version=sd.comment("1.0"),
        worker_count=sd.comment(2),
        description=sd.text("x"),
        service_user=sd.text("smg"),
        api_key_env=None,
        control_key_env=None,
        tenant_keys_env=None,
        exec_start=sd.argv(["/bin/true"]),
    )
    assert "ExecStart=/bin/true" in templates.render(template, **kwargs)
    with pytest.raises(sd.EncodingError) as error:
        templates.render(template, **{**kwargs, "service_user": "smg"})
    assert str(error.value).startswith(f"{template}: variable 'service_user' is a str, not systemd unit text")
    with pytest.raises(sd.EncodingError, match="variable 'args' is a UnitText, not EnvironmentFile text"):
        templates.render("roles/monitoring/templates/prometheus-node-exporter.default.j2", args=sd.text("--x"))
    with pytest.raises(sd.EncodingError, match="variable 'interval_s' is a int"):
        templates.render("roles/monitoring/templates/inference-host-checks.timer.j2", interval_s=600)


def test_every_template_systemd_reads_is_guarded():
    """Units, timers, environment files and Debian's /etc/default files are known by their names."""
    for template in PROJECT_ROOT.glob("roles/*/templates/*.j2"):
        name = str(template.relative_to(PROJECT_ROOT))
        text = template.read_text()
        reads_like_systemd = (
            "[Unit]" in text or "[Service]" in text or "[Timer]" in text or name.endswith((".env.j2", ".default.j2"))
        )
        assert (sd.language_of(name) is not None) == reads_like_systemd, name


@pytest.mark.parametrize(
    ("encoder", "value", "message"),
    [
        (sd.text, "a\nb", "control character '\\n'"),
        (sd.text, "x\x00", "control character '\\x00'"),
        (sd.text, " padded", "leading or trailing blanks"),
        (sd.text, "ends\\", "trailing backslash"),
        (sd.path, "relative/dir", "absolute paths only"),
        (sd.path, "/a/../etc", "'..' part"),
        (sd.path, "/trailing ", "strips blanks"),
        (lambda v: sd.path_list([v]), "/a\nb", "control character"),
        (lambda v: sd.argv([v]), "true", "absolute path"),
        (lambda v: sd.environment("1BAD", v), "x", "not a valid environment variable name"),
        (lambda v: sd.env_assignment("A", v), "\x1b[0m", "control character '\\x1b'"),
        (sd.comment, "a\nb", "control character"),
    ],
)
def test_what_cannot_be_encoded_is_refused_naming_the_setting(encoder, value, message):
    with pytest.raises(sd.EncodingError) as error:
        encoder(value)
    assert message in str(error.value)


def test_encodings_follow_systemds_rules():
    assert sd.path_list(["/var/lib/sg lang /", "/var/log/x"]) == '"/var/lib/sg lang /" /var/log/x'
    assert sd.path("/srv/a b%h") == "/srv/a b%%h"  # WorkingDirectory= is read whole, not unquoted
    assert sd.text("kimi-%h") == "kimi-%%h"
    assert sd.environment("K", 'a "b" %n\\') == '"K=a \\"b\\" %%n\\\\"'
    assert sd.argv(["/bin/echo", "$HOME", "a b", ";", "--api-key"]) == '/bin/echo "$$HOME" "a b" ";" --api-key'
    assert sd.env_assignment("A", 'x"$`\\ y%h') == 'A="x\\"\\$\\`\\\\ y%h"'  # no specifiers in env files
    assert sd.env_assignment("A", "SYS") == "A=SYS"
    assert sd.env_words(["--a=b c", "--d="]) == '"\\"--a=b c\\" --d="'
    assert type(sd.text("x")) is sd.UnitText and type(sd.env_value("x")) is sd.EnvFileText


@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [
        (
            "base_data_dir",
            "/var/lib/inference-engine ",
            "WorkingDirectory= (base_data_dir): systemd strips blanks at the ends",
        ),
    ],
)
def test_a_value_systemd_would_change_is_refused_at_inventory_load(inventory, setting, value, message):
    """Refused before any host is touched (validation.py's role checks), not at render time. (A
    `..`, control characters and invalid names are the model's own refusals already.)"""
    from roles.site import SiteError
    from validation import ROLE_CHECKS

    with pytest.raises(SiteError) as caught:
        load_site(inventory.groups(gpu_nodes=[gpu_node(**{setting: value})]), ROLE_CHECKS)
    assert any(message in p and "systemd would not read it back unchanged" in p for p in caught.value.problems), (
        caught.value.problems
    )
