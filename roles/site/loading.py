"""Building the site from a pyinfra Inventory (deploy time) or an inventory file (CLI, tests),
and the validation every inventory runs before pyinfra connects (through validation.py)."""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
from pathlib import Path

from roles.site import lock, vault
from roles.site.errors import SiteError, closest, display, print_problems, python_error, shown
from roles.site.host_keys import connection_defaults
from roles.site.rules import NO_ROLE_CHECKS, RoleChecks, check_driver_match, check_site
from roles.site.rules_secrets import key_roles
from roles.site.rules_services import MONITOR_SECRETS
from roles.site.rules_tls import check_plaintext_listeners
from roles.site.schema import KNOWN_GROUPS, PROJECT_ROOT, SITE_KEYS, HostSettings, Site, build_host
from roles.site.stack import Stack, load_stack
from roles.site.weights import check_weights


def site_from_inventory(
    inventory, inventory_file: str, listed_groups: dict | None = None, checks: RoleChecks = NO_ROLE_CHECKS
) -> Site:
    """The typed site. listed_groups: the inventory file's own groups as it wrote them (before
    pyinfra merged them), when known: a host listed twice, or given two values for one key, is
    refused instead of one entry silently winning. checks: the role checks to run besides the
    model's own rules (validation.py's ROLE_CHECKS)."""
    problems: list[str] = []
    where = display(Path(inventory_file))
    file_group = Path(inventory_file).stem
    hosts: dict[str, HostSettings] = {}
    raw_data: dict[str, dict] = {}
    if listed_groups is not None:
        _check_listing(listed_groups, where, problems)
    if not any(True for _ in inventory):
        problems.append(
            f"{where}: no host in the inventory; expected at least one host in one of the"
            f" groups {', '.join(KNOWN_GROUPS)} (a list named after the group)"
        )
    for group in inventory.groups:
        if group not in KNOWN_GROUPS and group not in (file_group, "all") and not group.startswith("@"):
            problems.append(
                f"{where}: unknown group {group!r}{closest(group, KNOWN_GROUPS)}; valid groups: "
                + ", ".join(KNOWN_GROUPS)
            )
    for pyinfra_host in inventory:
        data = pyinfra_host.data.dict()
        raw_data[pyinfra_host.name] = data
        groups = tuple(g for g in KNOWN_GROUPS if pyinfra_host in inventory.get_group(g, []))
        hosts[pyinfra_host.name] = build_host(pyinfra_host.name, groups, data, where, problems)
    site_values = _site_values(raw_data, where, problems)
    stack = None
    stack_path = Path(inventory_file).parent / site_values.get("stack_file", "stack.yml")
    if "stack_file" in site_values and stack_path.is_dir():
        setter = next(name for name, data in raw_data.items() if "stack_file" in data)
        problems.append(
            f"{where}: host {setter}: stack_file = {shown(site_values['stack_file'])} is a folder"
            f" ({display(stack_path)}); expected the stack file (YAML), relative to the inventory, like 'stack.yml'"
        )
    else:
        try:
            stack = load_stack(stack_path)
        except SiteError as error:
            problems.extend(error.problems)
    if stack is not None and "stack" in site_values:
        stack = _chosen_stack(stack, site_values["stack"], where, problems)
    if stack is not None and any(h.in_group("gpu_nodes") for h in hosts.values()):
        # Every stack an engine host may be pointed at has a lock made from its current pins
        # (local files only: no network while the inventory loads).
        problems.extend(lock.stale_lock_problems(stack_path, stack.file, stack.stacks.values()))
    gateway_versions = {h.gateway.version for h in hosts.values() if h.in_group("gateways")}
    if stack is not None and gateway_versions:
        # The gateway's environment is locked the same way (roles/gateway installs the lock).
        problems.extend(lock.stale_gateway_lock_problems(stack_path, stack.file, gateway_versions))
    secrets_file: str | None = None
    secret_names: frozenset[str] | None = frozenset()
    if "secrets_file" in site_values:
        secrets_file = str(Path(inventory_file).parent / site_values["secrets_file"])
        try:
            secret_names = frozenset(vault.load(Path(secrets_file)))
        except vault.SecretsError as error:
            problems.append(f"{where}: secrets_file = {shown(site_values['secrets_file'])}: {error}")
            # Its keys are unknown, not absent: the references to it are not judged (the one
            # line above says what is wrong with the file).
            secret_names = None
    check_site(hosts, where, secret_names, secrets_file, problems, stack, checks)
    check_driver_match(hosts, stack, where, problems)
    check_weights(hosts, where, problems)
    check_plaintext_listeners(hosts, where, problems)
    if problems:
        raise SiteError(problems)
    assert stack is not None and secret_names is not None, "each is a problem above when missing"
    return Site(
        inventory_file=where,
        stack=stack,
        hosts=hosts,
        secrets_file=secrets_file,
        secret_names=secret_names,
    )


