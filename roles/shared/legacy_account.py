# rename-script: keep (the service account's names before the rename, named on purpose)
"""The service account before the engine-neutral names (main up to commit fb51e7b), which the
next deploy migrates away from, keeping its ids, with the one health-gated restart the engine's
unit already gets (its User=, ReadWritePaths= and HF_HOME change).

Then: the system user `sglang` and its group `sglang` (base_service_user's and
base_service_group's old defaults), its home /var/lib/sglang (base_data_dir: HF_HOME, the Hub
token, the torch and Triton caches) and /var/log/sglang (base_log_dir). Now: `inference`,
/var/lib/inference-engine and /var/log/inference-engine, named after the unit as systemd's
StateDirectory= and LogsDirectory= name theirs.

Why the uid and gid are kept: what the account owns is owned by number. The model directory,
the caches and the secret files keep working without a chown, and on an LXC guest the node's
weights are mounted read-only with the ownership the node gave the guest's uid: a new uid could
neither read nor chown them.

Why the new names are added beside the old ones rather than renamed in place: `usermod -l`
refuses while any process of the user runs (shadow 4.13 usermod.c checks user_busy for -l, -u
and -d: "user sglang is currently used by process N", exit 8), and the engine runs as it until
the switch restarts it. And until the new unit has passed its health gate, what a rollback
starts runs under the old names: a 7c5257e host's sglang.service, or the previous release's
unit (the deploy never rewrites a release that is not the active one). So:

1. roles/base, before it ensures the user: the group and the user under their new names with
   the old ids (`groupadd -o -g`, `useradd -o -u`: second names of the same ids), and each
   directory moved to its new name (a rename on one file system: the Hugging Face cache is not
   copied) with a link at its old name (systemd follows it for WorkingDirectory= and
   ReadWritePaths=, the running engine and a rolled-back unit reach their files through it);
2. roles/serving's switch restarts the engine under the new names, once, health-gated;
3. after a healthy switch (roles/serving) the old names go: `userdel -f sglang` (-f: the uid
   runs the engine, under its new name; without -r nothing on disk is touched; with
   USERGROUPS_ENAB, Debian's and Ubuntu's default, the group of the same name goes with it),
   `groupdel -f sglang` where it is left, and the two links. The deploy after that changes nothing.

While both names exist, the ids resolve to the first entry of /etc/passwd and /etc/group, the
former one: pyinfra's facts (stat's %U, `id -gn`) read `sglang`, so the migration deploy sets
the owner of the account's folders and secret files and the user's group again (the same ids:
nothing changes on disk); once the former names are gone they read `inference`. The engine's
switch also runs whenever the fact finds the account between its names (roles/serving
Switching.renaming): a deploy that stopped after roles/base's part still restarts the engine.

A host that runs no engine (a gateway) drops the old names in roles/base right away. Only the
old defaults are migrated: a site that set base_service_user or base_service_group to `sglang`
keeps its account (the account moves only when neither configured name is `sglang`, and only
onto names that are free or already second names of its ids, never onto another account), and
a folder moves only when its setting names another folder that does not exist yet (the new
default, say).
"""

from __future__ import annotations

from dataclasses import dataclass

from pyinfra.api import FactBase
from pyinfra.operations import files, server

from roles.shared.fact_batch import batched
from roles.shared.shell import Shell, sh

FORMER_USER = "sglang"
FORMER_GROUP = "sglang"
FORMER_DATA_DIR = "/var/lib/sglang"
FORMER_LOG_DIR = "/var/log/sglang"


@dataclass(frozen=True)
class AccountState:
    """The local account entries and folders of both the former and the configured names."""

    users: dict[str, tuple[int, int]]  # name -> (uid, primary gid), from /etc/passwd
    groups: dict[str, int]  # name -> gid, from /etc/group
    paths: dict[str, tuple[str, str]]  # path -> ("dir" | "link" | "other", a link's target)


