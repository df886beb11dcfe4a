"""Facts of roles/weights."""

from __future__ import annotations

import json

from pyinfra.api import FactBase

from roles.shared.shell import Shell, sh


class WeightsManifestState(FactBase):
    """Returns {"state": verified|absent|changed|incomplete|no-tool, "detail": ...} for a weights
    directory: the manifest against the wanted repository, commit and patterns, and every
    file's size. Reads no file's content, so it is quick on hundreds of GB."""

    def command(self, tool: str, directory: str, repo: str, revision: str, patterns: str) -> Shell:
        return sh(
            "if [ -x {tool} ]; then python3 {tool} check --dir={directory} --repo={repo} --revision={revision}"
            """ --patterns={patterns}; else echo '{{"state": "no-tool"}}'; fi""",
            tool=tool,
            directory=directory,
            repo=repo,
            revision=revision,
            patterns=patterns,
        )

    def process(self, output: list[str]) -> dict:
        try:
            return json.loads("\n".join(output))
        except ValueError:
            return {"state": "unknown", "detail": "\n".join(output)}


class FileText(FactBase):
    """Returns a small file's text, or None when it does not exist."""

    def command(self, path: str) -> Shell:
        return sh("cat -- {path} 2>/dev/null || true", path=path)

    def process(self, output: list[str]) -> str | None:
        text = "\n".join(output).strip()
        return text or None
