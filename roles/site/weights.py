"""Weights: which host keeps which model's files, and where (roles/weights, roles/serving), and
the rules that keep that unambiguous. Derived from the typed settings only."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Literal

from roles.site.schema import HostSettings, Site
from roles.site.sections.weights import WEIGHTS_MANIFEST, WeightsSettings


@dataclass(frozen=True)
class WeightSet:
    """One model's files as one host keeps them: the gpu node itself, or the Proxmox node whose
    directory reaches the guest through a guest_mount_points entry (read-only there)."""

    kind: Literal["model", "drafter"]
    repo: str
    revision: str
    allow_patterns: tuple[str, ...]
    ignore_patterns: tuple[str, ...]
    guest_dir: str  # where the gpu node reads them (serving_model_path, draft path)
    store_host: str  # inventory name of the host that downloads and keeps them
    store_dir: str  # the path there
    source_dir: str | None
    endpoint: str | None
    token_secret: str | None
    settings: WeightsSettings

    @property
    def name(self) -> str:
        """Unit and state name: the directory's last part and a hash of the whole path."""

        base = re.sub(r"[^A-Za-z0-9_.-]", "_", self.store_dir.rstrip("/").rsplit("/", 1)[-1])[:40]
        return f"{base}-{hashlib.sha1(self.store_dir.encode()).hexdigest()[:8]}"

    @property
    def manifest(self) -> str:
        return f"{self.guest_dir.rstrip('/')}/{WEIGHTS_MANIFEST}"


def _draft_path(host: HostSettings) -> str | None:
    spec = host.serving.speculative or {}
    return spec.get("draft_model_path") if isinstance(spec, dict) else None


def _store_of(host: HostSettings, site_hosts: dict[str, HostSettings], guest_dir: str) -> tuple[str, str]:
    """(host, path) that keeps guest_dir: the node when a mount point of this LXC guest holds it."""
    node = site_hosts.get(host.guest.node or "")
    if node is not None and host.in_group("lxc_guests"):
        for host_path, guest_path in host.guest.mount_points.items():
            guest_path = guest_path.rstrip("/")
            if guest_dir == guest_path or guest_dir.startswith(guest_path + "/"):
                return node.name, host_path.rstrip("/") + guest_dir[len(guest_path) :]
    return host.name, guest_dir


def weight_sets_of(host: HostSettings, site_hosts: dict[str, HostSettings]) -> list[WeightSet]:
    """The weights a gpu node serves from (none when weights_repo is unset)."""
    w = host.weights
    wanted: list[tuple[Literal["model", "drafter"], str, str, list[str], list[str], str | None, str | None]] = []
    if w.repo and w.revision:
        wanted.append(
            (
                "model",
                w.repo,
                w.revision,
                w.allow_patterns,
                w.ignore_patterns,
                w.local_dir or host.serving.model_path,
                w.source_dir,
            )
        )
    if w.drafter_repo and w.drafter_revision and (w.drafter_local_dir or _draft_path(host)):
        wanted.append(
            (
                "drafter",
                w.drafter_repo,
                w.drafter_revision,
                w.drafter_allow_patterns,
                w.drafter_ignore_patterns,
                w.drafter_local_dir or _draft_path(host),
                w.drafter_source_dir,
            )
        )
    sets = []
    for kind, repo, revision, allow, ignore, guest_dir, source in wanted:
        assert guest_dir, "the site rules require serving_model_path (or weights_local_dir) with weights_repo"
        store_host, store_dir = _store_of(host, site_hosts, guest_dir.rstrip("/"))
        sets.append(
            WeightSet(
                kind,
                repo,
                revision,
                tuple(allow),
                tuple(ignore),
                guest_dir.rstrip("/"),
                store_host,
                store_dir,
                source,
                w.endpoint,
                host.serving.hf_token_secret,
                w,
            )
        )
    return sets


def served_weight_manifests(host: HostSettings) -> list[str]:
    """Manifests the gpu node's engine needs before it may start (paths as the node sees them)."""
    return [ws.manifest for ws in weight_sets_of(host, {})]


def weight_sets_kept_by(site: Site, host_name: str) -> list[WeightSet]:
    """What one host downloads and keeps: one copy per directory, whoever reads it."""
    kept: dict[str, WeightSet] = {}
    for host in site.group("gpu_nodes"):
        for ws in weight_sets_of(host, site.hosts):
            if ws.store_host == host_name:
                kept.setdefault(ws.store_dir, ws)
    return list(kept.values())


def weights_mount_points(host: HostSettings) -> set[str]:
    """Host paths of this LXC guest's mount points that carry its weights: mounted read-only."""
    if not (host.in_group("lxc_guests") and host.guest.node):
        return set()
    carried = set()
    for ws in weight_sets_of(host, {}):
        for host_path, guest_path in host.guest.mount_points.items():
            guest_path = guest_path.rstrip("/")
            if ws.guest_dir == guest_path or ws.guest_dir.startswith(guest_path + "/"):
                carried.add(host_path)
    return carried


def check_weights(site_hosts: dict[str, HostSettings], where: str, problems: list[str]) -> None:
    stores: dict[tuple[str, str], tuple[str, WeightSet]] = {}
    for host in site_hosts.values():
        here, w = f"{where}: host {host.name}", host.weights
        if not host.valid(
            "weights_repo",
            "weights_revision",
            "weights_drafter_repo",
            "weights_drafter_revision",
            "serving_speculative",
        ):
            continue
        for prefix, repo, revision in (
            ("weights_", w.repo, w.revision),
            ("weights_drafter_", w.drafter_repo, w.drafter_revision),
        ):
            if repo and not revision:
                problems.append(
                    f"{here}: {prefix}repo = {repo!r} without {prefix}revision;"
                    " expected the 40-character commit hash to download"
                )
            if revision and not repo:
                problems.append(f"{here}: {prefix}revision is set without {prefix}repo; expected both, or neither")
        if w.drafter_repo and not (w.drafter_local_dir or _draft_path(host)):
            problems.append(
                f"{here}: weights_drafter_repo = {w.drafter_repo!r} has nowhere to go;"
                " expected weights_drafter_local_dir or serving_speculative's draft_model_path"
            )
        if (w.repo or w.drafter_repo) and not host.in_group("gpu_nodes"):
            problems.append(
                f"{here}: weights_repo is set on a host outside gpu_nodes;"
                " expected it on the gpu node that serves the model"
            )
        for ws in weight_sets_of(host, site_hosts):
            key = (ws.store_host, ws.store_dir)
            identity = (ws.repo, ws.revision, ws.allow_patterns, ws.ignore_patterns)
            first = stores.setdefault(key, (host.name, ws))
            if (first[1].repo, first[1].revision, first[1].allow_patterns, first[1].ignore_patterns) != identity:
                problems.append(
                    f"{here}: {ws.kind} weights {ws.repo}@{ws.revision} go to {ws.store_dir} on"
                    f" {ws.store_host}, which already holds {first[1].repo}@{first[1].revision}"
                    f" for {first[0]}; expected one model per directory"
                )
