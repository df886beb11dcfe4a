# rename-script: keep (this file names the service account before the rename on purpose)
"""The service account's engine-neutral names (docs/upgrades.md#the-service-account) and the
migration of a host deployed by main up to commit fb51e7b (roles/shared/legacy_account.py): the
new defaults; the fact read from captured output; what is planned from what the fact says, and
in which order (the new names on the former ids before roles/base ensures the user; the former
names dropped only after the engine's one health-gated switch). What the host then holds:
tests/lab/test_sglang_engine.py."""

from __future__ import annotations

import pytest

from roles.shared.legacy_account import (
    FORMER_DATA_DIR,
    FORMER_LOG_DIR,
    AccountState,
    ServiceAccountState,
    account_migration,
    adoption_steps,
    drop_steps,
)
from roles.site.sections.base import BaseSettings
from tests.unit.conftest import PROJECT_ROOT
from tests.unit.test_gpu_stack_plans import plan

DATA = PROJECT_ROOT / "tests" / "unit" / "data" / "service_account"
NEW_DATA, NEW_LOG = "/var/lib/inference-engine", "/var/log/inference-engine"
LIBEXEC = "/usr/local/libexec/inference-host"

ACCOUNT = ("inventory_account_ubuntu2404.py", "@fake/gpu-account")
KEPT = ("inventory_account_kept_ubuntu2404.py", "@fake/gpu-account-kept")
FRESH = ("inventory_ubuntu2404.py", "@fake/gpu-ubuntu2404")
GATEWAY = ("inventory_gateway_ubuntu2404.py", "@fake/gw-ubuntu2404")
LAYOUT = ("inventory_migration_ubuntu2404.py", "@fake/gpu-migrating")  # 7c5257e: an older layout too

ADOPT_GROUP = "groupadd --system --non-unique --gid 995 -- inference"
ADOPT_USER = (
    "useradd --system --non-unique --uid 999 --gid inference --home-dir /var/lib/inference-engine"
    " --shell /usr/sbin/nologin --no-create-home -- inference"
)
DROP_USER = (
    'u=$(id -u -- sglang 2>/dev/null); if [ -n "$u" ] && [ "$u" = "$(id -u -- inference)" ];'
    " then userdel -f -- sglang; fi"
)
CREATE_USER = "useradd -d /var/lib/inference-engine -s /usr/sbin/nologin -g inference -r -M inference"


def _state(name: str) -> AccountState:
    return ServiceAccountState().process((DATA / f"{name}.txt").read_text().splitlines())


def _base(**settings) -> BaseSettings:
    return BaseSettings(**settings)


def test_the_defaults_name_no_engine():
    base = BaseSettings()
    assert (base.service_user, base.service_group) == ("inference", "inference")
    assert (base.data_dir, base.log_dir) == (NEW_DATA, NEW_LOG)
    # group_data/all.py leaves them to the model (one place says them).
    lines = (PROJECT_ROOT / "group_data" / "all.py").read_text().splitlines()
    assert not [line for line in lines if line.startswith(("base_service", "base_data_dir", "base_log_dir"))]


def test_the_fact_reads_the_captured_states():
    assert _state("fb51e7b") == AccountState(
        users={"sglang": (999, 995)},
        groups={"sglang": 995},
        paths={FORMER_DATA_DIR: ("dir", ""), FORMER_LOG_DIR: ("dir", "")},
    )
    transition = _state("transition")
    assert transition.users == {"sglang": (999, 995), "inference": (999, 995)}
    assert transition.groups == {"sglang": 995, "inference": 995}
    assert transition.paths[FORMER_DATA_DIR] == ("link", NEW_DATA) and transition.paths[NEW_LOG] == ("dir", "")
    assert _state("migrated") == AccountState(
        users={"inference": (999, 995)},
        groups={"inference": 995},
        paths={NEW_DATA: ("dir", ""), NEW_LOG: ("dir", "")},
    )
    assert ServiceAccountState.default() == AccountState({}, {}, {})


