"""Client keys per tenant (issue 52; docs/security.md#keys-and-their-roles): the site model refuses a
bad tenant name, a tenant vault key not named *api_key or shared with another role, tenants without a
client key and replicas behind a gateway with different tenants, each in one line; the deploy writes
each tenant's key only into 0600 files (the engine's, smg's), never a command line."""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from roles import render
from roles.gateway.tenants import tenant_keys_content
from roles.serving import keys
from roles.site import load_site
from roles.site.loading import api_key_problems
from tests.unit.conftest import CLIENT_KEY, CONTROL, GATEWAY_PLAINTEXT, ROLE_KEYS
from tests.unit.test_key_roles import _site
from tests.unit.test_site import assert_names, only_problem, problems_of
from tests.unit.test_topology import smg_launch_with_a_fake_smg

TENANTS = {"serving_tenant_api_key_secrets": {"alpha": "tenant_alpha_api_key", "beta-2": "tenant_beta_api_key"}}
TENANT_VALUES = {
    "tenant_alpha_api_key": "alpha-key-of-the-unit-tests-0123456789",
    "tenant_beta_api_key": "beta-key-of-the-unit-tests-01234567890",
}
ADMIN_AND_TENANTS = {"serving_admin_api_key_secret": "engine_admin_api_key", **TENANTS}


def _tenant_site(inventory, node=None, gateway=CONTROL, **values):
    return _site(
        inventory, node=node if node is not None else ADMIN_AND_TENANTS, gateway=gateway, **{**TENANT_VALUES, **values}
    )


def test_tenants_make_a_valid_site_and_each_key_is_held_to_the_key_rule(inventory):
    site = load_site(_tenant_site(inventory))
    assert site.hosts["gpu1"].serving.tenant_api_key_secrets == TENANTS["serving_tenant_api_key_secrets"]
    values = {"engine_api_key": CLIENT_KEY, **ROLE_KEYS, **TENANT_VALUES}
    assert api_key_problems(site, values) == []
    problems = api_key_problems(site, {**values, "tenant_alpha_api_key": "short", "tenant_beta_api_key": CLIENT_KEY})
    assert len(problems) == 2, problems
    assert_names(problems[0], "secret 'tenant_alpha_api_key' (serving_tenant_api_key_secrets) is 5 characters long")
    assert_names(problems[1], "'tenant_beta_api_key' (serving_tenant_api_key_secrets) hold the same key")
    assert not any(CLIENT_KEY in p or "short" in p.split("characters")[0].split("'")[-1] for p in problems)


@pytest.mark.parametrize("name", ["Alpha", "-alpha", "al:pha", "a b", "a" * 33, ""])
def test_a_tenant_name_outside_the_grammar_is_refused_in_one_line(inventory, name):
    path = _tenant_site(
        inventory, node={**ADMIN_AND_TENANTS, "serving_tenant_api_key_secrets": {name: "tenant_alpha_api_key"}}
    )
    message = only_problem(path)
    assert_names(
        message,
        f"{path}: host gpu1: serving_tenant_api_key_secrets = {{{name!r}: 'tenant_alpha_api_key'}} is invalid",
        "expected {tenant: vault key} with tenant names of 1 to 32 characters: a-z, 0-9 and '-', not first",
    )


def test_a_tenant_key_not_named_api_key_or_in_two_roles_is_refused(inventory):
    node = {**ADMIN_AND_TENANTS, "serving_tenant_api_key_secrets": {"alpha": "alpha_token"}}
    message = only_problem(_tenant_site(inventory, node=node, alpha_token="x" * 40))
    assert_names(
        message,
        "serving_tenant_api_key_secrets['alpha'] = 'alpha_token' names a vault key that does not end in api_key",
        "expected a name like tenant_alpha_api_key",
    )
    node = {**ADMIN_AND_TENANTS, "serving_tenant_api_key_secrets": {"alpha": "engine_api_key"}}
    message = only_problem(_tenant_site(inventory, node=node, name="b.py"))
    assert_names(message, "the vault key 'engine_api_key' is given 2 roles", "serving_tenant_api_key_secrets['alpha']")
    node = {
        **ADMIN_AND_TENANTS,
        "serving_tenant_api_key_secrets": {"a": "tenant_alpha_api_key", "b": "tenant_alpha_api_key"},
    }
    message = only_problem(_tenant_site(inventory, node=node, name="c.py"))
    assert_names(message, "the vault key 'tenant_alpha_api_key' is given 2 roles")


