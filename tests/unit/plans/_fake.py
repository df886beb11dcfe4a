"""Fake facts shared by the plan inventories: what a fresh host of each distro answers."""

OS_RELEASE = {
    "ubuntu2404": [
        "/etc/lsb-release",
        "DISTRIB_ID=Ubuntu",
        "DISTRIB_RELEASE=24.04",
        "DISTRIB_CODENAME=noble",
        "---",
        "/etc/os-release",
        'PRETTY_NAME="Ubuntu 24.04.3 LTS"',
        'NAME="Ubuntu"',
        'VERSION_ID="24.04"',
        'VERSION="24.04.3 LTS (Noble Numbat)"',
        "VERSION_CODENAME=noble",
        "ID=ubuntu",
        "ID_LIKE=debian",
        "UBUNTU_CODENAME=noble",
        "---",
    ],
    "debian12": [
        "/etc/os-release",
        'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"',
        'NAME="Debian GNU/Linux"',
        'VERSION_ID="12"',
        'VERSION="12 (bookworm)"',
        "VERSION_CODENAME=bookworm",
        "ID=debian",
        "---",
    ],
}


# The running kernel (`uname -r`) of a fresh install: DKMS needs this kernel's headers.
KERNEL = {"ubuntu2404": "6.8.0-85-generic", "debian12": "6.1.0-37-amd64"}


# Tools a fresh host of either distro has (pyinfra looks them up with `command -v`).
TOOLS = ["useradd", "usermod", "groupadd", "curl", "wget", "dpkg", "apt-get", "systemctl"]


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
            "uname -s": "Linux",
            "uname -r": KERNEL[distro],
            **{f"command -v {tool} ": f"/usr/bin/{tool}" for tool in TOOLS},
        },
    }
