"""A configured unit name against the host's own units (roles/shared/unit_owner.py): the fact
parsed from systemctl's real output, ours told from another's, and a deploy refused in one line
before any operation when the name is a unit the project did not write.

tests/unit/data/systemd/list-unit-files-debian12.txt is `systemctl --root=/ list-unit-files
--no-legend --no-pager --full --type=service` on a Debian 12 machine (systemd 252.38-1~deb12u1):
the offline form prints the same columns (UNIT FILE, STATE, PRESET) as the live one the fact runs.
fact-output-lab-debian12.txt is the fact's whole command run live in the lab's systemd image."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from roles.shared.unit_owner import MARKER, ServiceUnitFiles, UnitFiles, foreign_unit_problem
from tests.unit.conftest import PROJECT_ROOT
from tests.unit.test_gpu_stack_plans import PLANS

DATA = PROJECT_ROOT / "tests" / "unit" / "data" / "systemd"
ROOT = "/opt/inference-host"


def recorded(*extra: str) -> UnitFiles:
    lines = (DATA / "list-unit-files-debian12.txt").read_text().splitlines()
    return ServiceUnitFiles().process([*lines, "list-rc 0", *extra])


def test_the_fact_reads_systemctl_s_list():
    found = recorded()
    assert found.error is None and len(found.states) == 111
    assert found.states["docker.service"] == "enabled"
    assert found.states["autovt@.service"] == "alias"
    assert found.states["e2scrub_all.service"] == "static"


@pytest.mark.parametrize(
    ("name", "extra", "problem"),
    [
        ("inference-engine", (), None),  # not on the host yet
        ("docker", ("ours smg.service",), "is docker.service, a unit this host already has (enabled)"),
        ("docker.service", (), "is docker.service, a unit this host already has (enabled)"),
        ("dbus-org.freedesktop.login1", (), "a unit this host already has (alias)"),
        ("docker", ("ours docker.service",), None),  # our line in /etc/systemd/system/docker.service
        ("docker", (f"link docker.service {ROOT}/current/serving/docker.service",), None),
        ("docker", ("link docker.service /usr/lib/systemd/system/docker.service",), "a unit this host already has"),
    ],
)
def test_a_unit_the_host_has_is_ours_or_refused(name, extra, problem):
    found = foreign_unit_problem("serving_unit_name", name, recorded(*extra), ROOT)
    if problem is None:
        assert found is None
    else:
        assert found.startswith(f"serving_unit_name = {name!r} ") and problem in found
        assert found.endswith(
            f"that inference-host did not write (/etc/systemd/system/{name.removesuffix('.service')}.service has no"
            f" '{MARKER}...' line); expected a unit name of its own"
        )


@pytest.mark.parametrize(
    ("rc", "why"), [("124", "ran past 30 s"), ("1", "failed with exit 1"), (None, "did not answer (no output)")]
)
def test_a_list_that_cannot_be_read_stops_the_deploy_with_its_reason(rc, why):
    found = ServiceUnitFiles().process(["docker.service enabled enabled", *([f"list-rc {rc}"] if rc else [])])
    assert foreign_unit_problem("gateway_unit_name", "smg", found, ROOT) == (
        f"gateway_unit_name = 'smg' cannot be checked against the host's units: `systemctl list-unit-files` {why};"
        " expected systemd to answer there (systemctl status)"
    )


def test_both_unit_templates_carry_the_marker():
    for template in ("roles/serving/templates/inference-engine.service.j2", "roles/gateway/templates/smg.service.j2"):
        assert MARKER in (PROJECT_ROOT / template).read_text().lower(), template


def test_the_deploy_refuses_a_foreign_unit_before_any_operation():
    host, inventory = "@fake/gpu-foreign-unit", PLANS / "inventory_foreign_unit.py"
    completed = subprocess.run(
        [sys.executable, str(PLANS / "record.py"), "--limit", host, str(inventory), "deploy.py"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert completed.returncode != 0
    records = [json.loads(line) for line in completed.stdout.splitlines() if line.strip()]
    assert [r for r in records if "command" in r or "upload" in r] == []  # nothing ran, nothing uploaded
    line = (
        f"{inventory.relative_to(PROJECT_ROOT)}: host {host}: serving_unit_name = 'model-server' is"
        " model-server.service, a unit this host already has (enabled) that inference-host did not write"
        f" (/etc/systemd/system/model-server.service has no '{MARKER}...' line); expected a unit name of its own"
    )
    assert line in completed.stderr, completed.stderr[-3000:]


def test_the_fact_s_whole_answer_from_a_running_systemd():
    """The fact's own command run in the lab's systemd image (Debian 12, systemd as PID 1) with
    our engine unit linked into /opt/ih/current/serving (it carries the marker) and a packaged
    model-server.service enabled: fact-output-lab-debian12.txt, captured as it answered."""
    found = ServiceUnitFiles().process((DATA / "fact-output-lab-debian12.txt").read_text().splitlines())
    assert found.error is None and found.states["inference-engine.service"] == "linked"
    assert found.ours == {"inference-engine.service"}
    assert found.links == {"inference-engine.service": "/opt/ih/current/serving/inference-engine.service"}
    assert foreign_unit_problem("serving_unit_name", "inference-engine", found, "/opt/ih") is None
    assert "model-server.service, a unit this host already has (enabled)" in foreign_unit_problem(
        "serving_unit_name", "model-server", found, "/opt/ih"
    )
    assert foreign_unit_problem("gateway_unit_name", "cron", found, "/opt/ih") is None  # not installed there
