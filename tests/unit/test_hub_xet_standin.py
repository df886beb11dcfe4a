"""The Hub stand-in's Xet half (lab/standins/hf_hub/xet.py, server.py --xet) against the REAL clients.

huggingface_hub 1.17.0 and hf_xet 1.8.0 from PyPI (the project's dev group pins the versions
roles/weights installs; a test holds the two to each other) download from the stand-in on
127.0.0.1. Nothing on the client side is substituted: the stand-in is the only stand-in (for the Hub and
its CAS), and the files it serves were chunked and hashed by hf_xet's own upload. The byte counts
that docs/weights-resume.md quotes come from the stand-in's counters, checked here against its log
and against what the client wrote."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
import urllib.error
import urllib.request
from importlib.metadata import version

import pytest

from lab.standins import hf_hub
from lab.standins.hf_hub import measure_resume, xet
from lab.standins.hf_hub import server as hub_server
from roles import weights
from tests.unit.conftest import PROJECT_ROOT

REPO = hf_hub.MODEL_REPO
SHARD = "model-00002-of-00002.safetensors"  # 20 MiB + 12345 bytes: no piece of it is round
CONTENT = hub_server.generate(REPO, hub_server.LAB_REPOS[REPO]).files[SHARD].content
DOWNLOAD = """
import sys
from huggingface_hub import hf_hub_download
print(hf_hub_download(sys.argv[1], sys.argv[2], revision=sys.argv[3], local_dir=sys.argv[4]))
"""


@pytest.fixture(scope="module", autouse=True)
def xet_cache(tmp_path_factory):
    """hf_xet's working files (logs, staging) of this process go to a temporary folder, not ~/.cache
    (read once, when hf_xet's runtime starts)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_XET_CACHE", str(tmp_path_factory.mktemp("xet-cache")))
        yield


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """The stand-in with --xet, unthrottled; yields (url, log path)."""
    folder = tmp_path_factory.mktemp("hub")
    server, url, log = measure_resume.serve(folder, rate=0)
    yield url, log
    server.terminate()
    server.wait(timeout=10)


def _download(hub, tmp_path, disable_xet: bool, **env_extra: str) -> tuple[bytes, dict, str]:
    """hf_hub_download in a fresh process; returns the file, the counters' deltas, the log lines."""
    url, log = hub
    env = {**measure_resume.client_env("http" if disable_xet else "xet", url, tmp_path), **env_extra}
    before, mark = measure_resume._counters(url), len(log.read_text())
    done = subprocess.run(
        [sys.executable, "-c", DOWNLOAD, REPO, SHARD, hf_hub.commit_of(REPO), str(tmp_path / "local")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    after = measure_resume._counters(url)
    path = done.stdout.strip().splitlines()[-1]
    with open(path, "rb") as f:
        data = f.read()
    return data, {k: after[k] - before[k] for k in after}, log.read_text()[mark:]


@pytest.mark.parametrize("api", ["2", "1"])
def test_huggingface_hub_downloads_through_hf_xet_byte_exact(hub, tmp_path, api):
    """hf_xet asks for a v2 reconstruction (v1 is its fallback; forced here by its own setting)."""
    data, sent, log = _download(hub, tmp_path, disable_xet=False, HF_XET_CLIENT_RECONSTRUCTION_API_VERSION=api)
    assert data == CONTENT
    # It went through hf_xet: a reconstruction, then the xorb bytes from the presigned URL.
    assert re.search(r'"GET /api/models/[^ ]+/xet-read-token/[0-9a-f]{40} HTTP', log)
    assert re.search(rf'"GET /v{api}/reconstructions/[0-9a-f]{{64}} HTTP/1.1" 200', log)
    xorbs = [int(n) for n in re.findall(r"sent (\d+) of \d+ bytes of /xorbs/default/[0-9a-f]{64}", log)]
    assert xorbs and sent["xet"] == sum(xorbs)
    assert sent["http"] == 0 and "/lfs-cdn/" not in log
    # Each chunk costs its 8-byte header on the wire; random bytes are stored uncompressed.
    assert len(CONTENT) < sent["xet"] < len(CONTENT) * 1.001
    assert 0 < sent["xet_api"] < 10_000


def test_disable_xet_downloads_the_same_file_over_http_from_the_same_hub(hub, tmp_path):
    data, sent, log = _download(hub, tmp_path, disable_xet=True)
    assert data == CONTENT
    assert sent["http"] == len(CONTENT) and sent["xet"] == 0 and sent["xet_api"] == 0
    assert f"sent {len(CONTENT)} of {len(CONTENT)} bytes of /lfs-cdn/" in log
    assert "xet-read-token" not in log


def _head(url: str) -> dict:
    class Keep(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args):
            return None

    try:
        urllib.request.build_opener(Keep).open(
            urllib.request.Request(f"{url}/{REPO}/resolve/main/{SHARD}", method="HEAD")
        )
    except urllib.error.HTTPError as answer:
        assert answer.code == 302
        return dict(answer.headers)
    raise AssertionError("the resolve HEAD of an LFS file must answer 302")


def _token(url: str) -> dict:
    with urllib.request.urlopen(f"{url}/api/models/{REPO}/xet-read-token/main") as answer:
        body = json.load(answer)
        assert answer.headers["X-Xet-Access-Token"] == body["accessToken"]
        assert answer.headers["X-Xet-Cas-Url"] == body["casUrl"] == url
    return body


def test_hf_xet_reads_byte_ranges_of_the_file(hub):
    """hf_xet's own ranged reads (XetSession download streams) hold the stand-in's reconstruction
    of a byte range (ported from xet-core's compute_reconstruction_ranges) to the real client."""
    import hf_xet

    url = hub[0]
    file_hash, token = _head(url)["X-Xet-Hash"], _token(url)
    group = hf_xet.XetSession().new_download_stream_group(
        endpoint=token["casUrl"], token=token["accessToken"], token_expiry_unix_secs=token["exp"]
    )
    info = hf_xet.XetFileInfo(file_hash, len(CONTENT))
    for start, end in ((12345, 777777), (5_000_001, 20_000_000), (len(CONTENT) - 10, None)):
        assert b"".join(group.download_stream(info, start, end)) == CONTENT[start:end], (start, end)


def test_cas_refuses_a_wrong_token_and_a_range_it_did_not_sign(hub):
    url = hub[0]
    file_hash = _head(url)["X-Xet-Hash"]
    wrong = urllib.request.Request(
        f"{url}/v2/reconstructions/{file_hash}", headers={"Authorization": "Bearer not-the-token"}
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(wrong)
    assert refused.value.code == 401
    right = urllib.request.Request(
        f"{url}/v2/reconstructions/{file_hash}", headers={"Authorization": f"Bearer {_token(url)['accessToken']}"}
    )
    with urllib.request.urlopen(right) as answer:
        fetch = next(iter(json.load(answer)["xorbs"].values()))[0]
    signed = fetch["ranges"][0]["bytes"]
    with urllib.request.urlopen(
        urllib.request.Request(fetch["url"], headers={"Range": f"bytes={signed['start']}-{signed['end']}"})
    ) as answer:
        assert answer.status == 206
    wider = urllib.request.Request(fetch["url"], headers={"Range": f"bytes=0-{signed['end']}"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(wider)
    assert refused.value.code == 403


def test_a_shard_that_is_not_one_is_refused_with_the_reason():
    with pytest.raises(xet.XetFormatError, match="not an MDB shard"):
        xet.parse_shard(b"\0" * 100)
    store = xet.XetStore()
    header = xet.SHARD_HEADER_TAG + b"\2" + b"\0" * 15
    file_entry = b"\1" * 32 + (1).to_bytes(4, "little") * 2 + b"\0" * 8  # names one segment ...
    segment = (
        b"\2" * 32 + b"\0" * 4 + (100).to_bytes(4, "little") + (0).to_bytes(4, "little") + (1).to_bytes(4, "little")
    )
    with pytest.raises(xet.XetFormatError, match="unknown xorb"):  # ... of a xorb never uploaded
        store.add_shard(header + file_entry + segment + xet.BOOKEND + b"\0" * 16 + xet.BOOKEND + b"\0" * 16)


def test_merkle_hex_is_xet_cores_word_order():
    """data_hash.rs hex(): 4 u64 words read little-endian, each printed big-endian."""
    raw = bytes(range(32))
    assert xet.merkle_hex(raw) == "07060504030201000f0e0d0c0b0a090817161514131211101f1e1d1c1b1a1918"


@pytest.mark.parametrize("mode", ["http", "http-no-range", "xet"])
def test_a_killed_download_costs_what_docs_weights_resume_says(mode):
    """measure_resume's kill mid-shard and restart, once per path, fast (the figures in the doc
    are from 3 throttled runs each): HTTP asks for the rest with Range and gets 206; behind a CDN
    that ignores Range it gets 200 and the whole file, and starts it over; Xet starts over."""
    # The stand-in holds the path at the kill's byte (server.py Hub.holds): before it did, a kill
    # that polled the counter came after the whole shard at load 18.
    result = measure_resume.measure(sys.executable, mode, kill_at=18_000_000, rate=12_000_000)
    assert result["byte_exact"] and result["other_path"] == 0
    size, kept = result["size"], result["incomplete_at_kill"]
    assert 18_000_000 <= result["first_sent"] < size
    if mode == "http-no-range":
        assert kept > 0 and kept % (10 * 1024 * 1024) == 0  # it had a piece to resume from...
        assert result["second_answers"] == [(size, 0, 200)]  # ...asked for the rest, got everything
        assert result["refetched"] == size
    elif mode == "http":
        assert kept % (10 * 1024 * 1024) == 0  # file_download.py writes DOWNLOAD_CHUNK_SIZE pieces
        # A kept piece is asked for with Range (206); none kept: the whole file again (200).
        assert result["second_answers"] == [(size - kept, kept, 206 if kept else 200)]
        assert result["refetched"] == size - kept
    else:
        assert result["incomplete_at_kill"] == 0 and result["reconstruction_json"] > 0
        assert result["refetched"] > size  # every chunk again, with its header


def test_dev_pins_are_the_weights_roles_pins():
    """The unit tier tests the versions roles/weights installs, and runs them."""
    dev = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["dependency-groups"]["dev"]
    assert f"huggingface-hub=={weights.HF_HUB_VERSION}" in dev
    assert f"hf-xet=={weights.HF_XET_VERSION}" in dev
    assert version("huggingface_hub") == weights.HF_HUB_VERSION
    assert version("hf_xet") == weights.HF_XET_VERSION


def _in_a_process_of_its_own(body: str, tmp_path) -> None:
    """Runs `body` (a function of this module) in a fresh Python. These two serve the stand-in
    from a thread of their own process while hf_xet, compiled code, blocks the calling thread:
    once any test of the session has imported pyinfra's CLI (pyinfra_cli/__init__.py calls
    gevent's monkey.patch_all()), that thread is a greenlet that never runs, and the download
    waits forever (seen: the unit tier stopped there until pytest's timeout)."""
    code = f"import pathlib, tests.unit.test_hub_xet_standin as m; m.{body}(pathlib.Path({str(tmp_path)!r}))"
    done = subprocess.run([sys.executable, "-c", code], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def test_hf_xet_does_not_check_chunk_hashes_on_download(tmp_path):
    """A byte flipped in a stored xorb reaches the file unnoticed (see the body below)."""
    _in_a_process_of_its_own("_flipped_xorb_byte_reaches_the_file", tmp_path)


def _flipped_xorb_byte_reaches_the_file(tmp_path):
    """A byte flipped in a stored xorb reaches the file unnoticed: hf_xet 1.8.0 checks lengths on
    download, not hashes (docs/upstream.md). roles/weights' own SHA-256 verification is what
    catches it (docs/weights.md, "Verification"). The stand-in runs in this process here, so
    that the test can corrupt what it stores."""
    import threading
    from http.server import ThreadingHTTPServer

    import hf_xet

    hub_server.Handler.hub = hub = hub_server.Hub(tmp_path, None, xet=True)
    server = ThreadingHTTPServer(("127.0.0.1", 0), hub_server.Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        hub.publish_xet(url)
        f = hub.repos[REPO].files[SHARD]
        first = hub.xet.files[f.xet_hash][0]
        xorb = hub.xet.xorbs[first.xorb]
        at = xorb.offsets[first.start] + xet.CHUNK_HEADER_SIZE + 1000
        assert xorb.data[xorb.offsets[first.start] + 4] == 0  # stored uncompressed (random bytes)
        xorb.data = xorb.data[:at] + bytes([xorb.data[at] ^ 0xFF]) + xorb.data[at + 1 :]
        group = hf_xet.XetSession().new_download_stream_group(
            endpoint=url, token=hub.xet.token, token_expiry_unix_secs=hub.xet.expires
        )
        data = b"".join(group.download_stream(hf_xet.XetFileInfo(f.xet_hash, f.size)))
    finally:
        server.shutdown()
    assert len(data) == len(CONTENT) and data != CONTENT
    assert [i for i in range(0, len(data), 4096) if data[i : i + 4096] != CONTENT[i : i + 4096]] == [0]


def test_a_restarted_stand_in_serves_what_it_stored_without_uploading(tmp_path):
    """Each lab deploy serves the stand-in anew (see the body below)."""
    _in_a_process_of_its_own("_restarted_stand_in_reads_back", tmp_path)


def _restarted_stand_in_reads_back(tmp_path):
    """Each lab deploy serves the stand-in anew; it reads back the xorbs and shard it stored
    (through the same checks as an upload) instead of uploading again."""
    import threading
    from http.server import ThreadingHTTPServer

    hub_server.Handler.hub = first = hub_server.Hub(tmp_path, None, xet=True)
    server = ThreadingHTTPServer(("127.0.0.1", 0), hub_server.Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        first.publish_xet(f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
    again = hub_server.Hub(tmp_path, None, xet=True)
    again.publish_xet("http://127.0.0.1:9")  # nothing listens there: an upload would fail
    for repo_id, repo in first.repos.items():
        for path, f in repo.files.items():
            assert again.repos[repo_id].files[path].xet_hash == f.xet_hash
    assert again.xet.xorbs.keys() == first.xet.xorbs.keys() and again.xet.files == first.xet.files
    # A content it has not stored (another repository spec): nothing is read back, it uploads.
    assert xet.XetStore().load(tmp_path / "xet", ["0" * 64]) is None