def _entries(group_value) -> list[tuple[str, dict]]:
    """(name, data) of each host a group lists (pyinfra: a list of names or (name, data)
    tuples, or a (hosts, group data) tuple)."""
    hosts = group_value[0] if isinstance(group_value, tuple) else group_value
    entries = []
    for host in hosts or []:
        if isinstance(host, tuple) and len(host) == 2 and isinstance(host[1], dict):
            entries.append((str(host[0]), host[1]))
        elif isinstance(host, str):
            entries.append((host, {}))
    return entries


def _check_listing(groups: dict, where: str, problems: list[str]) -> None:
    """pyinfra merges a host's entries with dict.update in the file's group order (later wins,
    pyinfra/api/inventory.py make_hosts_and_groups): a host listed twice in one group, or two
    groups giving one key two values, is almost always a mistake that would pass silently."""
    first_value: dict[tuple[str, str], tuple[str, object]] = {}
    for group, value in groups.items():
        if group == "all":
            continue
        seen: dict[str, int] = {}
        for position, (name, data) in enumerate(_entries(value), start=1):
            if name in seen:
                problems.append(
                    f"{where}: host {name} is listed twice in {group} (entries {seen[name]}"
                    f" and {position}); expected each host once per group, with all its data"
                    " in that one entry"
                )
                continue
            seen[name] = position
            for key, item in data.items():
                earlier = first_value.setdefault((name, key), (group, item))
                if earlier[0] != group and earlier[1] != item:
                    problems.append(
                        f"{where}: host {name}: {key} = {shown(item)} in {group} but"
                        f" {shown(earlier[1])} in {earlier[0]}; expected one value (set"
                        " it in one group only)"
                    )


HOST_ENTRY = "a host name or a (name, {data}) tuple"


def _group_shape_problems(attrs: dict, where: str) -> list[str]:
    """Every group a list of hosts, or one line. pyinfra keeps a module-level name as a group only
    when it is a list or tuple of names and tuples (pyinfra_cli/inventory.py _is_inventory_group,
    3.x): `gpu_nodes = {...}` or `builders = 'gpu1'` was dropped without a word, and the summary
    said valid without the group; a (name, [list]) entry failed inside pyinfra, naming its file."""
    problems = []
    for name, value in attrs.items():
        if name.startswith("_"):
            continue
        known = name in KNOWN_GROUPS or bool(difflib.get_close_matches(name, KNOWN_GROUPS, n=1, cutoff=0.85))
        if not isinstance(value, (list, tuple)):
            if known and not callable(value) and not isinstance(value, type(difflib)):
                problems.append(
                    f"{where}: {name} = {shown(value)} is a {type(value).__name__}, not a group;"
                    f" expected a list of hosts, each {HOST_ENTRY}: {name} = [('gpu1', {{'gpu_count': 8}})]"
                )
            continue
        hosts = value
        if isinstance(value, tuple):  # pyinfra: (hosts, group data)
            if not (len(value) == 2 and isinstance(value[0], (list, tuple)) and isinstance(value[1], dict)):
                if known or all(isinstance(item, (str, tuple)) for item in value):
                    problems.append(
                        f"{where}: {name} = {shown(value)} is a tuple, read as (hosts, group data);"
                        f" expected a list of hosts, each {HOST_ENTRY}, or ([hosts], {{group data}})"
                    )
                continue
            hosts = value[0]
        if not known and not all(isinstance(item, (str, tuple)) for item in hosts):
            continue  # not a group to pyinfra: an ordinary variable of the file
        for position, entry in enumerate(hosts, start=1):
            if isinstance(entry, str) or (
                isinstance(entry, tuple)
                and len(entry) == 2
                and isinstance(entry[0], str)
                and isinstance(entry[1], dict)
            ):
                continue
            problems.append(
                f"{where}: {name} entry {position} = {shown(entry)} is not a host; expected {HOST_ENTRY}"
                + (
                    f" (its data is a {type(entry[1]).__name__}, expected a dict of settings)"
                    if isinstance(entry, tuple) and len(entry) == 2
                    else ""
                )
            )
    return problems


