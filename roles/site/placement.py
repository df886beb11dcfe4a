"""Which host writes a setting that another host's section declares: kernel settings an LXC
guest cannot set go to its Proxmox node; the Hugging Face token goes where the download runs.
Derived from the typed settings only (the site model's own rules; no role imported)."""

from __future__ import annotations

from roles.site.schema import HostSettings
from roles.site.weights import weight_sets_of

# The sysctls a container can set for itself: those of its own IPC and network namespaces, as
# runc allows them (opencontainers/runc libcontainer/configs/validate/validator.go, `sysctl`).
# Every other key (kernel.numa_balancing, vm.*) is the shared kernel's, so the node's to write.
_IPC_SYSCTLS = {
    "kernel.msgmax",
    "kernel.msgmnb",
    "kernel.msgmni",
    "kernel.sem",
    "kernel.shmall",
    "kernel.shmmax",
    "kernel.shmmni",
    "kernel.shm_rmid_forced",
}
_NAMESPACED_PREFIXES = ("net.", "fs.mqueue.")


def namespaced_sysctl(key: str) -> bool:
    return key in _IPC_SYSCTLS or key.startswith(_NAMESPACED_PREFIXES)


# The shared kernel's keys an LXC guest may have its node write (node_sysctl): the memory and
# scheduling knobs that serving tunes. Any other key of the shared kernel (kernel.core_pattern,
# kernel.modprobe, fs.*, every other kernel.*) would change the node itself, and with it every
# other guest, from a guest's settings: set it in the node's own base_sysctl, where a reviewer
# reads it as the node's.
GUEST_NODE_SYSCTLS = frozenset(
    {"kernel.numa_balancing", "vm.swappiness", "vm.max_map_count", "vm.overcommit_memory", "vm.nr_hugepages"}
)


def guest_sysctl_problems(host: HostSettings) -> list[str]:
    """Keys of an LXC guest's base_sysctl its node would write that are not the guest's to set."""
    if not host.in_group("lxc_guests") or not host.valid("base_sysctl"):
        return []
    bad = [k for k in host.base.sysctl if not namespaced_sysctl(k) and k.replace("/", ".") not in GUEST_NODE_SYSCTLS]
    if not bad:
        return []
    return [
        f"base_sysctl {', '.join(bad)} on an LXC guest is the node's kernel's, which its node would write;"
        f" expected a guest's namespaced keys (net.*, kernel.shm*, ...) or {', '.join(sorted(GUEST_NODE_SYSCTLS))};"
        " set any other in the node's own base_sysctl"
    ]


def own_sysctl(host: HostSettings) -> dict[str, str]:
    """base_sysctl as this host's roles/base writes it: all of it on a VM or bare metal, only the
    namespaced keys inside an LXC guest (the rest is written on its node, `node_sysctl`)."""
    if not host.in_group("lxc_guests"):
        return dict(host.base.sysctl)
    return {k: v for k, v in host.base.sysctl.items() if namespaced_sysctl(k)}


def node_sysctl(node: HostSettings, site_hosts: dict[str, HostSettings]) -> dict[str, str]:
    """What a Proxmox node writes: its own base_sysctl, then the host-wide keys of its LXC
    guests that run the engine (a conflict between them is refused, `sysctl_conflicts`)."""
    merged = dict(node.base.sysctl)
    for key, value, _ in _guest_kernel_keys(node, site_hosts):
        merged.setdefault(key, value)
    return merged


def sysctl_conflicts(node: HostSettings, site_hosts: dict[str, HostSettings]) -> list[str]:
    """Problems: one host-wide key with two values on one node (node or guests)."""
    seen = {key: (value, node.name) for key, value in node.base.sysctl.items()}
    problems = []
    for key, value, guest in _guest_kernel_keys(node, site_hosts):
        first = seen.setdefault(key, (value, guest))
        if first[0] != value:
            problems.append(
                f"base_sysctl {key} = {value!r} on LXC guest {guest} but {first[0]!r} on {first[1]}:"
                f" the key is the shared kernel's, written once on node {node.name}; expected one value"
            )
    return problems


def _guest_kernel_keys(node: HostSettings, site_hosts: dict[str, HostSettings]):
    for guest in sorted(site_hosts.values(), key=lambda h: h.name):
        if guest.guest.node == node.name and guest.in_group("lxc_guests") and guest.in_group("gpu_nodes"):
            for key, value in sorted(guest.base.sysctl.items()):
                if not namespaced_sysctl(key):
                    yield key, value, guest.name


def engine_reads_hub_token(host: HostSettings, site_hosts: dict[str, HostSettings]) -> bool:
    """Whether the engine host gets $HF_HOME/token (roles/base): only when its engine itself may
    fetch from the Hub, i.e. a served model or drafter is named by a Hub id rather than a local
    directory that roles/weights fills. A download by roles/weights reads its own token file on the
    host that keeps the files (the Proxmox node for an LXC guest's mounted directory)."""
    if not host.serving.hf_token_secret:
        return False
    managed = {ws.guest_dir for ws in weight_sets_of(host, site_hosts)}
    spec = host.serving.speculative
    draft = spec.get("draft_model_path") if isinstance(spec, dict) else None
    served = [p.rstrip("/") for p in (host.serving.model_path, draft) if p]
    return any(not p.startswith("/") and p not in managed for p in served)


def exporter_bind(host: HostSettings, hosts: dict[str, HostSettings]) -> str:
    """Where a host's exporters (node_exporter, DCGM's) listen: monitoring_exporter_address, else
    the loopback when the host is its site's only monitor (no other host scrapes it), else every
    address, where roles/firewall, when on, lets only the monitors in."""
    if host.monitoring.exporter_address is not None:
        return host.monitoring.exporter_address
    monitors = [h.name for h in hosts.values() if h.in_group("monitors")]
    return "127.0.0.1" if monitors == [host.name] else "0.0.0.0"


FIREWALL_GROUPS = ("gpu_nodes", "gateways", "monitors")


def firewalled(host: HostSettings) -> bool:
    """roles/firewall runs here: the firewall is on, and the host is one the deploy serves from.
    Never a Proxmox node: its firewall is Proxmox's own (pve-firewall), and the node's traffic is
    not ours to cut."""
    return (
        host.firewall.enabled
        and not host.in_group("proxmox_hosts")
        and any(host.in_group(group) for group in FIREWALL_GROUPS)
    )
