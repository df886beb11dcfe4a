"""STAND-IN for a dead man's switch service's ping endpoint (Healthchecks.io), for the lab only:
no outside service can be reached from the lab. It records every ping it gets, one JSON line each
in --log, so that a lab test sees the beats arrive and stop.

What is mirrored, from healthchecks/healthchecks v4.3 (github.com/healthchecks/healthchecks):
- the URLs, hc/api/urls.py `uuid_urls` under PING_ENDPOINT's /ping/ (hc/settings.py): /ping/<uuid>,
  /ping/<uuid>/fail, /start, /log and /<exit status>, any method (Alertmanager's webhook POSTs);
- the answers, hc/api/views.py `ping`: 200 "OK" with the headers Ping-Body-Limit and
  Access-Control-Allow-Origin: *, for a check that exists; 404 "not found" for a UUID no check has;
  400 "invalid url format" for an exit status over 255; the body kept up to PING_BODY_LIMIT (10000
  bytes, hc/settings.py), the rest dropped;
- a non-zero exit status is a failure ping (action "fail").
What is not: the checks' own schedule, grace time and the alert the service sends when the pings
stop (hc/api/models.py Check.get_status); the test reads the pings' times instead.
"""

from __future__ import annotations

import argparse
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PING_BODY_LIMIT = 10000  # hc/settings.py: PING_BODY_LIMIT default "10000"
PING = re.compile(r"^/ping/([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})(?:/(fail|start|log|\d+))?/?$")


def make_handler(checks: set[str], log_path: str):
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def _answer(self, status: int, text: str, headers: dict | None = None) -> None:
            body = text.encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _ping(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            path = self.path.split("?", 1)[0]
            if path == "/ready":
                self._answer(200, "heartbeat stand-in")
                return
            match = PING.match(path)
            if not match or match.group(1) not in checks:
                self._answer(404, "not found")
                return
            action = match.group(2) or "success"
            if action.isdigit():
                if int(action) > 255:
                    self._answer(400, "invalid url format")
                    return
                action = "fail" if int(action) > 0 else "success"
            record = {
                "at": time.time(),
                "method": self.command,
                "check": match.group(1),
                "action": action,
                "user_agent": self.headers.get("User-Agent", ""),
                "body": body[:PING_BODY_LIMIT].decode("utf-8", "replace"),
            }
            with lock, open(log_path, "a") as log:
                log.write(json.dumps(record) + "\n")
            self._answer(200, "OK", {"Ping-Body-Limit": str(PING_BODY_LIMIT), "Access-Control-Allow-Origin": "*"})

        do_GET = do_POST = do_HEAD = _ping

        def log_message(self, *args) -> None:
            pass

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser(description="STAND-IN: a Healthchecks.io-style ping endpoint that records pings")
    parser.add_argument("--bind", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--check", action="append", default=[], help="UUID of a check that exists (repeatable)")
    parser.add_argument("--log", required=True, help="JSON lines, one per accepted ping")
    args = parser.parse_args()
    server = ThreadingHTTPServer((args.bind, args.port), make_handler(set(args.check), args.log))
    server.serve_forever()


if __name__ == "__main__":
    main()
