"""roles/engine_envs: what every engine environment shares, SGLang's and vLLM's (engine_*)."""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import Field

from roles.site.fields import AbsolutePath, Section, check


class EngineSettings(Section):
    """roles/engine_envs: uv environments under <base_install_root>/envs/<stack id>-<stamp>, each
    installed exactly from its stack's lock, whichever engine the stack runs (SGLang's own install
    settings: sglang_*; vLLM's: vllm_*)."""

    PREFIX: ClassVar[str] = "engine_"

    python: AbsolutePath | None = Field(
        None,
        description=(
            "Interpreter of the engine environments; None: uv's managed CPython of the stack's python "
            "pin; a path: that interpreter (it must be the stack's version)."
        ),
    )
    keep_environments: Annotated[
        int, check(lambda v: v >= 2, "2 or more (the live environment and the one it may roll back to)")
    ] = Field(
        3,
        description=(
            "Engine environments kept on the host, the live one and the one being deployed included "
            "(rollback needs the previous one); older ones are removed."
        ),
    )
