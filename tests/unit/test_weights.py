"""roles/weights without a host: settings and their refusals, where the weights live, the
rendered units, and the host tool's quick check, verification and space check."""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from roles.shared import pve, templates
from roles.site import load_site, served_weight_manifests, weight_sets_kept_by, weights_mount_points
from tests.unit import systemd_verify
from tests.unit.conftest import PROJECT_ROOT, gpu_node
from tests.unit.test_site import NODE, assert_names, lxc, only_problem

COMMIT = "0123456789abcdef0123456789abcdef01234567"
WEIGHTS = {"weights_repo": "moonshotai/Kimi-K2.5", "weights_revision": COMMIT}
GPUS = {200: [NODE[1]["proxmox_gpu_addresses"][0]], 201: [NODE[1]["proxmox_gpu_addresses"][1]]}
TOOL = PROJECT_ROOT / "roles" / "weights" / "files" / "inference-host-weights"


def tool():
    loader = importlib.machinery.SourceFileLoader("inference_host_weights", str(TOOL))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def guest_node(name="ct", vmid=200, **data):
    """An LXC guest that is also the gpu node, with the node's /tank/models mounted at /models."""
    return (
        name,
        {
            "guest_vmid": vmid,
            "guest_node": "pve",
            "guest_gpu_addresses": GPUS[vmid],
            "guest_mount_points": {"/tank/models": "/models"},
            "gpu_count": 1,
            **data,
        },
    )


# --- settings ----------------------------------------------------------------------------------


@pytest.mark.parametrize("revision", ["main", "v1.0", "0123456789abcdef", COMMIT.upper()])
def test_a_revision_that_is_not_a_commit_is_refused(inventory, revision):
    path = inventory.groups(gpu_nodes=[gpu_node(**{**WEIGHTS, "weights_revision": revision})])
    assert_names(
        only_problem(path),
        f"weights_revision = {revision!r} is invalid",
        "the 40-character commit hash",
        "branch or tag name",
    )


def test_repo_without_revision_is_refused(inventory):
    path = inventory.groups(gpu_nodes=[gpu_node(weights_repo="moonshotai/Kimi-K2.5")])
    assert_names(only_problem(path), "weights_repo = 'moonshotai/Kimi-K2.5' without weights_revision")


def test_repo_id_format(inventory):
    path = inventory.groups(gpu_nodes=[gpu_node(**{**WEIGHTS, "weights_repo": "Kimi-K2.5"})])
    assert_names(only_problem(path), "weights_repo = 'Kimi-K2.5' is invalid", "moonshotai/Kimi-K2.5")


def test_drafter_needs_a_directory(inventory):
    path = inventory.groups(
        gpu_nodes=[gpu_node(**WEIGHTS, weights_drafter_repo="a/eagle3", weights_drafter_revision=COMMIT)]
    )
    assert_names(only_problem(path), "weights_drafter_repo = 'a/eagle3' has nowhere to go")


# --- where the weights live ----------------------------------------------------------------------


def test_without_a_node_the_gpu_node_keeps_its_weights(inventory):
    site = load_site(inventory.groups(gpu_nodes=[gpu_node(**WEIGHTS, serving_model_path="/data/k2")]))
    (kept,) = weight_sets_kept_by(site, "gpu1")
    assert (kept.store_host, kept.store_dir, kept.guest_dir) == ("gpu1", "/data/k2", "/data/k2")
    assert served_weight_manifests(site.hosts["gpu1"]) == ["/data/k2/.inference-host/manifest.json"]


