"""Issue 53 items 4 to 6, the site model's side: pyinfra's own keys in host data, words that mean
harm to their reader (apt, sysctl, the engine's environment, root's interpreters, the build's
source trees, a guest's image, the data folders, the units' accounts), and every credential
shape detect-secrets knows, with npm's, NGC's and a URL's query. Each hostile value is refused in
one line naming the file, the host and the key; each legitimate one beside it still passes."""

from __future__ import annotations

import typing

import pytest

from roles.site import load_site
from roles.site.credentials import DETECTORS, found_credentials, masked
from roles.site.fields import _url_rule
from roles.site.schema import SECTIONS
from tests.unit.conftest import gpu_node
from tests.unit.test_refusals import NODE, lxc
from tests.unit.test_validation_rules import validate  # noqa: F401 (a fixture)

# --- item 4: pyinfra's operation arguments in host data --------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "reason"),
    [
        ("_env", {"LD_PRELOAD": "/var/lib/inference-engine/x.so"}, "pyinfra's operation argument"),
        ("_shell_executable", "/var/lib/inference-engine/sh", "pyinfra's operation argument"),
        ("_ignore_errors", True, "pyinfra's operation argument"),
        ("_chdir", "/tmp", "pyinfra's operation argument"),
        ("_retries", 3, "pyinfra's operation argument"),
        ("_temp_dir", "/var/lib/inference-engine", "pyinfra's operation argument"),
        ("name", "every operation", "pyinfra's operation argument"),
        ("_sudo", True, "pyinfra's privilege escalation"),
        ("_sudo_password", "hunter2-not-shown", "pyinfra's privilege escalation"),
        ("_preserve_sudo_env", True, "pyinfra's privilege escalation"),
        ("_su_user", "root", "pyinfra's privilege escalation"),
        ("_use_su_login", True, "pyinfra's privilege escalation"),
        ("_doas", True, "pyinfra's privilege escalation"),
        ("_dzdo_user", "root", "pyinfra's privilege escalation"),
        ("ssh_password", "hunter2-not-shown", "a password in clear"),
    ],
)
def test_pyinfras_operation_arguments_in_host_data_are_refused(inventory, validate, key, value, reason):  # noqa: F811
    path = inventory.groups(gpu_nodes=[("gpu.invalid", {"gpu_count": 8, key: value})])
    line = validate(path)
    assert line.startswith(f"{path}: host gpu.invalid: {key} is {reason}"), line
    assert "hunter2" not in line and "LD_PRELOAD" not in line  # the value is never printed


def test_every_operation_argument_of_the_installed_pyinfra_is_refused():
    """pyinfra's own list (pyinfra/api/arguments.py AllArguments), not a copy: a key a new
    pyinfra adds is refused the day it is installed."""
    from pyinfra.api.arguments import all_global_arguments

    from roles.site.schema import operation_argument_problem

    keys = [name for name, _ in all_global_arguments()]
    assert {"_env", "_shell_executable", "_sudo_password", "_ignore_errors", "_if"} <= set(keys)
    assert [key for key in keys if not operation_argument_problem(key)] == []
    assert operation_argument_problem("ssh_hostname") is None and operation_argument_problem("serving_port") is None


def test_a_connectors_data_is_checked_like_any_value(inventory, validate):  # noqa: F811
    path = inventory.groups(gpu_nodes=[gpu_node("gpu.invalid", ssh_known_hosts_file="/x\nProxyCommand=y")])
    assert validate(path).startswith(
        f"{path}: host gpu.invalid: ssh_known_hosts_file = '/x\\nProxyCommand=y' has the control character"
    )


# --- item 5: words that mean harm -------------------------------------------------------------------------

