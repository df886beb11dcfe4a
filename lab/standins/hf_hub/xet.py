"""STAND-IN for Xet storage: the CAS server behind the Hugging Face Hub, as hf_xet 1.8.0 uses it.

The real CAS (cas-server.xethub.hf.co, its presigned xorb URLs on S3/CloudFront) cannot be reached
from these machines. This module holds what the Hub stand-in (server.py, `--xet`) needs to serve
a repository's large files over Xet to the REAL client: huggingface_hub 1.17.0's `xet_get` calling
hf_xet 1.8.0's `download_files`, the pins roles/weights installs.

No Xet hash is computed here. At start-up the stand-in uploads each large file with hf_xet's own
`upload_bytes` to its own CAS routes (as huggingface_hub's `_commit_api.py` `_upload_xet_files`
does against the real CAS); hf_xet chunks the file, builds the xorbs and the shard, and returns the
file's Merkle hash. The stand-in stores the xorbs as sent and reads the shard to answer
reconstructions. Sources, from the hf_xet 1.8.0 sdist on PyPI
(hf_xet-1.8.0.tar.gz, sha256 10ed23b51dacf7917d64f335c25048deb470efa755e9989b218fc0531386138e):

- `xet_client/src/cas_client/remote_client.rs`: the routes the client calls. Upload:
  `POST {cas}/v1/xorb-grants/default/{hash}` (404: "the server does not offer upload grants", then)
  `POST {cas}/v1/xorbs/default/{hash}` -> `{"was_inserted": bool}`; `POST {cas}/v2/shards` (404 or
  501: falls back to) `POST {cas}/v1/shards` -> `{"result": 0|1}`; `GET {cas}/v1/chunks/default/..`
  (global dedup, 404 = nothing to dedup against). Download: `GET {cas}/v2/reconstructions/{file}`
  with `Range: bytes=a-b` over the FILE's bytes (404/501: falls back to v1, also served), then a
  GET of each fetch URL with exactly its `Range` (no CAS token: a presigned URL; 403 makes it
  refresh the URL).
  CAS API calls carry `Authorization: Bearer <X-Xet-Access-Token>`.
- `xet_client/src/cas_types/mod.rs`: `QueryReconstructionResponseV2` {offset_into_first_range,
  terms: [{hash, unpacked_length, range: {start, end}}], xorbs: {hash: [{url, ranges: [{chunks:
  {start, end}, bytes: {start, end}}]}]}}; chunk ranges end-exclusive, byte ranges end-inclusive.
- `xet_client/src/cas_client/simulation/xorb_utils.rs` `compute_reconstruction_ranges`: the
  reconstruction of a file byte range (ported in `XetStore.reconstruction`; 416 past the end).
- `xet_core_structures/src/metadata_shard/{shard_format,file_structs,xorb_structs}.rs`: the shard
  (`parse_shard`); `xorb_object/xorb_chunk_format.rs`: the 8-byte chunk header (`chunk_layout`);
  `merklehash/data_hash.rs` `hex()`: each of the 4 little-endian u64 words as 16 hex digits.
- Verification: the download path (`get_file_term_data`, `deserialize_chunks_to_writer_from_stream`)
  checks each term's unpacked length and the file's size, not chunk hashes. The real CAS validates
  an uploaded shard against its xorbs (cas_types/mod.rs `ShardUploadEvent::Validating`); this
  stand-in checks only that the xorbs and chunks a shard names were uploaded (it trusts hf_xet).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path

SHARD_HEADER_TAG = bytes(
    [  # shard_format.rs MDB_SHARD_HEADER_TAG
        *b"HFRepoMetaData",
        0,
        85,
        105,
        103,
        69,
        106,
        123,
        129,
        87,
        131,
        165,
        189,
        217,
        92,
        205,
        209,
        74,
        169,
    ]
)
ENTRY_SIZE = 48  # shard_format.rs MDB_FILE_INFO_ENTRY_SIZE == MDB_XORB_INFO_ENTRY_SIZE: [u64; 4] + 4 x u32
BOOKEND = b"\xff" * 32  # file_structs.rs / xorb_structs.rs bookend(): the all-ones hash ends a section
FLAG_VERIFICATION = 1 << 31  # file_structs.rs MDB_FILE_FLAG_WITH_VERIFICATION
FLAG_METADATA_EXT = 1 << 30  # file_structs.rs MDB_FILE_FLAG_WITH_METADATA_EXT
CHUNK_HEADER_SIZE = 8  # xorb_chunk_format.rs XorbChunkHeader: version u8, 3-byte lengths, scheme u8
XORB_FOOTER_IDENT = b"XETBLOB"  # xorb_object_format.rs XORB_OBJECT_FORMAT_IDENT: a footer starts so
TOKEN_LIFETIME_S = 3600


class XetFormatError(ValueError):
    """What the stand-in was sent is not a shard or xorb as hf_xet 1.8.0 writes them."""


def merkle_hex(raw: bytes) -> str:
    """data_hash.rs `hex()`: the hash is 4 u64 read little-endian, each printed as 16 hex digits."""
    return "".join(raw[i : i + 8][::-1].hex() for i in range(0, 32, 8))


@dataclass(frozen=True)
class Segment:
    """file_structs.rs FileDataSequenceEntry: chunks [start, end) of a xorb, `unpacked` bytes."""

    xorb: str
    unpacked: int
    start: int
    end: int


def parse_shard(data: bytes) -> tuple[dict[str, list[Segment]], dict[str, int]]:
    """Files (Merkle hash -> segments) and xorbs (hash -> chunk count) of an MDB shard."""
    if len(data) < 48 or data[:32] != SHARD_HEADER_TAG:
        raise XetFormatError("not an MDB shard (shard_format.rs MDB_SHARD_HEADER_TAG)")
    offset = 48  # MDBShardFileHeader: tag, version u64, footer_size u64

    def entry() -> tuple[bytes, int, int, bytes]:
        nonlocal offset
        if offset + ENTRY_SIZE > len(data):
            raise XetFormatError(f"shard ends inside an entry at byte {offset}")
        raw = data[offset : offset + ENTRY_SIZE]
        offset += ENTRY_SIZE
        flags, count = struct.unpack_from("<II", raw, 32)
        return raw[:32], flags, count, raw[40:]

    files: dict[str, list[Segment]] = {}
    while True:  # file info section: FileDataSequenceHeader, its entries, then options
        file_hash, flags, count, _ = entry()
        if file_hash == BOOKEND:
            break
        segments = []
        for _ in range(count):
            xorb, _flags, unpacked, rest = entry()
            start, end = struct.unpack("<II", rest)
            segments.append(Segment(merkle_hex(xorb), unpacked, start, end))
        offset += ENTRY_SIZE * (count if flags & FLAG_VERIFICATION else 0)
        offset += ENTRY_SIZE if flags & FLAG_METADATA_EXT else 0
        files[merkle_hex(file_hash)] = segments
    xorbs: dict[str, int] = {}
    while True:  # xorb info section: XorbChunkSequenceHeader, then one entry per chunk
        xorb_hash, _flags, count, _ = entry()
        if xorb_hash == BOOKEND:
            break
        offset += ENTRY_SIZE * count
        xorbs[merkle_hex(xorb_hash)] = count
    return files, xorbs


def chunk_layout(xorb: bytes, n_chunks: int) -> tuple[list[int], list[int]]:
    """Byte offset of each chunk in the serialized xorb (n+1 entries) and each chunk's unpacked size.

    Read from the chunk headers. hf_xet uploads a xorb without its footer
    (xet_data/src/processing/file_upload_session.rs: `SerializedXorbObject::from_xorb(xorb, false,
    ..)`, "the server/client reconstructs it from chunk data"); a stored xorb may carry one. Either
    way the chunks the shard counts must end where the data or the footer does."""
    offsets, sizes, at = [0], [], 0
    for _ in range(n_chunks):
        header = xorb[at : at + CHUNK_HEADER_SIZE]
        if len(header) < CHUNK_HEADER_SIZE or header[0] != 0:
            raise XetFormatError(f"no chunk header (version 0) at byte {at} of the xorb")
        compressed = int.from_bytes(header[1:4], "little")
        sizes.append(int.from_bytes(header[5:8], "little"))
        at += CHUNK_HEADER_SIZE + compressed
        offsets.append(at)
    if at != len(xorb) and xorb[at : at + len(XORB_FOOTER_IDENT)] != XORB_FOOTER_IDENT:
        raise XetFormatError(f"the xorb's footer does not follow its {n_chunks} chunks (byte {at})")
    return offsets, sizes


@dataclass
class Xorb:
    data: bytes
    offsets: list[int] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)


class XetStore:
    """Xorbs as uploaded and the files their shards describe; answers reconstructions."""

    def __init__(self) -> None:
        self.pending: dict[str, bytes] = {}  # xorbs uploaded, not yet described by a shard
        self.xorbs: dict[str, Xorb] = {}
        self.files: dict[str, list[Segment]] = {}
        self.shards: list[bytes] = []  # as uploaded, kept for save()
        self.token = secrets.token_urlsafe(24)  # the CAS access token the refresh route hands out
        self.expires = int(time.time()) + TOKEN_LIFETIME_S
        self._url_key = secrets.token_bytes(32)  # signs the "presigned" xorb URLs

    def add_xorb(self, xorb_hash: str, data: bytes) -> bool:
        inserted = xorb_hash not in self.xorbs and xorb_hash not in self.pending
        if inserted:
            self.pending[xorb_hash] = data
        return inserted

    def add_shard(self, data: bytes) -> bool:
        """Registers the shard's files; the real CAS refuses a shard naming xorbs it lacks (400)."""
        files, xorbs = parse_shard(data)
        for xorb_hash, n_chunks in xorbs.items():
            if xorb_hash in self.xorbs:
                continue
            if xorb_hash not in self.pending:
                raise XetFormatError(f"shard names xorb {xorb_hash}, which was not uploaded")
            offsets, sizes = chunk_layout(self.pending[xorb_hash], n_chunks)
            self.xorbs[xorb_hash] = Xorb(self.pending.pop(xorb_hash), offsets, sizes)
        for segments in files.values():
            for s in segments:
                if s.xorb not in self.xorbs or s.end > len(self.xorbs[s.xorb].sizes):
                    raise XetFormatError(f"shard's file names chunks {s.start}-{s.end} of unknown xorb {s.xorb}")
        new = any(h not in self.files for h in files)
        self.files.update(files)
        self.shards.append(data)
        return new

    def save(self, folder: Path, hashes: dict[str, str]) -> None:
        """Keeps the xorbs and shards as uploaded, and which content (sha256) has which Merkle hash,
        so that the next start of the stand-in (each lab deploy serves it anew) needs no upload."""
        (folder / "xorbs").mkdir(parents=True, exist_ok=True)
        (folder / "shards").mkdir(exist_ok=True)
        for xorb_hash, xorb in self.xorbs.items():
            (folder / "xorbs" / xorb_hash).write_bytes(xorb.data)
        for index, shard in enumerate(self.shards):
            (folder / "shards" / f"{index}.mdb").write_bytes(shard)
        (folder / "hashes.json").write_text(json.dumps(hashes, indent=1, sort_keys=True))

    def load(self, folder: Path, sha256s: list[str]) -> dict[str, str] | None:
        """What save() kept, read back through add_xorb/add_shard; None unless it has every sha256."""
        try:
            hashes = json.loads((folder / "hashes.json").read_text())
            if not set(sha256s) <= set(hashes):
                return None
            for path in sorted((folder / "xorbs").iterdir()):
                self.add_xorb(path.name, path.read_bytes())
            for path in sorted((folder / "shards").iterdir()):
                self.add_shard(path.read_bytes())
        except (OSError, ValueError):
            self.pending, self.xorbs, self.files, self.shards = {}, {}, {}, []
            return None
        return hashes

    def file_size(self, file_hash: str) -> int:
        return sum(s.unpacked for s in self.files[file_hash])

    def sign(self, xorb_hash: str, first: int, last: int) -> str:
        return hmac.new(self._url_key, f"{xorb_hash}:{first}-{last}".encode(), hashlib.sha256).hexdigest()

    def reconstruction(self, file_hash: str, start: int, end: int, base_url: str) -> dict | None:
        """QueryReconstructionResponseV2 for file bytes [start, end), None past the end (416).

        xorb_utils.rs compute_reconstruction_ranges: skip whole segments before `start`, trim
        whole chunks off the first and last segment, one term per segment, merge adjacent chunk
        ranges per xorb; offset_into_first_range is where `start` falls in the first chunk."""
        segments, size = self.files[file_hash], self.file_size(file_hash)
        if start >= size:
            return {"offset_into_first_range": 0, "terms": [], "xorbs": {}} if size == start == 0 else None
        end = min(end, size)
        index, cumulative = 0, 0
        while cumulative + segments[index].unpacked <= start:
            cumulative += segments[index].unpacked
            index += 1
        first_chunk_start = cumulative
        terms: list[dict] = []
        ranges: dict[str, list[list[int]]] = {}
        while index < len(segments) and cumulative < end:
            s = segments[index]
            xorb, first, last, unpacked = self.xorbs[s.xorb], s.start, s.end, s.unpacked
            if cumulative < start:
                while first < last and cumulative + xorb.sizes[first] <= start:
                    cumulative += xorb.sizes[first]
                    first_chunk_start += xorb.sizes[first]
                    unpacked -= xorb.sizes[first]
                    first += 1
            while last > first and cumulative + unpacked - xorb.sizes[last - 1] >= end:
                unpacked -= xorb.sizes[last - 1]
                last -= 1
            terms.append({"hash": s.xorb, "unpacked_length": unpacked, "range": {"start": first, "end": last}})
            ranges.setdefault(s.xorb, []).append([first, last])
            cumulative += unpacked
            index += 1
        xorbs = {}
        for xorb_hash, chunk_ranges in ranges.items():
            merged: list[list[int]] = []
            for first, last in sorted(chunk_ranges):
                if merged and first <= merged[-1][1]:
                    merged[-1][1] = max(merged[-1][1], last)
                else:
                    merged.append([first, last])
            offsets = self.xorbs[xorb_hash].offsets
            # One URL per range: the client then sends single-range requests, as it does by
            # default (`enable_multirange_fetching` off, file_term.rs).
            xorbs[xorb_hash] = [self._fetch(base_url, xorb_hash, first, last, offsets) for first, last in merged]
        return {"offset_into_first_range": start - first_chunk_start, "terms": terms, "xorbs": xorbs}

    def _fetch(self, base_url: str, xorb_hash: str, first: int, last: int, offsets: list[int]) -> dict:
        byte_first, byte_last = offsets[first], offsets[last] - 1
        url = (
            f"{base_url}/xorbs/default/{xorb_hash}?range={byte_first}-{byte_last}"
            f"&signature={self.sign(xorb_hash, byte_first, byte_last)}"
        )
        return {
            "url": url,
            "ranges": [{"chunks": {"start": first, "end": last}, "bytes": {"start": byte_first, "end": byte_last}}],
        }


def upload(contents: list[bytes], cas_url: str, token: str, expires: int) -> list[str]:
    """hf_xet 1.8.0 `upload_bytes` of each content to the CAS at cas_url; returns the Merkle hashes.

    As huggingface_hub 1.17.0 `_commit_api.py` `_upload_xet_files` calls it (endpoint, token
    info, refresher; the refresher is not needed within one token's lifetime)."""
    import warnings

    from hf_xet import upload_bytes

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 1.8.0 deprecates the legacy call
        infos = upload_bytes(contents, cas_url, (token, expires), None, None, "model")
    return [info.hash for info in infos]