def test_the_node_keeps_one_copy_for_every_guest_that_mounts_it(inventory):
    # A drafter is checked against the target at load (roles/serving/speculative.py): real configs,
    # on the stack whose Kimi-K2.5 has the EAGLE-3 capture hook.
    eagle3 = PROJECT_ROOT / "tests" / "unit" / "data" / "eagle3"
    shutil.copy(eagle3 / "kimi-k2.5-config.json", inventory.dir / "target.json")
    shutil.copy(eagle3 / "torchspec-kimi-k25-eagle3.json", inventory.dir / "drafter.json")
    inventory.edit_stack("active: sglang-0.5.9-cu128", "active: sglang-0.5.10-cu128")
    # One GPU stands for the node's eight here: the KV-cache estimate of the same check needs
    # Kimi-K2.5's 554 GiB to fit the GPUs (tests/unit/test_kv_cache_estimate.py).
    a = guest_node(
        "a",
        200,
        **WEIGHTS,
        serving_model_path="/models/Kimi-K2.5",
        gpu_memory_gib=640,
        serving_context_length=512,
        serving_speculative={
            "draft_model_path": "/models/eagle3",
            "draft_config": "drafter.json",
            "target_config": "target.json",
        },
        weights_drafter_repo="lightseekorg/kimi-k2.5-eagle3",
        weights_drafter_revision=COMMIT,
    )
    b = guest_node("b", 201, **WEIGHTS, serving_model_path="/models/Kimi-K2.5")
    site = load_site(inventory.groups(proxmox_hosts=[NODE], lxc_guests=[a, b], gpu_nodes=[a, b]))
    kept = weight_sets_kept_by(site, "pve")
    assert [(w.kind, w.store_dir) for w in kept] == [
        ("model", "/tank/models/Kimi-K2.5"),
        ("drafter", "/tank/models/eagle3"),
    ]
    assert weight_sets_kept_by(site, "a") == [] and weight_sets_kept_by(site, "b") == []
    assert weights_mount_points(site.hosts["a"]) == {"/tank/models"}
    assert served_weight_manifests(site.hosts["a"]) == [
        "/models/Kimi-K2.5/.inference-host/manifest.json",
        "/models/eagle3/.inference-host/manifest.json",
    ]


def test_two_models_in_one_directory_are_refused(inventory):
    a = guest_node("a", 200, **WEIGHTS)
    b = guest_node("b", 201, **{**WEIGHTS, "weights_revision": "f" * 40})
    path = inventory.groups(proxmox_hosts=[NODE], lxc_guests=[a, b], gpu_nodes=[a, b])
    assert_names(only_problem(path), "go to /tank/models/Kimi-K2.5 on pve", "expected one model per directory")


def test_weights_mount_point_is_read_only_in_the_guest(inventory):
    from roles.lxc_guest import wanted_mount_points

    a = guest_node("a", 200, **WEIGHTS)
    site = load_site(inventory.groups(proxmox_hosts=[NODE], lxc_guests=[a], gpu_nodes=[a]))
    assert wanted_mount_points(site.hosts["a"]) == ["/tank/models,mp=/models,ro=1"]
    plain = load_site(
        inventory.groups("plain.py", proxmox_hosts=[NODE], lxc_guests=[lxc(guest_mount_points={"/tank/data": "/data"})])
    )
    assert wanted_mount_points(plain.hosts["ct"]) == ["/tank/data,mp=/data"]
    assert pve.mount_identity("/tank/models,mp=/models,ro=1") == "/tank/models->/models"


# --- rendered units ------------------------------------------------------------------------------


def _render(template: str, **kwargs) -> str:
    return templates.render(template, **kwargs)


def _kept(inventory, name="site.py", **data):
    site = load_site(inventory.groups(name, gpu_nodes=[gpu_node(**WEIGHTS, **data)]))
    return weight_sets_kept_by(site, "gpu1")[0]


def test_weights_unit_text(inventory):
    from roles import weights

    ws = _kept(inventory, serving_hf_token_secret=None, weights_endpoint="http://mirror:8080")
    text = _render("roles/weights/templates/inference-host-weights.service.j2", **weights.unit_kwargs(ws))
    lines = text.splitlines()
    assert (
        f"ExecStart={weights.ENV_DIR}/bin/python {weights.TOOL} run --config"
        f" {weights.CONFIG_DIR}/{ws.name}.json" in lines
    )
    for line in (
        "Type=exec",
        "Restart=on-failure",
        "RestartPreventExitStatus=2",
        "Environment=HF_ENDPOINT=http://mirror:8080",
        "WantedBy=multi-user.target",
        "UMask=0022",
        # Its own user, no capabilities (issue 53): not root on the node that keeps every guest's weights.
        f"User={weights.USER}",
        f"Group={weights.USER}",
        "CapabilityBoundingSet=",
        "ProtectSystem=strict",
        f"ReadWritePaths=/models/Kimi-K2.5 {weights.STATE_DIR}",
    ):
        assert line in lines, line
    assert "HF_TOKEN_PATH" not in text  # no secret configured
    # Only huggingface_hub's http_get resumes a killed shard: Xet off unless asked for.
    assert "Environment=HF_HUB_DISABLE_XET=1" in lines
    xet = _render(
        "roles/weights/templates/inference-host-weights.service.j2",
        **weights.unit_kwargs(_kept(inventory, "xet.py", serving_hf_token_secret=None, weights_xet=True)),
    )
    assert "HF_HUB_DISABLE_XET" not in xet
    config = weights.config_of(ws)
    assert config["revision"] == COMMIT and config["local_dir"] == "/models/Kimi-K2.5"
    assert config["margin_bytes"] == 20 * 1024**3 and "token" not in json.dumps(config).lower()


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze is not installed")
def test_weights_unit_passes_systemd_analyze_verify(inventory, tmp_path):
    from roles import weights

    text = _render("roles/weights/templates/inference-host-weights.service.j2", **weights.unit_kwargs(_kept(inventory)))
    assert systemd_verify.verify({"/etc/systemd/system/inference-host-weights-x.service": text}, tmp_path) == []