def _chosen_stack(stack: Stack, stack_id: str, where: str, problems: list[str]) -> Stack | None:
    """The inventory's `stack` in place of the stack file's `active`: one inventory can serve
    with another stack of the same file (EAGLE-3 on sglang-0.5.10) without a copy of it."""
    if stack_id not in stack.stacks:
        problems.append(
            f"{where}: stack = {shown(stack_id)} is not a stack of {stack.file}"
            f"{closest(stack_id, stack.stacks)}; expected one of: {', '.join(stack.stacks)}"
        )
        return None
    return dataclasses.replace(stack, active=stack.stacks[stack_id])


def _site_values(raw_data: dict[str, dict], where: str, problems: list[str]) -> dict[str, str]:
    """stack_file / secrets_file must be the same for every host (they describe the site)."""
    values: dict[str, str] = {}
    for key in SITE_KEYS:
        seen = {repr(data[key]): data[key] for data in raw_data.values() if key in data}
        if len(seen) > 1:
            problems.append(f"{where}: {key} differs between hosts ({', '.join(sorted(seen))}); expected one value")
        elif seen:
            value = seen.popitem()[1]
            if not isinstance(value, str):
                expected = "a stack id string" if key == "stack" else "a path string"
                problems.append(f"{where}: {key} = {shown(value)} is invalid; expected {expected}")
            else:
                values[key] = value
    return values


def _quiet_interrupt_under_gevent() -> None:
    """Ctrl-C stays the one line of run_command (roles/site/command_line.py) once pyinfra_cli has
    patched the standard library with gevent: gevent's hub prints a KeyboardInterrupt that lands
    while it waits (`KeyboardInterrupt` and a timestamp on stderr) before raising it in the main
    greenlet. Hub.NOT_ERROR lists what it raises without printing (gevent/hub.py, 26.x)."""
    from gevent.hub import Hub

    if KeyboardInterrupt not in Hub.NOT_ERROR:
        Hub.NOT_ERROR = (*Hub.NOT_ERROR, KeyboardInterrupt)


def _pyinfra_inventory(path: Path, namespace: dict | None = None):
    """The Inventory pyinfra's CLI would build from this file (group_data included); namespace:
    the file's globals when it has already run (else pyinfra runs it here)."""
    from pyinfra.api import State
    from pyinfra.context import ctx_state
    from pyinfra_cli import inventory as cli_inventory
    from pyinfra_cli.inventory import make_inventory_from_files

    _quiet_interrupt_under_gevent()

    key = str(path.resolve())
    _VALIDATING.add(key)  # the file's own require_valid_inventory call must not recurse
    # The groups as the file wrote them, for _check_listing (make_inventory_from_files merges
    # them): kept from pyinfra's own reading of the file, which runs it once.
    original = cli_inventory._get_groups_from_filename

    def keep_groups(filename):
        attrs = namespace if namespace is not None else cli_inventory.exec_file(filename, return_locals=True)
        shape_problems = _group_shape_problems(attrs, display(path))
        if shape_problems:
            raise SiteError(shape_problems)
        groups = {name: value for name, value in attrs.items() if cli_inventory._is_inventory_group(name, value)}
        _LISTED_GROUPS[key] = dict(groups)
        return groups

    cli_inventory._get_groups_from_filename = keep_groups
    try:
        if ctx_state.isset():  # inside pyinfra: reuse its state
            inventory = make_inventory_from_files(str(path), cwd=str(PROJECT_ROOT))
        else:
            with ctx_state.use(State()):
                inventory = make_inventory_from_files(str(path), cwd=str(PROJECT_ROOT))
    finally:
        cli_inventory._get_groups_from_filename = original
        _VALIDATING.discard(key)
    _pin_host_keys(inventory, path, namespace)
    return inventory


