"""The grammars of values the consumers on a host read: paths and the folders the deploy makes,
systemd unit names, apt package names, sysctl.d(5) lines. Pure functions and constants; the
settings' rules (roles/site/fields.py) are written with them."""

from __future__ import annotations

import re

# Paths on a host. Each reaches a root shell (quoted there: roles/shared's command builder), a
# unit (systemd's quoting and %% for specifiers: roles/shared/systemd_syntax.py, issue 38) and a chown.
# What no sane path holds is refused, so that a path that escaped its quoting once still cannot
# be shell syntax: $ ` ; | & < > ( ) \ ' " and the glob characters * ? [ ] { } ! # ~ (control
# and invisible characters are refused for every setting, schema.py). A space stays allowed
# (issue 38 writes it for systemd; the shell gets it quoted). A Proxmox mount point has its own,
# stricter rule (',' and '=': property_value_problem). Folders the deploy makes and gives to an
# owner (HostFolder) are, besides, never '/', a folder of the system (SYSTEM_FOLDERS: chowned to
# the service account, /var/log would be its), nor under a kernel file system (/proc, /sys,
# /dev) or /run (a tmpfs emptied at boot).
PATH_FORBIDDEN = frozenset("$`;|&<>()\\'\"*?[]{}!#~")
SYSTEM_FOLDERS = frozenset(
    {
        "/",
        *(
            f"/{name}"
            for name in ("bin", "boot", "dev", "etc", "home", "lib", "lib32", "lib64", "libx32", "lost+found")
        ),
        *(f"/{name}" for name in ("media", "mnt", "opt", "proc", "root", "run", "sbin", "snap", "srv", "sys", "tmp")),
        *(f"/{name}" for name in ("usr", "var")),
        *(f"/usr/{name}" for name in ("bin", "games", "include", "lib", "lib32", "lib64", "libexec", "local", "sbin")),
        *(f"/usr/{name}" for name in ("share", "src")),
        *(f"/usr/local/{name}" for name in ("bin", "etc", "games", "include", "lib", "sbin", "share", "src")),
        *(f"/var/{name}" for name in ("backups", "cache", "crash", "lib", "local", "lock", "log", "mail", "opt")),
        *(f"/var/{name}" for name in ("run", "spool", "tmp", "lib/vz", "lib/systemd", "lib/apt")),
        *(f"/var/{name}" for name in ("lib/dpkg", "cache/apt", "log/journal")),
        *(f"/etc/{name}" for name in ("systemd", "ssh", "apt", "default", "security", "sudoers.d", "pve", "ssl")),
    }
)
NOT_UNDER = ("/proc", "/sys", "/dev", "/run")
# Trees no folder of the deploy's may sit in, at any depth: what lives there is the system's
# and read or run by root (a folder the service account owns in /etc/systemd/system, /etc/cron.d
# or /usr/local/lib/python3.12 is a unit, a cron job or a module root runs; one in /root or
# /boot is root's), or the trees every user may write (/tmp, /var/tmp: another user makes the
# folder first, or a link in its place, and the deploy's chown follows it).
SYSTEM_TREES = (
    *("/etc", "/usr", "/boot", "/root", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/snap"),
    *("/var/spool", "/var/lib/systemd", "/var/lib/dpkg", "/var/lib/apt", "/var/lib/vz", "/var/log/journal"),
    *("/var/cache/apt", "/var/lib/lxc", "/var/lib/containerd", "/var/lib/docker/volumes"),
    # cloud-init runs what it finds in /var/lib/cloud (instance/scripts, per-boot scripts) as
    # root at boot; pmxcfs keeps the cluster's database (config.db: every guest's config and the
    # cluster's keys) in /var/lib/pve-cluster.
    *("/var/lib/cloud", "/var/lib/pve-cluster"),
)
WORLD_WRITABLE_TREES = ("/tmp", "/var/tmp", "/dev/shm", "/var/crash")
HOST_PATH_TEXT = "an absolute path without shell syntax ($ ` ; | & < > ( ) \\ quotes * ? [ ] { } ! # ~)"


def normal_path(path: str) -> str:
    """path without repeated or trailing slashes (the form folders are compared in)."""
    return "/" + "/".join(part for part in path.split("/") if part and part != ".")


def host_path_problem(path: str) -> str | None:
    """Why path cannot be written on a host's command line, unit or property string, or None."""
    if not path.startswith("/"):
        return "it is not absolute"
    parts = [part for part in path.split("/") if part]
    if ".." in parts:
        return "it has a '..' part"
    position = next((i for i, c in enumerate(path) if c in PATH_FORBIDDEN), None)
    if position is not None:
        return f"{ascii(path[position])} at position {position} is one of them"
    return None


def host_folder_problem(path: str) -> str | None:
    """host_path_problem, and why the deploy must not make path a folder of its own, or None."""
    problem = host_path_problem(path)
    if problem:
        return f"{HOST_PATH_TEXT}; {problem}"
    folder = normal_path(path)
    if folder == "/":
        return "a folder of its own, not / (the whole system)"
    if folder in SYSTEM_FOLDERS or folder in SYSTEM_TREES:
        return f"a folder of its own, not the system's {folder} (docs/inventory.md#host-folders)"
    under = next((top for top in NOT_UNDER if folder.startswith(top + "/")), None)
    if under:
        return f"a folder on a disk, not under {under} (a kernel or boot-time file system)"
    under = next((top for top in SYSTEM_TREES if folder.startswith(top + "/")), None)
    if under:
        return f"a folder of its own, not inside the system's {under} (docs/inventory.md#host-folders)"
    if folder.startswith("/home/") and folder.count("/") == 2:
        return f"a folder of its own, not {folder} (a user's home folder)"
    return home_dotfolder_problem(folder)


def home_dotfolder_problem(path: str) -> str | None:
    """Why path is in a user's dot folder (/home/NAME/.ssh, .config, .local/bin), or None: what
    lives there is read or run by that user's ssh, shell and tools (authorized_keys, .bashrc,
    ~/.local/bin on PATH), so a folder the service account owns there is a way into that user."""
    parts = normal_path(path).split("/")[1:]
    if len(parts) >= 3 and parts[0] == "home" and parts[2].startswith("."):
        return f"a folder of its own, not in /home/{parts[1]}/{parts[2]} (a user's dot folder: ssh, shell, tools)"
    return None


# Where a file root copies into a guest (qm's import-from) must not be: the node's own secrets
# (/etc/shadow, /root/.ssh, /etc/pve/priv), kernel and device trees, and the trees every user may
# write (another user's file in place of the image).
SECRET_TREES = ("/etc", "/root", "/home", "/boot", "/proc", "/sys", "/dev", "/run", *WORLD_WRITABLE_TREES)
# A guest's image is taken only from the node's image storage: the `local` storage's folder
# (/var/lib/vz, where Proxmox keeps import/, template/ and images/) or a directory or network
# storage, which Proxmox mounts under /mnt/pve/<storage> (pve-storage's default path for NFS, CIFS
# and CephFS). Anything else is some file of the node's (/var/lib/pve-cluster/config.db, the
# cluster's database) that qm would copy, as root, into the guest's disk.
IMAGE_TREES = ("/var/lib/vz", "/mnt/pve")


def image_path_problem(path: str) -> str | None:
    """Why path cannot be a guest's cloud image on the node, or None."""
    folder = normal_path(path)
    if ".." in path.split("/") or not any(folder.startswith(top + "/") for top in IMAGE_TREES):
        return "it is not in the node's image storage (/var/lib/vz or /mnt/pve/<storage>)"
    return secret_tree_problem(folder)


def secret_tree_problem(path: str) -> str | None:
    folder = normal_path(path)
    under = next((top for top in SECRET_TREES if folder == top or folder.startswith(top + "/")), None)
    return f"it is in {under}" if under else None


def world_writable_problem(path: str) -> str | None:
    """Why path (a folder the deploy makes, or a program root runs) must not be where every user
    may write, or None."""
    under = next((top for top in WORLD_WRITABLE_TREES if normal_path(path).startswith(top + "/")), None)
    if under:
        return f"a path outside {under}, where every user may write (and put a link or a program first)"
    return None


# Names of the units the deploy writes (<name>.service in /etc/systemd/system, which overrides
# a packaged unit of the same name in /usr/lib/systemd/system: systemd.unit(5), "Unit File Load
# Path"). A name of the system's own would replace that service: `ssh` is the deploy's own way
# in. Refused: the units every Debian/Ubuntu/Proxmox host of this project runs or may run
# (SYSTEM_UNITS), every name with a prefix of SYSTEM_UNIT_PREFIXES (systemd's, Proxmox's,
# NVIDIA's and the package families'), and the units this project installs itself
# (inference-host-*: the checks' timer, the weights' units; nvidia-*: DCGM's exporter).
SYSTEM_UNITS = frozenset(
    {
        *("anacron", "apparmor", "apt-daily", "apt-daily-upgrade", "atd", "auditd", "avahi-daemon", "basic"),
        *("chrony", "chronyd", "console-getty", "containerd", "corosync", "cron", "crond", "cups", "dbus"),
        *("default", "docker", "emergency", "firewalld", "fstrim", "getty", "graphical", "halt", "irqbalance"),
        *("kexec", "lxc", "lxcfs", "multi-user", "multipathd", "network", "networking", "NetworkManager", "nftables"),
        *("ntp", "ntpsec", "polkit", "postfix", "poweroff", "qmeventd", "reboot", "rescue", "rpcbind", "rsync"),
        *("rsyslog", "shutdown", "smartd", "smartmontools", "snapd", "spiceproxy", "ssh", "sshd", "sudo", "sysinit"),
        *("syslog", "udev", "ufw", "unattended-upgrades", "user", "watchdog", "zfs"),
        *("prometheus", "prometheus-alertmanager", "prometheus-node-exporter", "alertmanager", "node_exporter"),
    }
)
SYSTEM_UNIT_PREFIXES: tuple[str, ...] = (
    "systemd-",
    "getty@",
    "serial-getty@",
    "user@",
    "user-",
    "pve",
    "ceph",
    "lvm2-",
    "zfs-",
)
SYSTEM_UNIT_PREFIXES += ("nvidia-", "ssh@", "sshd@", "dbus-", "apt-", "snap.", "lxc@", "lxc-", "qemu-", "mdmonitor")
PROJECT_UNIT_PREFIX = "inference-host-"  # the checks' timer, the weights' units
UNIT_NAME_RE = re.compile(r"[A-Za-z0-9_.@:-]{1,200}")
UNIT_NAME_TEXT = (
    "a systemd unit name of letters, digits and _ . @ : - that is not a system's unit (ssh, dbus, cron,"
    " systemd-*, pve*, nvidia-*, ...: docs/inventory.md#unit-names)"
)


# The roles write <name>.service: a name that ends in a unit type's suffix (systemd.unit(5))
# would be `x.service.service` or `x.socket.service`, never the unit the user named, and a name
# with '@' is a template (`x@.service`, which systemctl cannot start) or one instance of one.
UNIT_SUFFIXES: tuple[str, ...] = (".service", ".socket", ".target", ".timer", ".mount", ".automount", ".swap")
UNIT_SUFFIXES += (".path", ".slice", ".scope", ".device")


def unit_name_problem(name: str) -> str | None:
    if not UNIT_NAME_RE.fullmatch(name) or name.startswith(("-", ".")):
        return "it has a character other than those"
    base = name.removesuffix(".service")
    if base in SYSTEM_UNITS or base.startswith((*SYSTEM_UNIT_PREFIXES, PROJECT_UNIT_PREFIX)):
        return f"{base}.service is a unit of the system or of this project, which the deploy would replace"
    if "@" in name:
        return "it has an '@', which makes it a template or an instance of one; expected a plain name"
    suffix = next((s for s in UNIT_SUFFIXES if name.endswith(s)), None)
    if suffix:
        return f"it ends in {suffix}; expected the name without it (the deploy writes <name>.service)"
    return None


# apt package names: apt-get has no `--` before its package words, so a word that begins with
# '-' is an option (`-oDpkg::Pre-Invoke::=CMD` runs CMD as root). Debian policy 5.6.1 (Source)
# and 5.6.7 (Package): a name of lower-case letters, digits, '+', '-', '.', at least two
# characters, beginning with a letter or digit; 5.6.12 (Version): [epoch:]upstream[-revision],
# the upstream part beginning with a digit, of letters, digits and . + ~ - (':' only after an
# epoch). `name=version` is how apt-get pins one.
DEBIAN_PACKAGE_RE = re.compile(r"[a-z0-9][a-z0-9+.-]+(=([0-9]+:)?[0-9][A-Za-z0-9.+~-]*)?")
DEBIAN_PACKAGE_TEXT = (
    "Debian package names (policy 5.6.7: [a-z0-9][a-z0-9+.-]+), each optionally =VERSION"
    " ([epoch:]version, policy 5.6.12), not ending in '-', a '.' only between digits (python3.11),"
    " a '+' only as '++' after a letter (libstdc++6, g++)"
)
# A policy name still has other meanings to apt-get install (apt-get(8), "install"; apt 2.6.2
# and 2.7, read in apt-get(8) and tried with `apt-get -s install`), each taken only when no
# package has exactly that name, so they depend on the host's package lists, which the site
# model cannot see: a trailing '-' removes the package (`openssh-server-` removes the SSH
# server), a trailing '+' installs it, and a name with '.', '?', '*' or '+' is a POSIX regular
# expression matched against every package name as a substring (`x.z` installed 766 packages,
# `nginx.` 162). So: no name ends in '-' (never a real name); a '.' only between two digits (a
# version inside a name: python3.11, gir1.2-glib-2.0), whose regex reading matches only names
# that contain this one with a character other than '.' between those digits; a '+' only as
# '++' after a letter (libstdc++6, g++, g++-12), whose reading is "that letter once or more".
# A '.' also needs a name of three or more characters before it (`1.2` would match any name
# holding 1, a character and 2). A '.' between letters (python3-zope.interface) is refused:
# install such a package in a stack or an image instead. `g++` stays: it is in Debian's and
# Ubuntu's main archive, so apt always finds it by its exact name.
_APT_DOT_RE = re.compile(r"(?<![0-9])\.|\.(?![0-9])")
_APT_PLUS_RE = re.compile(r"(?<![a-z])\+\+|\+\+\+|(?<!\+)\+(?!\+)")


def debian_package_problem(word: str) -> str | None:
    """Why word is not one package apt-get installs as written, or None."""
    if not DEBIAN_PACKAGE_RE.fullmatch(word):
        return "it is not one"
    name = word.split("=", 1)[0]
    if name.endswith("-"):
        return "it ends in '-', which tells apt-get to remove the package (apt-get(8), install)"
    if _APT_DOT_RE.search(name):
        return "its '.' is not between two digits; apt-get reads such a name as a regular expression"
    if "." in name and not re.match(r"[a-z][a-z0-9-]{2,}[0-9]\.", name):
        return "its '.' does not follow a name of three or more characters; apt-get reads it as a regular expression"
    if _APT_PLUS_RE.search(name):
        return "its '+' is not '++' after a letter; apt-get reads such a name as a regular expression"
    return None


# sysctl.d(5) (systemd 252, Debian 12's; procps' `sysctl -p` reads the same lines): one
# `key = value` per line; a line beginning with '#' or ';' is a comment; the key is what comes
# before the first '=', the value the rest, both stripped of white space; a key beginning with
# '-' means "ignore a failure to set it"; keys name /proc/sys files with '.' or '/' between parts.
# So a key is refused unless made of [A-Za-z0-9_] parts joined by '.', '/' or '-', not beginning
# with '-' (a flag), '.' or '/'; a value is refused when it is empty or has white space at its
# ends (stripped: not what was written). sysctl.d(5) also takes a glob ('*') in a key and sets
# every file it matches (`kernel.* = 0` writes every kernel setting, the limits and the core
# pattern with them): refused, a key names one setting.
SYSCTL_KEY_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_./-]*")
SYSCTL_TEXT = (
    "sysctl.d(5) settings {key: value}: keys of letters, digits and _ . / - (not beginning with"
    " '-', '.' or '/'; no glob '*', no '=', '#', ';' or space), values without white space at their ends"
)
# Settings whose value is a program the kernel runs as root (proc_sys_kernel(5)): a core
# pattern that begins with '|' pipes every crash dump into that program; kernel.modprobe,
# kernel.hotplug and kernel.poweroff_cmd name the program the kernel starts for a module, an
# event or a power-off. None is the deploy's to change: a path there is a program of the
# service account's, run as root.
SYSCTL_PROGRAMS = frozenset({"kernel.modprobe", "kernel.hotplug", "kernel.poweroff_cmd"})


