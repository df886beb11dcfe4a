"""The DCGM packages' install step (roles/shared/apt_resolve.py) against the lab's NVIDIA apt
stand-in's index, as `apt-cache madison` prints it: NVIDIA's DCGM packages carry epoch 1 that their
file names leave out (NVIDIA/DCGM v4.5.3 CMakeLists.txt), and the stand-in's exporter carries one too.

The step runs in sh with apt-cache answering from the captured index and an apt-get as strict as
apt's: `pkg=<version>` must be a version of the index exactly, epoch included ("Version '4.5.3-1' for
'...' was not found", apt-pkg/cachefilter / apt-private/private-install). The old literal pins fail
against it; the resolved ones install."""

from __future__ import annotations

import subprocess

import pytest

from lab.standins.nvidia_apt_repo.dcgm import dcgm_packages
from lab.standins.nvidia_apt_repo.dcgm_exporter import dcgm_exporter_packages
from lab.standins.nvidia_apt_repo.repo import Package
from roles.shared.apt_resolve import install_command, installed_at, upstream_version
from roles.site.stack import DCGM_FOR_EXPORTER

EXPORTER = "datacenter-gpu-manager-exporter"
CORE = "datacenter-gpu-manager-4-core"
CUDA12 = "datacenter-gpu-manager-4-cuda12"
URL = "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/x86_64  Packages"


def standin_index(extra: list[Package] = ()) -> list[Package]:
    """The stand-in's DCGM and exporter packages, plus a newer DCGM as a real index also has."""
    return [*dcgm_packages(Package), *dcgm_exporter_packages(Package, "580.95.05"), *extra]


def madison(packages: list[Package]) -> dict[str, str]:
    """apt-cache madison's output per package (apt-private/private-madison.cc: name | version | source)."""
    out: dict[str, str] = {}
    for p in packages:
        out[p.name] = out.get(p.name, "") + f"{p.name:>32} | {p.version} | {URL}\n"
    return out


@pytest.fixture
def host_sh(tmp_path):
    """Run a command in sh with fake apt-cache / strict apt-get on PATH; returns (rc, stderr, installed)."""

    def run(command: str, packages: list[Package]):
        bin_dir, log = tmp_path / "bin", tmp_path / "apt-get.log"
        bin_dir.mkdir(exist_ok=True)
        for name, text in madison(packages).items():
            (tmp_path / f"{name}.madison").write_text(text)
        index = " ".join(f"{p.name}={p.version}" for p in packages)
        (bin_dir / "apt-cache").write_text(
            f'#!/bin/sh\n[ "$1" = madison ] || exit 100\ncat {tmp_path}/"$2".madison 2>/dev/null; exit 0\n'
        )
        (bin_dir / "apt-get").write_text(
            f'#!/bin/sh\n[ "$1" = update ] && {{ echo update >> {tmp_path}/updates; exit 0; }}\n'
            'for a in "$@"; do case "$a" in -*|install) ;; *=*)\n'
            f'  case " {index} " in *" $a "*) ;;'
            " *) echo \"E: Version '${a#*=}' for '${a%%=*}' was not found\" >&2;"
            " exit 100 ;; esac ;; esac; done\n"
            f'echo "$*" >> {log}\n'
        )
        for f in bin_dir.iterdir():
            f.chmod(0o755)
        done = subprocess.run(
            ["sh", "-c", command], capture_output=True, text=True, env={"PATH": f"{bin_dir}:/usr/bin:/bin"}
        )
        return done.returncode, done.stderr, log.read_text() if log.exists() else ""

    return run


def test_the_old_literal_pins_are_refused_by_the_standins_index(host_sh):
    """What the deploy ran before: `=4.8.2-1` (stack.yml's old pin) and DCGM as `=4.5.3-1`."""
    for literal in (f"{EXPORTER}=4.8.2-1", f"{CORE}=4.5.3-1"):
        rc, err, installed = host_sh(f"apt-get install -y {literal}", standin_index())
        assert rc == 100 and "was not found" in err and installed == ""


