"""inference-host's alert relay: Alertmanager posts a webhook to http://127.0.0.1:<port>/<receiver>,
and this relay forwards the body to that receiver's real URL, which only this program reads (a 0600
JSON file of its own system user, written by roles/monitoring from the vault).

Why it exists: a webhook receiver's URL is its credential (a Healthchecks ping UUID, a Slack
incoming-webhook path, a chat bridge's token), and Alertmanager prints the URL when a delivery
fails. In prometheus/alertmanager v0.25.0 notify/webhook/webhook.go returns the error of
notify.PostJSON unchanged; that is Go's *url.Error, whose text is `Post "<url>": <cause>`, and
notify/notify.go logs it ("Notify attempt failed, will retry later" ... err=...). v0.26.0 wraps it in
notify.RedactURL (notify/util.go: the *url.Error's URL becomes "<redacted>"), but only that error:
an HTTP error status is still logged with the receiver's whole response body (notify/util.go
Retrier.Check, "unexpected status code %v: %s"). Through this relay Alertmanager holds, sends to and
logs only a loopback URL, and the relay logs the receiver's name and an outcome, never a URL, a
host name, an exception's text or a response body.

Standard library only: it runs on the distribution's python3 (python3 -I), nothing installed.

Config file: {"receivers": {"<name>": "<http(s) URL>", ...}, "token": "<this host's relay token>"};
names [a-z][a-z0-9_-]{0,31}. Only Alertmanager posts here: it sends `Authorization: Bearer <token>`
(its receiver's http_config `authorization: {credentials_file: ...}`, a 0600 file of its own user);
a request without the token is answered 401, sent nowhere, and counted: the count is logged with
each refusal, so a forged "resolved" notice or a heartbeat kept alive by another local process is
seen in the journal.
Answers to Alertmanager (so its retry rules work as with a direct delivery, notify/util.go
Retrier.Check: 5xx retried, 4xx not):
- the receiver's 2xx: 200; its 4xx or 5xx: the same status;
- a redirect (not followed), no answer within --timeout, or a network failure: 502 / 504;
- the body is always the relay's own short text, never the receiver's.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import errno
import hmac
import http.client
import json
import re
import socket
import ssl
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

NAME = re.compile(r"[a-z][a-z0-9_-]{0,31}")
MAX_BODY = 8 * 1024 * 1024  # Alertmanager's webhook message for a large group (max_alerts 0)
MAX_ANSWER = 64 * 1024  # read of the receiver's answer, discarded
FORWARDED_HEADERS = ("Content-Type", "User-Agent")


class ConfigError(Exception):
    """The config file is unusable: the message names the file and the receiver, never a value."""


MIN_TOKEN = 32  # characters; the deploy writes 64 hex digits


def load_config(path: str) -> tuple[dict[str, str], str]:
    """(name -> URL, the token), from the JSON config file; ConfigError (no value in its text)."""
    receivers = load_receivers(path)
    with open(path, encoding="utf-8") as handle:
        token = json.load(handle).get("token")
    if not isinstance(token, str) or len(token) < MIN_TOKEN or not token.isascii() or not token.isprintable():
        raise ConfigError(f"{path}: expected a token of at least {MIN_TOKEN} printable characters (not shown)")
    return receivers, token


def load_receivers(path: str) -> dict[str, str]:
    """name -> URL, from the JSON config file; ConfigError (no value in its text) when wrong."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except OSError as error:
        raise ConfigError(f"{path}: cannot be read ({errno.errorcode.get(error.errno or 0, 'error')})") from None
    except (ValueError, UnicodeDecodeError):
        raise ConfigError(f'{path}: not JSON; expected {{"receivers": {{name: URL}}}}') from None
    receivers = data.get("receivers") if isinstance(data, dict) else None
    if not isinstance(receivers, dict) or not receivers:
        raise ConfigError(f'{path}: expected {{"receivers": {{name: URL}}}} with at least one receiver')
    for name, url in receivers.items():
        if not NAME.fullmatch(name):
            raise ConfigError(f"{path}: a receiver name is not [a-z][a-z0-9_-]{{0,31}} (not shown)")
        if not _is_one_url(url):
            raise ConfigError(f"{path}: receiver {name}: its value is not one http(s) URL (not shown)")
    return dict(receivers)


def _is_one_url(url: object) -> bool:
    if not isinstance(url, str) or not url.isascii() or any(c.isspace() or ord(c) < 32 for c in url):
        return False
    parts = urllib.parse.urlsplit(url)
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def failure(error: BaseException, timeout: float) -> tuple[int, str]:
    """(status for Alertmanager, what happened): a category from the exception's type and errno,
    never its text (urllib's and ssl's texts can hold the host, http.client's the URL)."""
    if isinstance(error, urllib.error.URLError) and isinstance(error.reason, BaseException):
        error = error.reason
    if isinstance(error, (TimeoutError, socket.timeout)):
        return 504, f"no answer within {timeout:g} s"
    if isinstance(error, socket.gaierror):
        return 502, "name resolution failed"
    if isinstance(error, ssl.SSLCertVerificationError):
        return 502, "TLS certificate not trusted"
    if isinstance(error, ssl.SSLError):
        return 502, "TLS error"
    if isinstance(error, ConnectionRefusedError):
        return 502, "connection refused"
    if isinstance(error, ConnectionResetError):
        return 502, "connection reset"
    if isinstance(error, http.client.HTTPException):
        return 502, f"bad HTTP answer ({type(error).__name__})"
    if isinstance(error, OSError) and error.errno is not None and error.errno in errno.errorcode:
        return 502, f"network error ({errno.errorcode[error.errno]})"
    return 502, f"failed ({type(error).__name__})"


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is an answer, not followed: a receiver's URL does not move silently."""

    def redirect_request(self, *args, **kwargs):
        return None


