"""STAND-IN for `python -m sglang.launch_server` (lab only: there is no GPU here).

Mirrors the interface the deploy and the health checks rely on, from SGLang's own sources:
- the command line: the pinned release's real options (captured from its wheel into
  roles/serving/cli/<version>.json, copied beside this file as cli/); an unknown flag or a
  bad choice exits 2 as argparse does; `--config FILE` merges options from a YAML (here JSON)
  file as sglang's ConfigArgumentMerger does;
- python/sglang/srt/entrypoints/http_server.py: /health, /health_generate (503 until
  loaded), /v1/models, /model_info, /get_model_info, /generate, /v1/chat/completions,
  /metrics (only with --enable-metrics);
- the start-up log: the `server_args=...` line of the installed release, built from that
  release's own (patched) source (startup_log.py says how);
- python/sglang/srt/utils/auth.py: with --api-key, every path but /health* and /metrics
  needs `Authorization: Bearer <key>`, else 401 {"error": "Unauthorized"}.

The version it reports is the sglang distribution installed in the interpreter running it
(the real wheel the deploy put into the environment). Generated text is deterministic and
varied (no repeated token loop), so a server check that looks at text can pass or fail.

Lab-only knobs (environment, set through serving_extra_env):
  INFERENCE_HOST_STANDIN_LOAD_SECONDS    seconds before /health_generate answers 200 (default 2)
  INFERENCE_HOST_STANDIN_NEVER_HEALTHY   comma list of sglang versions that never get ready
  INFERENCE_HOST_STANDIN_STUBBORN_CHILD  1: spawn a child that ignores SIGTERM (orphan test)
Never installed by a production path: only lab/ copies it into the rehearsal container.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from startup_log import log_server_args  # noqa: E402 - beside this file on the host, not a package

WORDS = ["the", "quick", "model", "answers", "every", "prompt", "with", "care", "while", "tensors", "flow", "across", "eight", "cards", "and", "the", "scheduler", "keeps", "batches", "full", "so", "tokens", "stream", "steadily", "to", "each", "client", "without", "stalls", "or", "repeated", "phrases"]


def installed_version() -> str:
    return metadata.version("sglang")


def build_parser(version: str) -> argparse.ArgumentParser:
    table = json.loads((HERE / "cli" / f"{version}.json").read_text())
    parser = argparse.ArgumentParser(prog="sglang.launch_server (stand-in)")
    for flag, option in table["options"].items():
        if flag in ("-h", "--help"):
            continue
        if option["takes_value"]:
            choices = [str(c) for c in option["choices"]] if option["choices"] else None
            parser.add_argument(flag, choices=choices)
        else:
            parser.add_argument(flag, action="store_true")
    return parser


def merge_config(argv: list[str]) -> list[str]:
    """`--config FILE`: its options go after the command line's, as in sglang."""
    if "--config" not in argv:
        return argv
    index = argv.index("--config")
    config = json.loads(Path(argv[index + 1]).read_text())
    extra = []
    for key, value in config.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            extra.append(flag)
        elif value is not False:
            extra += [flag, str(value)]
    return argv[: index] + argv[index + 2:] + extra


def generate_text(prompt: str, max_tokens: int) -> list[str]:
    seed = int(hashlib.sha256(prompt.encode()).hexdigest(), 16)
    return [WORDS[(seed >> (i % 200)) % len(WORDS) if i % 3 else (seed + i * 7) % len(WORDS)]
            for i in range(max_tokens)]


class State:
    def __init__(self, args, version: str):
        self.args = args
        self.version = version
        self.started = time.monotonic()
        self.requests = 0
        self.generated_tokens = 0
        never = os.environ.get("INFERENCE_HOST_STANDIN_NEVER_HEALTHY", "")
        self.never_healthy = version in [v.strip() for v in never.split(",") if v.strip()]
        self.load_seconds = float(os.environ.get("INFERENCE_HOST_STANDIN_LOAD_SECONDS", "2"))

    def ready(self) -> bool:
        return not self.never_healthy and time.monotonic() - self.started >= self.load_seconds


