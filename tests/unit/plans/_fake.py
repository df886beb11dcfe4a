"""Fake facts shared by the plan inventories: what a fresh host of each distro answers."""

from roles import stated_state

# A fresh install's release files: the preview's stated state (roles/stated_state.py) states
# them once for both.
OS_RELEASE = {"ubuntu2404": stated_state.OS_RELEASE["Ubuntu 24.04"], "debian12": stated_state.OS_RELEASE["Debian 12"]}


# The running kernel (`uname -r`) of a fresh install: DKMS needs this kernel's headers.
KERNEL = {"ubuntu2404": "6.8.0-85-generic", "debian12": "6.1.0-37-amd64"}


# Tools a fresh host of either distro has (pyinfra looks them up with `command -v`).
TOOLS = stated_state.TOOLS


def fake_host(distro: str, **responses) -> dict:
    """Host data for a @fake host of `distro` (no delay); extra fact answers by matcher."""
    return {
        # These plans cover the GPU host stack; the health checks need a real host to talk to,
        # and roles/wheels has its own tests (tests/unit/test_wheels_*, tests/lab/test_wheels.py).
        "health_after_deploy": [],
        "build_kernel_wheels": False,
        "fake_delay": 0,
        "fake_delay_jitter": 0,
        # Matchers are tried in order, first match wins: the specific answers come first (a
        # fact's command such as `command -v dpkg ... dpkg -l` also contains a tool lookup).
        "fake_responses": {
            **responses,
            "-release | grep -v /": OS_RELEASE[distro],
            # the host's service units (roles/shared/unit_owner.py), unless given: none of ours
            "systemctl list-unit-files": responses.get(
                "systemctl list-unit-files", ["ssh.service enabled enabled", "list-rc 0"]
            ),
            "uname -s": "Linux",
            "uname -r": KERNEL[distro],
            **{f"command -v {tool} ": f"/usr/bin/{tool}" for tool in TOOLS},
        },
    }


def fb51e7b_account(moved: bool = True) -> dict:
    """Fact answers of a gpu node deployed by main up to commit fb51e7b: the service user `sglang`
    with /var/lib/sglang and /var/log/sglang (roles/shared/legacy_account.py's fact, captured
    output), and (moved) pyinfra's Link fact on those folders once moved: links to the new names."""
    import re
    from pathlib import Path

    data = Path(__file__).resolve().parents[1] / "data" / "service_account"
    folders = (("/var/lib/sglang", "/var/lib/inference-engine"), ("/var/log/sglang", "/var/log/inference-engine"))
    return {
        "/etc/passwd | sed 's/^/passwd:/'": (data / "fb51e7b.txt").read_text().splitlines(),
        **{
            re.compile(rf"stat -c .* {old}\b"): [
                f"user=root group=root mode=lrwxrwxrwx atime=0 mtime=0 ctime=0 size=25 '{old}' -> '{new}'"
            ]
            for old, new in folders
            if moved
        },
    }
