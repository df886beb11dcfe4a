"""What the checks' timer runs on a gpu node: the project's health checks (checks and the
site model they read their expectations through) in their own small environment, installed
exactly from the project's own uv.lock (the versions and hashes the controller runs them with).

The environment holds only what `python -m checks --hosts local://` imports: pytest,
pytest-testinfra, pydantic and PyYAML, with their dependencies as uv.lock resolved them.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
import tomllib
from pathlib import Path

from roles.shared import layout
from roles.site import PROJECT_ROOT

# detect-secrets: the site model's credential shapes (roles/site/credentials.py), which the
# checks read their expectations through.
ROOTS = ("pytest", "pytest-testinfra", "pydantic", "pyyaml", "detect-secrets")
# The files the checks need on the host, relative to the project root.
BUNDLE_GLOBS = (
    "checks/*.py",
    "checks/programs/*",
    "checks/reference.yml",
    "roles/__init__.py",
    "roles/site/*.py",
    "roles/site/sections/*.py",
    "inventory/stack.yml",
    # the pure helpers checks imports (parsers shared with the roles; no pyinfra)
    "roles/shared/__init__.py",
    "roles/shared/driver_state.py",
    "roles/shared/xid_catalog.py",
    "roles/shared/xid_catalog.yml",
    "roles/shared/eagle3.py",
    "roles/shared/replicas.py",
    "roles/shared/shell.py",
    "roles/shared/tls.py",
    "roles/shared/layout.py",
    "roles/shared/nccl.py",
    "roles/shared/sglang_kv_log.py",
    "roles/shared/kv_cache.py",
)


def _packages(lock: dict) -> dict[tuple[str, str], dict]:
    return {(p["name"], p["version"]): p for p in lock["package"]}


def requirements(lock_text: str, roots: tuple[str, ...] = ROOTS) -> str:
    """A requirements file with one pinned, hashed line per package of the roots' closure
    (markers kept: pytest's colorama is for Windows only), for `uv pip install --require-hashes`."""
    lock = tomllib.loads(lock_text)
    packages = _packages(lock)
    by_name: dict[str, list[dict]] = {}
    for package in lock["package"]:
        by_name.setdefault(package["name"], []).append(package)
    lines: dict[str, str] = {}
    todo = [(name, None, None) for name in roots]
    while todo:
        name, version, marker = todo.pop()
        candidates = [packages[(name, version)]] if version else by_name.get(name, [])
        if len(candidates) != 1:
            raise ValueError(f"uv.lock: {name} {version or ''} resolves to {len(candidates)} packages; expected one")
        package = candidates[0]
        key = f"{package['name']}=={package['version']}"
        if key in lines:
            continue
        hashes = [w["hash"] for w in package.get("wheels", [])]
        if "sdist" in package:
            hashes.append(package["sdist"]["hash"])
        if not hashes:
            raise ValueError(f"uv.lock: {key} has no hashed file")
        lines[key] = key + (f" ; {marker}" if marker else "") + "".join(f" \\\n    --hash={h}" for h in hashes)
        for dep in package.get("dependencies", []):
            todo.append((dep["name"], dep.get("version"), dep.get("marker")))
    return (
        "# The health checks' environment on a gpu node, from uv.lock (roles/monitoring/checks_env.py).\n"
        + "\n".join(lines[k] for k in sorted(lines))
        + "\n"
    )


def bundle_files(root: Path = PROJECT_ROOT) -> list[str]:
    return sorted({str(p.relative_to(root)) for pattern in BUNDLE_GLOBS for p in root.glob(pattern) if p.is_file()})


def bundle_archive(root: Path = PROJECT_ROOT) -> bytes:
    """The bundle as one uncompressed tar, the same bytes for the same files (sorted names, no
    times, root's, 0644): one upload whose checksum pyinfra compares, not one per file."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as archive:
        for name in bundle_files(root):
            data = (root / name).read_bytes()
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime, info.uname, info.gname = len(data), 0o644, 0, "root", "root"
            archive.addfile(info, io.BytesIO(data))
    return out.getvalue()


def bundle_digest(root: Path = PROJECT_ROOT) -> str:
    """Names the bundle's directory on the host: a change to the checks is a new directory."""
    digest = hashlib.sha256()
    for name in bundle_files(root):
        digest.update(name.encode() + b"\0" + (root / name).read_bytes() + b"\0")
    digest.update(requirements((root / "uv.lock").read_text()).encode())
    return digest.hexdigest()[:12]


# Settings the checks do not read, kept out of the 0644 expect.json: serving_extra_env reaches
# only the engine's 0600 environment file (its values may be keys: an AWS_ACCESS_KEY_ID); the
# checks read the environment the unit really has, on the host. base_extra_ca_certificates and
# serving_tls_ca_file are files of the controller, not of the host (the checks get the host's
# copy of the CA as tls_ca_file, and the name they ask as tls_server_name).
NOT_EXPECTED = frozenset({"serving_extra_env", "base_extra_ca_certificates", "serving_tls_ca_file"})


def expectations(host, site) -> dict:
    """The checks' expectations of one gpu node as --expect values: every setting they read
    (gpu_, serving_, health_, base_, nccl_, nvidia_driver_), the driver pin and the engine."""
    from roles.site import (
        BaseSettings,
        GpuSettings,
        HealthSettings,
        NcclSettings,
        NvidiaDriverSettings,
        ServingSettings,
        address_of,
    )

    out: dict = {}
    for cls in (GpuSettings, ServingSettings, HealthSettings, BaseSettings, NcclSettings, NvidiaDriverSettings):
        section = getattr(host, cls.PREFIX.rstrip("_"))
        for name in cls.model_fields:
            if cls.PREFIX + name not in NOT_EXPECTED:
                out[cls.PREFIX + name] = getattr(section, name)
    tls = layout.tls_files(host.serving.unit_name)["ca"] if host.serving.tls_ca_file else layout.SYSTEM_CA_BUNDLE
    out["tls_ca_file"] = tls  # as Expectations.from_site reads them (checks/expectations.py, tls_ca_file)
    out["tls_server_name"] = address_of(host)
    out["driver_version"] = site.stack.driver_version  # as Expectations.from_site reads it
    out["engine"] = site.stack.active.engine
    return out