def _pin_host_keys(inventory, path: Path, namespace: dict | None) -> None:
    """Every SSH host's data gets the inventory's known_hosts file and strict checking, unless
    its data (host, group or group_data/) sets them (roles/site/host_keys.py says why). Set in
    the Inventory built here and, when the running file handed over its globals, in its groups'
    own entries too: pyinfra's CLI builds its Inventory from those same objects once the file
    returns, so the deploy and the checks connect with exactly what the model saw."""
    defaults = {host.name: connection_defaults(host.name, host.data.dict(), path) for host in inventory}
    for host in inventory:
        for setting, value in defaults[host.name].items():
            setattr(host.data, setting, value)
    from pyinfra_cli.inventory import _is_inventory_group

    for name, value in (namespace or {}).items():
        if not _is_inventory_group(name, value):  # a helper list (`_gpus`) is no group
            continue
        hosts = value[0] if isinstance(value, tuple) and len(value) == 2 else value
        if not isinstance(hosts, list):
            continue
        for index, entry in enumerate(hosts):
            if isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[1], dict):
                entry[1].update(defaults.get(str(entry[0]), {}))
            elif isinstance(entry, str) and defaults.get(entry):
                hosts[index] = (entry, dict(defaults[entry]))


def load_site(inventory_file: str | os.PathLike, checks: RoleChecks | None = None) -> Site:
    """Load an inventory file exactly as pyinfra's CLI does (group_data included) and type it.
    checks: the role checks to run; None: those the file's own require_valid_inventory call
    names (validation.py's ROLE_CHECKS; none for a file without that call)."""
    path = Path(inventory_file)
    if not path.is_file():
        raise SiteError([f"{inventory_file}: no such inventory file"])
    try:
        inventory = _pyinfra_inventory(path)
    except SiteError:
        raise
    except SystemExit as error:  # sys.exit() in the file: exit 0 and no output read as "valid"
        raise SiteError(
            [
                f"{display(path)}: the file ended the program (SystemExit({error.code!r})) while it was loaded;"
                " expected an inventory that defines its groups and returns"
            ]
        ) from None
    except Exception as error:  # a Python error in the user's inventory or group data
        raise SiteError([python_error(error, [path])]) from None
    finally:
        named = _NAMED_CHECKS.pop(str(path.resolve()), NO_ROLE_CHECKS)
    return site_from_inventory(
        inventory, str(path), _LISTED_GROUPS.pop(str(path.resolve()), None), named if checks is None else checks
    )


_VALIDATING: set[str] = set()
_LISTED_GROUPS: dict[str, dict] = {}
# The checks a file's own require_valid_inventory call named while load_site ran it.
_NAMED_CHECKS: dict[str, RoleChecks] = {}
_LOADED_INVENTORY: list[str] = []


def _inventory_from_namespace(path: Path, namespace: dict):
    """The Inventory pyinfra's CLI builds from this file, made from the globals the running file
    has just defined instead of running the file a second time.

    pyinfra_cli/inventory.py (3.10): make_inventory_from_files takes the file's groups from
    _get_groups_from_filename, which executes the file and keeps the globals that
    _is_inventory_group accepts; everything after that (the "all" group, the file-name group,
    group_data/) is unchanged. Names defined after the require_valid_inventory call are not
    groups in any inventory here (every file ends with the call)."""
    return _pyinfra_inventory(path, namespace)


def require_valid_inventory(inventory_file: str, namespace: dict, checks: RoleChecks) -> None:
    """Called at the end of every inventory file (through validation.py) with the file's
    globals and the role checks: stop before pyinfra connects to anything. The file is not
    executed again."""
    path = Path(inventory_file)
    if str(path.resolve()) in _VALIDATING:
        _NAMED_CHECKS[str(path.resolve())] = checks
        return  # the load done by load_site itself validates once the file has run
    _LOADED_INVENTORY.append(str(inventory_file))
    try:
        try:
            inventory = _inventory_from_namespace(path, namespace)
        except SiteError:
            raise
        except Exception as error:  # a Python error in the group data
            raise SiteError([python_error(error, [path])]) from None
        site = site_from_inventory(inventory, str(path), _LISTED_GROUPS.pop(str(path.resolve()), None), checks)
        if _under_pyinfra_cli():
            _require_decryptable(site)
    except SiteError as error:
        print_problems(error)
        raise SystemExit(2) from None


