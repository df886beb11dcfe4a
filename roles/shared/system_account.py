"""A service's own system account, as the roles create it: a group of its name, a system user in
it with no login shell and no home (Debian's convention for daemons: /nonexistent, never made)."""

from __future__ import annotations

from pyinfra.operations import server


def system_account(user: str, runs: str) -> None:
    """Group `user` and system user `user` ("Create system user USER (runs RUNS)")."""
    server.group(name=f"Create group {user}", group=user, system=True)
    server.user(
        name=f"Create system user {user} (runs {runs})",
        user=user,
        group=user,
        system=True,
        shell="/usr/sbin/nologin",
        home="/nonexistent",
        ensure_home=False,
        create_home=False,
    )
