"""Where things live on an engine host: the one owner of every path that more than one part of
the project names (the roles that make them, the preview in roles/render.py, the health checks
in checks). Paths only one role ever names stay that role's constants.

A leaf: it imports nothing at all, so the health checks (shipped to hosts in the checks bundle,
roles/monitoring/checks_env.py) and the site model, should it need a path, read it without a cycle.

    <install_root>/envs/<stack id>-<stamp>/              one engine environment (roles/engine_envs)
    <install_root>/envs/<...>/serving/launch             its command line        } written by
    <install_root>/envs/<...>/serving/<unit>.env         its environment (0640)  } roles/serving,
    <install_root>/envs/<...>/serving/<unit>-secret-args.yaml  --config (0600)   } per release
    <install_root>/envs/<...>/serving/<unit>.service     its unit                }
    <install_root>/current -> envs/<...>                  the release that serves
    /etc/systemd/system/<unit>.service  -> <install_root>/current/serving/<unit>.service
    /etc/inference-host/engine/<unit>-secret-args.yaml -> <install_root>/current/serving/<unit>-secret-args.yaml
"""

from __future__ import annotations

SYSTEMD_DIR = "/etc/systemd/system"
# The project's own helper scripts (roles/serving's switch and cleanup, roles/gateway's).
LIBEXEC = "/usr/local/libexec/inference-host"
# Stable names that do not change with the release: the health checks and inference-engine-rolling read
# the API key here (a link through `current`, roles/serving).
STABLE_DIR = "/etc/inference-host/engine"
RELEASE_DIR_NAME = "serving"
LAUNCHER_NAME = "launch"
# The project's own folders; a role's files go in a subfolder named for it.
ETC_DIR = "/etc/inference-host"
OPT_DIR = "/opt/inference-host"
# Debian/Ubuntu's CA bundle, with the site's extra CAs once update-ca-certificates ran.
SYSTEM_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
# Both driver roles keep nouveau off the GPUs (roles/nvidia_driver, roles/proxmox_host).
NOUVEAU_BLACKLIST = "/etc/modprobe.d/blacklist-nouveau.conf"
# The periodic checks' verdict for node_exporter's textfile collector (roles/monitoring writes the
# timer that fills it; `inference-host status` reads it). Debian's and Ubuntu's packaged folder.
TEXTFILE_DIR = "/var/lib/prometheus/node-exporter"
CHECKS_TEXTFILE = f"{TEXTFILE_DIR}/inference_host_checks.prom"
# The periodic checks' own system account (roles/base makes it on every gpu node, before roles/serving
# writes the engine's environment and API-key files 0640 with its group; roles/monitoring's unit runs as it).
CHECKS_USER = "inference-host-checks"
# What a rolling step leaves for the next deploy, and what `inference-host drain` leaves
# (roles/serving's inference-engine-rolling writes both; `inference-host status` reads the second).
SERVING_STATE_DIR = "/var/lib/inference-host/serving"
# The gateway's API key (roles/gateway writes it, 0640 root:smg; checks/gateway.py reads it).
GATEWAY_API_KEY_FILE = "/etc/smg/api-key"
# The gateway's control-plane key (0600 smg, read by smg-launch and the gateway check), and the
# same key on each replica behind it (0600 root, read by the rolling upgrade's drain):
# docs/security.md#keys-and-their-roles.
GATEWAY_CONTROL_PLANE_KEY_FILE = "/etc/smg/control-plane-api-key"
REPLICA_CONTROL_PLANE_KEY_FILE = f"{STABLE_DIR}/gateway-control-plane-api-key"
# The gateway's TLS files (gateway_tls_*, roles/gateway): its certificate and key (0600 smg), the
# CA its clients on that host verify it with and the CA it verifies TLS workers with (both 0644);
# and on each replica behind it the gateways' CA (0644: the rolling drain and the benchmark).
GATEWAY_TLS_FILES = {
    "cert": "/etc/smg/tls.crt",
    "key": "/etc/smg/tls.key",
    "ca": "/etc/smg/tls-ca.crt",
}
GATEWAY_WORKERS_CA_FILE = "/etc/smg/workers-ca.crt"
REPLICA_GATEWAY_CA_FILE = f"{STABLE_DIR}/gateway-tls-ca.crt"


def restart_pending_file(unit_name: str) -> str:
    return f"{SERVING_STATE_DIR}/{unit_name}.restart-pending"


def drained_marker_file(unit_name: str) -> str:
    """Left by inference-engine-rolling --drain-only; removed by --undrain-only or a finished step."""
    return f"{SERVING_STATE_DIR}/{unit_name}.drained"


def extra_ca_file(index: int) -> str:
    """Where the index-th of base_extra_ca_certificates goes (update-ca-certificates reads it)."""
    return f"/usr/local/share/ca-certificates/inference-host-{index}.crt"


def unit_file(unit_name: str) -> str:
    """Where systemd finds a unit named <unit_name>.service."""
    return f"{SYSTEMD_DIR}/{unit_name}.service"


def unit_dropin_dir(unit_name: str) -> str:
    """systemd's drop-in folder of <unit_name>.service."""
    return f"{unit_file(unit_name)}.d"


def current_link(install_root: str) -> str:
    """The link to the engine environment that serves (switched by roles/serving)."""
    return f"{install_root}/current"


def secret_args_link(unit_name: str) -> str:
    """The stable name of the engine's --config file (the API key), a link through `current`."""
    return f"{STABLE_DIR}/{unit_name}-secret-args.yaml"


def tls_files(unit_name: str) -> dict[str, str]:
    """The engine's TLS files (serving_tls_*): its certificate and key (0600, the service user's,
    written by roles/shared/secret_files.py) and the CA its clients verify it with (0644)."""
    return {
        "cert": f"{STABLE_DIR}/{unit_name}-tls.crt",
        "key": f"{STABLE_DIR}/{unit_name}-tls.key",
        "ca": f"{STABLE_DIR}/{unit_name}-tls-ca.crt",
    }


def release_files(env: str, unit_name: str) -> dict[str, str]:
    """One release's serving files inside its environment <env> (or inside `current`):
    launcher, env_file, secret_args, tenant_keys, unit."""
    folder = f"{env}/{RELEASE_DIR_NAME}"
    return {
        "launcher": f"{folder}/{LAUNCHER_NAME}",
        "env_file": f"{folder}/{unit_name}.env",
        "secret_args": f"{folder}/{unit_name}-secret-args.yaml",
        "tenant_keys": f"{folder}/{unit_name}-tenant-api-keys.json",
        "unit": f"{folder}/{unit_name}.service",
    }


def serving_files(install_root: str, unit_name: str) -> dict[str, str]:
    """The files of the release that serves, reached through `current` (what the checks read)."""
    return release_files(current_link(install_root), unit_name)


def engine_env(install_root: str, stamp: str) -> str:
    """One engine environment, named by its stamp (roles/shared/engine_env.env_dir computes it)."""
    return f"{install_root}/envs/{stamp}"
