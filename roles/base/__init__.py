"""roles/base: what every engine host needs before any GPU software.

Packages later roles rely on, the unprivileged service user and its directories, kernel and
limits tuning learned on the target, extra CA certificates, and uv at the pinned version
installed from PyPI into a fixed, versioned path (no curl-pipe-shell), from the stack file's
hashed lock locks/uv-<version>.txt (pip --require-hashes).
"""

from __future__ import annotations

from io import StringIO

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import apt, files, server

from roles.base.facts import UvVersion
from roles.shared.extra_cas import trust_extra_cas
from roles.shared.host_system import require_distro, sysctl_file
from roles.shared.layout import CHECKS_USER
from roles.shared.legacy_account import (
    ServiceAccountState,
    account_migration,
    adopt_former_names,
    drop_former_names,
    fact_arguments,
)
from roles.shared.pip import pip_environment
from roles.shared.secret_files import secret_file
from roles.shared.shell import sh
from roles.shared.system_account import system_account
from roles.site import (
    HostSettings,
    Stack,
    current_host,
    current_site,
    engine_reads_hub_token,
    own_sysctl,
    secret_value,
)

SUPPORTED = {("Ubuntu", 24), ("Debian", 12)}

# Build tools and the utilities later roles and the health checks call.
PACKAGES = [
    "build-essential",
    "git",
    "curl",
    "ca-certificates",
    "gnupg",
    "numactl",
    "pciutils",
    "jq",
    "python3",
    "python3-venv",
    "procps",
    "psmisc",
    "iproute2",
    "lsof",
    "kmod",
    "rsync",
]

SYSCTL_FILE = "/etc/sysctl.d/90-inference-host-sysctl.conf"
LIMITS_FILE = "/etc/security/limits.d/90-inference-host-limits.conf"


@deploy("Base")
def base() -> None:
    settings = current_host()
    stack = current_site().stack
    require_distro(SUPPORTED, "roles/base", "Ubuntu 24.04 (production) or Debian 12 (lab)")
    _install_apt(settings)
    trust_extra_cas(settings)
    _former_account(settings)  # before _service_user, which would make a new, empty one beside it
    _service_user(settings)
    if settings.in_group("gpu_nodes"):  # its group reads the engine's key and environment (roles/serving)
        system_account(CHECKS_USER, "the periodic health checks")
    _sysctl(settings)
    _limits(settings)
    _uv(settings, stack)
    _hf_token(settings)


def _install_apt(settings: HostSettings) -> None:
    packages = PACKAGES + settings.base.extra_packages
    apt.packages(
        name=f"Install base packages ({len(packages)})",
        packages=packages,
        no_recommends=True,
        update=True,
        cache_time=24 * 3600,
    )


def _former_account(settings: HostSettings) -> None:
    """A host deployed before the engine-neutral service account (roles/shared/legacy_account.py):
    the configured names take over the former account's ids and its folders. On a gpu node the
    former names go after the engine's switch (roles/serving); elsewhere nothing runs under them."""
    found = host.get_fact(ServiceAccountState, **fact_arguments(settings.base))
    migration = account_migration(found, settings.base)
    adopt_former_names(migration, settings.base.data_dir)
    if not settings.in_group("gpu_nodes"):
        drop_former_names(migration, "no engine runs on this host")


def _service_user(settings: HostSettings) -> None:
    base_settings = settings.base
    server.group(
        name=f"Create group {base_settings.service_group}",
        group=base_settings.service_group,
        system=True,
    )
    server.user(
        name=f"Create service user {base_settings.service_user}",
        user=base_settings.service_user,
        group=base_settings.service_group,
        home=base_settings.data_dir,
        shell="/usr/sbin/nologin",
        system=True,
        create_home=False,
    )
    owned = [base_settings.data_dir, base_settings.model_dir, base_settings.log_dir]
    # A model directory mounted from the Proxmox node (read-only, roles/weights) is the node's.
    mounted = [m.rstrip("/") for m in settings.guest.mount_points.values()]
    owned = [p for p in owned if not any(p == m or p.startswith(m + "/") for m in mounted)]
    for path in owned:
        files.directory(
            name=f"Create {path} owned by {base_settings.service_user}",
            path=path,
            user=base_settings.service_user,
            group=base_settings.service_group,
            mode="0750",
        )
    for path in (base_settings.install_root, base_settings.uv_dir):
        files.directory(name=f"Create {path}", path=path, user="root", group="root", mode="0755")