def test_serving_unit_asserts_the_verified_manifest(inventory):
    from roles import serving

    site = load_site(inventory.groups(gpu_nodes=[gpu_node(**WEIGHTS)]))
    host = site.hosts["gpu1"]
    text = _render(
        "roles/serving/templates/inference-engine.service.j2", **serving.unit_text_kwargs(host, site.stack.active, site)
    )
    assert "AssertPathExists=/models/Kimi-K2.5/.inference-host/manifest.json" in text.splitlines()
    bare_site = load_site(inventory.groups("bare.py", gpu_nodes=[gpu_node()]))
    assert "AssertPathExists" not in _render(
        "roles/serving/templates/inference-engine.service.j2",
        **serving.unit_text_kwargs(bare_site.hosts["gpu1"], bare_site.stack.active, bare_site),
    )


# --- the host tool (stdlib parts) ----------------------------------------------------------------


def _model(root: Path) -> list[dict]:
    big, small = b"\x01" * 300_000, b'{"a": 1}\n'
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "w.safetensors").write_bytes(big)
    (root / "config.json").write_bytes(small)
    return [
        {
            "path": "config.json",
            "size": len(small),
            "git_sha1": hashlib.sha1(b"blob %d\0" % len(small) + small).hexdigest(),
        },
        {"path": "sub/w.safetensors", "size": len(big), "sha256": hashlib.sha256(big).hexdigest()},
    ]


class _Status:
    def update(self, **values):
        pass


def test_verify_catches_a_flipped_byte_in_lfs_and_git_files(tmp_path):
    t = tool()
    files = _model(tmp_path)
    assert t.verify(tmp_path, files, _Status(), {}) == []
    data = bytearray((tmp_path / "sub" / "w.safetensors").read_bytes())
    data[1000] ^= 0xFF
    (tmp_path / "sub" / "w.safetensors").write_bytes(bytes(data))
    (tmp_path / "config.json").write_bytes(b'{"a": 2}\n')
    assert t.verify(tmp_path, files, _Status(), {}) == ["config.json", "sub/w.safetensors"]
    # A file the last manifest vouches for, with its size, is not re-hashed (no-change path).
    trusted = {f["path"]: f for f in files}
    assert t.verify(tmp_path, files, _Status(), trusted) == []


def test_quick_check_reads_manifest_and_sizes(tmp_path):
    t = tool()
    files = _model(tmp_path)
    patterns = t.patterns_key([], ["original/*"])
    assert t.manifest_state(tmp_path, "r/m", COMMIT, patterns)["state"] == "absent"
    t.write_json(
        tmp_path / t.MANIFEST,
        {"repo": "r/m", "revision": COMMIT, "patterns": patterns, "files": files, "verified_at": "now"},
    )
    assert t.manifest_state(tmp_path, "r/m", COMMIT, patterns)["state"] == "verified"
    assert t.manifest_state(tmp_path, "r/m", "f" * 40, patterns)["state"] == "changed"
    (tmp_path / "config.json").write_bytes(b"{}")
    state = t.manifest_state(tmp_path, "r/m", COMMIT, patterns)
    assert state == {"state": "incomplete", "detail": "config.json has 2 bytes, the manifest says 9"}


def test_free_space_refusal_names_both_numbers(tmp_path):
    t = tool()
    files = [{"path": "w", "size": 5 * 1024**3, "sha256": "0" * 64}]
    with pytest.raises(t.Permanent) as refused:
        t.require_space(tmp_path, files, margin=10**18)
    message = str(refused.value)
    assert f"not enough free space on {tmp_path}: 5.0 GiB still to download" in message
    assert " free (" in message and "bytes)" in message
    t.require_space(tmp_path, files[:0] or [{"path": "w", "size": 1, "sha256": "0" * 64}], margin=0)
