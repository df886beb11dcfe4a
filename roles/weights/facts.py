"""Facts of roles/weights."""

from __future__ import annotations

import json
import shlex

from pyinfra.api import FactBase


class WeightsManifestState(FactBase):
    """Returns {"state": verified|absent|changed|incomplete|no-tool, "detail": ...} for a weights
    directory: the manifest against the wanted repository, commit and patterns, and every
    file's size. Reads no file's content, so it is quick on hundreds of GB."""

    def command(self, tool: str, directory: str, repo: str, revision: str, patterns: str) -> str:
        check = (
            f"python3 {tool} check --dir {shlex.quote(directory)} --repo {shlex.quote(repo)}"
            f" --revision {shlex.quote(revision)} --patterns {shlex.quote(patterns)}"
        )
        return f'if [ -x {tool} ]; then {check}; else echo \'{{"state": "no-tool"}}\'; fi'

    def process(self, output: list[str]) -> dict:
        try:
            return json.loads("\n".join(output))
        except ValueError:
            return {"state": "unknown", "detail": "\n".join(output)}


class FileText(FactBase):
    """Returns a small file's text, or None when it does not exist."""

    def command(self, path: str) -> str:
        return f"cat {shlex.quote(path)} 2>/dev/null || true"

    def process(self, output: list[str]) -> str | None:
        text = "\n".join(output).strip()
        return text or None
