"""The SGLang stand-in serves TLS as uvicorn does for SGLang 0.5.10+ (--ssl-certfile/--ssl-keyfile,
lab/standins/sglang_server/server.py): a client verifying with the CA gets its answer, a plain HTTP
client gets no answer, and a client without the CA fails verification. Real sockets on loopback."""

from __future__ import annotations

import http.client
import socket
import ssl
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler

import pytest

from lab.standins.sglang_server import standin_tls as standin
from lab.tls_ca import make_tls_material


class Ok(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


@pytest.fixture
def tls_server(tmp_path):
    material = make_tls_material(["localhost", "127.0.0.1"])
    for name, text in (("ca.pem", material.ca_pem), ("cert.pem", material.cert_pem), ("key.pem", material.key_pem)):
        (tmp_path / name).write_text(text)
    context = standin.server_context(str(tmp_path / "cert.pem"), str(tmp_path / "key.pem"))
    server = standin.TlsHTTPServer(("127.0.0.1", 0), Ok, context)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1], tmp_path / "ca.pem"
    server.shutdown()


def test_https_with_the_ca_succeeds(tls_server):
    port, ca = tls_server
    context = ssl.create_default_context(cafile=str(ca))
    with urllib.request.urlopen(f"https://localhost:{port}/health", context=context, timeout=10) as answer:
        assert answer.status == 200 and answer.read() == b"ok"


def test_plain_http_gets_no_answer(tls_server):
    port, _ = tls_server
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    with pytest.raises((http.client.RemoteDisconnected, ConnectionResetError, http.client.BadStatusLine)):
        connection.request("GET", "/health")
        connection.getresponse()


def test_without_the_ca_verification_fails(tls_server):
    port, _ = tls_server
    context = ssl.create_default_context()  # the system's CAs only: not the lab's CA
    with pytest.raises(urllib.error.URLError) as error:
        urllib.request.urlopen(f"https://localhost:{port}/health", context=context, timeout=10)
    assert isinstance(error.value.reason, ssl.SSLCertVerificationError)


def test_a_name_the_certificate_does_not_cover_fails_verification(tls_server):
    port, ca = tls_server
    context = ssl.create_default_context(cafile=str(ca))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch"):
            context.wrap_socket(raw, server_hostname="other.example")


@pytest.mark.parametrize(
    ("cert", "key", "expected"),
    [
        ("c", None, "--ssl-certfile requires --ssl-keyfile"),
        (None, "k", "--ssl-keyfile requires --ssl-certfile"),
        ("/nonexistent.crt", "/nonexistent.key", "SSL key file not found"),
    ],
)
def test_the_options_are_checked_as_0_5_10_does(cert, key, expected):
    assert expected in (standin.ssl_problem(cert, key) or "")
    assert standin.ssl_problem(None, None) is None