HOSTILE = [
    # apt-get(8): a trailing '-' removes; '.' and '+' make a regular expression when no package
    # has exactly that name (`x.z` installed 766 packages in `apt-get -s install` on Debian 12).
    ({"base_extra_packages": ["openssh-server-"]}, "ends in '-', which tells apt-get to remove the package"),
    ({"base_extra_packages": ["x.z"]}, "its '.' is not between two digits"),
    ({"base_extra_packages": ["nginx."]}, "apt-get reads such a name as a regular expression"),
    ({"base_extra_packages": ["python3-zope.interface"]}, "its '.' is not between two digits"),
    ({"base_extra_packages": ["bas+h"]}, "its '+' is not '++' after a letter"),
    ({"base_extra_packages": ["1.2"]}, "its '.' does not follow a name of three or more characters"),
    # sysctl: a glob sets every matching setting; programs the kernel runs as root.
    ({"base_sysctl": {"kernel.*": "0"}}, "the key 'kernel.*' is not one"),
    ({"base_sysctl": {"kernel.core_pattern": "|/var/lib/inference-engine/x"}}, "pipes every crash dump"),
    ({"base_sysctl": {"kernel/core_pattern": "|/x %p"}}, "pipes every crash dump"),
    ({"base_sysctl": {"kernel.modprobe": "/var/lib/inference-engine/x"}}, "names a program the kernel runs"),
    # Root runs these interpreters; the service account owns its data, log and model folders.
    ({"engine_python": "/var/lib/inference-engine/bin/python"}, "is inside base_data_dir"),
    ({"health_engine_python": "/var/log/inference-engine/python"}, "is inside base_log_dir"),
    # Environment names that load code into the engine and the root-run checks.
    ({"serving_extra_env": {"CUDA_INJECTION64_PATH": "/x.so"}}, "CUDA_INJECTION64_PATH"),
    ({"serving_extra_env": {"NCCL_TUNER_PLUGIN": "/x.so"}}, "NCCL_TUNER_PLUGIN"),
    ({"serving_extra_env": {"NCCL_NET_PLUGIN": "/x.so"}}, "NCCL_NET_PLUGIN"),
    ({"serving_extra_env": {"PYTHONWARNINGS": "error::x.Y"}}, "PYTHONWARNINGS"),
    ({"serving_extra_env": {"JEMALLOC_PRELOAD": "/x.so"}}, "JEMALLOC_PRELOAD"),
    # Environment names that mount routes no key guards (vLLM's development and LoRA routes).
    ({"serving_extra_env": {"VLLM_SERVER_DEV_MODE": "1"}}, "development or adapter routes (VLLM_SERVER_DEV_MODE)"),
    ({"serving_extra_env": {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}}, "VLLM_ALLOW_RUNTIME_LORA_UPDATING"),
    # A source tree of the system's, tarred to the builder.
    ({"build_source_overrides": {"flash-attn": "/etc"}}, "flash-attn: a folder of its own, not the system's /etc"),
    ({"build_source_overrides": {"flash-attn": "/home/ubuntu/.ssh"}}, "not in /home/ubuntu/.ssh"),
    ({"build_source_overrides": {"flash-attn": "../../.."}}, "flash-attn: it leaves the checkout"),
    ({"build_source_overrides": {"flash-attn": "/"}}, "not / (the whole system)"),
    # Data folders in a home's dot folders or cloud-init's.
    ({"base_data_dir": "/home/ubuntu/.ssh"}, "not in /home/ubuntu/.ssh (a user's dot folder"),
    ({"base_model_dir": "/home/ubuntu/.local/bin"}, "not in /home/ubuntu/.local"),
    ({"base_data_dir": "/var/lib/cloud/scripts"}, "not inside the system's /var/lib/cloud"),
    # The engine as the gateway's or the alert relay's account.
    ({"base_service_user": "smg"}, "smg is the gateway's account; expected one account per unit"),
    ({"base_service_group": "smg"}, "smg is the gateway's group"),
    ({"base_service_user": "inference-host-alert-relay"}, "the alert relay's account"),
    # ... or the EAGLE-3 training job's (its polkit rule lets it start the root helper) or the checks'.
    ({"base_service_user": "inference-host-eagle3"}, "inference-host-eagle3 is the EAGLE-3 training job's account"),
    ({"base_service_group": "inference-host-eagle3"}, "the EAGLE-3 training job's group"),
    ({"base_service_user": "inference-host-checks"}, "inference-host-checks is the periodic checks' account"),
]