@batched
class ServiceAccountState(FactBase):
    """Returns the AccountState of the former names (sglang, /var/lib/sglang, /var/log/sglang)
    and the configured ones: /etc/passwd's and /etc/group's entries, and what each folder is."""

    def command(self, user: str, group: str, data_dir: str, log_dir: str) -> Shell:
        # Names are UnixName-validated ([a-z_][a-z0-9_-]*): safe in a regular expression.
        users, groups = "|".join(dict.fromkeys((FORMER_USER, user))), "|".join(dict.fromkeys((FORMER_GROUP, group)))
        return sh(
            "grep -E -- {users} /etc/passwd | sed 's/^/passwd:/'; "
            "grep -E -- {groups} /etc/group | sed 's/^/group:/'; "
            # One line a folder that exists: kind, path, a link's target, and a closing `.` (so
            # that no field is at the line's end, where a path's trailing blank could be lost).
            "for p in {paths}; do "
            """if [ -L "$p" ]; then printf 'link\\t%s\\t%s\\t.\\n' "$p" "$(readlink "$p")"; """
            """elif [ -d "$p" ]; then printf 'dir\\t%s\\t\\t.\\n' "$p"; """
            """elif [ -e "$p" ]; then printf 'other\\t%s\\t\\t.\\n' "$p"; fi; done; true""",
            users=f"^({users}):",
            groups=f"^({groups}):",
            paths=list(dict.fromkeys((FORMER_DATA_DIR, FORMER_LOG_DIR, data_dir, log_dir))),
        )

    def process(self, output: list[str]) -> AccountState:
        users: dict[str, tuple[int, int]] = {}
        groups: dict[str, int] = {}
        paths: dict[str, tuple[str, str]] = {}
        for line in output:
            if line.startswith("passwd:"):
                fields = line.removeprefix("passwd:").split(":")
                if len(fields) >= 4 and fields[2].isdigit() and fields[3].isdigit():
                    users.setdefault(fields[0], (int(fields[2]), int(fields[3])))
            elif line.startswith("group:"):
                fields = line.removeprefix("group:").split(":")
                if len(fields) >= 3 and fields[2].isdigit():
                    groups.setdefault(fields[0], int(fields[2]))
            else:
                fields = line.split("\t")
                if len(fields) == 4 and fields[0] in ("dir", "link", "other") and fields[3] == ".":
                    paths[fields[1]] = (fields[0], fields[2])
        return AccountState(users, groups, paths)

    @staticmethod
    def default() -> AccountState:
        return AccountState({}, {}, {})


@dataclass(frozen=True)
class AccountMigration:
    """What the deploy does about the former names on one host; nothing at all where falsy."""

    user: str  # the configured names
    group: str
    ids: tuple[int, int] | None = None  # (uid, gid) of the former account the configured names take over
    add_group: bool = False  # the configured group is added (with gid ids[1]) now
    add_user: bool = False  # the configured user is added (with uid ids[0]) now
    moves: tuple[tuple[str, str], ...] = ()  # (former folder, configured folder) to move now
    links: tuple[tuple[str, str], ...] = ()  # (former folder, configured folder): a link to drop

    @property
    def drop_account(self) -> bool:
        """The former names are (or are about to be) second names of the ids: to drop."""
        return self.ids is not None

    def __bool__(self) -> bool:
        return bool(self.ids or self.moves or self.links)


def fact_arguments(base) -> dict[str, str]:
    """ServiceAccountState's arguments for one host's base_* settings."""
    return dict(user=base.service_user, group=base.service_group, data_dir=base.data_dir, log_dir=base.log_dir)


def account_migration(state: AccountState, base) -> AccountMigration:
    """What is to do, from the state read before anything ran and the host's base_* settings."""
    user, group = base.service_user, base.service_group
    former, former_gid = state.users.get(FORMER_USER), state.groups.get(FORMER_GROUP)
    ids = None
    # The account moves only from the former defaults, only when neither name is kept, and only
    # onto names that are free or already second names of its ids (an earlier deploy's, whose
    # switch never passed or that stopped between two steps): never onto another account.
    if user != FORMER_USER and group != FORMER_GROUP and former is not None and former_gid is not None:
        user_free = user not in state.users or state.users[user][0] == former[0]
        group_free = group not in state.groups or state.groups[group] == former_gid
        if user_free and group_free:
            ids = (former[0], former_gid)
    moves, links = [], []
    for old, new in ((FORMER_DATA_DIR, base.data_dir), (FORMER_LOG_DIR, base.log_dir)):
        if new == old:
            continue
        if state.paths.get(old, ("", ""))[0] == "dir" and new not in state.paths:
            moves.append((old, new))
            links.append((old, new))
        elif state.paths.get(old) == ("link", new):
            links.append((old, new))
    return AccountMigration(
        user=user,
        group=group,
        ids=ids,
        add_group=ids is not None and group not in state.groups,
        add_user=ids is not None and user not in state.users,
        moves=tuple(moves),
        links=tuple(links),
    )


