"""roles/engine_envs + roles/serving in the lab: the migration of a host deployed by main before
the engine-neutral names (commit 7c5257e), and of one deployed by main before the engine-neutral
service account (commit fb51e7b); the real sglang wheel in its versioned uv environment,
patched; the stand-in server under the real systemd unit; restarts only on change; cleanup of
stubborn children; upgrade and health-gated rollback with measured downtime."""

from __future__ import annotations

import json
import shlex
import shutil
import statistics
import subprocess
import time
from pathlib import Path

import pytest

import lab
from lab.standins.nvidia_apt_repo import signing
from roles.shared import layout, legacy_account, legacy_layout
from roles.shared.engine_env import env_dir
from roles.site import address_of, load_site, vault
from tests.lab.harness import LAB_INVENTORY, PROJECT_ROOT, DeployRun, json_documents, run_deploy

pytestmark = pytest.mark.lab

SITE = load_site(LAB_INVENTORY)
HOST = SITE.group("gpu_nodes")[0]
OLD = SITE.stack.active
NEW = SITE.stack.stacks["sglang-0.5.23-cu130"]
ROOT = HOST.base.install_root
URL = f"http://127.0.0.1:{HOST.serving.port}"
OLD_ENV = env_dir(HOST, OLD, SITE)  # <root>/envs/<stack id>-<stamp of its lock>
NEW_ENV = env_dir(HOST, NEW, SITE)
POLLER = "/run/ih-downtime-poller.py"
POLL_LOG = "/run/ih-downtime.log"


def _main_pid(gpu_guest) -> str:
    return gpu_guest.check_output("systemctl show -p MainPID --value inference-engine.service")


def _secrets() -> dict[str, str]:
    return vault.decrypt_all(SITE.secrets_file, sorted(SITE.secret_names))


def _api_key() -> str:
    return _secrets()["engine_api_key"]


def _config(stack) -> str:
    return f"{env_dir(HOST, stack, SITE)}/serving"


def _leaked(text: str) -> list[str]:
    return [name for name, value in _secrets().items() if value in text]


def _inventory_with_active(tmp_path: Path, stack_id: str) -> Path:
    """inventory/lab.py beside a stack file whose `active` is stack_id (the user's edit)."""
    folder = tmp_path / "inventory"
    folder.mkdir(exist_ok=True)
    shutil.copy(LAB_INVENTORY, folder / "lab.py")
    if not (folder / "locks").exists():
        shutil.copytree(PROJECT_ROOT / "inventory/locks", folder / "locks")
    text = (PROJECT_ROOT / "inventory/stack.yml").read_text()
    (folder / "stack.yml").write_text(text.replace(f"active: {OLD.id}", f"active: {stack_id}"))
    return folder / "lab.py"


# Main before the engine-neutral names: what a host deployed today runs (roles/shared/legacy_layout.py).
OLD_MAIN = "7c5257e"
OLD_MAIN_FULL = "7c5257eb8f211ee0098afb5f1225a1e143f31695"
# Main before the engine-neutral service account (roles/shared/legacy_account.py): the user
# `sglang`, /var/lib/sglang and /var/log/sglang. 7c5257e had them too.
OLD_ACCOUNT_MAIN = "fb51e7b"
OLD_ACCOUNT_MAIN_FULL = "fb51e7b12f732aadda8b7ae472ae149155d45aa8"
FORMER_USER = legacy_account.FORMER_USER
FORMER_FOLDERS = (legacy_account.FORMER_DATA_DIR, legacy_account.FORMER_LOG_DIR)
UNIT = f"{HOST.serving.unit_name}.service"
LEGACY_ROOT = "/opt/sglang"
# systemd's catalog ids (systemd 252, src/systemd/sd-messages.h): a unit started, a unit stopped.
UNIT_STARTED, UNIT_STOPPED = "39f53479d3a045ac8e11786248231fbf", "9d1aaa27d60140bd96365438aad20286"