def test_the_resolver_installs_the_index_version_epoch_included(host_sh):
    newer = [Package(CORE, "1:4.6.0-1"), Package(CUDA12, "1:4.6.0-1")]
    pins = {CORE: DCGM_FOR_EXPORTER["4.8.2"], CUDA12: DCGM_FOR_EXPORTER["4.8.2"]}
    rc, err, installed = host_sh(install_command(pins), standin_index(newer))
    assert rc == 0, err
    assert f"{CORE}=1:4.5.3-1 {CUDA12}=1:4.5.3-1" in installed
    rc, err, installed = host_sh(install_command({EXPORTER: "4.8.2"}), standin_index())
    assert rc == 0, err
    assert f"{EXPORTER}=1:4.8.2-1" in installed


def test_the_exporter_comes_with_the_dcgm_it_is_built_against(host_sh):
    """Installed alone, the exporter's dependency on DCGM's core is apt's choice: the index's
    newest (1:4.6.0-1 here). The monitoring role pins the core beside it."""
    from roles.monitoring import exporter_pins

    newer = [Package(CORE, "1:4.6.0-1")]
    rc, err, installed = host_sh(install_command(exporter_pins("4.8.2")), standin_index(newer))
    assert rc == 0, err
    assert f"{EXPORTER}=1:4.8.2-1 {CORE}=1:4.5.3-1 datacenter-gpu-manager-4-proprietary=1:4.5.3-1" in installed


def test_the_index_is_refreshed_before_it_is_read(host_sh, tmp_path):
    """A host's index from hours ago may lack the pin or name files the repository no longer
    serves (a lab migration test met both): the step updates the index first, every time it runs
    (it runs only when something must be installed)."""
    rc, err, _ = host_sh(install_command({EXPORTER: "4.8.2"}), standin_index())
    assert rc == 0, err
    assert (tmp_path / "updates").read_text() == "update\n"


def test_a_pin_the_index_lacks_is_one_line_naming_package_pin_and_versions(host_sh):
    newer = [Package(CORE, "1:4.6.0-1")]
    rc, err, installed = host_sh(install_command({CORE: "4.4.0"}), standin_index(newer))
    assert rc == 1 and installed == ""
    assert err.strip().splitlines() == [
        f"{CORE}: version 4.4.0 (any epoch, any revision) is not in this host's apt index, which has:"
        " 1:4.5.3-1 1:4.6.0-1"
    ]
    rc, err, _ = host_sh(install_command({"no-such-package": "1.0"}), [])
    assert rc == 1 and err.strip().endswith("which has: none")


def test_names_and_pins_are_quoted():
    with pytest.raises(ValueError, match="refused: 'a;b'='1.0 x' is not a Debian package name"):
        install_command({"a;b": "1.0 x"})
    with pytest.raises(ValueError, match="refused"):
        install_command({"-oDpkg::Pre-Invoke::=touch": "1.0"})
    assert "set -- libfoo1 '1.0+dfsg~1' gpu-x 2;" in install_command({"libfoo1": "1.0+dfsg~1", "gpu-x": "2"})


def test_installed_is_read_without_epoch_and_revision():
    assert upstream_version("1:4.5.3-1") == "4.5.3" and upstream_version("4.8.2") == "4.8.2"
    assert upstream_version("2.45.3+ds-2ubuntu0.3") == "2.45.3+ds"
    assert installed_at({CORE: ["1:4.5.3-1"], CUDA12: ["1:4.5.3-1"]}, [CORE, CUDA12], "4.5.3")
    assert not installed_at({CORE: ["1:4.5.3-1"], CUDA12: ["1:4.6.0-1"]}, [CORE, CUDA12], "4.5.3")
    assert not installed_at({}, [CORE], "4.5.3")