def sysctl_problem(key: str, value: str) -> str | None:
    if not SYSCTL_KEY_RE.fullmatch(key):
        return f"the key {ascii(key)} is not one"
    if not value.strip() or value != value.strip():
        return f"the value {ascii(value)} of {key} is empty or has white space at its ends"
    name = key.replace("/", ".")
    if name in SYSCTL_PROGRAMS:
        return f"{key} names a program the kernel runs as root, which the deploy does not set"
    if name == "kernel.core_pattern" and value.startswith("|"):
        return f"{key} begins with '|', which pipes every crash dump into a program run as root"
    return None


# The service account and its primary group: made by the deploy, owning the data, model and log
# folders, running the engine (which runs the model folder's Python with trust_remote_code). An
# account of the system's own would be taken over (its files chowned, its processes' user shared)
# and a group of the system's would give the engine that group's powers: root's files (root),
# raw disks (disk), /etc/shadow (shadow), the logs (adm, systemd-journal), sudo (sudo, wheel,
# admin), the Docker or LXD API, which is root (docker, lxd). Refused: the static users and
# groups of Debian's base-passwd (3.6.1, /usr/share/base-passwd/passwd.master and group.master,
# which Ubuntu ships too), the accounts of the system's packages every host of this project
# may run (sshd, messagebus, systemd-*, ...) and the groups that are root in all but name.
BASE_PASSWD_USERS = frozenset(
    {
        *("root", "daemon", "bin", "sys", "sync", "games", "man", "lp", "mail", "news", "uucp", "proxy"),
        *("www-data", "backup", "list", "irc", "gnats", "nobody"),
    }
)
BASE_PASSWD_GROUPS = frozenset(
    {
        *("root", "daemon", "bin", "sys", "adm", "tty", "disk", "lp", "mail", "news", "uucp", "man", "proxy"),
        *("kmem", "dialout", "fax", "voice", "cdrom", "floppy", "tape", "sudo", "audio", "dip", "www-data"),
        *("backup", "operator", "list", "irc", "src", "gnats", "shadow", "utmp", "video", "sasl", "plugdev"),
        *("staff", "games", "users", "nogroup"),
    }
)
SYSTEM_ACCOUNTS = frozenset(
    {
        *("sshd", "messagebus", "syslog", "uuidd", "tcpdump", "tss", "landscape", "pollinate", "polkitd", "postfix"),
        *("chrony", "ntp", "statd", "_apt", "dnsmasq", "lxd", "ceph", "prometheus", "nvidia-persistenced"),
    }
)
ROOT_EQUIVALENT_GROUPS = frozenset(
    {"docker", "lxd", "wheel", "admin", "systemd-journal", "libvirt", "kvm", "render", "input", "netdev"}
)
ACCOUNT_TEXT = (
    "an unprivileged lower-case Unix user or group name ([a-z_][a-z0-9_-]*) of the deploy's own, not root"
    " nor an account or group of the system (daemon, nobody, sshd, systemd-*, sudo, adm, disk, shadow, docker, ...)"
)