def one_line_inventory_errors() -> None:
    """Under pyinfra's CLI, a Python error in the inventory (or its group data) as the one line
    the project's own commands print (FILE:LINE: NameError: ...), exit 2, in place of pyinfra's
    traceback: the inventory is user input like any setting. Called from config.py, which
    pyinfra_cli/cli.py (3.x) runs before it loads the inventory; it wraps that one call
    (cli.make_inventory), so errors in deploy code keep pyinfra's traceback."""
    from pyinfra_cli import cli
    from pyinfra_cli.exceptions import UnexpectedExternalError

    make_inventory = cli.make_inventory
    if getattr(make_inventory, "one_line_errors", False):
        return

    def make_inventory_or_one_line(inventory, *args, **kwargs):
        try:
            return make_inventory(inventory, *args, **kwargs)
        except (UnexpectedExternalError, SyntaxError, UnicodeDecodeError) as error:
            # (pyinfra reads the file before it runs it: a byte that is not UTF-8 is raised bare.)
            print_problems(SiteError([python_error(error, [Path(inventory)])]))
            raise SystemExit(2) from None

    make_inventory_or_one_line.one_line_errors = True  # type: ignore[attr-defined]  # a mark on the function
    make_inventory_or_one_line.__wrapped__ = make_inventory  # type: ignore[attr-defined]  # its signature stays pyinfra's (the contract test)
    cli.make_inventory = make_inventory_or_one_line


def _under_pyinfra_cli() -> bool:
    import pyinfra

    return bool(getattr(pyinfra, "is_cli", False))


def referenced_secrets(site: Site) -> set[str]:
    return {
        ref
        for host in site.hosts.values()
        for ref in (
            host.serving.api_key_secret,
            host.serving.hf_token_secret,
            *(getattr(host.monitoring, key) if host.in_group("monitors") else None for key in MONITOR_SECRETS),
        )
        if ref
    } | {ref for _, _, ref in key_roles(site.hosts)}


def _require_decryptable(site: Site) -> None:
    """A deploy needs the values: a wrong password stops it before any connection."""
    names = referenced_secrets(site)
    if names:
        assert site.secrets_file, "a secret is referenced only with a secrets_file (the site rules)"
        try:
            values = vault.decrypt_all(Path(site.secrets_file), names)
        except vault.SecretsError as error:
            raise SiteError([f"{site.inventory_file}: {error}"]) from None
        problems = api_key_problems(site, values) + receiver_url_problems(site, values)
        if problems:
            raise SiteError(problems)


def receiver_url_problems(site: Site, values: dict[str, str]) -> list[str]:
    """A monitor's vault URLs (webhook, Slack, heartbeat) must be one http(s) URL: Alertmanager
    refuses its whole configuration otherwise (v0.25.0 config/notifiers.go: "scheme required for
    webhook url") and stops sending every alert. The value is never printed."""
    keys = ("webhook_url_secret", "slack_api_url_secret", "heartbeat_url_secret")
    found = {
        (getattr(h.monitoring, key), key)
        for h in site.hosts.values()
        if h.in_group("monitors")
        for key in keys
        if getattr(h.monitoring, key)
    }
    return [
        f"{site.inventory_file}: secret {name!r} (monitoring_{key}) is not one http(s) URL (value not shown);"
        " expected http:// or https:// and no space or line break inside (set it again: inference-host"
        " vault set FILE NAME)"
        for name, key in sorted(found)
        if not re.fullmatch(r"https?://[^\s/]+(/\S*)?", values.get(name, "").strip())
    ]


def api_key_problems(site: Site, values: dict[str, str]) -> list[str]:
    """Every key the site gives a role (rules_secrets.key_roles), held to vault.API_KEY_RULE: not
    empty or blank (SGLang 0.5.9 checks `if api_key:`, so an empty key serves everyone), at least
    32 characters, not beginning with '-' (it reaches argparse as `--api-key VALUE`: vllm 0.16.0
    vllm/utils/argparse_utils.py load_config_file appends "--" + key, then str(value), and
    smg-launch does the same; argparse reads "-..." as an option), and no two roles sharing a
    value. One line each, naming the vault key and its setting, never the value."""
    problems: list[str] = []
    seen: dict[str, str] = {}
    for name, setting in sorted({(ref, setting.split("[")[0]) for _, setting, ref in key_roles(site.hosts)}):
        value = values.get(name, "")
        problem = vault.api_key_problem(value)
        if problem:
            problems.append(
                f"{site.inventory_file}: secret {name!r} ({setting}) {problem}; expected {vault.API_KEY_RULE}"
                f" (set a new one: inference-host vault set {site.secrets_file} {name})"
            )
        elif value in seen and seen[value] != name:
            problems.append(
                f"{site.inventory_file}: secrets {seen[value]!r} and {name!r} ({setting}) hold the same key;"
                f" expected each role its own key (set a new one: inference-host vault set {site.secrets_file} {name})"
            )
        else:
            seen[value] = name
    return problems
