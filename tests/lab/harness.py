"""Running the real deploy against the lab from tests, and reading what it changed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from roles.health import CHECK_OPERATION_PREFIX

PROJECT_ROOT = Path(__file__).resolve().parents[2]
LAB_INVENTORY = PROJECT_ROOT / "inventory" / "lab.py"
# CI sets this so that a missing Docker engine fails the run instead of skipping the lab.
REQUIRE_LAB_ENV = "INFERENCE_HOST_REQUIRE_LAB"


def _is_health_check(name: str) -> bool:
    # "Health | Check health of HOST: suites": the @deploy's name prefixes the operation's.
    return name.split(" | ")[-1].startswith(CHECK_OPERATION_PREFIX)


@dataclass
class DeployRun:
    returncode: int
    stdout: str
    stderr: str
    results: dict | None

    @classmethod
    def joined(cls, runs: list[DeployRun]) -> DeployRun:
        """Several runs read as one: outputs and operations in the order they ran."""
        operations = [op for run in runs for op in (run.results or {}).get("operations", [])]
        return cls(
            max(run.returncode for run in runs),
            "\n".join(run.stdout for run in runs),
            "\n".join(run.stderr for run in runs),
            {"operations": operations},
        )

    @property
    def changed(self) -> list[str]:
        """Names of operations that changed something on some host (pyinfra's --json results:
        "success" lists the hosts where the operation ran commands), with no exception: the
        health checks report no change when they pass (roles/health)."""
        if not self.results:
            return []
        return [op["name"] for op in self.results["operations"] if op["success"]]

    def changed_in_pass(self, number: int) -> list[str]:
        """What changed in pass `number` (1: the command's own; 2, 3: the passes the node's
        continuation started, roles/proxmox_host continue_in_guests)."""
        passes = (self.results or {}).get("passes") or [(self.results or {}).get("operations", [])]
        return [op["name"] for op in passes[number - 1] if op["success"]]

    @property
    def pass_count(self) -> int:
        return len((self.results or {}).get("passes") or [None])

    @property
    def health_checks(self) -> list[str]:
        """The health-check operations that ran and passed on some host."""
        return [
            op["name"]
            for op in (self.results or {}).get("operations", [])
            if _is_health_check(op["name"]) and (op["success"] or op["no_change"])
        ]

    @property
    def failed(self) -> list[str]:
        if not self.results:
            return []
        return [op["name"] for op in self.results["operations"] if op["error"]]

    def explain(self) -> str:
        return f"rc={self.returncode}\n--- stderr (tail) ---\n{self.stderr[-6000:]}"


def run_deploy(
    inventory: Path | str = LAB_INVENTORY, *extra: str, env: dict | None = None, timeout: int = 1800
) -> DeployRun:
    """`pyinfra -y --json INVENTORY deploy.py` from the project root, as a user runs it."""
    pyinfra = str(Path(sys.executable).parent / "pyinfra")
    command = [pyinfra, "-y", "--json", *extra, str(inventory), "deploy.py"]
    completed = subprocess.run(
        command,
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    passes = json_documents(completed.stdout)
    results = None
    if passes:
        # A bare node's one command runs in passes (roles/proxmox_host, continue_in_guests): each
        # later pass prints its JSON before the pass that started it ends, so the outermost
        # (first) pass prints last. Its operations come first here, in the order they ran.
        operations = [op for doc in reversed(passes) for op in doc["results"].get("operations", [])]
        results = {
            **passes[-1]["results"],
            "operations": operations,
            "passes": [doc["results"].get("operations", []) for doc in reversed(passes)],
        }
    return DeployRun(completed.returncode, completed.stdout, completed.stderr, results)


def json_documents(text: str) -> list[dict]:
    """The pyinfra --json documents printed one after another on stdout (one per pass)."""
    decoder, found, index = json.JSONDecoder(), [], 0
    while True:
        start = text.find("{", index)
        if start < 0:
            return found
        try:
            doc, index = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            index = start + 1
            continue
        if isinstance(doc, dict) and "results" in doc:
            found.append(doc)


def require_lab_tool(available: bool, message: str) -> None:
    """Skip a lab test whose tool is missing here, unless CI demands the lab (then fail)."""
    if available:
        return
    if os.environ.get(REQUIRE_LAB_ENV) == "1":
        pytest.fail(f"{REQUIRE_LAB_ENV}=1 but {message}")
    pytest.skip(message)


def require_docker() -> None:
    """Skip lab tests without a Docker engine, unless CI demands them (then fail)."""
    import lab

    require_lab_tool(lab.engine_available(), "no Docker engine answers `docker info` (docs/lab.md: Prerequisites)")


def load_lab_site(inventory: Path | str):
    """The site of a lab inventory once its lab is up: the containers' addresses are those the
    lab recorded as it brought them up (lab.recorded_address), which the deploy used too."""
    from roles.site import load_site

    return load_site(inventory)


def stream_chat(url: str, body: dict, key: str, timeout: float) -> dict:
    """One streamed chat completion (body with "stream": true) read as a client reads it:
    server-sent events in OpenAI's format, as SGLang (serving_chat.py) and vLLM
    (chat_completion/serving.py) send them. Returns the chunks that carried content, the
    completion_tokens of a usage chunk (stream_options.include_usage), the finish reason,
    whether `data: [DONE]` came, the error objects the server sent inside the stream (vLLM
    0.16.0 ends a generation that failed with `data: {"error": ...}` and then `[DONE]`), a
    client-side error, the longest pause between two events, and when it began, got its first
    token and ended (time.monotonic())."""
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
    result = {
        "chunks": 0,
        "usage": None,
        "finish": None,
        "done": False,
        "errors": [],
        "error": None,
        "gap": 0.0,
        "began": time.monotonic(),
        "first": None,
        "ended": None,
    }
    last = result["began"]
    try:
        request = urllib.request.Request(url, json.dumps(body).encode(), headers)
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            for raw in answer:
                line = raw.decode().strip()
                if not line.startswith("data: "):
                    continue
                now = time.monotonic()
                result["gap"], last = max(result["gap"], now - last), now
                if line == "data: [DONE]":
                    result["done"] = True
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    result["errors"].append(chunk["error"])
                result["usage"] = (chunk.get("usage") or {}).get("completion_tokens", result["usage"])
                for choice in chunk.get("choices") or []:
                    if (choice.get("delta") or {}).get("content"):
                        result["chunks"] += 1
                        result["first"] = result["first"] or now  # after any queue and prefill
                    result["finish"] = choice.get("finish_reason") or result["finish"]
    except (urllib.error.URLError, OSError, ValueError) as error:
        result["error"] = repr(error)
    result["ended"] = time.monotonic()
    return result


def gateway_workers(gateway: str, key: str) -> list[dict]:
    """smg's GET /workers (1.13.0: {"workers": [{"url", "status", "is_healthy", "load", ...}]})."""
    request = urllib.request.Request(f"{gateway}/workers", headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(request, timeout=5) as answer:
        return json.loads(answer.read()).get("workers", [])


def control_plane_key(site) -> str:
    """The gateways' control-plane key (the only key smg's /workers take), from the lab's vault."""
    from roles.site import vault

    name = site.group("gateways")[0].gateway.control_plane_api_key_secret
    return vault.decrypt_all(site.secrets_file, [name])[name]


def straight_at_drain(
    gateway: str, key: str, stop, sent: dict, body, timeout: float = 600, control_key: str | None = None
) -> None:
    """Until `stop` is set, polls smg's /workers every 0.2 s; the first time a replica reads
    Draining there (the rolling step has just taken it out), streams `body()` straight to that
    replica (its own address and the engine's key, not through the gateway; control_key: what
    smg's /workers take, the key by default), in a thread:
    sent[url] is the stream_chat result. A request no gateway counts: only the replica's own
    live load tells the drain about it."""
    threads = []
    while not stop.is_set():
        try:
            draining = [
                w["url"]
                for w in gateway_workers(gateway, control_key or key)
                if str(w.get("status", "")).lower() == "draining"
            ]
        except (urllib.error.URLError, OSError, ValueError):
            draining = []
        for url in draining:
            if url in sent:
                continue
            sent[url] = {}
            request = body()

            def send(url=url, request=request):
                sent[url] = stream_chat(f"{url}/v1/chat/completions", request, key, timeout=timeout)

            threads.append(threading.Thread(target=send))
            threads[-1].start()
        time.sleep(0.2)
    for thread in threads:
        thread.join()