# The accounts the project's other units run as (roles/gateway SERVICE_USER, roles/monitoring
# RELAY_USER, roles/shared/layout CHECKS_USER, roles/eagle3_training JOB_USER;
# tests/unit/test_site_meaning.py holds these names to them): the engine runs the model folder's
# code, so under one of these it could read the gateway's API key file, the relay's webhook
# secret, the checks' or the training job's client key, or start the training's root helper
# (its polkit rule names that account), and one account's compromise would be both units'.
# One account per unit.
OTHER_UNIT_ACCOUNTS = {
    "smg": "the gateway's",
    "inference-host-alert-relay": "the alert relay's",
    "inference-host-checks": "the periodic checks'",
    "inference-host-eagle3": "the EAGLE-3 training job's",
}


def service_account_problem(name: str, group: bool = False) -> str | None:
    """Why name cannot be the service account (group: its primary group), or None."""
    if name in OTHER_UNIT_ACCOUNTS:
        kind = "group" if group else "account"
        return f"{name} is {OTHER_UNIT_ACCOUNTS[name]} {kind}; expected one account per unit (the engine's own)"
    system = (BASE_PASSWD_GROUPS | ROOT_EQUIVALENT_GROUPS if group else BASE_PASSWD_USERS) | SYSTEM_ACCOUNTS
    if name in system or name.startswith(("systemd-", "_")):
        kind = "a group" if group else "an account"
        return f"{name} is {kind} of the system, whose files and powers the engine would share"
    return None


