"""STAND-IN for SGLang's TLS (lab only; lab/standins/sglang_server/server.py uses it).

SGLang 0.5.10 and later (0.5.9 has no such option, so the stand-in's argparse refuses it there): with
--ssl-certfile and --ssl-keyfile the server speaks only HTTPS, as SGLang's http_server.py does by
handing both to uvicorn.run, whose create_ssl_context (uvicorn/config.py) builds an
SSLContext(PROTOCOL_TLS_SERVER) with load_cert_chain(certfile, keyfile), no client certificate
asked (CERT_NONE) and set_ciphers("TLSv1"); a client that does not complete the handshake (plain
HTTP) gets its connection closed without an answer. The options are checked as 0.5.10's
ServerArgs._handle_ssl_validation does (one without the other, a missing file: ValueError), here
before the server listens (SGLang does it before the model loads).
"""

from __future__ import annotations

import os
import ssl
import sys
from http.server import ThreadingHTTPServer


def ssl_problem(certfile: str | None, keyfile: str | None) -> str | None:
    """0.5.10's ServerArgs._handle_ssl_validation (srt/server_args.py), for the two options the deploy sets."""
    if keyfile and not certfile:
        return "--ssl-keyfile requires --ssl-certfile to be specified as well."
    if certfile and not keyfile:
        return "--ssl-certfile requires --ssl-keyfile to be specified as well."
    if keyfile and not os.path.isfile(keyfile):
        return f"SSL key file not found: '{keyfile}'. Please check the --ssl-keyfile path."
    if certfile and not os.path.isfile(certfile):
        return f"SSL certificate file not found: '{certfile}'. Please check the --ssl-certfile path."
    return None


def server_context(certfile: str, keyfile: str) -> ssl.SSLContext:
    """uvicorn's create_ssl_context with the defaults SGLang leaves (uvicorn/config.py)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certfile, keyfile)
    context.verify_mode = ssl.CERT_NONE
    context.set_ciphers("TLSv1")
    return context


class TlsHTTPServer(ThreadingHTTPServer):
    """HTTPS only: the handshake runs in the request's own thread; one that fails (a plain HTTP
    client, a client that does not trust the certificate) closes the connection unanswered."""

    def __init__(self, address, handler, context: ssl.SSLContext):
        super().__init__(address, handler)
        self.context = context

    def finish_request(self, request, client_address):
        try:
            tls = self.context.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError):
            return
        try:
            super().finish_request(tls, client_address)
        finally:
            tls.close()


def make_server(args, address, handler) -> ThreadingHTTPServer:
    """The stand-in's HTTP server: HTTPS only with --ssl-certfile/--ssl-keyfile (which exit 1 with
    SGLang's own message when one is missing or not a file), else plain HTTP."""
    certfile, keyfile = getattr(args, "ssl_certfile", None), getattr(args, "ssl_keyfile", None)
    problem = ssl_problem(certfile, keyfile)
    if problem:
        print(f"ValueError: {problem}", file=sys.stderr, flush=True)
        raise SystemExit(1)
    if certfile and keyfile:
        return TlsHTTPServer(address, handler, server_context(certfile, keyfile))
    return ThreadingHTTPServer(address, handler)
