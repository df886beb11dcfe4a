"""Setting keys of older inventories: renamed or removed. An inventory is plain text, so an old
key is refused in one line saying what to write instead, never read under a new name: a silent
alias would keep the old name in inventories forever."""

from __future__ import annotations

# Renamed: old key -> the key to write (docs/upgrades.md#engine-neutral-setting-names).
RENAMED_KEYS = {
    "sglang_python": "engine_python",
    "sglang_keep_environments": "engine_keep_environments",
    "sglang_python_install_mirror": "base_python_install_mirror",
}
# Removed: old key -> what replaced it.
REMOVED_KEYS = {
    "cuda_keyring_version": "the CUDA repository's key is now <key id>.pub, pinned by cuda_repo_key_fingerprint"
    " (docs/upgrades.md#the-cuda-repositorys-key)",
}


def old_key_problem(key: str, shown_value: str) -> str | None:
    """What to do about an old key (the line's tail after 'host NAME: '), or None for any other key."""
    if key in RENAMED_KEYS:
        new = RENAMED_KEYS[key]
        return (
            f"{key} was renamed {new}; write {new} = {shown_value} instead"
            " (docs/upgrades.md#engine-neutral-setting-names)"
        )
    if key in REMOVED_KEYS:
        return f"{key} is no longer a setting: {REMOVED_KEYS[key]}; remove it"
    return None
