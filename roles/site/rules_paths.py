"""Cross-setting rules about the folders the deploy makes on one host: none is another's, and
none of another owner sits inside a folder the service account owns.

Owners (roles/base, roles/wheels, roles/gateway, roles/monitoring, roles/docker_engine): the
service account (base_service_user) owns base_data_dir, base_log_dir and base_model_dir (and
the model folders under it); root owns the engines' and the gateway's environments, uv, the
wheelhouse and Docker's data; Prometheus' user its TSDB. A folder inside one the service
account owns can be renamed away and replaced by that account (it may write the parent), so
a root-owned folder there is the account's to forge: root would then run or trust what the
account put in its place. Two of the service account's folders inside one another mix what
each is for (a data folder inside the log folder is rotated and read by log tools; a log
folder inside the data folder is wiped with the data). A root-owned folder inside another
root-owned one is harmless (same owner) and allowed, as is a service folder inside a root one.
"""

from __future__ import annotations

from roles.site.grammars import normal_path, world_writable_problem
from roles.site.schema import HostSettings

SERVICE = "the service account"


def _folders(host: HostSettings) -> list[tuple[str, str, str]]:
    """(setting, folder, owner) of each folder the deploy makes on this host."""
    folders = []
    if host.in_group("gpu_nodes") or host.in_group("gateways"):
        folders += [
            ("base_data_dir", host.base.data_dir, SERVICE),
            ("base_log_dir", host.base.log_dir, SERVICE),
            ("base_model_dir", host.base.model_dir, SERVICE),
            ("base_install_root", host.base.install_root, "root"),
            ("base_uv_dir", host.base.uv_dir, "root"),
        ]
    if host.in_group("builders"):
        folders.append(("build_wheelhouse_dir", host.build.wheelhouse_dir, "root"))
        if host.docker.manage_engine:
            folders.append(("docker_data_root", host.docker.data_root, "root"))
    if host.in_group("gateways"):
        folders.append(("gateway_install_dir", host.gateway.install_dir, "root"))
    if host.in_group("monitors"):
        folders.append(("monitoring_data_dir", host.monitoring.data_dir, "Prometheus' user"))
    return [(key, normal_path(folder), owner) for key, folder, owner in folders if host.valid(key)]


def interpreter_problems(host: HostSettings) -> list[str]:
    """The interpreters root runs (the engine's environments are built with engine_python; the
    health checks and the gateway's build run health_engine_python and gateway_python as root)
    are never in a folder the service account owns: it could put its own program there first."""
    problems = []
    owned = [(key, normal_path(folder)) for key, folder, owner in _service_folders(host)]
    for key, path in (
        ("engine_python", host.engine.python),
        ("health_engine_python", host.health.engine_python),
        ("gateway_python", host.gateway.python),
    ):
        if not path or not path.startswith("/") or not host.valid(key):  # gateway_python may be a version
            continue
        inside = next((f"{k} = {folder!r}" for k, folder in owned if _inside(normal_path(path), folder)), None)
        if inside:
            problems.append(
                f"{key} = {path!r} is inside {inside}, which {SERVICE} owns, and root runs it; expected an"
                " interpreter in a folder only root can write (/usr/bin/python3, <base_install_root>/...)"
            )
    return problems


def _service_folders(host: HostSettings) -> list[tuple[str, str, str]]:
    return [
        (key, folder, SERVICE)
        for key, folder in (
            ("base_data_dir", host.base.data_dir),
            ("base_log_dir", host.base.log_dir),
            ("base_model_dir", host.base.model_dir),
        )
        if host.valid(key)
    ]


def _inside(inner: str, outer: str) -> bool:
    return inner == outer or inner.startswith(outer.rstrip("/") + "/")


def folder_problems(host: HostSettings) -> list[str]:
    """One line (without the "file: host" prefix) per folder that is another's or nests wrongly."""
    problems = []
    folders = _folders(host)
    for key, folder, owner in folders:
        # chowned to an account other than root: in /tmp another user makes the folder (or a link
        # to /etc) first, and the chown follows it.
        shared = world_writable_problem(folder) if owner != "root" else None
        if shared:
            problems.append(f"{key} = {folder!r} is invalid; expected {shared}")
    for index, (key, folder, owner) in enumerate(folders):
        for other_key, other, other_owner in folders[:index] + folders[index + 1 :]:
            if folder == other:
                if index < folders.index((other_key, other, other_owner)):
                    continue  # named once, by the later setting
                problems.append(
                    f"{key} = {folder!r} is {other_key} too; expected a folder of its own for each"
                    " (their owners, modes and clean-ups differ)"
                )
            elif _inside(folder, other) and other_owner == SERVICE:
                why = (
                    f"{other_owner} owns {other_key} and could replace a folder of {owner} inside it"
                    if owner != SERVICE
                    else f"{key} and {other_key} are for different things (data, logs, models)"
                )
                problems.append(f"{key} = {folder!r} is inside {other_key} = {other!r}: {why}; expected it elsewhere")
    return problems