@pytest.mark.parametrize(("data", "message"), HOSTILE)
def test_a_word_that_means_harm_is_refused(inventory, validate, data, message):  # noqa: F811
    path = inventory.groups(gpu_nodes=[gpu_node("gpu.invalid", **data)], builders=["gpu.invalid"])
    line = validate(path)
    (key,) = data
    assert line.startswith(f"{path}: host gpu.invalid: ") and key in line, line
    assert message in line, line


def test_the_gateways_interpreter_in_the_service_accounts_folder_is_refused(inventory, validate):  # noqa: F811
    path = inventory.groups(
        gpu_nodes=[gpu_node("gpu.invalid", gateway_python="/var/lib/inference-engine/py/bin/python3")]
    )
    line = validate(path)
    assert line.startswith(
        f"{path}: host gpu.invalid: gateway_python = '/var/lib/inference-engine/py/bin/python3' is inside"
        " base_data_dir = '/var/lib/inference-engine', which the service account owns, and root runs it"
    ), line


@pytest.mark.parametrize(
    "image",
    ["/etc/pve/priv/authkey.key", "/var/lib/pve-cluster/config.db", "/srv/x.img", "/var/lib/vz/../../etc/shadow"],
)
def test_a_guest_image_outside_the_nodes_image_storage_is_refused(inventory, validate, image):  # noqa: F811
    path = inventory.groups(
        proxmox_hosts=[NODE],
        kvm_guests=[("vm.invalid", {"guest_vmid": 300, "guest_node": NODE[0], "guest_cloud_image": image})],
    )
    line = validate(path)
    assert line.startswith(f"{path}: host vm.invalid: guest_cloud_image = {image!r} is invalid;"), line
    assert "in the node's image storage (/var/lib/vz or /mnt/pve/<storage>)" in line, line


@pytest.mark.parametrize(
    "sysctl",
    [{"kernel.core_pattern": "core"}, {"kernel.panic": "10"}, {"fs.file-max": "100"}],
)
def test_a_guests_sysctl_its_node_would_write_is_refused_unless_the_projects(inventory, validate, sysctl):  # noqa: F811
    path = inventory.groups(proxmox_hosts=[NODE], lxc_guests=[lxc("ct.invalid", base_sysctl=sysctl)])
    line = validate(path)
    (key,) = sysctl
    assert line == (
        f"{path}: host ct.invalid: base_sysctl {key} on an LXC guest is the node's kernel's, which its node would"
        " write; expected a guest's namespaced keys (net.*, kernel.shm*, ...) or kernel.numa_balancing,"
        " vm.max_map_count, vm.nr_hugepages, vm.overcommit_memory, vm.swappiness; set any other in the node's"
        " own base_sysctl"
    )


