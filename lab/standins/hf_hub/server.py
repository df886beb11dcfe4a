"""STAND-IN for the Hugging Face Hub: the HTTP calls huggingface_hub 1.17.0 makes to download.

The Hub cannot be reached from these machines. This server answers exactly the requests that
the pinned client (huggingface_hub==1.17.0, the version roles/weights installs) makes in
`snapshot_download(repo_id, revision=<commit>, local_dir=...)` and `HfApi.model_info(...,
files_metadata=True)`, read from that wheel's source:

- `hf_api.py` `HfApi.model_info`: GET {endpoint}/api/models/{repo_id}/revision/{revision}
  (`?blobs=true` with files_metadata) -> JSON with `id`, `sha` and `siblings`
  [{rfilename, size, blobId, lfs: {size, sha256, pointerSize}}] (`ModelInfo.__init__`).
  `_snapshot_download.py` calls it as `repo_info` without blobs to resolve the revision.
- `hf_api.py` `HfApi.list_repo_tree`: GET {endpoint}/api/models/{repo_id}/tree/{revision}[/{path}]
  `?recursive=&expand=` -> [{type, oid, size, path, lfs: {oid, size, pointerSize}}]; pages are
  followed through a `Link: <...>; rel="next"` header (`utils/_pagination.py`). snapshot_download
  uses it only past 1000 siblings; served so that the tree and the siblings agree.
- `file_download.py` `get_hf_file_metadata`: HEAD {endpoint}/{repo_id}/resolve/{revision}/{file}
  with `Accept-Encoding: identity`; reads `X-Repo-Commit`, `X-Linked-Etag` or `ETag`, `Location`,
  `X-Linked-Size` or `Content-Length`, and Xet headers (`X-Xet-Hash`, `utils/_xet.py`). Relative
  redirects are followed (`_httpx_follow_relative_redirects_with_backoff`), absolute ones are not:
  like the Hub, an LFS file answers 302 to an absolute "CDN" URL with X-Linked-Etag = its sha256
  and X-Linked-Size; a git file answers 200 with ETag = its git blob sha1.
- `file_download.py` `http_get`: GET of that location, with `Range: bytes=<n>-` when a
  `<etag>.incomplete` file is resumed (`_download_to_tmp_and_move`) -> 206 + Content-Range.
- Errors as `utils/_http.py` `hf_raise_for_status` reads them: `X-Error-Code: RevisionNotFound`
  (404), `RepoNotFound` (401, what the Hub answers for an unknown or private repo),
  `EntryNotFound` (404), and 401 without a valid `Authorization: Bearer` when a token is required.

Without `--xet` no Xet headers are sent: the files come over plain HTTP, the path a mirror
(HF_ENDPOINT) or a repository not migrated to Xet takes. With `--xet` the large (LFS) files are
also stored on Xet, as on the real Hub, where most large repositories are (xet.py holds the CAS):

- the resolve HEAD adds `X-Xet-Hash` (the file's Merkle hash, as hf_xet computed it on upload) and
  `Link: <{endpoint}/api/models/{repo}/xet-read-token/{commit}>; rel="xet-auth"` (read by 1.17.0
  `utils/_xet.py` `parse_xet_file_data_from_response`; `get_hf_file_metadata` reads the 302's own
  headers, and `_get_metadata_or_catch_error` then skips the Location when xet_file_data is set);
  the 302 to the CDN stays, for clients with `HF_HUB_DISABLE_XET=1` or without hf_xet.
- GET that route answers `X-Xet-Cas-Url`, `X-Xet-Access-Token`, `X-Xet-Token-Expiration`
  (`parse_xet_connection_info_from_headers`; `xet_get` calls it through `refresh_xet_connection_info`
  before and during `hf_xet.download_files`) and the same as JSON {casUrl, exp, accessToken}
  (hf_xet 1.8.0 `xet_client/src/hub_client/types.rs` CasJWTInfo).
- the CAS routes (`/v1/xorbs`, `/v1/shards`, `/v2/reconstructions`) and the presigned xorb URLs
  (`/xorbs/default/{hash}?range=..&signature=..`) are served by this same server (xet.py).

It serves a small generated repository per repo id (`generate`), throttled per connection when
`<state>/rate` holds a number of bytes per second (the lab's interrupted-download test). While
`<state>/no-range` exists its LFS CDN route ignores `Range` as a CDN in front of the Hub may (the
case huggingface_hub 1.17.0's `http_get` handles: "If we requested a Range but got 200 back, the
server ignored our Range header (e.g. CloudFront with Accept-Encoding: gzip)"): 200 and the
whole file, so the client truncates its `.incomplete` and starts the file over. It logs
one line per request to stderr. File bytes sent are counted per path (`sent N of M bytes of PATH`
log lines, and live at GET /_standin/bytes-sent: {"http": .., "xet": .., "xet_api": ..}), so
measure_resume.py can compare the two. It never ships in a production path.

    python -m lab.standins.hf_hub.server --state DIR --port 8080 [--token-file F] [--xet]
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import random
import re
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlsplit

from lab.standins.hf_hub import xet as xet_cas

# The lab's repositories: repo id -> {file: size or text}. Large files are LFS (binary, seeded).
# Each config.json names itself a stand-in (as the stand-in server's tiny-model does), so that
# what reads the weights on the guest (checks.acceptance's weights line) can say where they came
# from; SGLang and transformers read config.json keys by name and ignore this one.
HUB_MARK = "STAND-IN repository of the inference-host lab's Hub (lab/standins/hf_hub): generated, no model"
LAB_REPOS: dict[str, dict[str, int | str]] = {
    "inference-host-lab/tiny-moe": {
        "config.json": json.dumps(
            {
                "_comment": HUB_MARK,
                "architectures": ["DeepseekV3ForCausalLM"],
                "model_type": "kimi_k2",
                "num_hidden_layers": 2,
                "hidden_size": 64,
            },
            indent=2,
        )
        + "\n",
        "tokenizer_config.json": json.dumps({"model_max_length": 131072}) + "\n",
        "model.safetensors.index.json": json.dumps(
            {
                "weight_map": {
                    "layers.0": "model-00001-of-00002.safetensors",
                    "layers.1": "model-00002-of-00002.safetensors",
                }
            },
            indent=2,
        )
        + "\n",
        "model-00001-of-00002.safetensors": 24 * 1024 * 1024,
        "model-00002-of-00002.safetensors": 20 * 1024 * 1024 + 12345,
        "original/README.md": "weights of the lab's tiny stand-in model\n",
    },
    "inference-host-lab/tiny-eagle3": {
        "config.json": json.dumps({"_comment": HUB_MARK, "architectures": ["LlamaForCausalLMEagle3"]}) + "\n",
        "model.safetensors": 2 * 1024 * 1024 + 7,
    },
}
LFS_MIN_SIZE = 10 * 1024  # the Hub's rule is by extension/.gitattributes; size suffices here


def git_blob_sha1(content: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


@dataclass
class RepoFile:
    path: str
    content: bytes
    lfs: bool
    xet_hash: str | None = None  # set once hf_xet uploaded it to the Xet stand-in (--xet)

    @property
    def size(self) -> int:
        return len(self.content)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.content).hexdigest()

    @property
    def pointer(self) -> bytes:
        return lfs_pointer(self.sha256, self.size)

    @property
    def blob_id(self) -> str:
        """The git object id: of the pointer for an LFS file, of the content otherwise."""
        return git_blob_sha1(self.pointer if self.lfs else self.content)


@dataclass
class Repo:
    repo_id: str
    commit: str
    files: dict[str, RepoFile]
    refs: dict[str, str]


def generate(repo_id: str, spec: dict[str, int | str]) -> Repo:
    """A repository with deterministic content; its commit id is a hash of the tree."""
    rng = random.Random(repo_id)
    files = {}
    for path, value in sorted(spec.items()):
        if isinstance(value, int):
            files[path] = RepoFile(path, rng.randbytes(value), lfs=value >= LFS_MIN_SIZE)
        else:
            files[path] = RepoFile(path, value.encode(), lfs=False)
    tree = "".join(f"{f.blob_id} {f.path}\n" for f in files.values())
    commit = hashlib.sha1(f"tree {repo_id}\n{tree}".encode()).hexdigest()
    return Repo(repo_id, commit, files, {"main": commit})


class Hub:
    def __init__(self, state: Path, token: str | None, xet: bool = False):
        self.state = state
        self.token = token
        self.repos = {rid: generate(rid, spec) for rid, spec in LAB_REPOS.items()}
        self.xet = xet_cas.XetStore() if xet else None
        self.ready = not xet  # with Xet: once every large file is stored there (publish_xet)
        self.sent = {"http": 0, "xet": 0, "xet_api": 0}  # file bytes on each path, reconstruction JSON
        self.lock = threading.Lock()

    def count(self, kind: str, n: int) -> None:
        with self.lock:
            self.sent[kind] += n

    def publish_xet(self, cas_url: str) -> None:
        """Stores every large file on the Xet stand-in with hf_xet's own upload (xet.upload), or
        reads back what an earlier start of this state folder stored (xet.XetStore.load)."""
        store = self.xet
        assert store is not None  # published only with Xet on
        files = [f for repo in self.repos.values() for f in repo.files.values() if f.lfs]
        kept = self.state / "xet"
        hashes = store.load(kept, [f.sha256 for f in files])
        if hashes is None:
            uploaded = xet_cas.upload([f.content for f in files], cas_url, store.token, store.expires)
            hashes = {f.sha256: file_hash for f, file_hash in zip(files, uploaded, strict=True)}
            store.save(kept, hashes)
        for f in files:
            if hashes[f.sha256] not in store.files or store.file_size(hashes[f.sha256]) != f.size:
                raise RuntimeError(f"the Xet stand-in holds no {f.size}-byte file {hashes[f.sha256]} for {f.path}")
            f.xet_hash = hashes[f.sha256]
        self.ready = True

    def holds(self, kind: str) -> bool:
        """True while <state>/hold-at ("KIND BYTES") says to send no more of KIND once BYTES of it
        were sent: measure_resume.py kills its client there, at the same byte on a loaded machine
        as on a quiet one (a client killed by polling the counter got the whole shard first)."""
        try:
            held, at = (self.state / "hold-at").read_text().split()
        except (OSError, ValueError):
            return False
        with self.lock:
            return held == kind and self.sent[kind] >= int(at)

    def honours_range(self) -> bool:
        """False while <state>/no-range exists: the CDN answers a Range request with 200 and all of it."""
        return not (self.state / "no-range").exists()

    def rate(self) -> float | None:
        """Bytes per second per connection, from <state>/rate (absent or 0: unthrottled)."""
        try:
            value = float((self.state / "rate").read_text().strip() or 0)
        except (OSError, ValueError):
            return None
        return value or None


class Handler(BaseHTTPRequestHandler):
    server_version = "standin-hub/1.17.0"
    protocol_version = "HTTP/1.1"
    hub: Hub
    _post_body: bytes | None = None

    # -- plumbing ---------------------------------------------------------------------------
    def log_message(self, format, *args):  # BaseHTTPRequestHandler's signature
        sys.stderr.write(f"[standin-hub] {self.address_string()} {format % args}\n")

    def _send(
        self,
        status: int,
        body: bytes = b"",
        headers: dict | None = None,
        content_type: str = "application/json; charset=utf-8",
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD" and body:
            self.wfile.write(body)

    def _error(self, status: int, code: str, message: str, headers: dict | None = None) -> None:
        body = json.dumps({"error": message}).encode()
        self._send(status, body, {"X-Error-Code": code, "X-Error-Message": message, **(headers or {})})

    def _authorized(self) -> bool:
        if not self.hub.token:
            return True
        return self.headers.get("Authorization", "") == f"Bearer {self.hub.token}"

    def _body_in(self) -> bytes:
        """The request body: Content-Length, or chunked (hf_xet streams uploads). Read once, before
        any answer: a body left unread would be taken for the next request on the connection."""
        if self.command != "POST":
            return b""
        if self._post_body is None:
            self._post_body = self._read_body()
        return self._post_body

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            parts = []
            while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                parts.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline().strip():
                pass
            return b"".join(parts)
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _repo(self, repo_id: str) -> Repo | None:
        repo = self.hub.repos.get(repo_id)
        if repo is None or not self._authorized():
            # The Hub does not say whether a repository exists to a caller without access.
            self._error(401, "RepoNotFound", "Repository not found")
            return None
        return repo

    def _commit(self, repo: Repo, revision: str) -> str | None:
        revision = unquote(revision)
        commit = repo.refs.get(revision) or (revision if revision == repo.commit else None)
        if commit is None:
            self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        return commit

    # -- routes -----------------------------------------------------------------------------
    def do_GET(self):  # http.server's naming
        self._route()

    def do_HEAD(self):
        self._route()

    def do_POST(self):
        self._post_body = None
        self._body_in()
        self._route()

    def _route(self) -> None:
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        path = url.path
        if path == "/ready":
            if self.hub.ready:
                self._send(200, b"standin-hub\n", content_type="text/plain")
            else:
                self._send(503, b"storing the large files on Xet\n", content_type="text/plain")
            return
        if path == "/_standin/bytes-sent":  # the stand-in's own counter (measure_resume.py)
            with self.hub.lock:
                self._send(200, json.dumps(self.hub.sent).encode())
            return
        if self.hub.xet is not None and self._xet_route(path, query):
            return
        if self.command == "POST":
            self._error(404, "EntryNotFound", f"POST {path} is not a route of this stand-in")
            return
        match = re.fullmatch(r"/api/models/(?P<repo>[^/]+/[^/]+)/revision/(?P<rev>[^/]+)", path)
        if match:
            return self._model_info(match["repo"], match["rev"], query.get("blobs") == ["true"])
        match = re.fullmatch(r"/api/models/(?P<repo>[^/]+/[^/]+)/tree/(?P<rev>[^/]+)(?P<sub>/.*)?", path)
        if match:
            return self._tree(
                match["repo"],
                match["rev"],
                unquote(match["sub"] or "").strip("/"),
                query.get("recursive") in (["True"], ["true"]),
            )
        match = re.fullmatch(r"/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)", path)
        if match:
            return self._resolve(match["repo"], match["rev"], unquote(match["file"]))
        match = re.fullmatch(r"/lfs-cdn/(?P<repo>[^/]+/[^/]+)/(?P<sha>[0-9a-f]{64})", path)
        if match:
            return self._cdn(match["repo"], match["sha"])
        self._error(404, "EntryNotFound", f"{path} is not a route of this stand-in")

    def _model_info(self, repo_id: str, revision: str, blobs: bool) -> None:
        repo = self._repo(repo_id)
        commit = repo and self._commit(repo, revision)
        if repo is None or not commit:
            return
        siblings = []
        for f in repo.files.values():
            entry: dict = {"rfilename": f.path}
            if blobs:
                entry.update(size=f.size, blobId=f.blob_id)
                if f.lfs:
                    entry["lfs"] = {"size": f.size, "sha256": f.sha256, "pointerSize": len(f.pointer)}
            siblings.append(entry)
        body = {
            "_id": hashlib.md5(repo_id.encode()).hexdigest()[:24],
            "id": repo_id,
            "modelId": repo_id,
            "author": repo_id.split("/")[0],
            "sha": commit,
            "lastModified": "2026-01-01T00:00:00.000Z",
            "private": False,
            "gated": False,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "tags": ["safetensors"],
            "library_name": "transformers",
            "siblings": siblings,
            "createdAt": "2026-01-01T00:00:00.000Z",
            "usedStorage": sum(f.size for f in repo.files.values()),
        }
        self._send(200, json.dumps(body).encode())

    def _tree(self, repo_id: str, revision: str, sub: str, recursive: bool) -> None:
        repo = self._repo(repo_id)
        commit = repo and self._commit(repo, revision)
        if repo is None or not commit:
            return
        entries, folders = [], set()
        prefix = f"{sub}/" if sub else ""
        for f in repo.files.values():
            if not f.path.startswith(prefix):
                continue
            rest = f.path[len(prefix) :]
            if "/" in rest and not recursive:
                folders.add(prefix + rest.split("/")[0])
                continue
            for depth in range(rest.count("/")):
                folders.add(prefix + "/".join(rest.split("/")[: depth + 1]))
            entry = {"type": "file", "oid": f.blob_id, "size": f.size, "path": f.path}
            if f.lfs:
                entry["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": len(f.pointer)}
            entries.append(entry)
        tree = [
            {"type": "directory", "oid": hashlib.sha1(d.encode()).hexdigest(), "size": 0, "path": d}
            for d in sorted(folders)
        ] + entries
        self._send(200, json.dumps(tree).encode())

    def _resolve(self, repo_id: str, revision: str, filename: str) -> None:
        repo = self._repo(repo_id)
        commit = repo and self._commit(repo, revision)
        if repo is None or not commit:
            return
        f = repo.files.get(filename)
        if f is None:
            self._error(404, "EntryNotFound", "Entry not found", {"X-Repo-Commit": commit})
            return
        common = {
            "X-Repo-Commit": commit,
            "Accept-Ranges": "bytes",
            "Content-Disposition": f"inline; filename*=UTF-8''{quote(Path(filename).name)};"
            f' filename="{Path(filename).name}";',
        }
        if f.lfs:
            host = self.headers.get("Host", "localhost")
            location = f"http://{host}/lfs-cdn/{repo_id}/{f.sha256}"
            if f.xet_hash:
                common["X-Xet-Hash"] = f.xet_hash
                common["Link"] = (
                    f'<http://{host}/api/models/{repo_id}/xet-read-token/{commit}>; rel="xet-auth",'
                    f' <http://{host}/v1/reconstructions/{f.xet_hash}>; rel="xet-reconstruction-info"'
                )
            self.send_response(302)
            for key, value in {
                **common,
                "ETag": f'"{f.blob_id}"',
                "X-Linked-Etag": f'"{f.sha256}"',
                "X-Linked-Size": str(f.size),
                "Location": location,
                "Content-Length": "0",
            }.items():
                self.send_header(key, value)
            self.end_headers()
            return
        self._body(f.content, {**common, "ETag": f'"{f.blob_id}"'})

    def _cdn(self, repo_id: str, sha256: str) -> None:
        repo = self.hub.repos.get(repo_id)
        f = next((f for f in (repo.files.values() if repo else []) if f.lfs and f.sha256 == sha256), None)
        if f is None:
            self._send(404, b"NoSuchKey", content_type="text/plain")
            return
        self._body(
            f.content,
            {"ETag": f'"{f.sha256}"', **({"Accept-Ranges": "bytes"} if self.hub.honours_range() else {})},
            content_type="binary/octet-stream",
            kind="http",
            honour_range=self.hub.honours_range(),
        )

    # -- Xet (xet.py has the sources) -------------------------------------------------------
    def _xet_route(self, path: str, query: dict) -> bool:
        """Serves a Xet route if `path` is one; False lets the Hub routes answer."""
        store = self.hub.xet
        assert store is not None  # routed only with Xet on (do_GET, do_POST)
        match = re.fullmatch(r"/api/models/(?P<repo>[^/]+/[^/]+)/xet-read-token/(?P<rev>[^/]+)", path)
        if match and self.command == "GET":
            repo = self._repo(match["repo"])
            if repo and self._commit(repo, match["rev"]):
                cas = f"http://{self.headers.get('Host', 'localhost')}"
                body = {"casUrl": cas, "exp": store.expires, "accessToken": store.token}
                self._send(
                    200,
                    json.dumps(body).encode(),
                    {
                        "X-Xet-Cas-Url": cas,
                        "X-Xet-Access-Token": store.token,
                        "X-Xet-Token-Expiration": str(store.expires),
                    },
                )
            return True
        match = re.fullmatch(r"/xorbs/default/(?P<hash>[0-9a-f]{64})", path)
        if match and self.command == "GET":
            self._xorb_range(match["hash"], query)
            return True
        if path == "/v1/telemetry" and self.command == "POST":
            # Best-effort on the client's side (telemetry.rs: never retried, often not waited for,
            # so the answer may find the socket closed); nothing kept.
            try:
                self._send(204)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True
            return True
        route = re.fullmatch(
            r"/(?P<api>v1/xorbs/default|v1/shards|v[12]/reconstructions)(?:/(?P<hash>[0-9a-f]{64}))?", path
        )
        if not route:
            return False  # also /v1/xorb-grants, /v2/shards, /v1/chunks: 404, the client falls back
        if self.headers.get("Authorization", "") != f"Bearer {store.token}":
            self._send(401, b"invalid or missing CAS token", content_type="text/plain")
            return True
        try:
            if route["api"] == "v1/xorbs/default" and route["hash"] and self.command == "POST":
                inserted = store.add_xorb(route["hash"], self._body_in())
                self._send(200, json.dumps({"was_inserted": inserted}).encode())
            elif route["api"] == "v1/shards" and not route["hash"] and self.command == "POST":
                # UploadShardResponseType: 0 Exists, 1 SyncPerformed
                self._send(200, json.dumps({"result": int(store.add_shard(self._body_in()))}).encode())
            elif route["api"].endswith("/reconstructions") and route["hash"] and self.command == "GET":
                self._reconstruction(route["hash"], v1=route["api"].startswith("v1"))
            else:
                return False
        except xet_cas.XetFormatError as error:
            self._send(400, f"{error}\n".encode(), content_type="text/plain")
        return True

    def _reconstruction(self, file_hash: str, v1: bool) -> None:
        """v2 (what hf_xet 1.8.0 asks first), or v1 (its fallback, and what the Hub's
        `rel="xet-reconstruction-info"` link names): cas_types/mod.rs, `From<QueryReconstructionResponse>
        for QueryReconstructionResponseV2` maps one to the other."""
        store = self.hub.xet
        assert store is not None  # routed only with Xet on (do_GET, do_POST)
        if file_hash not in store.files:
            self._send(404, b"file not found", content_type="text/plain")
            return
        start, end = 0, 2**64 - 1
        ranged = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range", ""))
        if ranged:
            start, end = int(ranged[1]), int(ranged[2]) + 1  # the header's end is inclusive
        answer = store.reconstruction(file_hash, start, end, f"http://{self.headers.get('Host', 'localhost')}")
        if answer is None:
            self._send(416, b"", {"Content-Range": f"bytes */{store.file_size(file_hash)}"})
            return
        if v1:
            answer = {
                "offset_into_first_range": answer["offset_into_first_range"],
                "terms": answer["terms"],
                "fetch_info": {
                    h: [
                        {"range": r["chunks"], "url": f["url"], "url_range": r["bytes"]}
                        for f in fetches
                        for r in f["ranges"]
                    ]
                    for h, fetches in answer["xorbs"].items()
                },
            }
        body = json.dumps(answer).encode()
        self.hub.count("xet_api", len(body))
        self._send(200, body)

    def _xorb_range(self, xorb_hash: str, query: dict) -> None:
        """A presigned URL: the Range must be the signed one (S3 answers 403 otherwise)."""
        store = self.hub.xet
        assert store is not None  # routed only with Xet on (do_GET, do_POST)
        signed = query.get("range", [""])[0]
        ranged = re.fullmatch(r"(\d+)-(\d+)", signed)
        if (
            not ranged
            or xorb_hash not in store.xorbs
            or self.headers.get("Range") != f"bytes={signed}"
            or not hmac.compare_digest(
                query.get("signature", [""])[0], store.sign(xorb_hash, int(ranged[1]), int(ranged[2]))
            )
        ):
            self._send(403, b"<Error><Code>SignatureDoesNotMatch</Code></Error>", content_type="application/xml")
            return
        self._body(
            store.xorbs[xorb_hash].data, {"Accept-Ranges": "bytes"}, content_type="binary/octet-stream", kind="xet"
        )

    def _body(
        self,
        content: bytes,
        headers: dict,
        content_type: str = "text/plain; charset=utf-8",
        kind: str | None = None,
        honour_range: bool = True,
    ) -> None:
        start, status = 0, 200
        ranged = honour_range and re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        end = len(content) - 1
        if ranged:
            start = int(ranged[1])
            end = min(int(ranged[2]), end) if ranged[2] else end
            if start > end:
                self._send(416, b"", {"Content-Range": f"bytes */{len(content)}"}, content_type)
                return
            status = 206
            headers = {**headers, "Content-Range": f"bytes {start}-{end}/{len(content)}"}
        part = content[start : end + 1]
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(part)))
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        if self.command == "HEAD":
            return
        sent = self._write_throttled(part, kind)
        # What a resumed download costs, counted here (docs/weights-resume.md measures with it).
        sys.stderr.write(
            f"[standin-hub] sent {sent} of {len(part)} bytes of {urlsplit(self.path).path}"
            f" from offset {start} (status {status})\n"
        )

    def _write_throttled(self, data: bytes, kind: str | None = None) -> int:
        """Writes data (at <state>/rate bytes per second if set); returns the bytes the socket took.

        Counted as they go (under `kind`), so that a measurement can kill a client mid-file."""
        rate = self.hub.rate()
        chunk = 64 * 1024 if rate is None else max(4096, int(rate / 10))
        began, sent = time.monotonic(), 0
        for offset in range(0, len(data), chunk):
            while kind and self.hub.holds(kind):
                time.sleep(0.05)
            try:
                self.wfile.write(data[offset : offset + chunk])
            except (BrokenPipeError, ConnectionResetError):
                return sent
            sent += len(data[offset : offset + chunk])
            if kind:
                self.hub.count(kind, len(data[offset : offset + chunk]))
            if rate:
                ahead = (offset + chunk) / rate - (time.monotonic() - began)
                if ahead > 0:
                    time.sleep(ahead)
        return sent


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state", required=True, type=Path)
    parser.add_argument("--bind", default="0.0.0.0")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--token-file", type=Path, help="require Authorization: Bearer <its content>")
    parser.add_argument(
        "--xet", action="store_true", help="also store the large files on Xet and advertise it (needs hf_xet)"
    )
    args = parser.parse_args(argv)
    args.state.mkdir(parents=True, exist_ok=True)
    token = args.token_file.read_text().strip() if args.token_file else None
    Handler.hub = Hub(args.state, token, xet=args.xet)
    server = ThreadingHTTPServer((args.bind, args.port), Handler)
    server.daemon_threads = True
    sys.stderr.write(f"[standin-hub] serving {', '.join(Handler.hub.repos)} on {args.bind}:{args.port}\n")
    for repo in Handler.hub.repos.values():
        sys.stderr.write(f"[standin-hub] {repo.repo_id} main = {repo.commit}\n")
    if args.xet:
        # hf_xet's own working files (logs, upload staging) stay in the state folder, not in ~/.cache.
        os.environ["HF_XET_CACHE"] = str(args.state / "xet-cache")
        # The upload goes through this server's own CAS routes, so it must already be serving.
        threading.Thread(target=server.serve_forever, daemon=True).start()
        own = "127.0.0.1" if args.bind in ("0.0.0.0", "") else args.bind
        Handler.hub.publish_xet(f"http://{own}:{args.port}")
        for repo in Handler.hub.repos.values():
            for f in repo.files.values():
                if f.xet_hash:
                    sys.stderr.write(f"[standin-hub] {repo.repo_id}/{f.path} on Xet as {f.xet_hash}\n")
        threading.Event().wait()
    server.serve_forever()


if __name__ == "__main__":
    os.umask(0o077)
    main()