def test_the_fact_asks_for_both_names_and_quotes_the_folders():
    command = ServiceAccountState().command(
        user="inference", group="engine", data_dir="/srv/a b", log_dir="/var/log/inference-engine"
    )
    assert "grep -E -- '^(sglang|inference):' /etc/passwd" in command
    assert "grep -E -- '^(sglang|engine):' /etc/group" in command
    assert "for p in /var/lib/sglang /var/log/sglang '/srv/a b' /var/log/inference-engine;" in command


def test_a_host_of_fb51e7b_takes_the_new_names_on_its_ids_and_moves_its_folders():
    migration = account_migration(_state("fb51e7b"), _base())
    assert migration.ids == (999, 995) and migration.add_group and migration.add_user
    assert migration.moves == ((FORMER_DATA_DIR, NEW_DATA), (FORMER_LOG_DIR, NEW_LOG))
    assert migration.drop_account and migration.links == migration.moves
    steps = adoption_steps(migration, NEW_DATA)
    assert [name for name, _ in steps] == [
        "Migrate service group sglang to inference (gid 995 kept)",
        "Migrate service user sglang to inference (uid 999 kept; the name sglang goes once the engine serves as"
        " inference)",
        f"Move {FORMER_DATA_DIR} to {NEW_DATA} (a rename on its file system, nothing copied; {FORMER_DATA_DIR}"
        " links there until the former names go)",
        f"Move {FORMER_LOG_DIR} to {NEW_LOG} (a rename on its file system, nothing copied; {FORMER_LOG_DIR}"
        " links there until the former names go)",
    ]
    assert steps[0][1] == [ADOPT_GROUP] and steps[1][1] == [ADOPT_USER]
    assert steps[2][1][1:] == [f"mv -T -- {FORMER_DATA_DIR} {NEW_DATA}", f"ln -s -- {NEW_DATA} {FORMER_DATA_DIR}"]
    assert steps[2][1][0].startswith(f"if mountpoint -q -- {FORMER_DATA_DIR}; then echo ")
    (drop,) = drop_steps(migration, "why")
    assert drop[0] == "Remove the former service user and group name sglang (uid 999 and gid 995 stay, as" + (
        " inference:inference): why"
    )
    assert drop[1][0] == DROP_USER


def test_after_a_switch_that_never_passed_only_the_former_names_are_left_to_drop():
    migration = account_migration(_state("transition"), _base())
    assert not migration.add_group and not migration.add_user and migration.moves == ()
    assert migration.drop_account and migration.ids == (999, 995)
    assert migration.links == ((FORMER_DATA_DIR, NEW_DATA), (FORMER_LOG_DIR, NEW_LOG))


@pytest.mark.parametrize("state", ["migrated", "fresh"])
def test_a_migrated_or_fresh_host_plans_nothing(state):
    found = AccountState({}, {}, {}) if state == "fresh" else _state(state)
    migration = account_migration(found, _base())
    assert not migration and adoption_steps(migration, NEW_DATA) == [] and drop_steps(migration, "x") == []


def test_a_site_that_set_the_former_user_keeps_its_account():
    # Its own name: no second name, nothing dropped (whichever of the two it kept).
    for own in (
        {"service_user": "sglang"},
        {"service_group": "sglang"},
        {"service_user": "sglang", "service_group": "sglang"},
    ):
        migration = account_migration(_state("fb51e7b"), _base(**own))
        assert migration.ids is None and not migration.drop_account, own
        assert not any("useradd" in c or "groupadd" in c for _, cs in adoption_steps(migration, NEW_DATA) for c in cs)
    # All four old names set: nothing at all.
    kept = _base(service_user="sglang", service_group="sglang", data_dir=FORMER_DATA_DIR, log_dir=FORMER_LOG_DIR)
    assert not account_migration(_state("fb51e7b"), kept)


def test_a_folder_moves_only_to_a_name_that_is_free():
    found = _state("fb51e7b")
    taken = AccountState(found.users, found.groups, {**found.paths, "/srv/engine": ("dir", "")})
    migration = account_migration(taken, _base(data_dir="/srv/engine"))
    assert migration.moves == ((FORMER_LOG_DIR, NEW_LOG),)


