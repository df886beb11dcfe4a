"""Make the committed lock of the gateway's environment (smg and everything it requires).

    uv run python -m roles.gateway.lock inventory/stack.yml 1.13.0            # gateway_version(s)
    uv run python -m roles.gateway.lock inventory/stack.yml 1.13.0 --index-url https://mirror/simple

`uv pip compile --generate-hashes` resolves smg==<version> for the gateway host (CPython 3.12
on x86_64 manylinux_2_39, Ubuntu 24.04) from the index's real Requires-Dist (smg 1.13.0:
setproctitle, grpcio, grpcio-health-checking, pyyaml), with the sha256 of every distribution
of every package. The result, with a header recording a digest of what it was made from, is
written beside the stack file at locks/smg-<version>.txt (roles/site/lock.py); commit it.
Loading an inventory whose gateways use a version without a fresh lock stops with this
command. The gateway host installs it with `uv pip sync --require-hashes` (roles/gateway).
"""

from __future__ import annotations

import re
from pathlib import Path

from roles.shared import lock_compile
from roles.site import SiteError
from roles.site import lock as site_lock
from roles.site.command_line import OneLineParser


def make_lock(stack_file: Path, version: str, shown: str, index_url: str | None = None) -> Path:
    python = site_lock.GATEWAY_PYTHON
    body = lock_compile.resolve(
        lock_compile.compile_command(lock_compile.uv_binary(), python, (), index_url),
        site_lock.gateway_roots(version),
        f"gateway smg {version}",
        python,
        "pick a gateway_version the index serves (pip index versions smg)",
    )
    if site_lock.entries(body).get("smg") != version:
        raise SiteError([f"gateway smg {version}: the resolution has no smg=={version}; uv answered:\n{body}"])
    path = site_lock.lock_path(stack_file, site_lock.gateway_lock_name(version))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(site_lock.sealed(site_lock.gateway_header(version, shown) + body))
    return path


def main(argv: list[str] | None = None, prog: str = "python -m roles.gateway.lock") -> int:
    parser = OneLineParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("stack_file", help="the stack file, e.g. inventory/stack.yml (the lock goes beside it)")
    parser.add_argument("versions", nargs="+", help="smg releases to lock (the gateways' gateway_version)")
    parser.add_argument("--index-url", default=None, help="package index (a mirror); default: UV_INDEX_URL or PyPI")
    args = parser.parse_args(argv)

    def jobs():
        # The stack file first (the lock goes beside it): a typo stops before the index is asked.
        if not Path(args.stack_file).is_file():
            raise SiteError(
                [
                    f"{args.stack_file}: no such stack file; expected the stack file the lock goes"
                    " beside, e.g. inventory/stack.yml"
                ]
            )
        bad = [v for v in args.versions if not re.match(r"^\d+\.\d+\.\d+$", v)]
        if bad:
            raise SiteError([f"versions {', '.join(bad)}: expected smg releases like 1.13.0"])
        return [
            (
                f"smg {version}",
                lambda version=version: make_lock(Path(args.stack_file), version, args.stack_file, args.index_url),
            )
            for version in args.versions
        ]

    return lock_compile.run_lock_command(jobs)


if __name__ == "__main__":
    raise SystemExit(main())