# http(s) URLs of mirrors, receivers and endpoints, read by uv, pip, apt, Alertmanager and
# huggingface_hub. What urllib.parse.urlsplit accepts is wider than what they reach: a port
# beyond 65535 (or 0) parses, then every connection fails, and Go's net/url (Alertmanager)
# refuses an IPv6 zone not written as RFC 6874 says ('%25' then the zone: section 2). So a URL
# is refused unless its host is a DNS name, an IPv4 address or a bracketed IPv6 address whose
# zone, if any, is '%25' and an interface name (ZONE_TEXT), and its port is 1 to 65535.
URL_TEXT = "an http(s) URL without spaces, with a DNS name or an IP address as its host and a port from 1 to 65535"
_URL_HOST_RE = re.compile(
    r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*"
)
_URL_ZONE_RE = re.compile(r"%25[A-Za-z0-9._~-]{1,15}")


def url_problem(url: str) -> str | None:
    """Why url is not an http(s) URL its readers take as written, or None."""
    import ipaddress
    from urllib.parse import urlsplit

    if not re.fullmatch(r"https?://[^\s/?#]+([/?#]\S*)?", url):
        return "it is not one"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as error:
        return f"urllib reads no host and port in it ({error})"
    if port == 0:
        return "its port 0 is no port to connect to"
    host = parts.netloc.rpartition("@")[2]
    host = host.rsplit(":", 1)[0] if parts.port is not None or host.endswith(":") else host
    if host.startswith("["):
        address, _, zone = host[1:-1].partition("%")
        if zone and not _URL_ZONE_RE.fullmatch("%" + zone):
            return "its IPv6 zone is not written %25 and an interface name (RFC 6874)"
        try:
            ipaddress.IPv6Address(address)
        except ValueError:
            return f"[{address}] is no IPv6 address"
        return None
    if not _URL_HOST_RE.fullmatch(host):
        return f"its host {host!r} is not a DNS name or an IP address"
    return None
