"""`systemd-analyze verify` on rendered units, as they lie on the host: the units at their own
paths under a throwaway root (`--root`, with this machine's packaged units for the targets they
name), every program they run planted there as an empty script (verify checks that each
ExecStart= program exists and is executable), a drop-in verified with its packaged unit."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

AVAILABLE = shutil.which("systemd-analyze") is not None
SYSTEM_UNITS = next((p for p in (Path("/usr/lib/systemd/system"), Path("/lib/systemd/system")) if p.is_dir()), None)
_NOT_EXECUTABLE = re.compile(r"Command (\S+) is not executable")


def verify(units: dict[str, str], root: Path) -> list[str]:
    """What verify says about `units` (absolute path on the host -> text); [] when clean.
    Lines about this machine's own packaged units are left out."""
    (root / "usr/lib/systemd").mkdir(parents=True, exist_ok=True)
    if SYSTEM_UNITS and not (root / "usr/lib/systemd/system").exists():
        shutil.copytree(SYSTEM_UNITS, root / "usr/lib/systemd/system", symlinks=True)
    checked = []
    for path, text in units.items():
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        if target.parent.name.endswith(".d"):  # a drop-in: verify the unit it extends
            base = f"/etc/systemd/system/{target.parent.name[:-2]}"
            if not (root / base.lstrip("/")).exists():
                (root / base.lstrip("/")).write_text("[Service]\nExecStart=/bin/true\n")
            path = base
        checked.append(path)
    names = {Path(p).name for p in checked}
    result = None
    for _ in range(4):
        result = subprocess.run(
            ["systemd-analyze", "verify", f"--root={root}", *(str(root / p.lstrip("/")) for p in checked)],
            capture_output=True,
            text=True,
        )
        missing = _NOT_EXECUTABLE.findall(result.stderr)
        if not missing:
            break
        for program in missing:
            stub = root / program.lstrip("/")
            stub.parent.mkdir(parents=True, exist_ok=True)
            if not stub.exists():
                stub.write_text("#!/bin/sh\n")
            stub.chmod(0o755)
    lines = [row for row in result.stderr.splitlines() if any(name in row for name in names) or "not found" in row]
    return lines if lines or result.returncode == 0 else [result.stderr]
