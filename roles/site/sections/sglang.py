"""roles/engine_envs: what only SGLang stacks' environments take (sglang_*)."""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import Field

from roles.site.fields import Section, one_of


class SglangSettings(Section):
    """SGLang stacks (engine: sglang in the stack file): how their environment is cut from the lock.
    What every engine environment shares (interpreter, how many are kept): engine_*."""

    PREFIX: ClassVar[str] = "sglang_"

    install_mode: Annotated[str, one_of("full", "no-gpu-deps")] = Field(
        "full",
        description=(
            "'full', or 'no-gpu-deps' (lab only): the lock without its GPU-only packages (rule in "
            "roles/site/lock.py), installed exactly, same versions and hashes."
        ),
    )
    install_leave_out: list[str] = Field(
        [],
        description=(
            "no-gpu-deps only: more packages of the lock to leave out by name (the lab: releases "
            "needing a newer Python); also applies to the training job's no-gpu-deps environment."
        ),
    )