def test_legitimate_words_pass(inventory):
    data = {
        "base_extra_packages": ["libstdc++6", "python3.11", "g++", "g++-12", "gir1.2-glib-2.0", "nvtop"],
        "base_sysctl": {"kernel.numa_balancing": "0", "net.core.somaxconn": "4096", "kernel.core_pattern": "core"},
        "engine_python": "/usr/bin/python3",
        "health_engine_python": "/opt/inference-host/current/bin/python",
        "serving_extra_env": {"VLLM_CPU_KVCACHE_SPACE": "1", "NCCL_ALGO": "Ring", "CUDA_MODULE_LOADING": "LAZY"},
        "build_source_overrides": {"flash-attn": "lab/fixtures/tiny_cuda_ext", "sgl-kernel": "/srv/src/sgl-kernel"},
        "base_data_dir": "/home/inference/data",
        "base_service_user": "engine",
    }
    host = load_site(inventory.groups(gpu_nodes=[gpu_node("gpu1", **data)], builders=["gpu1"])).hosts["gpu1"]
    assert host.base.extra_packages == data["base_extra_packages"]
    assert host.base.sysctl == data["base_sysctl"] and host.build.source_overrides == data["build_source_overrides"]
    for number, image in enumerate(
        ("/var/lib/vz/template/cloud/noble.img", "/mnt/pve/nfs/import/noble.img", "local:import/noble.img")
    ):
        path = load_site(
            inventory.groups(
                f"kvm{number}.py",
                proxmox_hosts=[NODE],
                kvm_guests=[("vm1", {"guest_vmid": 300, "guest_node": NODE[0], "guest_cloud_image": image})],
            )
        )
        assert path.hosts["vm1"].guest.cloud_image == image
    guest = lxc("ct1", base_sysctl={"kernel.numa_balancing": "0", "net.ipv4.ip_forward": "1", "kernel.shmmax": "1"})
    site = load_site(inventory.groups("lxc.py", proxmox_hosts=[NODE], lxc_guests=[guest]))
    assert site.hosts["ct1"].base.sysctl == guest[1]["base_sysctl"]


def test_the_other_units_accounts_are_the_roles_own():
    """grammars.OTHER_UNIT_ACCOUNTS copies names the roles define (roles never import each other,
    and the site model imports no role): held to them here."""
    from roles.eagle3_training.privileges import JOB_USER
    from roles.gateway import SERVICE_USER
    from roles.monitoring.config import RELAY_USER
    from roles.shared.layout import CHECKS_USER
    from roles.site.grammars import OTHER_UNIT_ACCOUNTS

    assert set(OTHER_UNIT_ACCOUNTS) == {SERVICE_USER, RELAY_USER, CHECKS_USER, JOB_USER}


# --- item 6: every credential shape ---------------------------------------------------------------------

AZURE = "DefaultEndpointsProtocol=https;AccountName=ih;AccountKey=" + "Ab3+" * 22
SHAPES = {
    "Azure Storage Account access key": AZURE,
    "NPM tokens": "npm_" + "a1B2c3D4e5" * 3 + "F6g7H8",
    "NVIDIA NGC API Key": "nvapi-" + "Xy9_Zw8-" * 8,
    "URL with a credential in its query (token=)": "https://hub.example/models?token=" + "q1w2e3r4t5y6",
    "URL with a credential in its query (sig=)": "https://ih.blob.core.windows.net/w?sv=2022-11-02&sig="
    + "Zm9vYmFy%3D",
    "URL with a credential in its query (x-amz-signature=)": "https://s3.example/b/k?X-Amz-Signature=" + "0af3" * 16,
    "IBM Cloud IAM Key": "ibm_api_key=" + "a1" * 22,
    "Artifactory Credentials": "AKC" + "p1o2i3u4y5t6r7e8",
}


@pytest.mark.parametrize("kind", SHAPES)
def test_a_credential_shape_detect_secrets_or_a_vendor_publishes_is_refused_unshown(inventory, validate, kind):  # noqa: F811
    value = SHAPES[kind]
    assert found_credentials(value)[0][0] == kind
    path = inventory.groups(gpu_nodes=[gpu_node("gpu.invalid", serving_served_model_name=value)])
    line = validate(path)
    assert line.startswith(f"{path}: host gpu.invalid: serving_served_model_name holds what looks like a credential")
    assert value[-8:] not in line and value[-8:] not in masked(value), line


