"""The one table of roles: which role runs on which host, in which order, and under which
condition. deploy.py runs it (dispatch, nothing else); the preview (roles/render.py) runs
deploy.py itself against recording hosts, so a role added here is previewed as it deploys, with
no entry of its own (tests/unit/test_preview_is_the_deploy.py). deploy.py calls no role of its
own (tests/unit/test_composition.py).

Like deploy.py and roles/render.py, this module composes the roles; no role imports it. The
conditions are read from the site model only (settings, the site), never from a host's facts,
except `waiting`, which deploy.py reads on the node while pyinfra plans (roles/proxmox_host's
guest_wait_reason); the preview's stated node has every guest running, so none waits there.

Order matters: the node's operations come first, then a barrier every host passes
(guests_ready), so pyinfra runs all of the nodes' operations before any of the guests' own; the
gateways' operations wait for the replicas' (replicas_serving); the health verdict is the last
word of a gpu node, continue_in_guests the last step of a node.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from roles.base import base
from roles.cuda import cuda
from roles.docker_engine import docker_engine
from roles.eagle3_training import eagle3_training
from roles.engine_envs import engine_envs
from roles.firewall import firewall
from roles.gateway import gateway, replicas_serving
from roles.health import health
from roles.kvm_guest import kvm_guest
from roles.lxc_guest import lxc_guest
from roles.monitoring import monitoring, watched
from roles.nvidia_driver import nvidia_driver
from roles.proxmox_host import (
    continue_in_guests,
    guests_of,
    guests_ready,
    needs_host_driver,
    proxmox_host,
    proxmox_reboot,
)
from roles.serving import serving
from roles.site import HostSettings, Site, firewalled
from roles.weights import weights
from roles.wheels import wheels


@dataclass(frozen=True)
class Scope:
    """One host of one pass: what the table's conditions read."""

    settings: HostSettings
    site: Site
    waiting: str | None = None  # a guest its node has not made (or started) yet: why, else None

    def group(self, name: str) -> bool:
        return self.settings.in_group(name)

    @property
    def node(self) -> bool:
        return self.group("proxmox_hosts")

    @property
    def gpu_node(self) -> bool:
        return self.group("gpu_nodes") and not self.waiting

    @property
    def builder(self) -> bool:
        return self.group("builders") and not self.waiting


@dataclass(frozen=True)
class Step:
    """`run` for every host whose scope `when` accepts. `role` is the package under roles/ the
    step belongs to (the preview's key); `barrier` marks an ordering barrier every host passes,
    which writes nothing."""

    role: str
    when: Callable[[Scope], bool]
    run: Callable[[Scope], object]  # a role (pyinfra types @deploy functions as operations)
    barrier: bool = False
    also: tuple[str, ...] = ()  # more roles the step runs (the node's guests: lxc_guest and kvm_guest)


def _guests(scope: Scope) -> None:
    """The node's guests, each by its kind's role (after the node's own preparation)."""
    for guest in guests_of(scope.settings.name, scope.site):
        # pyinfra types a @deploy function as an operation (global arguments first): a role's own
        # parameters are not seen by mypy.
        if guest.in_group("lxc_guests"):
            lxc_guest(guest)  # type: ignore[call-arg, arg-type]
        else:
            kvm_guest(guest)  # type: ignore[call-arg, arg-type]


def _every(scope: Scope) -> bool:
    return True


# Each step's `run` is a lambda written on that step's own line, never one made by a helper:
# pyinfra (pyinfra/api/operation.py, 3.10, solve_operation_consistency) identifies an operation
# across hosts by the line numbers of the calls that led to it, and orders operations by them.
# One shared call line would make the node's nvidia_driver and the guest's the same operations
# (a cycle in pyinfra's order, as the two hosts reach them on either side of guests_ready).


STEPS: tuple[Step, ...] = (
    Step("proxmox_host", lambda s: s.node, lambda s: proxmox_host()),
    # The node's kernel driver serves its LXC guests' GPUs (full mode; persistenced and nvidia-uvm
    # start once the module loads).
    Step("nvidia_driver", lambda s: s.node and needs_host_driver(s.settings, s.site), lambda s: nvidia_driver()),
    Step("proxmox_host", lambda s: s.node, lambda s: proxmox_reboot()),  # when something asked for it
    Step("lxc_guest", lambda s: s.node, lambda s: _guests(s), also=("kvm_guest",)),  # in the inventory's order
    # Weights the node keeps for its guests (read-only mount points), before they start.
    Step("weights", lambda s: s.node, lambda s: weights()),
    Step("proxmox_host", _every, lambda s: guests_ready(), barrier=True),  # guests wait for their node
    # First inside a host: its rules are in place before any role starts a listener.
    Step("firewall", lambda s: firewalled(s.settings) and not s.waiting, lambda s: firewall()),
    Step("base", lambda s: s.gpu_node, lambda s: base()),
    Step("nvidia_driver", lambda s: s.gpu_node, lambda s: nvidia_driver()),
    Step("cuda", lambda s: s.gpu_node, lambda s: cuda()),
    Step("docker_engine", lambda s: s.builder and s.settings.docker.manage_engine, lambda s: docker_engine()),
    Step("wheels", lambda s: s.builder and s.settings.build.kernel_wheels, lambda s: wheels()),
    # On its own disk when no node keeps them; the service waits for a verified copy.
    Step("weights", lambda s: s.gpu_node, lambda s: weights()),
    # Installs the kernel wheels the builders made (roles/wheels) from their wheelhouse.
    Step("engine_envs", lambda s: s.gpu_node, lambda s: engine_envs()),
    Step("serving", lambda s: s.gpu_node, lambda s: serving()),
    # Laid down only: the user starts its steps (systemctl).
    Step("eagle3_training", lambda s: s.gpu_node and s.settings.eagle3_training.enabled, lambda s: eagle3_training()),
    # Packages, the site's CAs (uv reaches PyPI through them), limits; beside the replicas' roles.
    Step("base", lambda s: s.group("gateways") and not s.gpu_node, lambda s: base()),
    Step("gateway", _every, lambda s: replicas_serving(), barrier=True),  # the gateways wait for the replicas
    Step("gateway", lambda s: s.group("gateways"), lambda s: gateway()),  # its workers already serve
    # Exporters and the checks' timer on gpu nodes; Prometheus and Alertmanager on monitors.
    Step("monitoring", lambda s: watched(s.settings, s.site) and not s.waiting, lambda s: monitoring()),
    # Last, after the barrier too: the health checks judge what every role above left, and a
    # failed check is the deploy's last word.
    Step("health", lambda s: s.gpu_node, lambda s: health()),
    # The very last step: a guest this pass created (or that waited for the node's reboot) is
    # deployed by the next pass of the same command, which this starts.
    Step("proxmox_host", lambda s: s.node, lambda s: continue_in_guests()),
)


def steps_for(scope: Scope) -> list[Step]:
    """The steps this host runs, in order."""
    return [step for step in STEPS if step.when(scope)]


def roles_for(scope: Scope) -> list[str]:
    """The roles whose files this host gets, each once, in the order they first run."""
    return list(
        dict.fromkeys(role for step in steps_for(scope) if not step.barrier for role in (step.role, *step.also))
    )


def roles() -> set[str]:
    """Every role the table runs."""
    return {role for step in STEPS if not step.barrier for role in (step.role, *step.also)}
