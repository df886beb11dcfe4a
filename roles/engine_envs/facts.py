"""Facts of roles/engine_envs: what an engine environment holds."""

from __future__ import annotations

from pyinfra.api import FactBase

from roles.shared.fact_batch import batched
from roles.shared.shell import Shell, sh


@batched
class UnappliedPatches(FactBase):
    """Returns the names of patches under <env>/inference-host-patches not yet applied to it."""

    def command(self, env_dir: str) -> Shell:
        return sh(
            "site=$(echo {env_dir}/lib/python3*/site-packages); "
            'for p in {env_dir}/inference-host-patches/*.patch; do [ -e "$p" ] || continue; '
            'patch -p1 -R -s -f --dry-run -d "$site" < "$p" >/dev/null 2>&1 '
            '|| basename -- "$p"; done',
            env_dir=env_dir,
        )

    def process(self, output: list[str]) -> list[str]:
        return [line.strip() for line in output if line.strip()]


@batched
class EngineEnvironments(FactBase):
    """Returns {"names": folders under envs_dir, newest first, "live": where `current` points
    (None: no link), "locks": files under locks_dir}."""

    @staticmethod
    def default() -> dict:
        return {"names": [], "live": None, "locks": []}

    def command(self, envs_dir: str, current: str, locks_dir: str) -> Shell:
        return sh(
            'echo "live $(readlink -- {current} || true)";'
            " [ -d {envs_dir} ] && ls -1t -- {envs_dir}; echo '-- locks';"
            " [ -d {locks_dir} ] && ls -1 -- {locks_dir}; true",
            current=current,
            envs_dir=envs_dir,
            locks_dir=locks_dir,
        )

    def process(self, output: list[str]) -> dict:
        lines = [line.strip() for line in output if line.strip()]
        live = lines[0].removeprefix("live").strip() if lines and lines[0].startswith("live") else ""
        split = lines.index("-- locks") if "-- locks" in lines else len(lines)
        return {"names": lines[1:split], "live": live or None, "locks": lines[split + 1 :]}