def test_every_regex_plugin_of_detect_secrets_is_on_but_the_guessing_ones():
    """The installed detect-secrets' own plugin list: a plugin a new version adds fails here until
    it is decided (on in credentials.DETECTORS, or named below with the reason in its docstring)."""
    from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class

    installed = {cls.__name__ for cls in get_mapping_from_secret_type_to_class().values()}
    on = {type(detector).__name__ for detector in DETECTORS}
    assert installed - on == {"Base64HighEntropyString", "HexHighEntropyString", "KeywordDetector", "IPPublicDetector"}


def _url_settings() -> list[str]:
    """Every setting typed as a URL (fields.Url, MirrorUrl), and the git URL SpecForge is fetched from."""

    def has_url_rule(annotation) -> bool:
        if typing.get_origin(annotation) is typing.Annotated and any(m is _url_rule for m in annotation.__metadata__):
            return True
        return any(has_url_rule(arg) for arg in typing.get_args(annotation))

    typed = [
        cls.PREFIX + name
        for cls in SECTIONS
        for name, field in cls.model_fields.items()
        if has_url_rule(field.annotation) or any(m is _url_rule for m in field.metadata)
    ]
    return sorted([*typed, "eagle3_training_specforge_repo"])


def test_the_url_settings_are_found():
    assert {
        "base_pypi_index_url",
        "cuda_repo_url",
        "weights_endpoint",
        "docker_repo_url",
        "monitoring_webhook_url",
    } <= set(_url_settings())


@pytest.mark.parametrize("key", _url_settings())
@pytest.mark.parametrize("query", ["?token=q1w2e3r4t5", "?a=1&access_token=q1w2e3r4t5", "?sv=1&SIG=q1w2e3r4t5"])
def test_a_credential_in_any_url_settings_query_is_refused_unshown(inventory, validate, key, query):  # noqa: F811
    path = inventory.groups(gpu_nodes=[gpu_node("gpu.invalid", **{key: "https://mirror.example/x" + query})])
    line = validate(path)
    assert line.startswith(f"{path}: host gpu.invalid: {key} holds what looks like a credential (URL with a"), line
    assert "q1w2e3r4t5" not in line


def test_a_url_whose_query_holds_no_credential_passes():
    assert found_credentials("https://mirror.example/simple?page=2&keyword=x&tokens=3&key=") == []


SHADOW = "root:$y$j9T$Q1w2E3r4T5y6$hashHASHhashHASHhash0123456789abcdefABCD:19000:0:99999:7:::\n"


@pytest.mark.parametrize("key", ["stack_file", "secrets_file"])
@pytest.mark.parametrize("text", [SHADOW, '{"auths": {"registry.example": {"auth": "dXNlcjpRMXcyRTNyNFQ1"}}}\n'])
def test_a_refused_file_is_named_by_its_line_never_quoted(inventory, validate, tmp_path, key, text):  # noqa: F811
    """stack_file or secrets_file pointed at /etc/shadow or ~/.docker/config.json (YAML too)."""
    target = tmp_path / "foreign"
    target.write_text(text)
    path = inventory.groups(gpu_nodes=[gpu_node("gpu.invalid", **{key: str(target)})])
    line = validate(path)
    assert "line 1" in line, line
    assert "(the file's text is not shown)" in line or "key 'auths' (line 1) not encrypted" in line, line
    assert "Q1w2E3r4T5" not in line and "dXNlcjpRMXcyRTNyNFQ1" not in line, line


def test_an_operation_argument_in_group_data_is_refused_too(inventory, validate):  # noqa: F811
    """pyinfra keeps a group data file's single-underscore names (pyinfra_cli/inventory.py
    _get_group_data drops only '__' names), so `_env` there reaches every host of the group."""
    (inventory.dir / "group_data").mkdir()
    (inventory.dir / "group_data" / "gpu_nodes.py").write_text('_env = {"LD_PRELOAD": "/x.so"}\n')
    path = inventory.groups(gpu_nodes=[gpu_node("gpu.invalid")])
    assert validate(path).startswith(f"{path}: host gpu.invalid: _env is pyinfra's operation argument")
