"""Facts of roles/base."""

from __future__ import annotations

import re

from pyinfra.api import FactBase

from roles.shared.fact_batch import batched
from roles.shared.shell import Shell, sh

_UV_VERSION_RE = re.compile(r"^uv (\d+\.\d+\.\d+\S*)")


@batched
class UvVersion(FactBase):
    """Returns the version printed by the uv binary at ``path``, or None if there is none."""

    def command(self, path: str) -> Shell:
        return sh("! test -x {path} || {path} --version", path=path)

    def process(self, output) -> str | None:
        for line in output:
            match = _UV_VERSION_RE.match(line.strip())
            if match:
                return match.group(1)
        return None