def _old_main(
    tmp: Path,
    commit: str = OLD_MAIN,
    full: str = OLD_MAIN_FULL,
    what: str = "main before the engine-neutral names",
    api_key_name: str = "sglang_api_key",
) -> Path:
    """The project at `commit` with its own environment, sharing this lab's throwaway vault
    (api_key_name: the vault key that commit reads the API key under)."""

    def known() -> bool:
        return (
            subprocess.run(
                ["git", "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}"],
                cwd=PROJECT_ROOT,
                capture_output=True,
            ).returncode
            == 0
        )

    if not known():  # a shallow clone: ask its origin for that one commit (full id: fetch needs it)
        subprocess.run(
            ["git", "fetch", "--quiet", "--depth=1", "origin", full],
            cwd=PROJECT_ROOT,
            capture_output=True,
            timeout=300,
        )
    if not known():
        pytest.fail(
            f"commit {commit} ({what}) is not in this clone; the migration test deploys it: git fetch origin {commit}"
        )
    # Short: gpg-agent's sockets live in <tree>/.lab/nvidia_apt_repo/gnupg, and a Unix socket's
    # path holds at most 107 bytes (sun_path); "account-migration0/old-main-fb51e7b" went past it,
    # and under pytest-xdist the base folder grows by its worker's "popen-gw0/".
    tree = tmp / commit
    tree.mkdir()
    archive = subprocess.run(["git", "archive", commit], cwd=PROJECT_ROOT, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    _serve_this_checkouts_repositories(tree)
    # The same vault (API key, token), its password and the guest's SSH key: this lab's, not new ones.
    (tree / ".lab").mkdir(mode=0o700)
    vault_file, password_file = lab.throwaway_vault()  # where the old code reads them: .lab/
    shutil.copy2(vault_file, tree / ".lab" / "secrets.vault.yml")
    shutil.copy2(password_file, tree / ".lab" / "vault-password")
    for name in ("guest-ssh-key", "guest-ssh-key.pub"):
        if (lab.STATE_DIR / name).exists():
            shutil.copy2(lab.STATE_DIR / name, tree / ".lab" / name)
    # Its inventory and lab read the API key by its old name (docs/upgrades.md#engine-neutral-setting-names):
    # its copy of the vault holds the same value under that name.
    copied = tree / ".lab" / "secrets.vault.yml"
    if api_key_name != "engine_api_key" and copied.exists() and "engine_api_key" in vault.stored(copied):
        vault.rename_secret(copied, "engine_api_key", api_key_name)
    # The same NVIDIA apt signing key: one vendor's key for old and new code, as on the target. A key
    # of its own (made once per checkout) left the guest trusting only the old repository's
    # signature, and apt kept the old index for this code's repository. The committed key goes
    # where the old code keeps the one it made.
    key, _, _ = signing.keyring(lab.STATE_DIR / "nvidia_apt_repo")
    shutil.copytree(key, tree / ".lab" / "nvidia_apt_repo" / "gnupg", ignore=shutil.ignore_patterns("S.*"))
    subprocess.run(["uv", "sync", "--frozen", "--quiet"], cwd=tree, check=True)
    return tree


def _serve_this_checkouts_repositories(tree: Path) -> None:
    """One Hub stand-in serves the old code and this one (the first to start it; the same port),
    so the old code's inventory must pin the commits of what this checkout's stand-in serves: its
    own copy of the stand-in computes them from its repositories' files, which have changed since
    (each config.json now names itself a stand-in). The old copy gets this checkout's files, as a
    Hub keeps serving the same commits whichever client asks."""
    import json

    from lab.standins.hf_hub import server as hub_server

    old = [tree / folder / "standins/hf_hub/server.py" for folder in ("lab", "tests")]
    found = [path for path in old if path.exists()]
    assert found, f"no Hub stand-in in the old tree at {tree} (looked for {[str(p) for p in old]})"
    with found[0].open("a") as module:
        module.write(
            "\n# Added by tests/lab/test_sglang_engine.py: the repositories of the Hub the lab runs now.\n"
            f"LAB_REPOS.clear()\nLAB_REPOS.update(__import__('json').loads({json.dumps(hub_server.LAB_REPOS)!r}))\n"
        )


def _cursor(gpu_guest) -> str:
    """Where the guest's journal ends now: what follows is what happened after this call.
    (`--since @<date +%s>` also counted what the same second logged before the call.)"""
    entry = gpu_guest.check_output("journalctl -n 1 -o json --output-fields=__CURSOR --no-pager")
    return json.loads(entry)["__CURSOR"]


def _after(gpu_guest, cursor: str) -> list[dict]:
    """The guest's journal entries after the cursor. Matched here, not by journalctl: systemd
    252's journalctl, given --after-cursor and field matches, steps over the first match (it
    skips one entry past the cursor's position, as if the cursor's own entry matched)."""
    out = gpu_guest.check_output(
        f"journalctl --no-pager -o json --after-cursor={shlex.quote(cursor)}"
        " --output-fields=MESSAGE_ID,UNIT,_SYSTEMD_UNIT,MESSAGE"
    )
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def _starts(gpu_guest, unit: str, after: str, message: str = UNIT_STARTED) -> int:
    return sum(1 for e in _after(gpu_guest, after) if e.get("MESSAGE_ID") == message and e.get("UNIT") == unit)


def _units_journal(gpu_guest, after: str) -> str:
    """Both units' journal lines (their own and systemd's about them) after the cursor, with
    microseconds: what an assertion on their starts shows when it fails."""
    units = {UNIT, "sglang.service"}
    return "\n".join(
        f"{int(e['__REALTIME_TIMESTAMP']) / 1e6:.6f} {e.get('MESSAGE') or '(a long line)'}"
        for e in _after(gpu_guest, after)
        if e.get("UNIT") in units or e.get("_SYSTEMD_UNIT") in units
    )


def _old_deploy(tree: Path) -> DeployRun:
    completed = subprocess.run(
        [
            "uv",
            "run",
            "--frozen",
            "pyinfra",
            "-y",
            "--json",
            "--limit",
            lab.pyinfra_name("gpu"),
            "inventory/lab.py",
            "deploy.py",
        ],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    docs = json_documents(completed.stdout)
    results = (
        {"operations": [op for d in reversed(docs) for op in d["results"].get("operations", [])]} if docs else None
    )
    return DeployRun(completed.returncode, completed.stdout, completed.stderr, results)


def _old_main_deploys_a_new_guest(gpu_guest, tree: Path, commit: str) -> float:
    """A new guest (a bare container, as its node's `pct create` makes one), deployed by the
    project at `commit` (tree); the seconds that took."""
    lab.fresh("gpu")
    started = time.monotonic()
    old = _old_deploy(tree)
    assert old.returncode == 0, f"the first deploy of main at {commit} failed\n" + old.explain()
    _forget_old_nvidia_index(gpu_guest)
    return time.monotonic() - started


def _migrate(gpu_guest, tree: Path) -> dict:
    # A new guest (a bare container, as its node's `pct create` makes one), deployed first by
    # OLD_MAIN: every file, user and unit on it is what that commit's deploy makes. Only the
    # guest: the node's roles kept their names across the rename.
    old_s = _old_main_deploys_a_new_guest(gpu_guest, tree, OLD_MAIN)
    assert gpu_guest.service(legacy_layout.LEGACY_UNIT).is_running
    assert not gpu_guest.file(f"/etc/systemd/system/{UNIT}").exists
    _wait_healthy(gpu_guest)
    ids = _ids(gpu_guest, FORMER_USER)  # its service account: migrated too, keeping these
    started = time.monotonic()
    failed = run_deploy(env={"INFERENCE_HOST_LAB_NEVER_HEALTHY": OLD.sglang})
    failed_s = time.monotonic() - started
    # Right after the failed try: the old unit serves again, and only it is enabled at boot.
    legacy_serves = (
        gpu_guest.service("sglang").is_running
        and gpu_guest.run(f"curl -sf -o /dev/null {URL}/health_generate").rc == 0
        and not gpu_guest.service(HOST.serving.unit_name).is_enabled
    )
    # ... under the service account's old names, still there beside the new ones until a switch passes.
    old_names_kept = gpu_guest.run(f"getent passwd {FORMER_USER}").rc == 0 and all(
        gpu_guest.file(path).is_symlink for path in FORMER_FOLDERS
    )
    after = _cursor(gpu_guest)
    started = time.monotonic()
    run = run_deploy()
    migration_s = time.monotonic() - started
    print(
        f"\nmigration: old main's first deploy of the guest {old_s:.0f} s, a failing first try {failed_s:.0f} s,"
        f" the migration {migration_s:.0f} s"
    )
    if run.returncode != 0:  # its test fails saying why; the tests after it get a deployed guest
        _restore(gpu_guest)
    return {
        "failed": failed,
        "run": run,
        "after": after,
        "legacy_serves": legacy_serves,
        "old_names_kept": old_names_kept,
        "ids": ids,
    }


def _forget_old_nvidia_index(gpu_guest) -> None:
    """Two builds of the NVIDIA repository at one URL, old main's and this lab's, are not one
    repository moving forward as NVIDIA's is: apt kept old main's index of it (python's
    http.server answers If-Modified-Since by file times: 304), where the exporter's DCGM pin is
    missing. The guest forgets old main's index of that URL; its next update reads this lab's."""
    gpu_guest.run("rm -f /var/lib/apt/lists/*_compute_cuda_repos_*")


def _ids(gpu_guest, user: str) -> tuple[str, str]:
    return gpu_guest.check_output(f"id -u {user}"), gpu_guest.check_output(f"id -g {user}")


def _gone(gpu_guest, path: str) -> bool:
    """Neither there nor a link (testinfra's `exists` follows a link: a dangling one is not there)."""
    return gpu_guest.run(f"test -e {shlex.quote(path)} || test -L {shlex.quote(path)}").rc != 0


def _assert_account_migrated(gpu_guest, ids: tuple[str, str]) -> None:
    """The service account under its new names with its old ids; nothing of the old names left."""
    base = HOST.base
    assert _ids(gpu_guest, base.service_user) == ids, f"{base.service_user} must keep {FORMER_USER}'s uid and gid"
    assert gpu_guest.run(f"getent passwd {FORMER_USER}").rc != 0, f"the user {FORMER_USER} is left"
    assert gpu_guest.run(f"getent group {legacy_account.FORMER_GROUP}").rc != 0, "the old group is left"
    for path in FORMER_FOLDERS:
        assert _gone(gpu_guest, path), f"{path} is left after the migration"
    for path in (base.data_dir, base.log_dir):
        folder = gpu_guest.file(path)
        assert folder.is_directory and (folder.user, folder.group) == (base.service_user, base.service_group), path
    assert gpu_guest.check_output(f"stat -c %U /proc/{_main_pid(gpu_guest)}") == base.service_user


def _restore(gpu_guest) -> None:
    """After a migration that failed: the guest as this code deploys it, so that the module's
    other tests (and the modules after it) test this code, not the wreck. The deploy (it
    migrates what it can), else a new guest deployed by this code (what the walk did)."""
    if run_deploy().returncode == 0:
        return
    lab.fresh("gpu")
    restored = run_deploy()
    assert restored.returncode == 0, "restoring the guest after the failed migration failed\n" + restored.explain()


@pytest.fixture(scope="module")
def migrated(gpu_guest, lab_second_deploy, tmp_path_factory):
    """A new guest deployed by OLD_MAIN, then by this code: first with a release that never
    becomes ready (the old unit must serve again), then as it is (the migration). Timings
    printed. Whatever fails here, the guest is restored for the tests after these."""
    tree = _old_main(tmp_path_factory.mktemp("mig"))  # before the guest is touched
    try:
        return _migrate(gpu_guest, tree)
    except KeyboardInterrupt:
        raise
    except BaseException:  # an assertion, a timeout, pytest.fail: the same repair
        _restore(gpu_guest)
        raise


def test_a_failed_migration_leaves_the_old_unit_serving(gpu_guest, migrated):
    failed = migrated["failed"]
    assert failed.returncode != 0, "the deploy must fail when the new unit never becomes ready"
    text = failed.stdout + failed.stderr
    assert "ROLLED BACK" in text and "sglang.service serves again" in text, failed.explain()
    assert migrated["legacy_serves"], "after the failed try the old unit must serve, the new one be off boot"
    assert migrated["old_names_kept"], "the failed try must leave the old account names (its rollback runs under them)"


def test_a_host_of_old_main_migrates_with_one_restart(gpu_guest, migrated):
    run, after = migrated["run"], migrated["after"]
    assert run.returncode == 0, run.explain()
    assert any(name.startswith("Serving | Migrate from sglang.service") for name in run.changed), run.changed
    journal = _units_journal(gpu_guest, after)
    assert _starts(gpu_guest, UNIT, after) == 1, "the new unit must start exactly once\n" + journal
    assert _starts(gpu_guest, "sglang.service", after) == 0, "the old unit must not start again\n" + journal
    assert _starts(gpu_guest, "sglang.service", after, UNIT_STOPPED) == 1, journal
    assert gpu_guest.service(HOST.serving.unit_name).is_running and gpu_guest.service(HOST.serving.unit_name).is_enabled
    _wait_healthy(gpu_guest, timeout=5)
    assert run.health_checks, "the deploy's health check did not run"
    # Nothing of the old names is left: unit, boot link, scripts, secret dir, root.
    for path in [
        "/etc/systemd/system/sglang.service",
        "/etc/systemd/system/multi-user.target.wants/sglang.service",
        "/etc/sglang",
        LEGACY_ROOT,
        *(f"/usr/local/libexec/inference-host/{name}" for name in legacy_layout.LEGACY_SCRIPTS),
    ]:
        assert not gpu_guest.file(path).exists, f"{path} is left after the migration"
    assert gpu_guest.run("systemctl cat sglang.service").rc != 0
    assert "sglang.service" not in gpu_guest.check_output("systemctl list-units --all --no-legend --plain")
    # Its service account too (the one main kept up to fb51e7b): given its new names by the failed
    # try already (roles/base), the old names dropped after this run's switch.
    assert any(name.startswith(f"Base | Migrate service user {FORMER_USER} to ") for name in migrated["failed"].changed)
    assert any(name.startswith("Serving | Remove the former service user") for name in run.changed), run.changed
    _assert_account_migrated(gpu_guest, migrated["ids"])


def test_the_deploy_after_the_migration_changes_nothing(gpu_guest, migrated):
    before = _main_pid(gpu_guest)
    unchanged = run_deploy()
    assert unchanged.returncode == 0 and unchanged.changed == [], unchanged.changed
    assert _main_pid(gpu_guest) == before


# A file planted in the old data folder (where the Hugging Face cache lives): the lab's engine
# reads no Hub repository, so its guest holds no token there (roles/base removes it); this file
# stands in for the cache and the token. Its digest and inode say it was moved, not copied.
PLANTED = ".cache/huggingface/hub/ih-account-migration"


def _plant(gpu_guest) -> dict:
    old = legacy_account.FORMER_DATA_DIR
    gpu_guest.check_output(
        f"install -d -o {FORMER_USER} -g {legacy_account.FORMER_GROUP} -m 0700 {old}/.cache {old}/.cache/huggingface"
        f" {old}/.cache/huggingface/hub && head -c 4096 /dev/urandom > {old}/{PLANTED}"
        f" && chown {FORMER_USER}:{legacy_account.FORMER_GROUP} {old}/{PLANTED} && chmod 0600 {old}/{PLANTED}"
    )
    return _planted(gpu_guest, old)


def _planted(gpu_guest, folder: str) -> dict:
    """Digest, inode and numeric owner of the planted file (computed in the guest: nothing of it is printed)."""
    path = f"{folder}/{PLANTED}"
    return {
        "sha256": gpu_guest.check_output(f"sha256sum {path} | cut -d' ' -f1"),
        "inode": gpu_guest.check_output(f"stat -c '%i %u:%g' {path}"),
    }


def _migrate_account(gpu_guest, tree: Path) -> dict:
    # A new guest deployed first by OLD_ACCOUNT_MAIN (its first deploy: the account and folders
    # are that commit's), then by this code once.
    old_s = _old_main_deploys_a_new_guest(gpu_guest, tree, OLD_ACCOUNT_MAIN)
    assert gpu_guest.service(HOST.serving.unit_name).is_running
    assert gpu_guest.check_output(f"stat -c %U /proc/{_main_pid(gpu_guest)}") == FORMER_USER
    _wait_healthy(gpu_guest)
    ids, planted = _ids(gpu_guest, FORMER_USER), _plant(gpu_guest)
    after = _cursor(gpu_guest)
    started = time.monotonic()
    run = run_deploy()
    migration_s = time.monotonic() - started
    print(f"\naccount migration: old main's first deploy of the guest {old_s:.0f} s, the migration {migration_s:.0f} s")
    if run.returncode != 0:  # its test fails saying why; the tests after it get a deployed guest
        _restore(gpu_guest)
    return {"run": run, "after": after, "ids": ids, "planted": planted}


@pytest.fixture(scope="module")
def account_migrated(gpu_guest, lab_second_deploy, tmp_path_factory):
    """A new guest deployed by OLD_ACCOUNT_MAIN (the service user `sglang`), then by this code.
    Whatever fails here, the guest is restored for the tests after these."""
    tree = _old_main(
        tmp_path_factory.mktemp("acct"),
        OLD_ACCOUNT_MAIN,
        OLD_ACCOUNT_MAIN_FULL,
        "main before the engine-neutral service account",
        api_key_name="engine_api_key",
    )
    try:
        return _migrate_account(gpu_guest, tree)
    except KeyboardInterrupt:
        raise
    except BaseException:
        _restore(gpu_guest)
        raise


def test_a_host_of_fb51e7b_takes_the_new_account_names_keeping_its_ids(gpu_guest, account_migrated):
    run, after = account_migrated["run"], account_migrated["after"]
    assert run.returncode == 0, run.explain()
    uid = account_migrated["ids"][0]
    assert f"Base | Migrate service user {FORMER_USER} to {HOST.base.service_user} (uid {uid} kept" in " ".join(
        run.changed
    ), run.changed
    assert any(name.startswith("Serving | Remove the former service user") for name in run.changed), run.changed
    _assert_account_migrated(gpu_guest, account_migrated["ids"])
    # The data folder was moved, not copied: the planted file, same content, same inode, same owner.
    assert _planted(gpu_guest, HOST.base.data_dir) == account_migrated["planted"]
    journal = _units_journal(gpu_guest, after)
    assert _starts(gpu_guest, UNIT, after) == 1, "the engine must start exactly once\n" + journal
    _wait_healthy(gpu_guest, timeout=5)
    assert run.health_checks, "the deploy's health check did not run"


def test_the_deploy_after_the_account_migration_changes_nothing(gpu_guest, account_migrated):
    before = _main_pid(gpu_guest)
    unchanged = run_deploy()
    assert unchanged.returncode == 0 and unchanged.changed == [], unchanged.changed
    assert _main_pid(gpu_guest) == before


def _wait_healthy(gpu_guest, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if gpu_guest.run(f"curl -sf -o /dev/null {URL}/health_generate").rc == 0:
            return
        time.sleep(0.5)
    raise AssertionError("the service did not become healthy")


def test_serves_from_the_versioned_environment(gpu_guest, lab_second_deploy):
    assert gpu_guest.file(f"{ROOT}/current").linked_to == OLD_ENV
    version = gpu_guest.check_output(
        f"{ROOT}/current/bin/python -c 'import importlib.metadata as m; print(m.version(\"sglang\"))'"
    )
    assert version == OLD.sglang  # the real wheel of the pinned release
    assert gpu_guest.service("inference-engine").is_running and gpu_guest.service("inference-engine").is_enabled
    models = json.loads(gpu_guest.check_output(f"curl -sf -H 'Authorization: Bearer {_api_key()}' {URL}/v1/models"))
    assert models["data"][0]["id"] == HOST.serving.served_model_name
    assert gpu_guest.check_output(f"curl -s -o /dev/null -w '%{{http_code}}' {URL}/v1/models") == "401"
    assert gpu_guest.check_output(f"curl -s -o /dev/null -w '%{{http_code}}' {URL}/metrics") == "200"


def test_api_key_and_environment_stay_private(gpu_guest, lab_second_deploy):
    cmdline = gpu_guest.check_output(f"cat /proc/{_main_pid(gpu_guest)}/cmdline | tr '\\0' ' '")
    assert _api_key() not in cmdline and f"--config {_config(OLD)}/inference-engine-secret-args.yaml" in cmdline
    assert gpu_guest.check_output(f"ps -o user= -p {_main_pid(gpu_guest)}") == HOST.base.service_user
    secret_args = gpu_guest.file(f"{_config(OLD)}/inference-engine-secret-args.yaml")
    assert secret_args.mode == 0o600 and secret_args.user == HOST.base.service_user
    assert gpu_guest.file("/etc/inference-host/engine/inference-engine-secret-args.yaml").linked_to == secret_args.path
    env_file = gpu_guest.file(f"{_config(OLD)}/inference-engine.env")
    # 0640, group the checks' user: the CUDA check runs the engine's python with it (no key in it)
    assert (env_file.mode, env_file.user, env_file.group) == (0o640, "root", layout.CHECKS_USER)
    assert env_file.contains("^NCCL_P2P_LEVEL=SYS$") and _api_key() not in env_file.content_string
    assert env_file.contains("^SGLANG_ENABLE_JIT_DEEPGEMM=0$")


def test_unit_is_the_current_releases_and_sandboxed(gpu_guest, lab_second_deploy):
    assert (
        gpu_guest.file("/etc/systemd/system/inference-engine.service").linked_to
        == f"{_config(OLD)}/inference-engine.service"
    )
    assert gpu_guest.service("inference-engine").is_enabled
    assert gpu_guest.check_output("systemctl show -p NoNewPrivileges --value inference-engine") == "yes"
    # libcuda cannot make /dev/nvidia-uvm itself under NoNewPrivileges: the unit waits for the one that does
    assert (
        "nvidia-uvm-devices.service"
        in gpu_guest.check_output("systemctl show -p After --value inference-engine").split()
    )
    assert gpu_guest.check_output("systemctl show -p ProtectSystem --value inference-engine") == "strict"
    # Devices: the pseudo-devices and NVIDIA's by /proc/devices name (none here: no driver).
    assert gpu_guest.check_output("systemctl show -p DevicePolicy --value inference-engine") == "closed"
    # The sandbox is in force on the running server: / is read-only to it, its home is not.
    pid = _main_pid(gpu_guest)
    mounts = gpu_guest.check_output(f"cat /proc/{pid}/mountinfo")
    options = {line.split()[4]: line.split()[5].split(",") for line in mounts.splitlines()}
    assert "ro" in options["/"] and "rw" in options[HOST.base.data_dir], mounts
    score = gpu_guest.run("systemd-analyze security --no-pager inference-engine.service")
    assert "Overall exposure level for inference-engine.service" in score.stdout, score.stdout + score.stderr
    exposure = float(score.stdout.rsplit("inference-engine.service:", 1)[1].split()[0])
    assert exposure < 4.0, score.stdout


def test_start_up_log_is_the_releases_without_the_key(gpu_guest, lab_second_deploy):
    journal = gpu_guest.check_output("journalctl -u inference-engine.service --no-pager -o cat")
    assert "server_args=ServerArgs(" in journal  # 0.5.9's line, from its patched source
    assert _leaked(journal) == [], "a secret reached the unit's journal"


def test_patches_are_applied_to_the_real_wheel(gpu_guest, lab_second_deploy):
    source = gpu_guest.check_output(
        f"cat {ROOT}/current/lib/python3*/site-packages/sglang/srt/distributed/device_communicators"
        "/custom_all_reduce.py"
    )
    assert "SGLANG_CUSTOM_AR_ALLOW_PCIE" in source


def test_unit_verifies_clean(gpu_guest, lab_second_deploy):
    result = gpu_guest.run("systemd-analyze verify /etc/systemd/system/inference-engine.service")
    assert result.rc == 0 and "inference-engine.service" not in result.stderr, result.stderr


def test_stop_leaves_no_process_of_the_service_user(gpu_guest, lab_second_deploy):
    user = HOST.base.service_user
    # The stand-in runs with a child that ignores SIGTERM (INFERENCE_HOST_STANDIN_STUBBORN_CHILD).
    assert len(gpu_guest.check_output(f"pgrep -u {user} -f signal.SIG_IGN || true").split()) >= 1
    # And a stray process of the service user outside the unit (a manual run's orphan).
    gpu_guest.check_output(f"systemd-run --quiet --uid={user} --unit=ih-stray sh -c 'trap \"\" TERM; sleep 600'")
    started = time.monotonic()
    gpu_guest.check_output("systemctl stop inference-engine.service")
    assert time.monotonic() - started < 30
    assert gpu_guest.run(f"pgrep -u {user}").stdout.strip() == "", "processes of the service user survived the stop"
    gpu_guest.check_output("systemctl start inference-engine.service")  # ExecStartPost waits for readiness
    _wait_healthy(gpu_guest)


def test_changed_setting_restarts_unchanged_does_not(gpu_guest, lab_second_deploy):
    before = _main_pid(gpu_guest)
    unchanged = run_deploy()
    assert unchanged.returncode == 0 and unchanged.changed == [], unchanged.changed
    assert _main_pid(gpu_guest) == before
    changed = run_deploy(env={"INFERENCE_HOST_LAB_READY_TIMEOUT": "21"})
    try:
        assert changed.returncode == 0, changed.explain()
        assert _main_pid(gpu_guest) != before
        assert any("restart" in name.lower() for name in changed.changed)
    finally:
        assert run_deploy().returncode == 0


def _start_poller(gpu_guest):
    script = (
        "import time, urllib.request\n"
        f"log = open('{POLL_LOG}', 'w', buffering=1)\n"
        "while True:\n"
        "    try:\n"
        f"        ok = urllib.request.urlopen('{URL}/health_generate', timeout=2).status == 200\n"
        "    except Exception:\n"
        "        ok = False\n"
        "    log.write(f'{time.time():.3f} {int(ok)}\\n')\n"
        "    time.sleep(0.05)\n"
    )
    gpu_guest.check_output(f"cat > {POLLER} <<'EOF'\n{script}EOF")
    gpu_guest.check_output(f"systemd-run --quiet --unit=ih-downtime-poller python3 {POLLER}")


def _stop_poller(gpu_guest) -> float:
    """Longest stretch in which /health_generate did not answer 200, in seconds."""
    gpu_guest.run("systemctl stop ih-downtime-poller")
    samples = [line.split() for line in gpu_guest.check_output(f"cat {POLL_LOG}").splitlines()]
    longest, down_since = 0.0, None
    for stamp, ok in samples:
        if ok == "0" and down_since is None:
            down_since = float(stamp)
        elif ok == "1" and down_since is not None:
            longest, down_since = max(longest, float(stamp) - down_since), None
    assert down_since is None, "the service was still down at the end"
    return longest


def _timed_deploy(gpu_guest, inventory, env=None):
    _start_poller(gpu_guest)
    run = run_deploy(inventory, env=env)
    return run, _stop_poller(gpu_guest)


def _assert_runs_with_its_own_configuration(gpu_guest, stack):
    unit = gpu_guest.check_output("systemctl cat inference-engine.service")
    assert f"stack {stack.id}" in unit and f"EnvironmentFile={_config(stack)}/inference-engine.env" in unit
    assert "health_generate 20\n" in unit  # the lab's ready timeout, not the failed deploy's 23
    pid = _main_pid(gpu_guest)
    cmdline = gpu_guest.check_output(f"cat /proc/{pid}/cmdline | tr '\\0' ' '")
    assert f"{env_dir(HOST, stack, SITE)}/bin/python" in cmdline
    assert f"--config {_config(stack)}/inference-engine-secret-args.yaml" in cmdline
    environ = gpu_guest.check_output(f"cat /proc/{pid}/environ | tr '\\0' '\\n'")
    assert "INFERENCE_HOST_STANDIN_NEVER_HEALTHY" not in environ and "NCCL_P2P_LEVEL=SYS" in environ


def test_upgrade_and_rollback(gpu_guest, lab_second_deploy, tmp_path):
    upgrade = _inventory_with_active(tmp_path, NEW.id)
    rounds = int(__import__("os").environ.get("INFERENCE_HOST_LAB_DOWNTIME_ROUNDS", "1"))
    good, rolled = [], []
    back_on_the_original = False
    try:
        for _ in range(rounds):
            back_on_the_original = False
            # A new release that never becomes ready, deployed with other settings too (a
            # longer ready timeout): switched back, the old release serves again with the
            # unit, environment, secret arguments and launcher it had before.
            failing = {"INFERENCE_HOST_LAB_NEVER_HEALTHY": NEW.sglang, "INFERENCE_HOST_LAB_READY_TIMEOUT": "23"}
            run, downtime = _timed_deploy(gpu_guest, upgrade, env=failing)
            assert run.returncode != 0, "the deploy must fail when the upgrade never becomes ready"
            assert "ROLLED BACK" in run.stdout + run.stderr, run.explain()
            assert gpu_guest.file(f"{ROOT}/current").linked_to == OLD_ENV
            assert gpu_guest.file(f"{NEW_ENV}/bin/python").exists  # built beside
            _wait_healthy(gpu_guest, timeout=5)
            _assert_runs_with_its_own_configuration(gpu_guest, OLD)
            assert gpu_guest.file(f"{_config(NEW)}/inference-engine.env").contains(
                "INFERENCE_HOST_STANDIN_NEVER_HEALTHY"
            )
            rolled.append(downtime)
            # The old release's configuration was never touched: nothing to do.
            assert run_deploy().returncode == 0
            # A good upgrade: the new release's own flags, served from its environment.
            run, downtime = _timed_deploy(gpu_guest, upgrade)
            assert run.returncode == 0, run.explain()
            assert gpu_guest.file(f"{ROOT}/current").linked_to == NEW_ENV
            launcher = gpu_guest.file(f"{_config(NEW)}/launch").content_string
            assert f"{NEW_ENV}/bin/python" in launcher
            _assert_runs_with_its_own_configuration(gpu_guest, NEW)
            good.append(downtime)
            # Downgrade to the original stack: also a good switch.
            assert run_deploy().returncode == 0
            assert gpu_guest.file(f"{ROOT}/current").linked_to == OLD_ENV
            back_on_the_original = True
    finally:
        if not back_on_the_original:  # the tests after this one get the guest as the lab deploys it
            run_deploy()
    print(
        f"\ndowntime (s) good upgrade: {good} median {statistics.median(good):.2f};"
        f" rollback: {rolled} median {statistics.median(rolled):.2f}"
    )


def test_no_secret_in_the_journal_of_either_release(gpu_guest, lab_second_deploy):
    """After the upgrade test both releases have started: 0.5.9's line is a ServerArgs repr,
    0.5.23's a dict, each built by the stand-in from that release's patched source."""
    journal = gpu_guest.check_output("journalctl --no-pager -o cat")
    assert "server_args=ServerArgs(" in journal and "server_args={'model_path'" in journal
    # Every line, Alertmanager's failed deliveries included: the vault's webhook URLs go through the
    # alert relay (docs/monitoring.md, "Webhook URLs stay out of the journal").
    assert _leaked(journal) == [], "a secret reached the journal"


def test_deploy_with_diff_prints_no_secret(gpu_guest, lab_second_deploy):
    """Secret files written again under `pyinfra --diff`: its whole output holds no secret."""
    gpu_guest.check_output(f"rm -f {_config(OLD)}/inference-engine-secret-args.yaml")
    run = run_deploy(LAB_INVENTORY, "--diff")
    assert run.returncode == 0, run.explain()
    assert any("API key" in name for name in run.changed), run.changed
    assert _leaked(run.stdout + run.stderr) == [], "pyinfra --diff printed a secret"
    assert gpu_guest.file(f"{_config(OLD)}/inference-engine-secret-args.yaml").mode == 0o600


def test_no_file_readable_by_others_holds_a_secret(gpu_guest, lab_second_deploy):
    """Everything the deploy wrote, read as `nobody`: no secret value anywhere it can read."""
    values = " ".join(f"-e {shlex.quote(v)}" for v in _secrets().values())
    found = gpu_guest.run(
        f"runuser -u nobody -- grep -rlsF {values} / --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev"
    )
    assert found.stdout.strip() == "", f"readable by others and holding a secret: {found.stdout}"
    # The check can see one: a world-readable copy is found.
    gpu_guest.check_output(
        f"cp {_config(OLD)}/inference-engine-secret-args.yaml /tmp/ih-planted && chmod 644 /tmp/ih-planted"
    )
    try:
        planted = gpu_guest.run(f"runuser -u nobody -- grep -rlsF {values} /tmp")
        assert planted.stdout.strip() == "/tmp/ih-planted"
    finally:
        gpu_guest.run("rm -f /tmp/ih-planted")


# rename-script: keep (this file names the layout before the rename on purpose: /work/w24b-rename.sh skips it)


# -- TLS (docs/security.md#tls) -------------------------------------------------------------------

# The name the readiness probe and the checks ask (the node's address_of: its name, with the lab's
# prefix), which the certificate must cover.
TLS_NAME = address_of(HOST)
TLS_ENTRIES = ("engine_tls_cert", "engine_tls_key")


def _set_tls_entries(material) -> None:
    """The certificate and key in the lab's throwaway vault, as `vault set` would store them."""
    path, password_file = lab.throwaway_vault()
    password = Path(password_file).read_bytes().strip()
    vault.set_secret(Path(path), "engine_tls_cert", material.cert_pem, password)
    vault.set_secret(Path(path), "engine_tls_key", material.key_pem, password)


def _drop_tls_entries() -> None:
    """Gone again: the other tests grep for every vault value, and a PEM's first line is in any
    certificate."""
    path, _ = lab.throwaway_vault()
    entries = vault.stored(Path(path))
    vault._write(Path(path), {name: value for name, value in entries.items() if name not in TLS_ENTRIES})


def _curl(gpu_guest, *options: str) -> tuple[int, str]:
    result = gpu_guest.run(
        "curl -sS -o /dev/null -w '%{http_code}' -m 10 " + " ".join(shlex.quote(option) for option in options)
    )
    return result.rc, result.stdout + result.stderr


def test_the_engine_serves_tls_verified_with_the_sites_ca(gpu_guest, lab_second_deploy, tmp_path):
    """0.5.23 with serving_tls_*: the deploy writes the certificate and key (0600, the service user's),
    renders --ssl-certfile/--ssl-keyfile, and its readiness probe and health checks reach the engine at
    https://NAME:PORT (NAME: the node's address_of) with the CA; curl (OpenSSL) with that CA gets 200,
    plain HTTP gets no answer, and without the CA verification fails. The stand-in serves TLS as
    uvicorn does (its docstring)."""
    from lab.tls_ca import make_tls_material
    from roles.shared.layout import tls_files

    material = make_tls_material([TLS_NAME, "localhost"])
    ca = tmp_path / "lab-ca.pem"
    ca.write_text(material.ca_pem)
    env = {"INFERENCE_HOST_LAB_TLS_CA_FILE": str(ca)}
    paths, port = tls_files(HOST.serving.unit_name), HOST.serving.port
    inventory = _inventory_with_active(tmp_path, NEW.id)
    _set_tls_entries(material)
    try:
        run = run_deploy(inventory, env=env)
        # The unit's readiness probe (https, --cacert) and the deploy's server checks passed.
        assert run.returncode == 0, run.explain()
        for kind in ("cert", "key"):
            file = gpu_guest.file(paths[kind])
            assert (file.mode, file.user) == (0o600, HOST.base.service_user), paths[kind]
        assert gpu_guest.file(paths["ca"]).mode == 0o644
        cmdline = gpu_guest.check_output(f"cat /proc/{_main_pid(gpu_guest)}/cmdline | tr '\\0' ' '")
        assert f"--ssl-certfile {paths['cert']} --ssl-keyfile {paths['key']}" in cmdline
        key_body = material.key_pem.splitlines()[1]
        assert key_body not in cmdline and key_body not in gpu_guest.check_output("journalctl --no-pager -o cat")
        assert key_body not in run.stdout + run.stderr

        with_ca = _curl(
            gpu_guest, "--cacert", paths["ca"], "--connect-to", "::127.0.0.1:", f"https://{TLS_NAME}:{port}/health"
        )
        assert with_ca == (0, "200"), with_ca
        plain = _curl(gpu_guest, f"http://127.0.0.1:{port}/health")
        assert plain[0] != 0 and plain[1].startswith("000"), plain  # no HTTP answer at all
        without_ca = _curl(gpu_guest, "--connect-to", "::127.0.0.1:", f"https://{TLS_NAME}:{port}/health")
        assert without_ca[0] == 60, without_ca  # CURLE_PEER_FAILED_VERIFICATION

        unchanged = run_deploy(inventory, env=env)
        assert unchanged.returncode == 0 and unchanged.changed == [], unchanged.changed
    finally:
        _drop_tls_entries()
        restored = run_deploy()  # the lab as the other tests know it: 0.5.9, plain HTTP
    assert restored.returncode == 0, restored.explain()
    for path in paths.values():
        assert not gpu_guest.file(path).exists, path