SETTING_OF = {FORMER_DATA_DIR: "base_data_dir", FORMER_LOG_DIR: "base_log_dir"}


def adoption_steps(migration: AccountMigration, data_dir: str) -> list[tuple[str, list[Shell]]]:
    """(operation name, shell commands) of roles/base's part, in order: the configured names on
    the former ids, then each folder under its new name with a link at the old one."""
    steps = []
    user, group = migration.user, migration.group
    assert migration.ids is not None or not (migration.add_group or migration.add_user), "adding keeps the ids"
    if migration.add_group:
        assert migration.ids is not None
        gid = migration.ids[1]
        steps.append(
            (
                f"Migrate service group {FORMER_GROUP} to {group} (gid {gid} kept)",
                [sh("groupadd --system --non-unique --gid {gid} -- {group}", gid=gid, group=group)],
            )
        )
    if migration.add_user:
        assert migration.ids is not None
        uid = migration.ids[0]
        steps.append(
            (
                f"Migrate service user {FORMER_USER} to {user} (uid {uid} kept; the name {FORMER_USER} goes"
                f" once the engine serves as {user})",
                [
                    sh(
                        "useradd --system --non-unique --uid {uid} --gid {group} --home-dir {home}"
                        " --shell /usr/sbin/nologin --no-create-home -- {user}",
                        uid=uid,
                        group=group,
                        home=data_dir,
                        user=user,
                    )
                ],
            )
        )
    for old, new in migration.moves:
        refusal = (
            f"{old} is a mount point: mount it at {new}, or set {SETTING_OF[old]} = {old!r} to keep it"
            " (docs/upgrades.md#the-service-account)"
        )
        steps.append(
            (
                f"Move {old} to {new} (a rename on its file system, nothing copied; {old} links there"
                " until the former names go)",
                [
                    # A mount point cannot be renamed: say what to do rather than mv's EBUSY.
                    sh("if mountpoint -q -- {old}; then echo {refusal} >&2; exit 1; fi", old=old, refusal=refusal),
                    sh("mv -T -- {old} {new}", old=old, new=new),
                    sh("ln -s -- {new} {old}", old=old, new=new),
                ],
            )
        )
    return steps


def drop_steps(migration: AccountMigration, why: str) -> list[tuple[str, list[Shell]]]:
    """(operation name, shell commands) that remove the former account names, once nothing runs
    under them (the ids stay, under the configured names). The links: drop_former_names."""
    if not migration.drop_account:
        return []
    user, group = migration.user, migration.group
    assert migration.ids is not None, "dropping the former names keeps their ids"
    uid, gid = migration.ids
    return [
        (
            f"Remove the former service user and group name {FORMER_USER} (uid {uid} and gid {gid} stay,"
            f" as {user}:{group}): {why}",
            [
                # Only a second name of the configured ids; -f: that uid runs the engine (as `user`).
                sh(
                    "u=$(id -u -- {former} 2>/dev/null);"
                    ' if [ -n "$u" ] && [ "$u" = "$(id -u -- {user})" ]; then userdel -f -- {former}; fi',
                    former=FORMER_USER,
                    user=user,
                ),
                # Left where USERGROUPS_ENAB is off (userdel then keeps a group of the user's name).
                sh(
                    "g=$(getent group -- {former} | cut -d: -f3);"
                    ' if [ -n "$g" ] && [ "$g" = "$(getent group -- {group} | cut -d: -f3)" ];'
                    " then groupdel -f -- {former}; fi",
                    former=FORMER_GROUP,
                    group=group,
                ),
            ],
        )
    ]


def adopt_former_names(migration: AccountMigration, data_dir: str) -> None:
    """roles/base, before the user is ensured (adoption_steps)."""
    for name, commands in adoption_steps(migration, data_dir):
        server.shell(name=name, commands=commands)  # type: ignore[arg-type]  # Shell is a str; pyinfra's list[str] is invariant


def drop_former_names(migration: AccountMigration, why: str) -> None:
    """The former names, once nothing runs under them: the user and group entries and the links
    at the old folders."""
    for name, commands in drop_steps(migration, why):
        server.shell(name=name, commands=commands)  # type: ignore[arg-type]  # Shell is a str; pyinfra's list[str] is invariant
    for old, new in migration.links:
        files.link(name=f"Remove the link {old} (now {new}): {why}", path=old, present=False)


# rename-script: keep (this file names the account before the rename on purpose)
