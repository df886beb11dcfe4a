"""fetch_source.py (inside the flash-attn build) against an index on the loopback: the archive is
unpacked only when it has the sha256 the stack file pins. An index that lists another digest, an
archive that differs from the pin (whatever the index says), and no pin at all are each refused
in one line naming both digests, before anything is unpacked."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import tarfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.unit.conftest import PROJECT_ROOT

SCRIPT = PROJECT_ROOT / "roles" / "wheels" / "docker" / "wheels" / "fetch_source.py"


def _archive(text: str) -> bytes:
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as tar:
        body = text.encode()
        info = tarfile.TarInfo("flash_attn-2.8.3/setup.py")
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))
    return data.getvalue()


GOOD = _archive("print('the release')\n")
TAMPERED = _archive("print('something else')\n")
PIN = hashlib.sha256(GOOD).hexdigest()


@pytest.fixture
def index(monkeypatch):
    """A PyPI-like index on 127.0.0.1: the JSON API and the archive; what it serves is set per test."""
    served = {"archive": GOOD, "listed": PIN}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            port = self.server.server_address[1]
            if self.path == "/pypi/flash-attn/2.8.3/json":
                url = f"http://127.0.0.1:{port}/files/flash_attn-2.8.3.tar.gz"
                item = {"packagetype": "sdist", "url": url, "digests": {"sha256": served["listed"]}}
                body = json.dumps({"urls": [item]}).encode()
            elif self.path == "/files/flash_attn-2.8.3.tar.gz":
                body = served["archive"]
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{server.server_address[1]}/simple")
    monkeypatch.delenv("NETRC", raising=False)
    yield served
    server.shutdown()


def _fetch():
    spec = importlib.util.spec_from_file_location("fetch_source", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_pinned_archive_is_unpacked(index, tmp_path):
    _fetch().main("flash-attn", "2.8.3", str(tmp_path / "src"), PIN)
    assert (tmp_path / "src" / "setup.py").read_text() == "print('the release')\n"


def test_a_tampered_archive_is_refused_even_when_the_index_vouches_for_it(index, tmp_path):
    index["archive"], index["listed"] = TAMPERED, hashlib.sha256(TAMPERED).hexdigest()
    with pytest.raises(SystemExit) as refused:
        _fetch().main("flash-attn", "2.8.3", str(tmp_path / "src"), PIN)
    assert str(refused.value) == (
        f"fetch_source: the index lists flash-attn 2.8.3 with sha256 {index['listed']}, not the pinned {PIN}"
    )
    assert not (tmp_path / "src").exists()


def test_an_archive_that_differs_from_the_pin_is_refused(index, tmp_path):
    index["archive"] = TAMPERED  # the index still lists the pinned digest
    with pytest.raises(SystemExit) as refused:
        _fetch().main("flash-attn", "2.8.3", str(tmp_path / "src"), PIN)
    message = str(refused.value)
    assert hashlib.sha256(TAMPERED).hexdigest() in message and f"not the pinned {PIN}" in message
    assert "\n" not in message and not (tmp_path / "src").exists()


def test_no_pin_is_refused(index, tmp_path):
    with pytest.raises(SystemExit) as refused:
        _fetch().main("flash-attn", "2.8.3", str(tmp_path / "src"), "")
    assert "no sha256 pinned for flash-attn 2.8.3" in str(refused.value)


def test_the_stack_file_s_pin_reaches_the_build():
    from roles.shared.wheel_plan import planned_builds
    from roles.site import load_stack
    from roles.site.sections.build import BuildSettings

    stack = load_stack(PROJECT_ROOT / "inventory" / "stack.yml")
    (flash,) = [b for b in planned_builds(stack.active, BuildSettings()) if b.package == "flash-attn"]
    assert flash.build_args["FLASH_ATTN_SHA256"] == stack.active.flash_attn_sha256
    dockerfile = (PROJECT_ROOT / "roles" / "wheels" / "docker" / "flash-attn.Dockerfile").read_text()
    assert f"ARG FLASH_ATTN_SHA256={stack.active.flash_attn_sha256}" in dockerfile
