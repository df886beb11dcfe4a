"""The checks' timer on a gpu node: its units pass `systemd-analyze verify`, enforce the
settings' budget, and its expectations file gives the checks the same expectations as the
inventory does from the controller; its environment is uv.lock's own pins and hashes."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys

import pytest

from checks.expectations import Expectations
from checks.textfile import expect_arguments
from roles.monitoring import checks_env, units
from roles.shared import templates
from roles.site import load_site
from tests.unit.conftest import ADMIN, CLIENT_KEY, PROJECT_ROOT, ROLE_KEYS, gpu_node
from tests.unit.test_monitoring_rules import speculative_ready


def render(template: str, **kwargs) -> str:
    return templates.render(template, **kwargs)


@pytest.fixture
def site(inventory):
    vault = inventory.vault(api_key=CLIENT_KEY, **ROLE_KEYS)
    return load_site(
        inventory.groups(
            gpu_nodes=[
                gpu_node(
                    secrets_file=vault,
                    serving_api_key_secret="api_key",
                    **ADMIN,
                    gpu_count=8,
                    serving_context_length=512,  # fits the KV cache with a drafter (roles/serving/memory.py)
                    health_min_temp_margin_c=12,
                    monitoring_check_interval="10m",
                    monitoring_check_cpu_quota_percent=30,
                    monitoring_check_timeout_s=200,
                    serving_speculative={
                        "draft_model_path": "/models/drafter",
                        "num_steps": 2,
                        "num_draft_tokens": 3,
                        **speculative_ready(inventory),
                    },
                )
            ],
            monitors=[("gpu1", {"monitoring_webhook_url": "http://127.0.0.1:9099/alerts"})],
        )
    )


def test_the_units_carry_the_budget_and_interval(site):
    host = site.hosts["gpu1"]
    (service_path, service_t, service_kw), (timer_path, timer_t, timer_kw) = units.gpu_templates(
        host, "/opt/inference-host/checks/bundle-x", "/opt/inference-host/checks/env-y/bin/python"
    )
    service, timer = render(service_t, **service_kw), render(timer_t, **timer_kw)
    assert service_path == "/etc/systemd/system/inference-host-checks.service"
    assert "CPUQuota=30%" in service and "TimeoutStartSec=200" in service and "Type=oneshot" in service
    assert (
        "ExecStart=/opt/inference-host/checks/env-y/bin/python -m checks.textfile --expect-file"
        " /etc/inference-host/checks/expect.json --suites gpu,service,server --out"
        " /var/lib/prometheus/node-exporter/inference_host_checks.prom"
    ) in service
    assert "restart" not in service.lower().replace("never stop or restart", "")
    assert "OnUnitActiveSec=600s" in timer


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze is not installed")
def test_the_checks_unit_runs_as_the_checks_user_never_root(site):
    """Issue 53: its own system user (roles/base makes it), no capability, the system read-only
    but the textfile folder; a unit that lost its User= would run the checks as root again."""
    ((_, template, kwargs), _) = units.gpu_templates(site.hosts["gpu1"], "/opt/b", "/opt/e/bin/python")
    lines = [line for line in render(template, **kwargs).splitlines() if not line.startswith("#")]
    assert [line for line in lines if line.startswith(("User=", "Group="))] == [
        "User=inference-host-checks",
        "Group=inference-host-checks",
    ]
    assert not [line for line in lines if line.split("=", 1)[-1] in ("root", "0") or "CAP_" in line]
    assert {"ProtectSystem=strict", "ReadWritePaths=/var/lib/prometheus/node-exporter", "NoNewPrivileges=yes"} <= set(
        lines
    )


def test_the_units_pass_systemd_analyze_verify(site, tmp_path):
    host = site.hosts["gpu1"]
    written = []
    for path, template, kwargs in units.gpu_templates(host, str(tmp_path), sys.executable):
        target = tmp_path / path.rsplit("/", 1)[1]
        target.write_text(render(template, **kwargs))
        written.append(str(target))
    result = subprocess.run(["systemd-analyze", "verify", *written], capture_output=True, text=True)
    problems = [row for row in result.stderr.splitlines() if "inference-host-checks" in row]
    assert result.returncode == 0 and not problems, result.stderr


def test_the_expectations_file_gives_the_inventorys_expectations(site, tmp_path):
    """What the timer's checks expect on the host = what `python -m checks --inventory`
    expects from the controller (nothing typed twice, nothing lost on the way)."""
    expect = tmp_path / "expect.json"
    expect.write_text(units.expect_text(site.hosts["gpu1"], site))
    on_host = Expectations.from_overrides([a.removeprefix("--expect=") for a in expect_arguments(expect)])
    from_inventory = Expectations.from_site(site, "gpu1")
    ignore = {"host_name", "source", "api_key_file"}  # the timer sends its own copy of the client key
    differ = {
        f.name
        for f in dataclasses.fields(Expectations)
        if f.name not in ignore and getattr(on_host, f.name) != getattr(from_inventory, f.name)
    }
    assert not differ, {name: (getattr(on_host, name), getattr(from_inventory, name)) for name in differ}
    assert on_host.api_key_file == units.CHECKS_KEY_FILE and on_host.api_key_configured
    assert on_host.min_temp_margin_c == 12 and on_host.speculative and on_host.speculative_num_steps == 2


def test_the_environment_is_the_locks_closure():
    lock = (PROJECT_ROOT / "uv.lock").read_text()
    text = checks_env.requirements(lock)
    pinned = {line.split(" ")[0] for line in text.splitlines() if "==" in line}
    names = {p.split("==")[0] for p in pinned}
    assert {"pytest", "pytest-testinfra", "pydantic", "pydantic-core", "pyyaml", "pluggy"} <= names
    assert not names & {"pyinfra", "ansible-core", "jinja2", "paramiko"}  # the controller's, not the checks'
    assert all(text.count(f"{p} ") + text.count(f"{p} ;") >= 1 for p in pinned)
    assert "colorama==0.4.6 ; sys_platform == 'win32'" in text
    assert text.count("--hash=sha256:") >= len(pinned)


def test_the_bundle_holds_what_the_checks_import():
    files = set(checks_env.bundle_files())
    assert {
        "checks/__main__.py",
        "checks/textfile.py",
        "checks/conftest.py",
        "roles/site/schema.py",
        "inventory/stack.yml",
        "checks/programs/membw.py",
    } <= files
    assert not any(f.startswith(("roles/serving", "roles/monitoring", "tests/unit", "tests/lab")) for f in files)


def test_every_project_module_the_checks_import_is_in_the_bundle():
    """Each `roles.*` / `tests.*` import of a bundled file names a bundled module."""
    import ast

    files = set(checks_env.bundle_files())
    missing = set()
    for name in files:
        if not name.endswith(".py"):
            continue
        for node in ast.walk(ast.parse((PROJECT_ROOT / name).read_text())):
            modules = []
            if isinstance(node, ast.ImportFrom) and node.module:
                modules = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            for module in modules:
                if not module.startswith(("roles", "tests")):
                    continue
                path = module.replace(".", "/")
                if (PROJECT_ROOT / f"{path}.py").exists() and f"{path}.py" not in files:
                    missing.add(f"{name}: {module}")
                elif (PROJECT_ROOT / path).is_dir() and f"{path}/__init__.py" not in files:
                    missing.add(f"{name}: {module}")
    assert not missing, sorted(missing)


def test_the_bundle_is_one_archive_of_its_files_the_same_bytes_each_time():
    """One upload whose checksum pyinfra compares: a deploy that changes nothing sends nothing."""
    import io
    import tarfile

    archive = checks_env.bundle_archive()
    assert archive == checks_env.bundle_archive()
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        members = tar.getmembers()
        assert [m.name for m in members] == checks_env.bundle_files()
        assert {(m.mode, m.uid, m.mtime) for m in members} == {(0o644, 0, 0)}
        assert tar.extractfile("checks/textfile.py").read() == (PROJECT_ROOT / "checks" / "textfile.py").read_bytes()
