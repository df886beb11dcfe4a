"""The NCCL variables an engine runs with, from nccl_*: one dict that roles/serving renders into
each release's environment file (templates/inference-engine.env.j2) and the health checks run their
all-reduce with when they cannot read that file (checks/expectations.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from roles.site import NcclSettings


def environment(nccl: NcclSettings) -> dict[str, str]:
    """NAME -> value, in the order the environment file lists them."""
    env = {"NCCL_P2P_DISABLE": "1"} if nccl.p2p_level == "off" else {"NCCL_P2P_LEVEL": nccl.p2p_level}
    # Unset means off (one node, nothing to use); False lets NCCL use InfiniBand/RoCE.
    env["NCCL_IB_DISABLE"] = "0" if nccl.ib_disable is False else "1"
    optional = {
        "NCCL_IB_HCA": nccl.ib_hca,
        "NCCL_SOCKET_IFNAME": nccl.socket_ifname,
        "NCCL_DEBUG": nccl.debug,
        "NCCL_DEBUG_SUBSYS": nccl.debug_subsys,
        "NCCL_MIN_NCHANNELS": str(nccl.min_nchannels) if nccl.min_nchannels else None,
    }
    env.update({key: value for key, value in optional.items() if value})
    return env
