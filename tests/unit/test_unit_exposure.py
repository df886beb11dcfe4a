"""Every unit the deploy writes, scored by `systemd-analyze security --offline=true` (systemd 250+;
Debian 12 has 252): the exposure of each, for every inventory in the repository, stays at or under
the ceiling written beside it below: 5.0 unless the comment says why a unit needs more. A unit
that loses its sandbox (a setting dropped, a new unit written without one) fails here, naming
the unit, its score and its ceiling. docs/security.md ("What runs as root") quotes these."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from roles import eagle3_training, render
from roles.shared import templates
from roles.site import PROJECT_ROOT, load_site
from tests.unit.test_systemd_syntax import INVENTORIES, _units_of

pytestmark = pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze is not installed")

DEFAULT_CEILING = 5.0
# Unit name (weight sets and instances by their prefix) -> (ceiling, why more than the default).
CEILINGS: dict[str, tuple[float, str]] = {
    # Root with its capabilities: loading nvidia-uvm and making /dev/nvidia-uvm* with their
    # owner and mode is the unit's whole job (no ProtectKernelModules, PrivateDevices,
    # capability bounding). The rest is shut (roles/nvidia_driver's template): 6.7.
    "nvidia-uvm-devices.service": (6.7, "loads a kernel module and makes device nodes"),
}
# Units that run as root, each for a reason; every other unit names its own user (docs/security.md,
# What runs as root: every unit runs as its own user or says why). The uvm setup: its ceiling above.
# The EAGLE-3 training's root helper: it stops, restarts and overrides the engine's unit and writes
# into the engine's model folder, one fixed verb per instance, for the job that runs as its own
# user (roles/eagle3_training/privileges.py); two DAC capabilities, no network: under the default.
AS_ROOT = {"nvidia-uvm-devices.service", "inference-host-eagle3-engine@.service"}
_SCORE = re.compile(r"Overall exposure level for (\S+): ([\d.]+)")


def exposure(name: str, text: str, folder: Path) -> float:
    """systemd's exposure score of one unit file, as it would lie on a host."""
    unit = folder / name
    unit.parent.mkdir(parents=True, exist_ok=True)
    unit.write_text(text)
    result = subprocess.run(
        ["systemd-analyze", "security", "--offline=true", "--no-pager", str(unit)], capture_output=True, text=True
    )
    found = _SCORE.search(result.stdout)
    assert found, f"{name}: no score from systemd-analyze security\n{result.stdout}{result.stderr}"
    return float(found.group(2))


def ceiling(name: str) -> float:
    for prefix, (limit, _) in CEILINGS.items():
        if name == prefix or (prefix.endswith("@.service") and name.startswith(prefix[: -len(".service")])):
            return limit
    return DEFAULT_CEILING


def over_ceiling(units: dict[str, str], folder: Path) -> list[str]:
    """'<unit>: <score> > <ceiling>' for each service unit above its ceiling."""
    found = []
    for name, text in sorted(units.items()):
        score = exposure(name, text, folder)
        if score > ceiling(name):
            found.append(f"{name}: {score} > {ceiling(name)}")
    return found


def _rendered_services() -> dict[str, str]:
    """Unit name -> text of every service unit the preview writes, for every inventory, and of
    the training unit (laid down but not previewed: roles/render.py)."""
    units: dict[str, str] = {}
    for inventory in INVENTORIES:
        site = load_site(PROJECT_ROOT / inventory)
        out = Path(tempfile.mkdtemp(prefix="ih-exposure-"))
        try:
            for host in render.render(site, out):
                for path, text in _units_of(out / host).items():
                    if path.endswith(".service") and "/system/" in path and ".d/" not in path:
                        units.setdefault(f"{Path(path).name}", text)
        finally:
            shutil.rmtree(out)
        for settings in site.hosts.values():
            if settings.eagle3_training.enabled:
                for dest, template, _, kwargs in eagle3_training.rendered(settings):
                    if dest.endswith(".service"):
                        units.setdefault(Path(dest).name, templates.render(template, **kwargs))
    return units


@pytest.fixture(scope="module")
def services() -> dict[str, str]:
    return _rendered_services()


def test_every_unit_the_deploy_writes_stays_under_its_ceiling(services, tmp_path):
    wanted = {"inference-engine.service", "smg.service", "inference-host-eagle3@.service"}
    assert wanted | {"inference-host-eagle3-engine@.service"} <= set(services), services
    assert over_ceiling(services, tmp_path) == []


def test_a_unit_without_its_sandbox_is_caught(services, tmp_path):
    """The check on a planted fault: the gateway's unit with its sandbox lines dropped."""
    sandbox = re.compile(r"^(NoNewPrivileges|Protect|Private|Restrict|Capability|SystemCall|Lock)\w*=", re.M)
    weakened = "\n".join(line for line in services["smg.service"].splitlines() if not sandbox.match(line))
    (found,) = over_ceiling({"smg.service": weakened}, tmp_path)
    assert found.startswith("smg.service: ") and found.endswith(" > 5.0"), found


def test_every_ceiling_names_a_unit_the_deploy_writes(services):
    """A ceiling for a unit that is gone would let a new unit of that name in unchecked."""
    assert set(CEILINGS) <= set(services)


def as_root(units: dict[str, str]) -> list[str]:
    """Service units not in AS_ROOT with no User= (or User=root)."""
    found = []
    for name, text in sorted(units.items()):
        users = re.findall(r"^User=(.*)$", text, re.M)
        if (not users or users[-1].strip() in ("root", "0")) and name not in AS_ROOT:
            found.append(name)
    return found


def test_every_unit_but_the_named_ones_runs_as_a_user_of_its_own(services):
    """The weights download (issue 53) joined the engine, the gateway and the relay: only the
    units of AS_ROOT run as root, and a unit that loses its User= line fails here by name."""
    assert as_root(services) == []
    assert sorted(name for name in services if not re.search(r"^User=", services[name], re.M)) == sorted(AS_ROOT)


def test_a_unit_back_on_root_is_caught(services):
    """The check on a planted fault: a weights unit with its User= line dropped (as before issue 53)."""
    name = next(n for n in services if n.startswith("inference-host-weights-"))
    planted = re.sub(r"^User=.*\n", "", services[name], flags=re.M)
    assert as_root({name: planted}) == [name]