def _opener() -> urllib.request.OpenerDirector:
    # No proxy from the environment (the unit sets none); the system's CA store for HTTPS.
    return urllib.request.build_opener(
        urllib.request.ProxyHandler({}),
        urllib.request.HTTPSHandler(context=ssl.create_default_context()),
        _NoRedirect(),
    )


def forward(url: str, body: bytes, headers: dict[str, str], timeout: float) -> tuple[int, str]:
    """POST body to url: (status for Alertmanager, outcome without the URL)."""
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with _opener().open(request, timeout=timeout) as answer:
            answer.read(MAX_ANSWER)
            return 200, f"HTTP {answer.status}"
    except urllib.error.HTTPError as error:
        code = error.code
        error.close()
        if 300 <= code < 400:
            return 502, f"HTTP {code} (a redirect, not followed)"
        return (code if 400 <= code < 600 else 502), f"HTTP {code}"
    except Exception as error:  # every failure is a category, never the exception's text
        return failure(error, timeout)


class Relay:
    """The receivers and the bounds; one worker pool so that a slow receiver holds a worker, not the server."""

    def __init__(self, receivers: dict[str, str], timeout: float, log=None, token: str | None = None):
        self.receivers = receivers
        self.timeout = timeout
        self.token = token
        self.refused = 0  # requests without the token, since the start
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=8)
        self.failing: set[str] = set()
        self.lock = threading.Lock()
        self.log = log or (lambda line: print(line, file=sys.stderr, flush=True))

    def deliver(self, name: str, body: bytes, headers: dict[str, str]) -> tuple[int, str]:
        # The whole delivery within twice the per-operation timeout (connect, send, each read):
        # a receiver that trickles its answer cannot hold Alertmanager longer.
        future = self.pool.submit(forward, self.receivers[name], body, headers, self.timeout)
        try:
            status, outcome = future.result(timeout=2 * self.timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()  # still queued behind slow deliveries: never sent late
            status, outcome = 504, f"no complete answer within {2 * self.timeout:g} s"
        self._note(name, status, outcome)
        return status, outcome

    def admits(self, authorization: str | None) -> bool:
        """Whether a request carries the token (`Bearer <token>`, compared in constant time); a
        refusal is counted and logged with the count (never what was sent)."""
        scheme, _, presented = (authorization or "").partition(" ")
        if self.token is None or (scheme.lower() == "bearer" and hmac.compare_digest(presented, self.token)):
            return True
        with self.lock:
            self.refused += 1
            count = self.refused
        self.log(f"refused a request without the relay's token (401; {count} refused since the start)")
        return False

    def _note(self, name: str, status: int, outcome: str) -> None:
        """Failures every time; a success only when it ends a run of failures (a heartbeat every
        minute would otherwise fill the journal)."""
        with self.lock:
            if status == 200:
                if name in self.failing:
                    self.failing.discard(name)
                    self.log(f"receiver {name}: delivered again ({outcome})")
                return
            self.failing.add(name)
        retried = "Alertmanager retries" if status >= 500 else "Alertmanager does not retry"
        self.log(f"receiver {name}: delivery failed: {outcome} ({retried})")


def handler_for(relay: Relay) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = relay.timeout  # a client that stops sending mid-request is dropped

        def do_POST(self):
            if not relay.admits(self.headers.get("Authorization")):
                return self._answer(401, "relay: the relay's token is required")
            name = self.path.strip("/")
            if name not in relay.receivers:
                # The path is not echoed: only Alertmanager, with the names we wrote, posts here.
                return self._answer(404, "relay: no such receiver")
            length = self.headers.get("Content-Length", "")
            if not length.isdigit():
                return self._answer(411, "relay: Content-Length required")
            if int(length) > MAX_BODY:
                return self._answer(413, f"relay: body over {MAX_BODY} bytes")
            body = self.rfile.read(int(length))
            headers = {k: v for k in FORWARDED_HEADERS if (v := self.headers.get(k)) is not None}
            status, outcome = relay.deliver(name, body, headers)
            self._answer(status, f"relay: receiver {name}: {outcome}")

        def do_GET(self):
            self._answer(405, "relay: POST only")

        def _answer(self, status: int, text: str) -> None:
            data = (text + "\n").encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):  # the access log would repeat every heartbeat
            pass

    return Handler


def serve(
    receivers: dict[str, str], host: str, port: int, timeout: float, log=None, token: str | None = None
) -> ThreadingHTTPServer:
    """token None: every request is taken (the unit tests of delivery); main() always has one."""
    server = ThreadingHTTPServer((host, port), handler_for(Relay(receivers, timeout, log, token)))
    server.daemon_threads = True
    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="JSON: {receivers: {name: URL}, token: TOKEN} (0600)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (loopback)")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per network operation")
    args = parser.parse_args(argv)
    try:
        receivers, token = load_config(args.config)
    except ConfigError as error:
        print(f"alert relay: {error}", file=sys.stderr)
        return 2
    server = serve(receivers, args.host, args.port, args.timeout, token=token)
    print(
        f"alert relay: listening on {args.host}:{args.port} for {', '.join(sorted(receivers))}",
        file=sys.stderr,
        flush=True,
    )
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
