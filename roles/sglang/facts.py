"""Facts of roles/sglang: what an engine environment holds."""

from __future__ import annotations

from pyinfra.api import FactBase

STACK_MARKER = ".inference-host-stack"


class SglangEnvironmentStamp(FactBase):
    """Returns the stamp a finished install left in an environment (None: not built)."""

    def command(self, env_dir: str) -> str:
        return f"cat {env_dir}/{STACK_MARKER} 2>/dev/null || true"

    def process(self, output: list[str]) -> str | None:
        text = "\n".join(output).strip()
        return text or None


class UnappliedPatches(FactBase):
    """Returns the names of patches under <env>/inference-host-patches not yet applied to it."""

    def command(self, env_dir: str) -> str:
        return (
            f"site=$(echo {env_dir}/lib/python3*/site-packages); "
            f"for p in {env_dir}/inference-host-patches/*.patch; do [ -e \"$p\" ] || continue; "
            "patch -p1 -R -s -f --dry-run -d \"$site\" < \"$p\" >/dev/null 2>&1 "
            "|| basename \"$p\"; done"
        )

    def process(self, output: list[str]) -> list[str]:
        return [line.strip() for line in output if line.strip()]