def test_a_tenant_key_the_vault_lacks_is_named(inventory):
    node = {**ADMIN_AND_TENANTS, "serving_tenant_api_key_secrets": {"alpha": "gone_api_key"}}
    message = only_problem(_tenant_site(inventory, node=node))
    assert_names(message, "serving_tenant_api_key_secrets['alpha'] = 'gone_api_key' names no secret")


def test_tenants_without_a_client_key_are_refused(inventory):
    vault = inventory.vault(**TENANT_VALUES)
    node = ("gpu1", {"secrets_file": vault, "gpu_count": 1, **TENANTS})
    problems = [p for p in problems_of(inventory.groups(gpu_nodes=[node])) if "tenant" in p]
    assert len(problems) == 1, problems
    assert_names(problems[0], "host gpu1: serving_tenant_api_key_secrets = ", "without serving_api_key_secret")


def test_replicas_behind_a_gateway_carry_the_same_tenants(inventory):
    values = {"engine_api_key": CLIENT_KEY, **ROLE_KEYS, **TENANT_VALUES}
    vault = inventory.vault(**values)
    common = {
        "secrets_file": vault,
        "gpu_count": 1,
        "serving_host": "0.0.0.0",
        "serving_api_key_secret": "engine_api_key",
        "serving_plaintext_acknowledged": "unit test: a private network",
        "serving_admin_api_key_secret": "engine_admin_api_key",
    }
    nodes = [
        ("gpu1", {**common, "ssh_hostname": "10.0.0.1", **TENANTS}),
        (
            "gpu2",
            {**common, "ssh_hostname": "10.0.0.2", "serving_tenant_api_key_secrets": {"alpha": "tenant_alpha_api_key"}},
        ),
    ]
    gateway = ("gw", {"secrets_file": vault, **GATEWAY_PLAINTEXT, **CONTROL})
    message = only_problem(inventory.groups(gpu_nodes=nodes, gateways=[gateway]))
    assert_names(
        message,
        "the gpu nodes behind gateway gw have different serving_tenant_api_key_secrets",
        "gpu2: {'alpha': 'tenant_alpha_api_key'}",
        "expected the same tenants and vault keys on every replica",
    )


def test_sglang_reads_the_tenants_from_a_file_the_environment_names(tmp_path, inventory):
    site = load_site(_tenant_site(inventory))
    out = tmp_path / "preview"
    render.render(site, out)
    from roles import serving

    gpu = site.hosts["gpu1"]
    paths = serving.config_paths(gpu, site.stack.active, site)
    env = (out / "gpu1" / paths["env_file"].lstrip("/")).read_text()
    assert f"{keys.TENANT_KEYS_ENV}={paths['tenant_keys']}\n" in env
    assert json.loads((out / "gpu1" / paths["tenant_keys"].lstrip("/")).read_text()) == {
        "alpha": "***",
        "beta-2": "***",
    }
    assert json.loads((out / "gpu1" / paths["secret_args"].lstrip("/")).read_text()) == {
        "api-key": "***",
        "admin-api-key": "***",
    }
    launch = (out / "gpu1" / paths["launcher"].lstrip("/")).read_text() + (
        out / "gpu1" / paths["unit"].lstrip("/")
    ).read_text()
    assert "tenant" not in launch.replace("tenant-api-keys", "")  # the path is in the environment file only
    # Each file of a key: (path, what, content) written 0600 by secret_file, as the deploy does.
    found = keys.key_files(gpu, "sglang", paths, lambda ref: f"<{ref}>")
    assert [(p, json.loads(c)) for p, _, c in found] == [
        (paths["secret_args"], {"api-key": "<engine_api_key>", "admin-api-key": "<engine_admin_api_key>"}),
        (paths["tenant_keys"], {"alpha": "<tenant_alpha_api_key>", "beta-2": "<tenant_beta_api_key>"}),
    ]


