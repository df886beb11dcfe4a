"""Each role's settings, one module per section (``roles/site/sections/<section>.py``), and the
one list that assembles them into host data.

A section is a pydantic model of the host-data keys sharing its ``PREFIX`` (``serving_port`` is
``ServingSettings.port``); ``HostSettings`` carries one attribute per section, named by the
prefix without its ``_`` (``host.serving``, ``host.nvidia_driver``). A new role adds its module
here and its class to ``SECTIONS``: nothing else dispatches on sections. The order is the order
of docs/settings.md and of the messages about one host.

The sections live in the model, not in the role packages, so that the model stays a leaf: a
role package's ``__init__`` imports pyinfra and the model (tests/unit/test_layout.py).
"""

from __future__ import annotations

from roles.site.fields import Section
from roles.site.sections import (
    base,
    build,
    cuda,
    docker,
    eagle3_training,
    engine,
    firewall,
    gateway,
    gpu,
    guest,
    health,
    monitoring,
    nccl,
    nvidia_driver,
    proxmox,
    serving,
    sglang,
    ssh,
    vllm,
    weights,
)

SECTIONS: tuple[type[Section], ...] = (
    base.BaseSettings,
    gpu.GpuSettings,
    nccl.NcclSettings,
    serving.ServingSettings,
    build.BuildSettings,
    guest.GuestSettings,
    proxmox.ProxmoxSettings,
    health.HealthSettings,
    engine.EngineSettings,
    sglang.SglangSettings,
    vllm.VllmSettings,
    nvidia_driver.NvidiaDriverSettings,
    cuda.CudaSettings,
    docker.DockerSettings,
    gateway.GatewaySettings,
    eagle3_training.Eagle3TrainingSettings,
    weights.WeightsSettings,
    monitoring.MonitoringSettings,
    firewall.FirewallSettings,
    ssh.SshSettings,
)


def attribute_of(section: type[Section]) -> str:
    """The HostSettings attribute holding a section: its prefix without the `_`."""
    return section.PREFIX.removesuffix("_")