def make_handler(state: State):
    args = state.args

    class Handler(BaseHTTPRequestHandler):
        server_version = "uvicorn"

        def log_message(self, fmt, *a):  # one line per request in the journal
            sys.stderr.write(f"[stand-in] {self.command} {self.path} {a[1] if len(a) > 1 else ''}\n")

        def _send(self, code: int, body, content_type="application/json"):
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _authorized(self) -> bool:
            path = self.path.split("?")[0]
            if not args.api_key or path.startswith("/health") or path.startswith("/metrics"):
                return True
            if self.headers.get("Authorization", "") == f"Bearer {args.api_key}":
                return True
            self._send(401, {"error": "Unauthorized"})
            return False

        def do_GET(self):
            if not self._authorized():
                return
            path = self.path.split("?")[0]
            if path in ("/health", "/health_generate"):
                return self._send(200, b"", "text/plain") if state.ready() else self._send(503, b"", "text/plain")
            if path == "/v1/models":
                return self._send(200, {"object": "list", "data": [{
                    "id": args.served_model_name or args.model_path, "object": "model",
                    "created": int(state.started), "owned_by": "sglang", "root": args.model_path}]})
            if path in ("/model_info", "/get_model_info"):
                return self._send(200, {"model_path": args.model_path, "tokenizer_path": args.model_path,
                                        "is_generation": True, "served_model_name": args.served_model_name})
            if path == "/metrics" and args.enable_metrics:
                name = args.served_model_name or args.model_path
                text = (f'sglang:num_requests_total{{model_name="{name}"}} {state.requests}\n'
                        f'sglang:generation_tokens_total{{model_name="{name}"}} {state.generated_tokens}\n'
                        f'sglang:num_running_reqs{{model_name="{name}"}} 0\n')
                return self._send(200, text.encode(), "text/plain; version=0.0.4")
            return self._send(404, {"detail": "Not Found"})

        def do_POST(self):
            if not self._authorized():
                return
            if not state.ready():
                return self._send(503, {"error": "server is not ready"})
            length = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except json.JSONDecodeError:
                return self._send(400, {"error": "invalid JSON"})
            path = self.path.split("?")[0]
            state.requests += 1
            if path == "/generate":
                params = body.get("sampling_params") or {}
                tokens = generate_text(str(body.get("text", "")), int(params.get("max_new_tokens", 16)))
                state.generated_tokens += len(tokens)
                return self._send(200, {"text": " ".join(tokens), "meta_info": {
                    "id": hashlib.md5(json.dumps(body).encode()).hexdigest(),
                    "prompt_tokens": len(str(body.get("text", "")).split()),
                    "completion_tokens": len(tokens),
                    "finish_reason": {"type": "length", "length": len(tokens)}}})
            if path == "/v1/chat/completions":
                prompt = " ".join(str(m.get("content", "")) for m in body.get("messages", []))
                tokens = generate_text(prompt, int(body.get("max_tokens") or 16))
                state.generated_tokens += len(tokens)
                return self._send(200, {
                    "id": "chatcmpl-" + hashlib.md5(prompt.encode()).hexdigest()[:16],
                    "object": "chat.completion", "created": int(time.time()),
                    "model": body.get("model") or args.served_model_name,
                    "choices": [{"index": 0, "finish_reason": "length",
                                 "message": {"role": "assistant", "content": " ".join(tokens)}}],
                    "usage": {"prompt_tokens": len(prompt.split()), "completion_tokens": len(tokens),
                              "total_tokens": len(prompt.split()) + len(tokens)}})
            return self._send(404, {"detail": "Not Found"})

    return Handler


def spawn_stubborn_child() -> None:
    """A 'GPU worker' that ignores SIGTERM, like the orphans seen on the target."""
    code = ("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "while True: time.sleep(1)\n")
    subprocess.Popen([sys.executable, "-c", code], start_new_session=True)


def main(argv: list[str]) -> None:
    version = installed_version()
    args = build_parser(version).parse_args(merge_config(argv))
    log_server_args(vars(args))
    state = State(args, version)
    if os.environ.get("INFERENCE_HOST_STANDIN_STUBBORN_CHILD") == "1":
        spawn_stubborn_child()
    server = ThreadingHTTPServer((args.host or "127.0.0.1", int(args.port or 30000)), make_handler(state))
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(f"[stand-in] sglang {version} (stand-in) serving {args.served_model_name} on "
          f"{args.host}:{args.port}, tp {args.tp_size}, attention {args.attention_backend}"
          + (" (never healthy for this version)" if state.never_healthy else ""), flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])
