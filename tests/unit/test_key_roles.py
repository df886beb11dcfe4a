"""Keys with roles (docs/security.md#keys-and-their-roles): the site model refuses, in one line
each and before any host is contacted, a client key that would also open the engine's admin routes
or the gateway's control plane, one vault key in two roles, and a key-role setting whose vault key
the key rule cannot see; the deploy refuses an empty, short or shared key value, never printing it."""

from __future__ import annotations

from roles.site import load_site
from roles.site.loading import api_key_problems
from tests.unit.conftest import ADMIN, CLIENT_KEY, CONTROL, GATEWAY_PLAINTEXT, ROLE_KEYS, SERVING_PLAINTEXT, gpu_node
from tests.unit.test_site import assert_names, only_problem, problems_of


def _site(inventory, node=None, gateway=None, name="site.py", **vault_values):
    values = {"engine_api_key": CLIENT_KEY, **ROLE_KEYS, **vault_values}
    vault = inventory.vault(**values)
    keyed = {
        "secrets_file": vault,
        "serving_host": "0.0.0.0",
        "serving_api_key_secret": "engine_api_key",
        **SERVING_PLAINTEXT,  # the plaintext rule stays quiet: these tests are about the keys
    }
    groups = {"gpu_nodes": [gpu_node(ssh_hostname="10.0.0.1", **keyed, **(node if node is not None else ADMIN))]}
    if gateway is not None:
        groups["gateways"] = [("gw", {"secrets_file": vault, **GATEWAY_PLAINTEXT, **gateway})]
    return inventory.groups(name, **groups)


def test_keys_of_every_role_make_a_valid_site(inventory):
    site = load_site(_site(inventory, gateway=CONTROL))
    assert site.hosts["gw"].gateway.control_plane_api_key_secret == "gateway_control_plane_api_key"
    assert api_key_problems(site, {"engine_api_key": CLIENT_KEY, **ROLE_KEYS}) == []


def test_sglang_with_a_client_key_needs_an_admin_key(inventory):
    message = only_problem(_site(inventory, node={}))
    assert_names(
        message,
        "host gpu1: serving_api_key_secret = 'engine_api_key' without serving_admin_api_key_secret",
        "/flush_cache",
        "expected serving_admin_api_key_secret",
    )


def test_vllm_has_no_admin_key(inventory):
    inventory.edit_stack("active: sglang-0.5.9-cu128", "active: vllm-0.16.0-cu128")
    messages = [p for p in problems_of(_site(inventory)) if "admin" in p]
    assert len(messages) == 1, messages
    assert_names(messages[0], "serving_admin_api_key_secret = 'engine_admin_api_key' with a vLLM stack")


def test_a_gateway_in_front_of_keyed_replicas_needs_a_control_plane_key(inventory):
    message = only_problem(_site(inventory, gateway={}))
    assert_names(
        message,
        "host gw: a gateway without gateway_control_plane_api_key_secret",
        "/workers",
        "expected gateway_control_plane_api_key_secret",
    )


def test_one_vault_key_in_two_roles_is_refused(inventory):
    message = only_problem(_site(inventory, gateway={"gateway_control_plane_api_key_secret": "engine_api_key"}))
    assert_names(
        message,
        "the vault key 'engine_api_key' is given 2 roles",
        "gateway_control_plane_api_key_secret",
        "serving_api_key_secret",
    )
    message = only_problem(_site(inventory, node={"serving_admin_api_key_secret": "engine_api_key"}, name="a.py"))
    assert_names(message, "the vault key 'engine_api_key' is given 2 roles", "serving_admin_api_key_secret")


def test_a_key_role_names_a_vault_key_ending_in_api_key(inventory):
    message = only_problem(_site(inventory, node={"serving_admin_api_key_secret": "admin_token"}, admin_token="x"))
    assert_names(message, "serving_admin_api_key_secret = 'admin_token'", "does not end in api_key")


def test_a_control_plane_key_the_vault_lacks_is_named(inventory):
    gateway = {"gateway_control_plane_api_key_secret": "other_api_key"}
    message = only_problem(_site(inventory, gateway=gateway))
    assert_names(message, "gateway_control_plane_api_key_secret = 'other_api_key' names no secret")


def test_the_deploy_refuses_an_empty_short_or_shared_key_without_printing_it(inventory):
    site = load_site(_site(inventory, gateway=CONTROL))
    values = {
        "engine_api_key": CLIENT_KEY,
        "engine_admin_api_key": "short-admin",
        "gateway_control_plane_api_key": CLIENT_KEY,  # the client's key
    }
    problems = api_key_problems(site, values)
    assert len(problems) == 2, problems
    assert_names(problems[0], "secret 'engine_admin_api_key' (serving_admin_api_key_secret) is 11 characters long")
    assert_names(
        problems[1],
        "secrets 'engine_api_key' and 'gateway_control_plane_api_key' (gateway_control_plane_api_key_secret)"
        " hold the same key",
    )
    problems = api_key_problems(site, {**values, "engine_api_key": "   ", "gateway_control_plane_api_key": "x" * 40})
    assert len(problems) == 2 and "(serving_api_key_secret) is empty or only white space" in problems[1], problems
    assert not any("short-admin" in p or CLIENT_KEY in p for p in problems)
