"""roles/eagle3_training: the EAGLE-3 drafter training job (eagle3_training_*)."""

from __future__ import annotations

import re
from typing import Annotated, ClassVar

from pydantic import Field

from roles.site.fields import (
    HostFolder,
    OptionValue,
    Section,
    check,
    one_of,
    positive,
)

# SpecForge (sgl-project/SpecForge) commit the drafter training job runs: the last main commit
# pinning sglang 0.5.9 / torch 2.9.1 / transformers 4.57.1 (2026-06-28; the next pins 0.5.14).
SPECFORGE_COMMIT = "82951a9711c8c9bf9e146e426b2e956d9798ddc7"
# `git fetch REPO COMMIT` takes the repository as a positional argument: a value starting with
# '-' would be one of git's options (--upload-pack runs a program), so it must start with a URL
# scheme, user@host: or '/'; nothing a shell would read either.
GIT_URL_RE = re.compile(
    r"(?:(?:https?|ssh|git|file)://|[A-Za-z0-9_][A-Za-z0-9._-]*@[A-Za-z0-9.-]+:|/)[A-Za-z0-9._~:/@+=%-]*"
)
_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")


def _pinned_dataset(value: dict) -> bool:
    if not value:
        return True
    if set(value) == {"repo", "revision", "file"}:
        return bool(_COMMIT_RE.match(str(value["revision"])))
    if set(value) == {"path", "sha256"}:
        return str(value["path"]).startswith("/") and bool(re.match(r"^[0-9a-f]{64}$", str(value["sha256"])))
    return False


class Eagle3TrainingSettings(Section):
    """roles/eagle3_training: the EAGLE-3 drafter training job (SpecForge), laid down by the
    deploy and started by the user (systemctl start inference-host-eagle3@<step>)."""

    PREFIX: ClassVar[str] = "eagle3_training_"

    enabled: bool = Field(
        False, description=("Lay down the EAGLE-3 drafter training job (started by the user, never by the deploy).")
    )
    work_dir: HostFolder = Field(
        "/var/lib/inference-host/eagle3",
        description=(
            "Data, hidden states and checkpoints: a disk with room (the job computes the budget). Owned by the"
            " job's own user, inference-host-eagle3, and the only folder it writes."
        ),
    )
    env_mode: Annotated[str, one_of("full", "no-gpu-deps")] = Field(
        "full",
        description=(
            "'full': SpecForge's locked environment; 'no-gpu-deps' (lab only): the packages of the "
            "steps that need no GPU."
        ),
    )
    specforge_repo: Annotated[
        str,
        check(
            GIT_URL_RE.fullmatch,
            (
                "a git repository URL (https://, ssh://, git://, file://, user@host:path) or an absolute path,"
                " without spaces or shell characters"
            ),
        ),
    ] = Field(
        "https://github.com/sgl-project/SpecForge.git",
        description=("Git repository of SpecForge (a mirror when air-gapped)."),
    )
    specforge_commit: Annotated[str, check(_COMMIT_RE.match, "a full 40-character git commit id")] = Field(
        SPECFORGE_COMMIT, description=("The SpecForge commit the job runs.")
    )
    specforge_lock: Annotated[
        str, check(re.compile(r"^[0-9a-f]{7}$").match, "the 7-character commit prefix of a committed lock file")
    ] = Field(
        SPECFORGE_COMMIT[:7],
        description=(
            "The committed lock of the job's environment (roles/eagle3_training/files/specforge-<lock>.lock.txt)."
        ),
    )
    dataset: Annotated[
        dict[str, str],
        check(
            _pinned_dataset,
            "{'repo': ..., 'revision': '<40-hex commit>', 'file': ...} or {'path': '/...', 'sha256': '<64 hex>'}",
        ),
    ] = Field(
        {},
        description=(
            "Prompts, pinned: {repo, revision: <40-hex commit>, file} on the Hub or {path, sha256} on the host."
        ),
    )
    samples: Annotated[int, positive] = Field(50000, description="Prompts used for training.")
    max_length: Annotated[int, positive] = Field(
        2048, description=("Maximum tokens per sample (hidden states and training).")
    )
    chat_template: OptionValue = Field(
        "kimi-k2-instruct", description=("SpecForge chat template name (specforge/data/template.py).")
    )
    regenerate_concurrency: Annotated[int, positive] = Field(
        32, description=("Parallel requests while the served target regenerates the answers.")
    )
    regenerate_max_tokens: Annotated[int, positive] = Field(
        2048, description=("Maximum tokens of each regenerated answer.")
    )
    num_epochs: Annotated[int, positive] = Field(1, description="Training epochs.")
    learning_rate: Annotated[float, positive] = Field(1e-4, description="Training learning rate.")
    save_interval: Annotated[int, positive] = Field(
        5000,
        description=(
            "SpecForge saves a checkpoint every this many steps and keeps them all (part of the disk budget)."
        ),
    )
    export_dir: HostFolder = Field(
        "/models/Kimi-K2.5-eagle3-trained",
        description=(
            "Where the exported drafter goes: the directory --speculative-draft-model-path loads. Written by the"
            " job's root helper (the job stages it in its work folder); its parent folder must exist."
        ),
    )
