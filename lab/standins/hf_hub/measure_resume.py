"""Measures what an interrupted shard download costs again, counted at the Hub stand-in.

    python -m lab.standins.hf_hub.measure_resume --python VENV/bin/python [--runs 3]

VENV holds the client roles/weights installs (huggingface_hub==1.17.0 hf_xet==1.8.0). Each run:
a fresh local_dir, the stand-in served on 127.0.0.1 and throttled, `snapshot_download` of one
24 MiB shard killed with SIGKILL mid-shard (--kill-after seconds after its first 10 MiB piece
reached the `.incomplete` file), then run again to the end; the bytes the server sent
for that shard in each attempt are read from its own log lines ("sent N of M bytes ... from
offset S"). docs/weights-resume.md holds the figures and what they mean.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
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


def _sent(text: str) -> list[tuple[int, int, int]]:
    """(bytes sent, offset, status) of each answer carrying the shard's bytes (whole or a tail)."""
    size = hub_server.LAB_REPOS[REPO][SHARD]
    return [(int(m[1]), int(m[4]), int(m[5])) for m in SENT.finditer(text) if int(m[2]) + int(m[4]) == size]


def _incomplete(local: Path) -> int:
    return sum(p.stat().st_size for p in (local / ".cache").rglob("*.incomplete")) if local.exists() else 0


def measure(python: str, kill_after: float, rate: int, xet: bool) -> dict:
    with tempfile.TemporaryDirectory(prefix="ih-resume-") as folder:
        state, local = Path(folder) / "state", Path(folder) / "local"
        state.mkdir()
        (state / "rate").write_text(str(rate))
        port, log = _free_port(), Path(folder) / "server.log"
        server = subprocess.Popen([sys.executable, "-m", "lab.standins.hf_hub.server", "--state", str(state),
                                   "--bind", "127.0.0.1", "--port", str(port)],
                                  stdout=log.open("w"), stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            for _ in range(100):
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=1).read()
                    break
                except OSError:
                    time.sleep(0.1)
            env = {**os.environ, "HF_ENDPOINT": f"http://127.0.0.1:{port}", "HF_HOME": f"{folder}/hf-home",
                   "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
            if not xet:
                env["HF_HUB_DISABLE_XET"] = "1"
            argv = [python, "-c", DOWNLOAD, REPO, hf_hub.commit_of(REPO), str(local), SHARD]
            first = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            # Mid-shard: once the first 10 MiB piece (file_download.py DOWNLOAD_CHUNK_SIZE) is in
            # the .incomplete file, kill_after seconds more, well before the shard's end.
            while first.poll() is None and _incomplete(local) < 10 * 1024 * 1024:
                time.sleep(0.1)
            time.sleep(kill_after)
            first.send_signal(signal.SIGKILL)
            first.wait()
            time.sleep(0.5)  # the server notices the closed socket and logs what it sent
            mark = len(log.read_text())
            incomplete = _incomplete(local)
            second = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
            if second.returncode != 0:
                raise RuntimeError(second.stderr[-2000:])
            time.sleep(0.5)
            text = log.read_text()
            before, after = _sent(text[:mark]), _sent(text[mark:])
            size = (local / SHARD).stat().st_size
            return {"size": size, "killed_after_s": kill_after, "incomplete": incomplete,
                    "first": before, "second": after, "refetched": sum(n for n, _, _ in after),
                    "xet_headers": "X-Xet-Hash" in log.read_text()}
        finally:
            server.terminate()
            server.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", required=True, help="a Python with huggingface_hub==1.17.0 and hf_xet")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--kill-after", type=float, default=1.5,
                        help="seconds after the first 10 MiB reached the .incomplete file")
    parser.add_argument("--rate", type=int, default=3_000_000, help="bytes per second per connection")
    parser.add_argument("--xet", action="store_true", help="leave HF_HUB_DISABLE_XET unset")
    args = parser.parse_args()
    for run in range(args.runs):
        result = measure(args.python, args.kill_after, args.rate, args.xet)
        print(f"run {run + 1}: {result}", flush=True)


if __name__ == "__main__":
    main()