def test_the_account_moves_only_onto_free_names_or_its_own_second_names():
    found = _state("fb51e7b")
    # A configured user or group that exists already on other ids is another account: left alone.
    for users, groups in (({"inference": (1001, 995)}, {}), ({}, {"inference": 1001})):
        other = AccountState({**found.users, **users}, {**found.groups, **groups}, found.paths)
        assert account_migration(other, _base()).ids is None, (users, groups)
    # An earlier deploy that stopped between the two steps: the group is there, the user is added.
    half = AccountState(found.users, {**found.groups, "inference": 995}, found.paths)
    migration = account_migration(half, _base())
    assert (migration.add_group, migration.add_user, migration.ids) == (False, True, (999, 995))
    assert [commands for _, commands in adoption_steps(migration, NEW_DATA)][0] == [ADOPT_USER]


# --- the plan: the real deploy against a @fake host that answers as an fb51e7b host -------------------------


def test_the_new_names_take_the_former_ids_before_the_user_is_ensured():
    p = plan(*ACCOUNT)
    group, user = p.index(ADOPT_GROUP), p.index(ADOPT_USER)
    move = p.index(f"mv -T -- {FORMER_DATA_DIR} {NEW_DATA}")
    assert group < user < move < p.index(f"mv -T -- {FORMER_LOG_DIR} {NEW_LOG}")
    # roles/base's own user (on this fake host the fact still says no `inference`) comes after.
    assert move < p.index(CREATE_USER)


def test_the_former_names_go_after_the_one_switch():
    p = plan(*ACCOUNT)
    switches = [i for i, c in enumerate(p.commands) if c.startswith(f"{LIBEXEC}/inference-engine-switch ")]
    assert len(switches) == 1, switches
    assert switches[0] < p.index(DROP_USER) < p.index(f"rm -f {FORMER_DATA_DIR}")
    assert p.index(f"rm -f {FORMER_LOG_DIR}") > switches[0]
    # The engine runs as the new name: the unit, its cleanup and the preflight say it.
    unit = next(text for path, text in p.uploads.items() if path.endswith("/serving/inference-engine.service"))
    assert "User=inference" in unit and f"ReadWritePaths={NEW_DATA} {NEW_LOG}" in unit
    assert "inference-engine-cleanup inference inference-engine.service" in unit
    preflight = next(c for c in p.commands if c.startswith("systemd-run ") and "preflight" in c)
    assert f"-p User=inference -p Group=inference -p WorkingDirectory={NEW_DATA}" in preflight


def test_a_site_that_kept_the_former_names_and_a_fresh_host_plan_no_migration():
    for where in (KEPT, FRESH):
        p = plan(*where)
        assert not any(
            "--non-unique" in c or "userdel" in c or "groupdel" in c or c.startswith("mv -T -- /var/")
            for c in p.commands
        ), where
    kept = plan(*KEPT)
    assert any(c.startswith("useradd ") and c.endswith(" sglang") for c in kept.commands)  # as before: its own user


def test_a_host_without_an_engine_drops_the_former_names_in_roles_base():
    """A gateway's host: nothing runs under the former names; they go right away, before
    roles/base ensures the user."""
    p = plan(*GATEWAY)
    assert p.index(ADOPT_USER) < p.index(DROP_USER) < p.index(f"rm -f {FORMER_DATA_DIR}") < p.index(CREATE_USER)


def test_a_host_of_the_older_layout_migrates_its_account_too():
    """A 7c5257e host has the same account: renamed with the same steps, the former names dropped
    after the switch that stops sglang.service (whose rollback starts it under them)."""
    p = plan(*LAYOUT)
    switch = next(i for i, c in enumerate(p.commands) if c.startswith(f"{LIBEXEC}/inference-engine-switch "))
    assert p.index(ADOPT_USER) < p.index(CREATE_USER) < switch < p.index(DROP_USER)
    assert p.commands[switch].endswith(" sglang.service")


# rename-script: keep (this file names the service account before the rename on purpose)
