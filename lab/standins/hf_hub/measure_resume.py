"""Measures what an interrupted shard download costs again, on the HTTP path and on the Xet path.

    python -m lab.standins.hf_hub.measure_resume [--python PY] [--runs 3] [--mode http|xet|xet-cache]

PY runs the client (default: this interpreter; the project's dev group pins the versions
roles/weights installs, huggingface_hub==1.17.0 hf_xet==1.8.0). Each run: a fresh local_dir and
HF_HOME, the Hub stand-in served on 127.0.0.1 with `--xet` (every large file on Xet too, as on the
real Hub) and throttled per connection, `snapshot_download` of one 24 MiB shard killed with SIGKILL
once the stand-in has sent --kill-at bytes of it, then run again to the end. The bytes come from
the stand-in's own counters (GET /_standin/bytes-sent: file bytes on the HTTP path, xorb bytes on
the Xet path, reconstruction JSON apart) and its log lines. Modes:

- http: HF_HUB_DISABLE_XET=1 (the project's default): huggingface_hub's http_get.
- http-no-range: as http, with the stand-in's CDN ignoring Range (<state>/no-range): a 200 with
  the whole file, which http_get takes as a restart of the file.
- xet: Xet left on: huggingface_hub's xet_get -> hf_xet.download_files.
- xet-cache: as xet, with HF_XET_CHUNK_CACHE_SIZE_BYTES=10000000000 (hf_xet's disk chunk cache
  asked for; the wheel is built without a default cache: hf_xet/Cargo.toml `no-default-cache`).

docs/weights-resume.md holds the figures and what they mean.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from lab.standins import hf_hub
from lab.standins.hf_hub import server as hub_server

REPO = hf_hub.MODEL_REPO
SHARD = "model-00001-of-00002.safetensors"
MODES = ("http", "http-no-range", "xet", "xet-cache")
SENT = re.compile(r"sent (\d+) of (\d+) bytes of (\S+) from offset (\d+) \(status (\d+)\)")
DOWNLOAD = """
import sys
from huggingface_hub import snapshot_download
snapshot_download(sys.argv[1], revision=sys.argv[2], local_dir=sys.argv[3], allow_patterns=[sys.argv[4]],
                  max_workers=1)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _incomplete(local: Path) -> int:
    return sum(p.stat().st_size for p in (local / ".cache").rglob("*.incomplete")) if local.exists() else 0


def _counters(url: str) -> dict[str, int]:
    with urllib.request.urlopen(f"{url}/_standin/bytes-sent", timeout=5) as response:
        return json.load(response)


def _answers(text: str) -> list[dict]:
    """(path, bytes sent, offset, status) of each file or xorb answer in a slice of the log."""
    return [
        {"path": m[3], "sent": int(m[1]), "of": int(m[2]), "offset": int(m[4]), "status": int(m[5])}
        for m in SENT.finditer(text)
    ]


def serve(folder: Path, rate: int, honour_range: bool = True) -> tuple[subprocess.Popen, str, Path]:
    """The stand-in with --xet on a free loopback port; returns once its files are on Xet."""
    state = folder / "state"
    state.mkdir()
    (state / "rate").write_text(str(rate))
    if not honour_range:
        (state / "no-range").touch()
    port, log = _free_port(), folder / "server.log"
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "lab.standins.hf_hub.server",
            "--state",
            str(state),
            "--bind",
            "127.0.0.1",
            "--port",
            str(port),
            "--xet",
        ],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        cwd=hf_hub.PROJECT_ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and server.poll() is None:
        try:
            urllib.request.urlopen(f"{url}/ready", timeout=1).read()
            return server, url, log
        except OSError:
            time.sleep(0.2)
    server.kill()
    raise RuntimeError(f"the Hub stand-in did not get ready: {log.read_text()[-2000:]}")


def client_env(mode: str, url: str, folder: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    env.update(
        HF_ENDPOINT=url, HF_HOME=f"{folder}/hf-home", HF_HUB_DISABLE_PROGRESS_BARS="1", HF_HUB_DISABLE_TELEMETRY="1"
    )
    if mode.startswith("http"):
        env["HF_HUB_DISABLE_XET"] = "1"
    if mode == "xet-cache":
        env["HF_XET_CHUNK_CACHE_SIZE_BYTES"] = "10000000000"
        env["HF_XET_CACHE"] = f"{folder}/xet-cache"
    return env


def measure(python: str, mode: str, kill_at: int, rate: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="ih-resume-") as name:
        folder = Path(name)
        server, url, log = serve(folder, rate, honour_range=mode != "http-no-range")
        try:
            local, path = folder / "local", "xet" if mode.startswith("xet") else "http"
            env = client_env(mode, url, folder)
            argv = [python, "-c", DOWNLOAD, REPO, hf_hub.commit_of(REPO), str(local), SHARD]
            start = _counters(url)
            hold = folder / "state" / "hold-at"  # the stand-in sends no more of the path from there
            hold.write_text(f"{path} {start[path] + kill_at}")
            first = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            # Mid-shard, counted where the bytes leave: the stand-in's live counter of this path.
            while first.poll() is None and _counters(url)[path] - start[path] < kill_at:
                time.sleep(0.05)
            if first.poll() is not None:
                assert first.stderr is not None  # stderr=PIPE
                raise RuntimeError(f"the first download ended before the kill: {first.stderr.read()[-2000:]!r}")
            first.send_signal(signal.SIGKILL)
            first.wait()
            hold.unlink()
            incomplete = _incomplete(local)
            time.sleep(0.5)  # the server notices the closed socket and logs what it sent
            mark, killed = len(log.read_text()), _counters(url)
            second = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
            if second.returncode != 0:
                raise RuntimeError(second.stderr[-2000:])
            time.sleep(0.5)
            done, text = _counters(url), log.read_text()
            result = (local / SHARD).read_bytes()
            expected = hub_server.generate(REPO, hub_server.LAB_REPOS[REPO]).files[SHARD].content
            return {
                "mode": mode,
                "size": len(expected),
                "byte_exact": result == expected,
                "first_sent": killed[path] - start[path],
                "incomplete_at_kill": incomplete,
                "refetched": done[path] - killed[path],
                "other_path": done["xet" if path == "http" else "http"] - start["xet" if path == "http" else "http"],
                "reconstruction_json": done["xet_api"] - start["xet_api"],
                "second_answers": [(a["sent"], a["offset"], a["status"]) for a in _answers(text[mark:])],
            }
        finally:
            server.terminate()
            server.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--python", default=sys.executable, help="a Python with huggingface_hub==1.17.0 and hf_xet==1.8.0"
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--mode", choices=MODES, action="append", help="default: all four")
    parser.add_argument(
        "--kill-at",
        type=int,
        default=15_000_000,
        help="bytes of the shard the stand-in has sent when the client is killed",
    )
    parser.add_argument("--rate", type=int, default=3_000_000, help="bytes per second per connection")
    args = parser.parse_args()
    for mode in args.mode or MODES:
        results = []
        for run in range(args.runs):
            results.append(measure(args.python, mode, args.kill_at, args.rate))
            print(f"{mode} run {run + 1}: {results[-1]}", flush=True)
        print(
            f"{mode}: median re-fetched {statistics.median(r['refetched'] for r in results):,.0f} of"
            f" {results[0]['size']:,} bytes ({args.runs} runs)",
            flush=True,
        )


if __name__ == "__main__":
    main()
