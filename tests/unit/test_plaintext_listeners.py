"""Plain HTTP beyond loopback needs an acknowledgement in the inventory (roles/site/rules_tls.py):
the bearer key crosses the network in clear otherwise, and the validator refuses in one line."""

from __future__ import annotations

import pytest

from roles.site import SiteError, load_site
from roles.site.schema import is_loopback
from tests.unit.conftest import ADMIN, CONTROL, ROLE_KEYS, gpu_node

REASON = "a private VLAN of trusted machines"


def _refusal(path) -> list[str]:
    with pytest.raises(SiteError) as error:
        load_site(str(path))
    return error.value.problems


def _vault(inventory):
    """The client key and the role keys (conftest.ROLE_KEYS) the admin and control-plane settings name."""
    return inventory.vault(engine_api_key="k" * 32, **ROLE_KEYS)


def _keyed(inventory, **data):
    """A gpu node with the API key and its admin key set (so the key rules stay quiet) and data on top."""
    return gpu_node(secrets_file=_vault(inventory), serving_api_key_secret="engine_api_key", **ADMIN, **data)


def _gateway(inventory, **data):
    """A gateway with its control-plane key (the key rules want one in front of keyed replicas)."""
    return ("gw1", {"secrets_file": _vault(inventory), **CONTROL, **data})


def test_an_engine_beyond_loopback_without_tls_is_refused_in_one_line(inventory):
    path = inventory.groups(gpu_nodes=[_keyed(inventory, serving_host="0.0.0.0")])
    assert _refusal(path) == [
        f"{path}: host gpu1: serving_host = '0.0.0.0' serves the engine in plain HTTP beyond this host"
        " (the API key and prompts cross the network in clear); expected serving_host = '127.0.0.1',"
        " or serving_tls_cert_secret and serving_tls_key_secret (it then serves TLS),"
        " or serving_plaintext_acknowledged = '<why plain HTTP is acceptable on this network>'"
        " (docs/security.md#tls)"
    ]


def test_a_private_address_is_beyond_loopback_too(inventory):
    path = inventory.groups(gpu_nodes=[_keyed(inventory, serving_host="10.0.0.5")])
    [problem] = _refusal(path)
    assert "serving_host = '10.0.0.5' serves the engine in plain HTTP" in problem


def test_the_acknowledgement_lets_it_through(inventory):
    path = inventory.groups(
        gpu_nodes=[_keyed(inventory, serving_host="0.0.0.0", serving_plaintext_acknowledged=REASON)]
    )
    assert load_site(str(path)).hosts["gpu1"].serving.plaintext_acknowledged == REASON


def test_the_acknowledged_listener_stays_in_view_as_a_warning(inventory):
    path = inventory.groups(
        gpu_nodes=[_keyed(inventory, serving_host="0.0.0.0", serving_plaintext_acknowledged=REASON)]
    )
    warnings = [line for line in load_site(str(path)).summary().splitlines() if "WARNING" in line]
    assert warnings == [
        "  gpu1: WARNING: the engine serves plain HTTP on 0.0.0.0 (the API key crosses the network in"
        f" clear); serving_plaintext_acknowledged: {REASON}"
    ]


def test_loopback_needs_no_acknowledgement(inventory):
    for address in ("127.0.0.1", "::1"):
        path = inventory.groups(gpu_nodes=[gpu_node(serving_host=address)])
        assert load_site(str(path)).hosts["gpu1"].serving.plaintext_acknowledged is None


@pytest.mark.parametrize("reason", ["", "   ", "ok", True])
def test_an_empty_or_bare_acknowledgement_is_refused(inventory, reason):
    """A reason a reader understands, not a flag flipped to silence the refusal."""
    path = inventory.groups(
        gpu_nodes=[_keyed(inventory, serving_host="0.0.0.0", serving_plaintext_acknowledged=reason)]
    )
    [problem] = _refusal(path)
    assert "serving_plaintext_acknowledged" in problem
    assert "plain HTTP beyond this host" not in problem  # the bad value is named once, by its own rule


def test_a_gateway_beyond_loopback_needs_its_own_acknowledgement(inventory):
    node = _keyed(inventory, serving_host="10.0.0.5", serving_plaintext_acknowledged=REASON)
    gateway = _gateway(inventory, gateway_host="0.0.0.0")
    path = inventory.groups(gpu_nodes=[node], gateways=[gateway])
    assert _refusal(path) == [
        f"{path}: host gw1: gateway_host = '0.0.0.0' serves the gateway in plain HTTP beyond this host"
        " (the API key and prompts cross the network in clear); expected gateway_host = '127.0.0.1',"
        " or gateway_tls_cert_secret and gateway_tls_key_secret (it then serves TLS),"
        " or gateway_plaintext_acknowledged = '<why plain HTTP is acceptable on this network>'"
        " (docs/security.md#tls)"
    ]
    acknowledged = _gateway(inventory, gateway_host="0.0.0.0", gateway_plaintext_acknowledged=REASON)
    path = inventory.groups("acknowledged.py", gpu_nodes=[node], gateways=[acknowledged])
    assert load_site(str(path)).hosts["gw1"].gateway.plaintext_acknowledged == REASON


def test_the_engine_behind_a_gateway_is_judged_on_its_own(inventory):
    """The gateway's TLS or acknowledgement does not cover the hop to the workers, which carries
    the same key (smg passes it on)."""
    node = _keyed(inventory, serving_host="10.0.0.5")
    gateway = _gateway(inventory, gateway_host="127.0.0.1")
    path = inventory.groups(gpu_nodes=[node], gateways=[gateway])
    assert _refusal(path) == [
        f"{path}: host gpu1: serving_host = '10.0.0.5' serves the engine in plain HTTP beyond this host"
        " (the API key and prompts cross the network in clear); expected serving_tls_cert_secret and"
        " serving_tls_key_secret (it then serves TLS), or"
        " serving_plaintext_acknowledged = '<why plain HTTP is acceptable on this network>'"
        " (docs/security.md#tls)"
    ]  # not loopback: the gateway could not reach the replica there


@pytest.mark.parametrize(
    ("address", "loopback"),
    [("127.0.0.1", True), ("127.1.2.3", True), ("::1", True), ("0.0.0.0", False), ("::", False), ("10.0.0.1", False)],
)
def test_is_loopback(address, loopback):
    assert is_loopback(address) is loopback
