"""roles/engine_envs: the engine environments (sglang_*)."""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import Field

from roles.site.fields import (
    AbsolutePath,
    Section,
    Url,
    check,
    one_of,
)


class SglangSettings(Section):
    """roles/engine_envs: uv environments under <base_install_root>/envs/<stack id>-<stamp>, each
    installed exactly from its stack's lock."""

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
    python: AbsolutePath | None = Field(
        None,
        description=(
            "Interpreter of the engine environments; None: uv's managed CPython of the stack's python "
            "pin; a path: that interpreter (it must be the stack's version)."
        ),
    )
    python_install_mirror: Url | None = Field(
        None,
        description=(
            "Where uv downloads its managed CPython (UV_PYTHON_INSTALL_MIRROR); None: "
            "python-build-standalone on GitHub."
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
