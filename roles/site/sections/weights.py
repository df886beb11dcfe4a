"""roles/weights: the served model's and drafter's weights (weights_*)."""

from __future__ import annotations

import re
from typing import Annotated, ClassVar

from pydantic import Field

from roles.site.fields import (
    HostFolder,
    Section,
    Url,
    check,
    positive,
)

COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
HF_REPO_RE = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# Written into the weights directory only once every file is verified (roles/weights); the
# serving unit asserts it, the health suite reads it.
WEIGHTS_MANIFEST = ".inference-host/manifest.json"
Commit = Annotated[
    str,
    check(
        COMMIT_RE.match,
        "the 40-character commit hash (a branch or tag name such as 'main' moves; pin the"
        " commit it points to, shown in the repository's 'Files and versions' history)",
    ),
]
HfRepo = Annotated[str, check(HF_REPO_RE.match, "a Hugging Face repository id like moonshotai/Kimi-K2.5")]


class WeightsSettings(Section):
    """roles/weights: the served model's (and its EAGLE-3 drafter's) weights, pinned and verified."""

    PREFIX: ClassVar[str] = "weights_"

    repo: HfRepo | None = Field(
        None,
        description=("Hugging Face repository of the served model; None: the weights are put in place by other means."),
    )
    revision: Commit | None = Field(
        None, description=("The model's exact 40-character commit (a branch or tag moves and is refused).")
    )
    allow_patterns: list[str] = Field(
        [], description=("Glob filters of the files to fetch, as snapshot_download applies them.")
    )
    ignore_patterns: list[str] = Field(
        [], description=("Glob filters of the files to skip, as snapshot_download applies them.")
    )
    local_dir: HostFolder | None = Field(
        None, description=("Where the gpu node reads the model; None: serving_model_path.")
    )
    source_dir: HostFolder | None = Field(
        None,
        description=(
            "A verified copy on a local disk or NAS of the downloading host, copied with rsync instead"
            " of the Hub; None: the Hub (or weights_endpoint)."
        ),
    )
    drafter_repo: HfRepo | None = Field(None, description=("Hugging Face repository of the EAGLE-3 drafter."))
    drafter_revision: Commit | None = Field(None, description=("The drafter's exact 40-character commit."))
    drafter_allow_patterns: list[str] = Field([], description=("Glob filters of the drafter's files to fetch."))
    drafter_ignore_patterns: list[str] = Field([], description=("Glob filters of the drafter's files to skip."))
    drafter_local_dir: HostFolder | None = Field(
        None, description=("Where the drafter goes; None: serving_speculative's draft_model_path.")
    )
    drafter_source_dir: HostFolder | None = Field(
        None, description=("A verified local/NAS copy of the drafter, copied with rsync.")
    )
    endpoint: Url | None = Field(None, description=("A Hub mirror (HF_ENDPOINT); None: https://huggingface.co."))
    free_space_margin_gib: Annotated[float, check(lambda v: v >= 0, "a number >= 0")] = Field(
        20.0, description=("Free space demanded beyond what is still to download, in GiB.")
    )
    verify: bool = Field(
        False,
        description=("Re-hash every file on this deploy (--data weights_verify=True), not only after a download."),
    )
    progress_interval_s: Annotated[int, positive] = Field(
        30, description=("Seconds between the deploy's progress lines while a download runs.")
    )
    max_workers: Annotated[int, check(lambda v: 1 <= v <= 64, "1 to 64")] = Field(
        8, description=("Parallel file downloads.")
    )
    xet: bool = Field(
        False,
        description=(
            "False: HF_HUB_DISABLE_XET=1, every file over huggingface_hub's http_get, which resumes a"
            " killed shard with Range. True: hf_xet for Xet-backed repositories (faster), whose xet_get"
            " rewrites a killed shard from its first byte (docs/weights-resume.md)."
        ),
    )