def _sysctl(settings: HostSettings) -> None:
    sysctl = own_sysctl(settings)
    if not sysctl:
        # An LXC guest shares its node's kernel: its host-wide keys (kernel.numa_balancing) are
        # written on the node (roles/proxmox_host); a copy here could never apply.
        files.file(
            name=f"Remove {SYSCTL_FILE} (kernel settings are the Proxmox node's)", path=SYSCTL_FILE, present=False
        )
        return
    sysctl_file(
        SYSCTL_FILE, "roles/base/templates/90-inference-host-sysctl.conf.j2", sysctl, name=f"Write {SYSCTL_FILE}"
    )


def _limits(settings: HostSettings) -> None:
    files.template(
        name=f"Write {LIMITS_FILE}",
        src="roles/base/templates/90-inference-host-limits.conf.j2",
        dest=LIMITS_FILE,
        service_user=settings.base.service_user,
        nofile=settings.base.limit_nofile,
        memlock=settings.base.limit_memlock,
        mode="0644",
    )


def _uv(settings: HostSettings, stack: Stack) -> None:
    version = stack.uv
    prefix = f"{settings.base.uv_dir}/{version}"
    lock = f"{settings.base.uv_dir}/uv-{version}.lock.txt"
    installed = host.get_fact(UvVersion, path=f"{prefix}/bin/uv")
    env = pip_environment(settings)
    # The stack file's locks/uv-<version>.txt (roles/shared/tool_locks.py): uv's wheel must match a
    # sha256 in it, or pip installs nothing.
    files.put(name=f"Write {lock} (locks/uv-{version}.txt)", src=StringIO(stack.uv_lock_text()), dest=lock, mode="0644")
    server.shell(
        name=f"Install uv {version} from PyPI into {prefix} (hashes from its lock)",
        commands=[
            sh(
                "rm -rf -- {prefix} && python3 -m venv -- {prefix}"
                " && {prefix}/bin/pip install --quiet --no-cache-dir --require-hashes --only-binary :all: -r {lock}"
                " || {{ rm -rf -- {prefix}; exit 1; }}",
                prefix=prefix,
                lock=lock,
            )
        ],
        _env=env,
        _if=lambda: installed != version,
    )
    for tool in ("uv", "uvx"):
        files.link(
            name=f"Link /usr/local/bin/{tool} to uv {version}",
            path=f"/usr/local/bin/{tool}",
            target=f"{prefix}/bin/{tool}",
        )


def _hf_token(settings: HostSettings) -> None:
    secret = settings.serving.hf_token_secret
    cache = f"{settings.base.data_dir}/.cache/huggingface"
    if not engine_reads_hub_token(settings, current_site().hosts):
        # The weights are local files (roles/weights downloads them with its own token file,
        # on the host that keeps them): the engine host holds no copy of the token.
        files.file(
            name=f"Remove {cache}/token (the engine reads no Hub repository)", path=f"{cache}/token", present=False
        )
        return
    assert secret, "engine_reads_hub_token is False without serving_hf_token_secret"
    user, group = settings.base.service_user, settings.base.service_group
    for path in (f"{settings.base.data_dir}/.cache", cache):
        files.directory(name=f"Create {path} (mode 0700)", path=path, user=user, group=group, mode="0700")
    # huggingface_hub reads $HF_HOME/token; the service user's home is base_data_dir.
    secret_file(
        label=f"the Hugging Face token (secret {secret})",
        value=secret_value(secret),
        dest=f"{cache}/token",
        user=user,
        group=group,
    )
