"""Service suite, weights: the engine's model directories hold the pinned commit, verified.

roles/weights writes `<dir>/.inference-host/manifest.json` only after every file's size and hash
matched the Hub's (LFS sha256, git blob sha1), and removes it before any new download. Here, on
the gpu node (the directory as the engine sees it, read-only when the Proxmox node keeps it):
the manifest exists, names the repository and commit the inventory pins, and every file it
lists has its size. Sizes only: hashing hundreds of GB belongs to `weights_verify` or
`inference-host-weights verify` on the host that keeps the weights.
"""

from __future__ import annotations

import json

import pytest

from checks import bounded
from checks.conftest import _site_host_name
from checks.probes import explain, report
from checks.site_cache import site_of
from roles.shared.shell import sh
from roles.site import weight_sets_of

pytestmark = pytest.mark.service

# Prints "<manifest JSON>\n<json list of sizes, -1 for a missing file>" for one directory.
PROBE = r"""
import json, os, sys
d = sys.argv[1]
m = json.load(open(os.path.join(d, ".inference-host/manifest.json")))
sizes = []
for f in m["files"]:
    try:
        sizes.append(os.stat(os.path.join(d, f["path"])).st_size)
    except OSError:
        sizes.append(-1)
print(json.dumps(m)); print(json.dumps(sizes))
"""


@pytest.fixture(scope="module")
def weight_sets(request, host):
    inventory = request.config.getoption("--inventory")
    if not inventory:
        pytest.skip("no --inventory: which weights the engine serves is not known")
    site = site_of(inventory)
    settings = site.hosts.get(_site_host_name(request.config, host))
    sets = weight_sets_of(settings, site.hosts) if settings else []
    if not sets:
        pytest.skip("no weights_repo for this host: its weights are put in place by other means")
    return sets


def test_weights_manifest_matches_the_pin(host, weight_sets, request):
    for ws in weight_sets:
        command = sh("python3 -c {probe} {folder}", probe=PROBE, folder=ws.guest_dir)
        probe = bounded.run(host, command, what="python probe")
        assert probe.rc == 0, explain(
            f"a verified manifest at {ws.manifest}",
            (probe.stderr.strip().splitlines() or ["none"])[-1],
            f"deploy again: roles/weights downloads and verifies {ws.repo}@{ws.revision}"
            f" into {ws.store_dir} on {ws.store_host} (progress: inference-host-weights status there)",
        )
        text, sizes_text = probe.stdout.strip().split("\n", 1)
        manifest, sizes = json.loads(text), json.loads(sizes_text)
        pinned = (ws.repo, ws.revision)
        assert (manifest.get("repo"), manifest.get("revision")) == pinned, explain(
            f"{ws.kind} weights {ws.repo}@{ws.revision} in {ws.guest_dir}",
            f"{manifest.get('repo')}@{manifest.get('revision')}",
            "deploy again to fetch the pinned commit",
        )
        wrong = [
            f"{f['path']} ({size} bytes, expected {f['size']})"
            for f, size in zip(manifest["files"], sizes, strict=True)
            if size != f["size"]
        ]
        assert not wrong, explain(
            f"every file of {ws.guest_dir} at its verified size",
            "; ".join(wrong[:3]),
            f"deploy again (the missing or changed files are fetched again); on {ws.store_host}:"
            " inference-host-weights verify re-hashes everything",
        )
        report(
            request,
            f"{ws.kind} {ws.repo}@{ws.revision[:12]}: {len(sizes)} files, verified {manifest.get('verified_at')}",
        )