def test_vllm_takes_the_tenants_as_more_api_key_values(inventory):
    """vLLM 0.16.0's api_key is a list ("the server will require one of these keys"); its --config
    loader turns a YAML list into `--api-key A B C` (vllm/utils/argparse_utils.py, load_config_file).
    The client key stays first: the checks, the drain and the benchmark read that one."""
    inventory.edit_stack("active: sglang-0.5.9-cu128", "active: vllm-0.16.0-cu128")
    site = load_site(_tenant_site(inventory, node=TENANTS))
    gpu = site.hosts["gpu1"]
    paths = {"secret_args": "/x/secret-args.yaml", "tenant_keys": "/x/tenant-api-keys.json"}
    found = keys.key_files(gpu, "vllm", paths, lambda ref: f"<{ref}>")
    assert yaml.safe_load(found[0][2]) == {
        "api-key": ["<engine_api_key>", "<tenant_alpha_api_key>", "<tenant_beta_api_key>"]
    }
    assert found[1] == (paths["tenant_keys"], "no tenant key set", None)  # removed: vLLM reads no such file
    assert keys.tenant_keys_env(gpu, "vllm", paths) == {}
    # Without tenants the file is as it was (a string), so an upgrade rewrites nothing.
    assert yaml.safe_load(keys.secret_args_content("k")) == {"api-key": "k"}


def test_every_reader_of_the_config_file_takes_the_client_key_first(tmp_path):
    from checks.server_checks import api_key_assignment

    class Expect:
        api_key_file = str(tmp_path / "secret-args.yaml")

    for content in ({"api-key": "client"}, {"api-key": ["client", "tenant-a", "tenant-b"]}):
        (tmp_path / "secret-args.yaml").write_text(json.dumps(content))
        script = str(api_key_assignment(Expect, "KEY")) + 'printf %s "$KEY"'
        assert subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True).stdout == "client"


def test_the_gateway_adds_each_tenant_from_its_file_never_argv(tmp_path, inventory):
    from roles import gateway

    site = load_site(_tenant_site(inventory))
    out = tmp_path / "preview"
    render.render(site, out)
    unit = (out / "gw" / "etc/systemd/system/smg.service").read_text()
    assert f"Environment={gateway.TENANT_KEYS_ENV}={gateway.TENANT_KEYS_FILE}\n" in unit
    assert "tenant-api-key " not in unit and "alpha" not in unit
    # The file as the deploy writes it (tenant names are no secret), each key read as ***.
    assert (out / "gw" / gateway.TENANT_KEYS_FILE.lstrip("/")).read_text() == "alpha:***\nbeta-2:***\n"
    assert tenant_keys_content({"beta-2": "b", "alpha": "a"}) == "alpha:a\nbeta-2:b\n"

    command, env_vars = smg_launch_with_a_fake_smg(tmp_path, control_plane_key=False, tenant_keys=True)
    env_vars[gateway.TENANT_KEYS_ENV] = str(tmp_path / "tenants")
    run = subprocess.run(command, capture_output=True, text=True, env=env_vars)
    assert run.returncode == 1 and "tenant keys file cannot be read" in run.stderr and "LAUNCH" not in run.stdout
    (tmp_path / "tenants").write_text(tenant_keys_content({"alpha": "ka", "beta-2": "kb"}))
    run = subprocess.run(command, capture_output=True, text=True, env=env_vars)
    assert run.returncode == 0, run.stderr
    assert (
        "LAUNCH ['--port', '1', '--api-key', 'client', '--tenant-api-key', 'alpha:ka', '--tenant-api-key', 'beta-2:kb']"
        in run.stdout
    )
